package lockcore

import (
	"context"
	"testing"

	"github.com/jobguard/jobguard/internal/testredis"
)

// BenchmarkAcquireRelease measures an uncontended TryAcquire+Release on the
// Redis at REDIS_ADDR with default options, and reports its round trips.
func BenchmarkAcquireRelease(b *testing.B) { benchAcquireRelease(b) }

// BenchmarkAcquireReleaseBatched is BenchmarkAcquireRelease with
// WithBatching: each call finds its lane idle and goes alone.
func BenchmarkAcquireReleaseBatched(b *testing.B) { benchAcquireRelease(b, WithBatching()) }

func benchAcquireRelease(b *testing.B, opts ...Option) {
	ctx := context.Background()
	client := testredis.Client(b)
	prefix := testredis.Prefix(b, client)
	var rt testredis.Counter
	client.AddHook(&rt)
	l, err := NewRedis(client, append([]Option{WithPrefix(prefix)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close(ctx) })
	benchCycles(b, l, &rt)
}

// benchCycles runs b.N acquire+release cycles on one key after one unmeasured
// cycle (which caches the scripts), reporting rt's count per cycle when rt is
// not nil.
func benchCycles(b *testing.B, l Locker, rt *testredis.Counter) {
	ctx := context.Background()
	cycle := func() {
		lease, err := l.TryAcquire(ctx, "job", nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	cycle()
	if rt != nil {
		rt.Reset()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		cycle()
	}
	b.StopTimer()
	if rt != nil {
		b.ReportMetric(float64(rt.Count())/float64(b.N), "roundtrips/op")
	}
}
