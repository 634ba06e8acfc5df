//go:build faults

package faults_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// replyDeployments are the Redis deployments of the reply-fault scenarios:
// a faulty client (the one faults are injected into) and a clean one (an
// observer's), each closed when the test ends.
var replyDeployments = map[string]func(t *testing.T) (redis.UniversalClient, redis.UniversalClient){
	"standalone": func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
		addr := testredis.Addr(t)
		a, b := redis.NewClient(&redis.Options{Addr: addr}), redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		return a, b
	},
	"cluster": func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
		a, b := redis.NewClusterClient(testredis.ClusterOptions(t)), redis.NewClusterClient(testredis.ClusterOptions(t))
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		return a, b
	},
}

// spreadKeys returns n keys named prefix-<i>, in the order of their names,
// whose records live in different slots: on a Cluster, each on another
// master while there are masters left.
func spreadKeys(t *testing.T, c redis.UniversalClient, prefix string, n int) []string {
	t.Helper()
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		var keys []string
		for i := range n {
			keys = append(keys, fmt.Sprint(prefix, "-", i))
		}
		return keys
	}
	var keys []string
	seen := map[string]bool{}
	for i := 0; len(keys) < n && i < 1000; i++ {
		k := fmt.Sprint(prefix, "-", i)
		m, err := cc.MasterForKey(context.Background(), "{"+k+"}")
		require.NoError(t, err)
		if !seen[m.Options().Addr] || len(seen) >= 3 {
			seen[m.Options().Addr] = true
			keys = append(keys, k)
		}
	}
	require.Len(t, keys, n)
	return keys
}

var (
	isAcquire = func(cmd redis.Cmder) bool { return plainAcquireCmd(cmd) || acquireCmd(cmd) }
	isRelease = func(cmd redis.Cmder) bool { return plainReleaseCmd(cmd) || releaseCmd(cmd) }
)

// onLockKey matches the script calls on key's records ("<prefix>{key}:...").
func onLockKey(key string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		a := cmd.Args()
		return len(a) > 3 && strings.Contains(fmt.Sprint(a[3]), "{"+key+"}")
	}
}

// extraGuard is a Guard on a faulty client whose jobs hold the keys extra
// gives them, with a clean Locker to look at the keys, and a channel of the
// leases the faulty Locker reported lost.
type extraGuard struct {
	g        *middleware.Guard
	observer *lockkit.Locker
	hook     *testredis.Faults
	lost     chan lockkit.Event
}

const extraTTL = 900 * time.Millisecond

func newExtraGuard(t *testing.T, faulty, clean redis.UniversalClient, match func(redis.Cmder) bool, policy middleware.Policy, extra func(middleware.Job) map[string]int) *extraGuard {
	t.Helper()
	hook := &testredis.Faults{Match: match, Delay: 200 * time.Millisecond}
	faulty.AddHook(hook)
	prefix := testredis.Prefix(t, clean)
	lost := make(chan lockkit.Event, 16)
	l, err := lockkit.NewRedis(faulty, lockkit.WithPrefix(prefix), lockkit.WithTTL(extraTTL), lockkit.WithOwner("faulty"),
		lockkit.WithObserver(func(e lockkit.Event) {
			if e.Kind == lockkit.LeaseLost {
				select {
				case lost <- e:
				default:
				}
			}
		}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	observer, err := lockkit.NewRedis(clean, lockkit.WithPrefix(prefix), lockkit.WithOwner("observer"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = observer.Close(context.Background()) })
	g, err := middleware.New(l, middleware.WithPolicy(policy), middleware.WithTTL(extraTTL),
		middleware.WithExtraKeys(func(_ context.Context, job middleware.Job) map[string]int { return extra(job) }))
	require.NoError(t, err)
	return &extraGuard{g: g, observer: observer, hook: hook, lost: lost}
}

// holderCount is how many holders key has now.
func (x *extraGuard) holderCount(t *testing.T, key string) int {
	info, err := x.observer.Inspect(context.Background(), key)
	require.NoError(t, err)
	return len(info.Holders)
}

// noneHeld waits, up to bound, until none of keys has a holder.
func (x *extraGuard) noneHeld(t *testing.T, keys []string, bound time.Duration, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, k := range keys {
			if x.holderCount(t, k) > 0 {
				return false
			}
		}
		return true
	}, bound, time.Millisecond, msg)
}

// noLoss fails the test if the faulty Locker reported a lease lost: Redis
// stayed healthy.
func (x *extraGuard) noLoss(t *testing.T) {
	t.Helper()
	select {
	case e := <-x.lost:
		t.Fatalf("lease %q lost while Redis was healthy: %v", e.Key, e.Err)
	default:
	}
}

// A job with two extra keys (limits 1 and 2, so both forms of a key), its
// own key under Skip, each script call of its path in turn faulted: its
// own key's acquire, each extra key's acquire, the extra keys' release
// (one pipeline) and its own key's release, with the reply repeated,
// dropped after Redis ran the call, or late. The job either ran once,
// holding every key at once, or did not run (a lost or late acquire's
// reply); within one renewal interval after Run returned no key has a
// holder (an orphaned acquire's holder, or a release whose reply was lost,
// is cleaned up in the background), no lease is reported lost, and the
// same job runs again.
func TestExtraKeysUnderReplyFaults(t *testing.T) {
	steps := []struct {
		name    string
		key     int // 0: the own key, 1 and 2: the extra keys
		release bool
	}{
		{"own-acquire", 0, false},
		{"extra1-acquire", 1, false},
		{"extra2-acquire", 2, false},
		{"extras-release", 1, true},
		{"own-release", 0, true},
	}
	for dname, connect := range replyDeployments {
		for _, step := range steps {
			for _, f := range []testredis.Fault{testredis.Repeat, testredis.DropReply, testredis.Late} {
				t.Run(fmt.Sprintf("%s/%s/%s", dname, step.name, f), func(t *testing.T) {
					t.Parallel()
					faulty, clean := connect(t)
					keys := spreadKeys(t, clean, "xk", 3) // own, then the extras in name order
					kind := isAcquire
					if step.release {
						kind = isRelease
					}
					on := onLockKey(keys[step.key])
					x := newExtraGuard(t, faulty, clean, func(cmd redis.Cmder) bool { return kind(cmd) && on(cmd) }, middleware.Skip(),
						func(middleware.Job) map[string]int { return map[string]int{keys[1]: 1, keys[2]: 2} })
					job := middleware.Job{Key: keys[0], Name: "report"}

					x.hook.Arm(f, 1)
					var runs atomic.Int32
					start := time.Now()
					out := x.g.Run(context.Background(), job, func(ctx context.Context) error {
						runs.Add(1)
						for _, k := range keys {
							info, err := x.observer.Inspect(context.Background(), k)
							require.NoError(t, err)
							require.Len(t, info.Holders, 1, "%s has one holder while the job runs", k)
							require.Equal(t, "faulty", info.Holders[0].Owner, "%s is held by the job's Locker", k)
						}
						return ctx.Err()
					})
					returned := time.Now()
					require.EqualValues(t, 1, x.hook.Hits(), "the fault was injected once")
					if step.name == "extras-release" {
						require.EqualValues(t, 2, x.hook.Carried(), "the extra keys are released in one pipeline")
					}
					wantRan := f == testredis.Repeat || step.release
					require.Equal(t, wantRan, out.Ran, "ran (err %v)", out.Err)
					require.EqualValues(t, map[bool]int32{true: 1, false: 0}[out.Ran], runs.Load(), "runs")
					if !out.Ran {
						require.Error(t, out.Err)
						require.Nil(t, out.Duplicate, "a fault was reported as a duplicate: %v", out.Err)
					}
					x.noneHeld(t, keys, extraTTL/3, "a key kept a holder beyond a renewal interval")
					cleaned := time.Since(returned)
					x.noLoss(t)
					again := x.g.Run(context.Background(), job, func(context.Context) error { return nil })
					require.True(t, again.Ran, "the job runs again: %v", again.Err)
					require.NoError(t, again.Err)
					x.noneHeld(t, keys, extraTTL/3, "a key kept a holder after a clean run")
					t.Logf("%s %s %s: Run %s (ran %v, err %v), keys free %s after it returned",
						dname, step.name, f, returned.Sub(start).Round(time.Millisecond), out.Ran, out.Err, cleaned.Round(time.Millisecond))
				})
			}
		}
	}
}

// Two jobs whose keys overlap in opposite orders (each one's own key is
// the other's extra key) under Wait, each run five times, while the first
// three script calls on their keys (acquires and releases) have their
// replies repeated, dropped or late: both complete. A run that a fault
// kept from running is retried, as a runtime would; no wait runs out
// (a deadlock would, and so would a key left held); the two never run at
// once; and no key keeps a holder afterwards.
func TestExtraKeysInOppositeOrdersUnderReplyFaults(t *testing.T) {
	const runsEach = 5
	for dname, connect := range replyDeployments {
		for _, f := range []testredis.Fault{testredis.Repeat, testredis.DropReply, testredis.Late} {
			t.Run(fmt.Sprintf("%s/%s", dname, f), func(t *testing.T) {
				t.Parallel()
				faulty, clean := connect(t)
				keys := spreadKeys(t, clean, "xo", 2)
				onA, onB := onLockKey(keys[0]), onLockKey(keys[1])
				x := newExtraGuard(t, faulty, clean, func(cmd redis.Cmder) bool { return (isAcquire(cmd) || isRelease(cmd)) && (onA(cmd) || onB(cmd)) },
					middleware.Wait(3*time.Second, middleware.Skip()),
					func(job middleware.Job) map[string]int {
						if job.Key == keys[0] {
							return map[string]int{keys[1]: 1}
						}
						return map[string]int{keys[0]: 1}
					})
				x.hook.Arm(f, 3)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				var running atomic.Int32
				var wg sync.WaitGroup
				errs := make(chan error, 2)
				failed := make([]int, 2)
				for i, own := range keys {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for done := 0; done < runsEach; {
							if ctx.Err() != nil {
								errs <- fmt.Errorf("%s: %d of %d runs: %w", own, done, runsEach, ctx.Err())
								return
							}
							out := x.g.Run(ctx, middleware.Job{Key: own, Name: own}, func(context.Context) error {
								if running.Add(1) > 1 {
									errs <- fmt.Errorf("%s ran beside the other job, which holds one of its keys", own)
								}
								time.Sleep(time.Millisecond) // the work
								running.Add(-1)
								return nil
							})
							var dup *middleware.DuplicateError
							switch {
							case errors.As(out.Err, &dup):
								errs <- fmt.Errorf("%s: a wait ran out: %w", own, out.Err)
								return
							case out.Ran:
								done++
							default:
								failed[i]++ // a fault kept it from running: the runtime runs it again
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}
				require.EqualValues(t, 3, x.hook.Hits(), "three faults were injected")
				x.noneHeld(t, keys, extraTTL/3, "a key kept a holder beyond a renewal interval")
				x.noLoss(t)
				t.Logf("%s %s: both jobs ran %d times; runs a fault kept from running: %v", dname, f, runsEach, failed)
			})
		}
	}
}
