package lockcore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// scriptTrips counts the round trips (a command or a pipeline) that carry
// a script call, per server address, through the hook of each server's
// client (on a Cluster, each node's: clusterWithNodeHooks).
type scriptTrips struct {
	mu sync.Mutex
	by map[string]int
}

func (s *scriptTrips) hook(addr string) redis.Hook {
	return beforeHook(func(cmds []redis.Cmder) { s.count(addr, cmds) })
}

func (s *scriptTrips) count(addr string, cmds []redis.Cmder) {
	for _, c := range cmds {
		if isScriptCall(c) {
			s.mu.Lock()
			if s.by == nil {
				s.by = map[string]int{}
			}
			s.by[addr]++
			s.mu.Unlock()
			return
		}
	}
}

// take returns the round trips per address so far, and forgets them.
func (s *scriptTrips) take() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	by := s.by
	s.by = nil
	return by
}

// countedClients are the deployments ReleaseAll's round trips are counted
// on, each with trips added to every server's client.
var countedClients = map[string]func(t *testing.T, trips *scriptTrips) redis.UniversalClient{
	"standalone": func(t *testing.T, trips *scriptTrips) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
		t.Cleanup(func() { _ = c.Close() })
		c.AddHook(trips.hook(testredis.Addr(t)))
		return c
	},
	"cluster": func(t *testing.T, trips *scriptTrips) redis.UniversalClient {
		return clusterWithNodeHooks(t, trips.hook)
	},
}

// masterOf is the address of the server that keeps key's records ("" on a
// standalone Redis).
func masterOf(t *testing.T, l *RedisLocker, key string) string {
	t.Helper()
	cc, ok := l.r.c.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	m, err := cc.MasterForKey(context.Background(), l.r.keys(key).holders)
	require.NoError(t, err)
	return m.Options().Addr
}

// ReleaseAll releases leases on three keys in one round trip per server
// that keeps them: one on a standalone Redis, one per master touched on a
// Cluster (three keys on three masters, or on one), whatever form each
// lease's key is in (limit 1: the plain form; above: the sorted set).
func TestReleaseAllOneRoundTripPerServer(t *testing.T) {
	for name, connect := range countedClients {
		for _, limits := range [][]int{{1, 1, 1}, {2, 3, 4}, {1, 3, 1}} {
			t.Run(fmt.Sprintf("%s/limits=%v", name, limits), func(t *testing.T) {
				ctx := ctxT(t)
				trips := &scriptTrips{}
				c := connect(t, trips)
				l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				// Three keys on three masters, and three on one (on a
				// standalone Redis, both on the one server).
				var spreadKeys, together []string
				seen := map[string]bool{}
				for i := 0; (len(spreadKeys) < 3 || len(together) < 3) && i < 10000; i++ {
					k := fmt.Sprint("k-", i)
					addr := masterOf(t, l, k)
					if len(spreadKeys) < 3 && (!seen[addr] || name != "cluster") {
						seen[addr] = true
						spreadKeys = append(spreadKeys, k)
					} else if len(together) < 3 && addr == masterOf(t, l, "k-0") {
						together = append(together, k)
					}
				}
				require.Len(t, spreadKeys, 3)
				require.Len(t, together, 3)
				masters := 1
				if name == "cluster" {
					masters = 3
				}
				take := func(keys []string) []*Lease {
					var leases []*Lease
					for i, k := range keys {
						lease, err := l.TryAcquire(ctx, k, &AcquireOptions{Limit: limits[i]})
						require.NoError(t, err, k)
						leases = append(leases, lease)
					}
					return leases
				}
				for _, keys := range [][]string{spreadKeys, together} {
					require.NoError(t, ReleaseAll(ctx, take(keys))) // every script is cached on every master
				}
				for _, tc := range []struct {
					keys    []string
					servers int
				}{{spreadKeys, masters}, {together, 1}} {
					leases := take(tc.keys)
					trips.take()
					require.NoError(t, ReleaseAll(ctx, leases))
					by := trips.take()
					require.Len(t, by, tc.servers, "servers touched by releasing %v: %v", tc.keys, by)
					for addr, n := range by {
						require.Equal(t, 1, n, "round trips to %q releasing %v", addr, tc.keys)
					}
					for _, k := range tc.keys {
						info, err := l.Inspect(ctx, k)
						require.NoError(t, err)
						require.Empty(t, info.Holders, k)
					}
				}
			})
		}
	}
}

// A lease among them that was lost already (an operator removed it), or
// released already, makes ReleaseAll return an error matching ErrNotHeld
// that names its key; the others are released.
func TestReleaseAllReportsALeaseNotHeldAndReleasesTheOthers(t *testing.T) {
	for _, how := range []string{"lost", "released"} {
		t.Run(how, func(t *testing.T) {
			ctx := ctxT(t)
			c := testredis.Client(t)
			prefix := testredis.Prefix(t, c)
			l, err := NewRedis(c, WithPrefix(prefix), WithOwner("a"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			other, err := NewRedis(c, WithPrefix(prefix), WithOwner("b"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = other.Close(context.Background()) })
			var leases []*Lease
			for i, k := range []string{"a", "b", "c"} {
				lease, err := l.TryAcquire(ctx, k, &AcquireOptions{Limit: 1 + i%2})
				require.NoError(t, err)
				leases = append(leases, lease)
			}
			switch how {
			case "lost":
				n, err := other.ForceRelease(ctx, "b", Select{})
				require.NoError(t, err)
				require.Equal(t, 1, n)
				select {
				case <-leases[1].Lost():
				case <-ctx.Done():
					t.Fatal("the lease an operator removed was not reported lost")
				}
			case "released":
				require.NoError(t, leases[1].Release(ctx))
			}
			err = ReleaseAll(ctx, leases)
			require.ErrorIs(t, err, ErrNotHeld)
			require.ErrorContains(t, err, `"b"`)
			require.NotContains(t, err.Error(), `"a"`)
			require.NotContains(t, err.Error(), `"c"`)
			for _, k := range []string{"a", "b", "c"} {
				lease, err := other.TryAcquire(ctx, k, nil)
				require.NoError(t, err, "%s is free", k)
				require.NoError(t, lease.Release(ctx))
			}
		})
	}
}

// A lease taken with AsyncRelease goes to the background releaser:
// ReleaseAll returns while its release is still in flight, having
// released the others itself.
func TestReleaseAllLeavesAsyncReleasesToTheBackground(t *testing.T) {
	ctx := ctxT(t)
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	g := &gate{}
	gated := hookedClient(t, g)
	l, err := NewRedis(gated, WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { g.release(); _ = l.Close(context.Background()) })
	observer, err := NewRedis(c, WithPrefix(prefix), WithOwner("observer"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = observer.Close(context.Background()) })
	sync1, err := l.TryAcquire(ctx, "sync", nil)
	require.NoError(t, err)
	async, err := l.TryAcquire(ctx, "async", &AcquireOptions{AsyncRelease: true})
	require.NoError(t, err)

	g.match = onKey(l.r, "async")
	held := g.arm()
	done := make(chan error, 1)
	go func() { done <- ReleaseAll(ctx, []*Lease{sync1, async}) }()
	require.NoError(t, await(t, done), "ReleaseAll waited for the background release")
	await(t, held)
	require.Empty(t, holders(t, observer, "sync"), "released by ReleaseAll itself")
	require.Len(t, holders(t, observer, "async"), 1, "its release is in flight, in the background")
	g.release()
	require.Eventually(t, func() bool { return len(holders(t, observer, "async")) == 0 }, 5*time.Second, time.Millisecond)
}

// failPipeline fails, once armed, the next pipeline that carries a script
// call without sending it (a connection that broke before it was written).
type failPipeline struct{ armed atomic.Bool }

func (h *failPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *failPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *failPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if isScriptCall(c) && h.armed.CompareAndSwap(true, false) {
				for _, c := range cmds {
					c.SetErr(testredis.ErrInjected)
				}
				return testredis.ErrInjected
			}
		}
		return next(ctx, cmds)
	}
}

// A ReleaseAll whose pipeline failed (not sent, or its reply dropped after
// Redis ran it) returns the error, and the releases are retried in the
// background: the keys end free well within their TTL.
func TestReleaseAllRetriesAFailedReleaseInTheBackground(t *testing.T) {
	for _, fault := range []string{"not-sent", "reply-dropped"} {
		t.Run(fault, func(t *testing.T) {
			ctx := ctxT(t)
			var hook redis.Hook
			notSent := &failPipeline{}
			dropped := &testredis.Faults{Match: anyScript(append(releaseSources(), plainReleaseSrc)...)}
			if fault == "not-sent" {
				hook = notSent
			} else {
				hook = dropped
			}
			l, _, observer := faultyLocker(t, nil, WithTTL(time.Minute))
			l.r.c.(*redis.Client).AddHook(hook)
			keys := []string{"a", "b", "c"}
			var leases []*Lease
			for i, k := range keys {
				lease, err := l.TryAcquire(ctx, k, &AcquireOptions{Limit: 1 + i%2})
				require.NoError(t, err)
				leases = append(leases, lease)
			}
			notSent.armed.Store(fault == "not-sent")
			dropped.Arm(testredis.DropReply, 1)
			err := ReleaseAll(ctx, leases)
			require.ErrorIs(t, err, testredis.ErrInjected)
			require.NotErrorIs(t, err, ErrNotHeld)
			require.False(t, notSent.armed.Load(), "the pipeline was failed")
			if fault == "reply-dropped" {
				require.EqualValues(t, 1, dropped.Hits(), "the pipeline's reply was dropped")
				require.EqualValues(t, len(keys), dropped.Carried(), "one pipeline")
			}
			for _, lease := range leases {
				require.NoError(t, lease.Err(), "a lease given up is not lost")
			}
			require.Eventually(t, func() bool {
				for _, k := range keys {
					if len(holders(t, observer, k)) > 0 {
						return false
					}
				}
				return true
			}, 10*time.Second, 5*time.Millisecond, "the keys are released in the background, not left to their TTL")
		})
	}
}
