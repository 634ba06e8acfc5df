package lockcore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// cacheScripts loads lockkit's scripts into Redis, so that measured calls are
// not charged the one-time NOSCRIPT reply and EVAL fallback.
func cacheScripts(t *testing.T, c redis.Scripter) {
	t.Helper()
	for _, s := range append(append(acquireScripts, releaseScripts...), extendScript) {
		require.NoError(t, s.Load(context.Background(), c).Err())
	}
}

// An uncontended TryAcquire then Release, with default options (auto-renewal
// on), costs one round trip each once the scripts are cached and the Locker
// has checked the server's version.
func TestAcquireReleaseCostsTwoRoundTrips(t *testing.T) {
	ctx := ctxT(t)
	client := testredis.Client(t)
	prefix := testredis.Prefix(t, client)
	cacheScripts(t, client)
	var rt testredis.Counter
	client.AddHook(&rt)
	l, err := NewRedis(client, WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	// The first acquire of a Locker also reads the server's version.
	lease, err := l.TryAcquire(ctx, "first", nil)
	require.NoError(t, err)
	require.EqualValues(t, 4, rt.Count(),
		"INFO, then the acquire, then, once per Locker, its subscription to the operators' channel (two commands, on its pub/sub connection)")
	require.NoError(t, lease.Release(ctx))

	for i := range 50 {
		rt.Reset()
		lease, err := l.TryAcquire(ctx, "job", nil)
		require.NoError(t, err)
		require.EqualValues(t, 1, rt.Count(), "cycle %d: TryAcquire", i)
		require.NoError(t, lease.Release(ctx))
		require.EqualValues(t, 2, rt.Count(), "cycle %d: TryAcquire+Release", i)
	}
}

// One Locker renews all of its leases in one pipelined round trip per renewal
// tick (fewer leases than WithRenewBatch).
func TestRenewalCostsOneRoundTripPerTick(t *testing.T) {
	const (
		leases = 50
		ticks  = 4
	)
	ctx := ctxT(t)
	client := testredis.Client(t)
	prefix := testredis.Prefix(t, client)
	cacheScripts(t, client)
	var rt testredis.Counter
	client.AddHook(&rt)

	// At the end of every tick (each multiple of `leases` renewals) the
	// observer records the round trips so far. It runs on the renewer
	// goroutine before the next batch is sent, so consecutive records differ
	// by exactly the round trips of one tick.
	var renewed atomic.Int64
	tickEnds := make(chan int64, ticks+1)
	failed := make(chan Event, 1)
	l, err := NewRedis(client, WithPrefix(prefix), WithObserver(func(e Event) {
		switch e.Kind {
		case LeaseRenewed:
			if renewed.Add(1)%leases == 0 {
				select {
				case tickEnds <- rt.Count():
				default:
				}
			}
		case LeaseRenewFailed, LeaseLost:
			select {
			case failed <- e:
			default:
			}
		}
	}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })

	opt := &AcquireOptions{TTL: 600 * time.Millisecond} // renewed every 200ms
	for i := range leases {
		_, err := l.TryAcquire(ctx, fmt.Sprintf("job:%d", i), opt)
		require.NoError(t, err)
	}

	var ends []int64
	for len(ends) <= ticks {
		select {
		case n := <-tickEnds:
			ends = append(ends, n)
		case e := <-failed:
			t.Fatalf("renewal failed: %s %q: %v", e.Kind, e.Key, e.Err)
		case <-ctx.Done():
			t.Fatalf("saw %d of %d renewal ticks", len(ends), ticks+1)
		}
	}
	for i := 1; i < len(ends); i++ {
		require.EqualValues(t, 1, ends[i]-ends[i-1], "round trips of renewal tick %d for %d leases", i+1, leases)
	}
}

// errNoScript is Redis's NOSCRIPT reply, as go-redis returns it.
type errNoScript struct{}

func (errNoScript) Error() string { return "NOSCRIPT No matching script. Please use EVAL." }
func (errNoScript) RedisError()   {}

// noScriptOnce answers the first EVALSHA of hash in a pipeline with NOSCRIPT
// (after it ran, as if Redis had lost its script cache since), and counts
// the EVALs of the script that follow.
type noScriptOnce struct {
	hash, src string
	done      atomic.Bool
	evals     atomic.Int64
}

func (h *noScriptOnce) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *noScriptOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *noScriptOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			switch a := c.Args(); {
			case len(a) > 1 && a[0] == "evalsha" && a[1] == h.hash && h.done.CompareAndSwap(false, true):
				c.SetErr(errNoScript{})
			case len(a) > 1 && a[0] == "eval" && a[1] == h.src:
				h.evals.Add(1)
			}
		}
		return err
	}
}

// A batched renewal whose script Redis no longer has is sent again with
// EVAL, in the same renewal, and the leases stay held.
func TestBatchedRenewalFallsBackToEval(t *testing.T) {
	ctx := ctxT(t)
	client := testredis.Client(t)
	prefix := testredis.Prefix(t, client)
	hook := &noScriptOnce{hash: renewScript.Hash(), src: renewSrc}
	client.AddHook(hook)
	l, err := NewRedis(client, WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	var leases []*Lease
	for i := range 3 {
		lease, err := l.TryAcquire(ctx, fmt.Sprint("batch-", i), &AcquireOptions{TTL: 600 * time.Millisecond})
		require.NoError(t, err)
		leases = append(leases, lease)
	}
	require.Eventually(t, func() bool { return hook.evals.Load() > 0 }, 5*time.Second, time.Millisecond, "the renewal was sent again with EVAL")
	time.Sleep(time.Second) // more than one TTL: renewed since
	for i, lease := range leases {
		require.NoError(t, lease.Err(), "lease %d", i)
		require.NoError(t, lease.Release(ctx))
	}
}
