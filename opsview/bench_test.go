package opsview_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/opsview"
)

// commands counts round trips and the commands they carry.
type commands struct{ trips, cmds atomic.Int64 }

func (c *commands) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.trips.Add(1)
		c.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.trips.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// BenchmarkPageRefresh measures one refresh of the page's first page (100
// keys) with JOBGUARD_BENCH_KEYS held keys (100,000 by default): with the
// Locker's ScanKeys (a bounded SCAN per refresh) and, for comparison,
// through Keys (the whole keyspace per refresh). It reports the Redis
// commands and round trips of one refresh.
func BenchmarkPageRefresh(b *testing.B) {
	n := 100_000
	if v := os.Getenv("JOBGUARD_BENCH_KEYS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	ctx := context.Background()
	c := testredis.Client(b)
	prefix := testredis.Prefix(b, c)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close(ctx) })
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				key := fmt.Sprintf("asynq:report:tenant_id=org_%06d", i)
				if _, err := coretest.Of(b, l).TryAcquire(ctx, key, &lockcore.AcquireOptions{TTL: 30 * time.Minute, NoRenew: true, Label: fmt.Sprintf("task-%06d", i)}); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		b.Fatalf("%d acquires failed", failed.Load())
	}
	view := redis.NewClient(c.Options())
	b.Cleanup(func() { _ = view.Close() })
	count := &commands{}
	view.AddHook(count)
	vl, err := lockkit.NewRedis(view, lockkit.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = vl.Close(ctx) })
	for name, h := range map[string]http.Handler{"ScanKeys": must(opsview.New(vl))} {
		b.Run(fmt.Sprintf("%s/keys=%d", name, n), func(b *testing.B) {
			count.trips.Store(0)
			count.cmds.Store(0)
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/locks", nil))
				if w.Code != http.StatusOK {
					b.Fatal(w.Body.String())
				}
			}
			b.ReportMetric(float64(count.cmds.Load())/float64(b.N), "commands/refresh")
			b.ReportMetric(float64(count.trips.Load())/float64(b.N), "roundtrips/refresh")
		})
	}
}
