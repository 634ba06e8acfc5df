package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/internal/logbuf"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/internal/throttle"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// go-redis v9.17's process-wide clock goroutine is go-redis's, not a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// backends returns, per store, a function making Lockers that share state
// like processes sharing one Redis: miniredis in the process, and the Redis
// at REDIS_ADDR. A Locker made with hooks has a client of its own that
// runs them.
func backends(t *testing.T) map[string]func(t *testing.T, hooks ...redis.Hook) *lockkit.Locker {
	store := lockkittest.NewStore(t)
	return map[string]func(*testing.T, ...redis.Hook) *lockkit.Locker{
		"miniredis": func(t *testing.T, hooks ...redis.Hook) *lockkit.Locker {
			if len(hooks) == 0 {
				l := store.Locker()
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				return l
			}
			c := redis.NewClient(store.Client().Options())
			t.Cleanup(func() { _ = c.Close() })
			for _, h := range hooks {
				c.AddHook(h)
			}
			l, err := lockkit.NewRedis(c)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			return l
		},
		"redis": func() func(*testing.T, ...redis.Hook) *lockkit.Locker {
			var prefix string
			return func(t *testing.T, hooks ...redis.Hook) *lockkit.Locker {
				c := testredis.Client(t)
				if prefix == "" {
					prefix = testredis.Prefix(t, c)
				}
				for _, h := range hooks {
					c.AddHook(h)
				}
				l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				return l
			}
		}(),
	}
}

type recorder struct {
	mu     sync.Mutex
	events []guard.Event
}

func (r *recorder) observe(_ context.Context, e guard.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) kinds() []guard.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []guard.EventKind
	for _, e := range r.events {
		out = append(out, e.Kind)
	}
	return out
}

func (r *recorder) find(k guard.EventKind) (guard.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Kind == k {
			return e, true
		}
	}
	return guard.Event{}, false
}

func newGuard(t *testing.T, l *lockkit.Locker, opts ...guard.Option) (*guard.Guard, *recorder) {
	rec := &recorder{}
	g, err := guard.New(l, append(opts, guard.WithObserver(rec.observe))...)
	require.NoError(t, err)
	return g, rec
}

// holdKey runs a job on g that holds key until release is closed.
func holdKey(t *testing.T, g *guard.Guard, key string) (release func()) {
	started := make(chan struct{})
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		err := runErr(g, context.Background(), guard.Job{Key: key, Name: "holder"}, func(context.Context) error {
			close(started)
			<-stop
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}()
	<-started
	return func() { close(stop); <-done }
}

func TestPolicies(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			ctx := context.Background()
			holder, _ := newGuard(t, newLocker(t))
			release := holdKey(t, holder, "k")
			defer release()

			t.Run("skip", func(t *testing.T) {
				g, rec := newGuard(t, newLocker(t))
				ran := false
				out := g.Run(ctx, guard.Job{Key: "k", Name: "report"}, func(context.Context) error { ran = true; return nil })
				require.False(t, ran)
				require.False(t, out.Ran)
				require.NotNil(t, out.Duplicate)
				require.Same(t, out.Duplicate, out.Err)
				err := out.Err
				require.ErrorIs(t, err, guard.ErrDuplicate)
				require.ErrorIs(t, err, lockkit.ErrNotAcquired)
				var dup *guard.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, guard.ActionSkip, dup.Action)
				require.Equal(t, guard.ReasonHeld, dup.Reason)
				ev, ok := rec.find(guard.EventDuplicate)
				require.True(t, ok)
				require.Equal(t, guard.ActionSkip, ev.Action)
				require.NotEmpty(t, ev.Holder)
			})
			t.Run("requeue", func(t *testing.T) {
				g, _ := newGuard(t, newLocker(t), guard.WithPolicy(guard.Requeue(time.Second)))
				err := runErr(g, ctx, guard.Job{Key: "k"}, func(context.Context) error { return nil })
				var dup *guard.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, guard.ActionRequeue, dup.Action)
			})
			t.Run("fail", func(t *testing.T) {
				g, _ := newGuard(t, newLocker(t), guard.WithPolicy(guard.Fail()))
				err := runErr(g, ctx, guard.Job{Key: "k"}, func(context.Context) error { return nil })
				var dup *guard.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, guard.ActionFail, dup.Action)
			})
			t.Run("wait then fall back", func(t *testing.T) {
				g, rec := newGuard(t, newLocker(t), guard.WithPolicy(guard.Wait(150*time.Millisecond, guard.Requeue(0))))
				err := runErr(g, ctx, guard.Job{Key: "k"}, func(context.Context) error { return nil })
				var dup *guard.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, guard.ActionRequeue, dup.Action)
				require.GreaterOrEqual(t, dup.Waited, 150*time.Millisecond)
				require.Equal(t, []guard.EventKind{guard.EventDuplicate}, rec.kinds())
			})
		})
	}
}

func TestWaitRunsAfterRelease(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			holder, _ := newGuard(t, newLocker(t))
			release := holdKey(t, holder, "k")
			g, rec := newGuard(t, newLocker(t), guard.WithPolicy(guard.Wait(time.Minute, guard.Skip())))
			done := make(chan error, 1)
			go func() {
				done <- runErr(g, context.Background(), guard.Job{Key: "k"}, func(context.Context) error { return nil })
			}()
			require.Eventually(t, func() bool {
				info, err := newLocker(t).Inspect(context.Background(), "k")
				return err == nil && info.Waiters == 1
			}, 10*time.Second, time.Millisecond)
			release()
			require.NoError(t, <-done)
			require.Equal(t, []guard.EventKind{guard.EventWaited, guard.EventAcquired, guard.EventReleased}, rec.kinds())
		})
	}
}

func TestLimitAllowsNConcurrentRuns(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			const limit, jobs = 3, 12
			var running, maxRunning, ran, dups atomic.Int32
			gate := make(chan struct{})
			var wg sync.WaitGroup
			for range jobs {
				g, _ := newGuard(t, newLocker(t), guard.WithLimit(limit))
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := runErr(g, context.Background(), guard.Job{Key: "tenant"}, func(context.Context) error {
						n := running.Add(1)
						for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
						}
						ran.Add(1)
						<-gate
						running.Add(-1)
						return nil
					})
					if errors.Is(err, guard.ErrDuplicate) {
						dups.Add(1)
					} else if err != nil {
						t.Error(err)
					}
				}()
			}
			require.Eventually(t, func() bool { return ran.Load()+dups.Load() == jobs }, 10*time.Second, time.Millisecond)
			close(gate)
			wg.Wait()
			require.EqualValues(t, limit, maxRunning.Load())
			require.EqualValues(t, limit, ran.Load())
			require.EqualValues(t, jobs-limit, dups.Load())
		})
	}
}

func TestEpochRunsOnce(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			var runs atomic.Int32
			job := guard.With(guard.Job{Key: "cron:report", Name: "report"}, guard.Work{Epoch: 1700000000, EpochTTL: time.Minute})
			for i := range 3 {
				g, rec := newGuard(t, newLocker(t))
				err := runErr(g, context.Background(), job, func(context.Context) error { runs.Add(1); return nil })
				if i == 0 {
					require.NoError(t, err)
					continue
				}
				var dup *guard.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, guard.ReasonClaimed, dup.Reason)
				require.ErrorIs(t, err, lockcore.ErrEpochUsed)
				require.Equal(t, []guard.EventKind{guard.EventClaimed}, rec.kinds())
			}
			require.EqualValues(t, 1, runs.Load())
		})
	}
}

func TestPanicReleasesAndRepanics(t *testing.T) {
	l := lockkittest.New(t)
	g, rec := newGuard(t, l)
	require.PanicsWithValue(t, "boom", func() {
		_ = runErr(g, context.Background(), guard.Job{Key: "k"}, func(context.Context) error { panic("boom") })
	})
	info, err := l.Inspect(context.Background(), "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders)
	ev, ok := rec.find(guard.EventError)
	require.True(t, ok)
	require.ErrorContains(t, ev.Err, "panicked: boom")
	ev, ok = rec.find(guard.EventReleased)
	require.True(t, ok, "the run ended: EventReleased follows")
	require.ErrorContains(t, ev.Err, "panicked: boom")
}

// The lease outlives a cancelled ctx until the work really returns: this is
// what keeps a shutdown-requeued asynq task from overlapping the old run.
func TestLeaseHeldUntilWorkReturnsAfterCancel(t *testing.T) {
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	a, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer a.Close(context.Background())
	b, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer b.Close(context.Background())
	ga, _ := newGuard(t, a, guard.WithTTL(300*time.Millisecond))
	gb, _ := newGuard(t, b)

	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	cancelled := make(chan struct{})
	finish := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- runErr(ga, ctx, guard.Job{Key: "k"}, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			close(cancelled)
			<-finish // keeps working after cancellation, past several TTLs
			return nil
		})
	}()
	<-started
	cancel()
	<-cancelled
	renewedPast := time.Now().Add(time.Second) // > 3 TTLs
	for time.Now().Before(renewedPast) {
		err := runErr(gb, context.Background(), guard.Job{Key: "k"}, func(context.Context) error {
			t.Error("a second run overlapped the cancelled one")
			return nil
		})
		require.ErrorIs(t, err, guard.ErrDuplicate)
		time.Sleep(20 * time.Millisecond)
	}
	close(finish)
	require.NoError(t, <-done)
	require.NoError(t, runErr(gb, context.Background(), guard.Job{Key: "k"}, func(context.Context) error { return nil }))
}

func TestLostLeaseCancelsWork(t *testing.T) {
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer l.Close(context.Background())
	g, rec := newGuard(t, l, guard.WithTTL(300*time.Millisecond))
	err = runErr(g, context.Background(), guard.Job{Key: "k"}, func(ctx context.Context) error {
		require.NoError(t, c.Del(context.Background(), prefix+"{k}:h").Err()) // the key is stolen
		<-ctx.Done()
		require.ErrorIs(t, context.Cause(ctx), lockkit.ErrLost)
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, lockkit.ErrLost)
	require.Eventually(t, func() bool { _, ok := rec.find(guard.EventLost); return ok }, 5*time.Second, time.Millisecond)
}

func one(context.Context, guard.Job) int { return 1 }

// WithLimitFunc gives each job its own limit: a premium key runs two jobs
// at once, another one.
func TestLimitFuncGivesEachJobItsLimit(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			ctx := context.Background()
			g, _ := newGuard(t, newLocker(t), guard.WithLimitFunc(func(_ context.Context, job guard.Job) int {
				if strings.HasPrefix(job.Key, "premium:") {
					return 2
				}
				return 1
			}))
			for key, want := range map[string]int{"premium:a": 2, "basic:b": 1} {
				var ran []bool
				var nest func(ctx context.Context, depth int) error
				nest = func(ctx context.Context, depth int) error {
					if depth == 3 {
						return nil
					}
					out := g.Run(ctx, guard.Job{Key: key}, func(ctx context.Context) error { return nest(ctx, depth+1) })
					ran = append(ran, out.Ran)
					return nil
				}
				require.NoError(t, nest(ctx, 0))
				runs := 0
				for _, r := range ran {
					if r {
						runs++
					}
				}
				require.Equal(t, want, runs, "%s: runs at once", key)
			}
		})
	}
}

// A limit out of range fails the job that got it, naming its key and the
// value: it does not run, takes no lease, and is no duplicate.
func TestLimitFuncOutOfRangeFailsTheJob(t *testing.T) {
	l := lockkittest.New(t)
	for _, n := range []int{0, -3, 10001} {
		g, rec := newGuard(t, l, guard.WithLimitFunc(func(context.Context, guard.Job) int { return n }))
		ran := false
		out := g.Run(context.Background(), guard.Job{Key: "tenant:7", Name: "report"}, func(context.Context) error { ran = true; return nil })
		require.False(t, ran)
		require.False(t, out.Ran)
		require.Nil(t, out.Duplicate)
		require.ErrorIs(t, out.Err, guard.ErrInvalid)
		require.ErrorContains(t, out.Err, fmt.Sprintf(`report: key "tenant:7": WithLimitFunc gave %d: a limit must be between 1 and 10000`, n))
		ev, ok := rec.find(guard.EventError)
		require.True(t, ok)
		require.Equal(t, out.Err, ev.Err)
		info, err := l.Inspect(context.Background(), "tenant:7")
		require.NoError(t, err)
		require.Empty(t, info.Holders)
	}
}

// Guards that give one key different limits, under Wait, never run more
// jobs at once than the smallest limit among the running jobs allows, and
// every job runs: the waiters that a release wakes are admitted by the
// same rule.
func TestDisagreeingLimitsKeepTheSmallerAndEveryJobRuns(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			const jobs = 24
			var (
				mu               sync.Mutex
				running, ran     int
				limits           []int // the limits of the running jobs
				worst, worstOver int   // the most jobs running, and above which limit
			)
			var wg sync.WaitGroup
			for i := range jobs {
				limit := []int{3, 1, 2}[i%3]
				g, _ := newGuard(t, newLocker(t), guard.WithPolicy(guard.Wait(time.Minute, guard.Fail())),
					guard.WithLimitFunc(func(context.Context, guard.Job) int { return limit }))
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := runErr(g, context.Background(), guard.Job{Key: "tenant"}, func(context.Context) error {
						mu.Lock()
						running++
						limits = append(limits, limit)
						if m := slices.Min(limits); running > m && running-m > worst-worstOver {
							worst, worstOver = running, m
						}
						mu.Unlock()
						for range 100 {
							runtime.Gosched() // let the other jobs try meanwhile
						}
						mu.Lock()
						running--
						limits = slices.Delete(limits, slices.Index(limits, limit), slices.Index(limits, limit)+1)
						ran++
						mu.Unlock()
						return nil
					})
					if err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			require.Equal(t, jobs, ran)
			require.Zero(t, worst, "%d jobs ran at once while one with limit %d ran", worst, worstOver)
		})
	}
}

func TestNewValidation(t *testing.T) {
	l := lockkittest.New(t)
	cases := []struct {
		name string
		opts []guard.Option
		want string
	}{
		{"limit", []guard.Option{guard.WithLimit(0)}, "WithLimit(0): must be between 1 and 10000"},
		{"huge limit", []guard.Option{guard.WithLimit(10001)}, "WithLimit(10001): must be between 1 and 10000"},
		{"nil limit func", []guard.Option{guard.WithLimitFunc(nil)}, "WithLimitFunc(nil): the limit function must not be nil"},
		{"limit func and coalesce", []guard.Option{guard.WithPolicy(guard.Coalesce()), guard.WithLimitFunc(one)}, "WithLimitFunc: Coalesce runs one job per key"},
		{"limit func and keep newest", []guard.Option{guard.WithPolicy(guard.KeepNewest()), guard.WithLimitFunc(one)}, "WithLimitFunc: KeepNewest runs one job per key"},
		{"limit func and preempt", []guard.Option{guard.WithPolicy(guard.Preempt(0)), guard.WithLimitFunc(one)}, "WithLimitFunc: Preempt runs one job per key"},
		{"limit after limit func", []guard.Option{guard.WithLimitFunc(one), guard.WithLimit(-1)}, "WithLimit(-1)"},
		{"limit func after limit", []guard.Option{guard.WithLimit(2), guard.WithLimitFunc(nil)}, "WithLimitFunc(nil)"},
		{"ttl", []guard.Option{guard.WithTTL(time.Millisecond)}, "WithTTL(1ms): must be zero (the Locker's) or between 100ms and"},
		{"keep newest and wait", []guard.Option{guard.WithPolicy(guard.Wait(time.Second, guard.KeepNewest()))}, "KeepNewest() waits for its turn itself"},
		{"throttle n", []guard.Option{guard.WithThrottle(0, time.Second, guard.ActionSkip)}, "WithThrottle(0, 1s): n must be at least 1"},
		{"throttle then", []guard.Option{guard.WithThrottle(1, time.Second, guard.ActionFail)}, "then must be ActionSkip or ActionRequeue, not fail"},
		{"negative hold", []guard.Option{guard.WithHoldAtLeast(-time.Second)}, "WithHoldAtLeast(-1s): must not be negative"},
		{"negative wait", []guard.Option{guard.WithPolicy(guard.Wait(-time.Second, guard.Skip()))}, "the wait -1s must be positive"},
		{"zero wait", []guard.Option{guard.WithPolicy(guard.Wait(0, guard.Skip()))}, "the wait 0s must be positive"},
		{"zero wait in order", []guard.Option{guard.WithPolicy(guard.WaitInOrder(0, guard.Fail()))}, "the wait 0s must be positive"},
		{"wait around a wait", []guard.Option{guard.WithPolicy(guard.Wait(time.Second, guard.Wait(time.Hour, guard.Skip())))}, "then waits already: Wait(1h0m0s, Skip())"},
		{"negative delay", []guard.Option{guard.WithPolicy(guard.Requeue(-time.Second))}, "the requeue delay must not be negative nor longer than"},
		{"delay past MaxTTL", []guard.Option{guard.WithPolicy(guard.Requeue(lockcore.MaxTTL + time.Hour))}, "the requeue delay must not be negative nor longer than"},
		{"nil admit", []guard.Option{guard.WithAdmit(nil)}, "WithAdmit(nil)"},
		{"nil done", []guard.Option{guard.WithDone(nil)}, "WithDone(nil)"},
		{"preempt and wait", []guard.Option{guard.WithPolicy(guard.Wait(time.Second, guard.Preempt(0)))}, "Preempt(0s) waits for its turn itself"},
		{"negative grace", []guard.Option{guard.WithPolicy(guard.Preempt(-time.Second))}, "the grace must not be negative"},
		{"preempt and limit", []guard.Option{guard.WithPolicy(guard.Preempt(0)), guard.WithLimit(2)}, "Preempt runs one job per key"},
		{"preempt and hold", []guard.Option{guard.WithPolicy(guard.Preempt(0)), guard.WithHoldAtLeast(time.Second)}, "Preempt ends runs early"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := guard.New(l, c.opts...)
			require.ErrorIs(t, err, guard.ErrInvalid)
			require.ErrorIs(t, err, lockkit.ErrInvalid)
			require.ErrorContains(t, err, c.want)
		})
	}
	_, err := guard.New(nil)
	require.ErrorContains(t, err, "locker is nil")

	g, err := guard.New(l)
	require.NoError(t, err)
	require.Equal(t, guard.ModeAction, guard.ModeOf(guard.PolicyOf(g)))
	require.Equal(t, guard.ActionSkip, guard.ActionOf(guard.PolicyOf(g)))
	require.Equal(t, guard.DefaultRequeueDelay, guard.DelayOf(guard.PolicyOf(g)))
	require.Equal(t, "Skip()", guard.PolicyOf(g).String())
	err = runErr(g, context.Background(), guard.Job{Name: "report"}, func(context.Context) error { return nil })
	require.ErrorContains(t, err, "report: empty key")
	out := g.Run(context.Background(), guard.Job{Key: "k", Name: "report"}, nil)
	require.ErrorIs(t, out.Err, guard.ErrInvalid)
	require.ErrorContains(t, out.Err, "fn is nil")
	require.False(t, out.Ran)
	info, err := l.Inspect(context.Background(), "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "nothing was acquired")
}

// The TTL and the logger given once at the Locker are what the guard uses;
// a guard option overrides them for that guard only.
func TestSettingsComeFromTheLocker(t *testing.T) {
	ctx := context.Background()
	var lockerLog, guardLog logbuf.Buffer
	l := lockkittest.New(t, lockkit.WithTTL(2*time.Second),
		lockkit.WithLogger(slog.New(slog.NewTextHandler(&lockerLog, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	ttlOf := func(g *guard.Guard, key string) time.Duration {
		var ttl time.Duration
		err := runErr(g, ctx, guard.Job{Key: key, Name: "report", ID: "t1"}, func(ctx context.Context) error {
			info, err := l.Inspect(ctx, key)
			require.NoError(t, err)
			ttl = info.Holders[0].TTL
			return errors.New("smtp down")
		})
		require.EqualError(t, err, "smtp down")
		return ttl
	}

	g, err := guard.New(l)
	require.NoError(t, err)
	require.InDelta(t, 2, ttlOf(g, "a").Seconds(), 0.1, "the Locker's TTL")
	out := lockerLog.String()
	require.Contains(t, out, `level=WARN msg="jobguard: released" key=a job=report id=t1`)
	require.Contains(t, out, `err="smtp down"`)
	require.NotContains(t, out, "acquired", "routine events stay at Debug")

	g, err = guard.New(l, guard.WithTTL(5*time.Second),
		guard.WithLogger(slog.New(slog.NewTextHandler(&guardLog, nil))))
	require.NoError(t, err)
	require.InDelta(t, 5, ttlOf(g, "b").Seconds(), 0.1, "the guard's own TTL")
	require.Contains(t, guardLog.String(), "key=b")
	require.NotContains(t, lockerLog.String(), "key=b", "the guard's own logger")
}

// A job whose key is held by an earlier delivery of the same work (same
// Origin) is never a duplicate, whatever the policy: it waits for that run.
// If that run succeeded after its caller's ctx ended, the work is done and the
// job does not run; otherwise it runs.
func TestOwnEarlierDeliveryIsNeverADuplicate(t *testing.T) {
	for name, newLocker := range backends(t) {
		for _, firstErr := range []error{nil, errors.New("interrupted")} {
			t.Run(fmt.Sprintf("%s/first err %v", name, firstErr), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				a, err := guard.New(newLocker(t), guard.WithPolicy(guard.Skip()))
				require.NoError(t, err)
				b, err := guard.New(newLocker(t))
				require.NoError(t, err)
				key := t.Name()
				job := guard.With(guard.Job{Key: key, Name: "sync"}, guard.Work{Label: "task-1"})

				// The first delivery: its runtime gives up on it (ctx cancelled)
				// while it keeps working.
				actx, giveUp := context.WithCancel(ctx)
				started, finish := make(chan struct{}), make(chan struct{})
				firstDone := make(chan error, 1)
				go func() {
					firstDone <- runErr(a, actx, job, func(context.Context) error {
						close(started)
						<-finish
						return firstErr
					})
				}()
				<-started
				giveUp()
				// Another job of the key is a duplicate as usual.
				err = runErr(b, ctx, guard.With(guard.Job{Key: key, Name: "sync"}, guard.Work{Label: "task-2"}), func(context.Context) error { return nil })
				require.ErrorIs(t, err, guard.ErrDuplicate)

				var ran atomic.Bool
				second := make(chan error, 1)
				go func() {
					second <- runErr(b, ctx, job, func(context.Context) error { ran.Store(true); return nil })
				}()
				require.Eventually(t, func() bool {
					info, err := newLocker(t).Inspect(ctx, key)
					require.NoError(t, err)
					return info.Waiters == 1
				}, 10*time.Second, time.Millisecond, "the second delivery waits")
				close(finish)
				if ferr := <-firstDone; firstErr == nil {
					require.NoError(t, ferr)
				} else {
					require.ErrorIs(t, ferr, firstErr)
				}
				err = <-second
				if firstErr == nil {
					var dup *guard.DuplicateError
					require.ErrorAs(t, err, &dup)
					require.Equal(t, guard.ReasonCompleted, dup.Reason)
					require.Equal(t, guard.ActionSkip, dup.Action)
					require.ErrorIs(t, err, lockcore.ErrCompleted)
					require.False(t, ran.Load())
				} else {
					require.NoError(t, err)
					require.True(t, ran.Load())
				}
			})
		}
	}
}

// runErr runs fn under g and returns the outcome's error.
func runErr(g *guard.Guard, ctx context.Context, job guard.Job, fn func(context.Context) error) error {
	return g.Run(ctx, job, fn).Err
}

// Run's Outcome says which path a job took: ran (with fn's error), duplicate,
// or kept from running by an error that is never a duplicate.
func TestOutcome(t *testing.T) {
	l := lockkittest.New(t)
	g, _ := newGuard(t, l)
	ctx := context.Background()

	boom := errors.New("boom")
	out := g.Run(ctx, guard.Job{Key: "k"}, func(context.Context) error { return boom })
	require.Equal(t, guard.Outcome{Ran: true, Err: boom}, out)

	out = g.Run(ctx, guard.Job{Key: "k"}, func(context.Context) error { return nil })
	require.Equal(t, guard.Outcome{Ran: true}, out)

	out = g.Run(ctx, guard.Job{Name: "report"}, func(context.Context) error { return nil })
	require.False(t, out.Ran)
	require.Nil(t, out.Duplicate)
	require.ErrorContains(t, out.Err, "empty key")
	require.NotErrorIs(t, out.Err, guard.ErrDuplicate)

	closed := lockkittest.New(t)
	require.NoError(t, closed.Close(ctx))
	gc, _ := newGuard(t, closed)
	out = gc.Run(ctx, guard.Job{Key: "k"}, func(context.Context) error { return nil })
	require.False(t, out.Ran)
	require.Nil(t, out.Duplicate)
	require.ErrorIs(t, out.Err, lockkit.ErrClosed)
}

// Coalesce: a job waits as its key's follow-up, later jobs fold into it, and
// a job that began after a run started is not covered by that run.
func TestCoalescePolicy(t *testing.T) {
	l := lockkittest.New(t)
	ctx := context.Background()
	holder, _ := newGuard(t, l)
	release := holdKey(t, holder, "k")

	g, rec := newGuard(t, l, guard.WithPolicy(guard.Coalesce()))
	follow := make(chan guard.Outcome, 1)
	go func() {
		follow <- g.Run(ctx, guard.Job{Key: "k", ID: "t1"}, func(context.Context) error { return nil })
	}()
	require.Eventually(t, func() bool {
		info, err := l.Inspect(ctx, "k")
		require.NoError(t, err)
		return info.Waiters == 1
	}, 5*time.Second, time.Millisecond)

	out := g.Run(ctx, guard.Job{Key: "k", ID: "t2"}, func(context.Context) error { t.Error("t2 ran"); return nil })
	require.False(t, out.Ran)
	require.NotNil(t, out.Duplicate)
	require.Equal(t, guard.ReasonCovered, out.Duplicate.Reason)
	require.Equal(t, guard.ActionSkip, out.Duplicate.Action)
	require.ErrorIs(t, out.Err, lockcore.ErrCovered)
	require.ErrorIs(t, out.Err, guard.ErrDuplicate)
	ev, ok := rec.find(guard.EventDuplicate)
	require.True(t, ok)
	require.Equal(t, "t2", ev.Job.ID)

	release()
	require.True(t, (<-follow).Ran, "the follow-up runs")
	out = g.Run(ctx, guard.Job{Key: "k", ID: "t3"}, func(context.Context) error { return nil })
	require.True(t, out.Ran, "a job that began after the follow-up started is not covered by it")

	cctx, cancel := context.WithCancel(ctx)
	release = holdKey(t, holder, "k")
	go func() {
		require.Eventually(t, func() bool {
			info, err := l.Inspect(ctx, "k")
			require.NoError(t, err)
			return info.Waiters == 1
		}, 5*time.Second, time.Millisecond)
		cancel()
	}()
	out = g.Run(cctx, guard.Job{Key: "k", ID: "t4"}, func(context.Context) error { return nil })
	release()
	require.False(t, out.Ran)
	require.Nil(t, out.Duplicate, "a follow-up whose wait ended is an error, so the runtime retries it")
	require.ErrorIs(t, out.Err, context.Canceled)

	for _, opts := range [][]guard.Option{
		{guard.WithPolicy(guard.Wait(time.Second, guard.Coalesce()))},
		{guard.WithPolicy(guard.Coalesce()), guard.WithLimit(2)},
	} {
		_, err := guard.New(l, opts...)
		require.ErrorIs(t, err, guard.ErrInvalid)
		require.ErrorContains(t, err, "Coalesce")
	}
}

func TestPolicyString(t *testing.T) {
	for want, p := range map[string]guard.Policy{
		"Skip()":                  guard.Skip(),
		"Skip()\x00zero":          {},
		"Fail()":                  guard.Fail(),
		"Requeue(1s)":             guard.Requeue(time.Second),
		"Wait(10s, Fail())":       guard.Wait(10*time.Second, guard.Fail()),
		"WaitInOrder(5s, Skip())": guard.WaitInOrder(5*time.Second, guard.Skip()),
		"Coalesce()":              guard.Coalesce(),
		"KeepNewest()":            guard.KeepNewest(),
		"Preempt(2s)":             guard.Preempt(2 * time.Second),
	} {
		want, _, _ = strings.Cut(want, "\x00")
		require.Equal(t, want, p.String())
	}
}

// Preempt: the running job's ctx is cancelled with lockkit.ErrPreempted, the
// newer job runs after it returned, and the outcome of the preempted job
// says so.
func TestPreemptPolicy(t *testing.T) {
	l := lockkittest.New(t)
	var events recorder
	g, err := guard.New(l, guard.WithPolicy(guard.Preempt(0)), guard.WithObserver(events.observe))
	require.NoError(t, err)
	ctx := context.Background()
	started := make(chan struct{})
	var returned atomic.Bool
	old := make(chan guard.Outcome, 1)
	go func() {
		old <- g.Run(ctx, guard.Job{Key: "k", Name: "sync"}, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			returned.Store(true)
			return context.Cause(ctx)
		})
	}()
	<-started
	out := g.Run(ctx, guard.Job{Key: "k", Name: "sync"}, func(ctx context.Context) error {
		if !returned.Load() {
			t.Error("the newer job ran before the preempted one returned")
		}
		return nil
	})
	require.True(t, out.Ran)
	require.NoError(t, out.Err)
	prev := <-old
	require.True(t, prev.Ran)
	require.ErrorIs(t, prev.Err, lockcore.ErrPreempted)
	require.ErrorIs(t, prev.Err, lockkit.ErrLost)
	preempted, ok := events.find(guard.EventPreempted)
	require.True(t, ok, "a preemption is reported as such")
	require.ErrorIs(t, preempted.Err, lockcore.ErrPreempted)
	require.Equal(t, "preempted", preempted.Kind.String())
	_, ok = events.find(guard.EventLost)
	require.False(t, ok, "a preemption is not a lost lease")
}

// Job.Order: under KeepNewest and Preempt a job older than the key's
// follow-up or its latest run does not run, whatever order the jobs arrive
// in; a job without an order goes by arrival.
func TestOlderJobGivesWayToNewerOrder(t *testing.T) {
	for _, policy := range []guard.Policy{guard.KeepNewest(), guard.Preempt(0)} {
		t.Run(policy.String(), func(t *testing.T) {
			l := lockkittest.New(t)
			ctx := context.Background()
			g, err := guard.New(l, guard.WithPolicy(policy))
			require.NoError(t, err)
			var mu sync.Mutex
			var ran []string
			job := func(origin string, order int64) guard.Job {
				return guard.With(guard.Job{Key: "k", Name: "sync"}, guard.Work{Label: origin, Order: order})
			}
			work := func(name string, hold <-chan struct{}) func(context.Context) error {
				return func(context.Context) error {
					mu.Lock()
					ran = append(ran, name)
					mu.Unlock()
					if hold != nil {
						<-hold
					}
					return nil
				}
			}
			hold, holding := make(chan struct{}), make(chan struct{})
			go func() {
				_ = g.Run(ctx, job("a", 1), func(ctx context.Context) error {
					close(holding)
					return work("a", hold)(ctx)
				})
			}()
			<-holding
			newest := make(chan guard.Outcome, 1)
			go func() { newest <- g.Run(ctx, job("c", 3), work("c", nil)) }()
			require.Eventually(t, func() bool {
				info, err := l.Inspect(ctx, "k")
				require.NoError(t, err)
				return info.Waiters == 1
			}, 5*time.Second, time.Millisecond)
			out := g.Run(ctx, job("b", 2), work("b", nil)) // arrives after c
			require.False(t, out.Ran)
			require.NotNil(t, out.Duplicate)
			require.Equal(t, guard.ReasonSuperseded, out.Duplicate.Reason)
			close(hold)
			require.True(t, (<-newest).Ran)
			out = g.Run(ctx, job("b", 2), work("b", nil)) // b delivered again, after c ran
			require.False(t, out.Ran, "an older job does not run after a newer one")
			require.True(t, g.Run(ctx, job("c", 3), work("c", nil)).Ran, "a delivery of the newest runs")
			require.True(t, g.Run(ctx, job("d", 0), work("d", nil)).Ran, "without an order: arrival")
			require.Equal(t, []string{"a", "c", "c", "d"}, ran)
		})
	}
}

// WithAdmit: the runtime's check is made before the job takes its key. A
// *DuplicateError completes the job without running (EventDuplicate with its
// Action and Cause, the Duplicate naming the job); another error fails it
// (EventError); nil lets it run. WithShadow runs every job without asking.
func TestAdmit(t *testing.T) {
	l := lockkittest.New(t)
	ctx := context.Background()
	var verdict error
	var asked []string
	ev := &recorder{}
	admit := guard.WithAdmit(func(_ context.Context, job guard.Job) error {
		asked = append(asked, job.ID)
		return verdict
	})
	g, err := guard.New(l, admit, guard.WithObserver(ev.observe))
	require.NoError(t, err)
	run := func(g *guard.Guard, id string) guard.Outcome {
		return g.Run(ctx, guard.Job{Key: "k", Name: "sync", ID: id}, func(context.Context) error { return nil })
	}

	cause := errors.New(`a newer request of the key, "t2", is pending`)
	verdict = &guard.DuplicateError{Reason: guard.ReasonSuperseded, Action: guard.ActionSkip, Cause: cause}
	out := run(g, "t1")
	require.False(t, out.Ran)
	require.NotNil(t, out.Duplicate)
	require.Equal(t, guard.ReasonSuperseded, out.Duplicate.Reason)
	require.Equal(t, "t1", out.Duplicate.Job.ID, "Run names the job")
	require.ErrorIs(t, out.Err, guard.ErrDuplicate)
	require.ErrorIs(t, out.Err, cause)
	dup, ok := ev.find(guard.EventDuplicate)
	require.True(t, ok)
	require.Equal(t, guard.ActionSkip, dup.Action)
	require.ErrorIs(t, dup.Err, cause)

	verdict = errors.New("asynq unreachable")
	out = run(g, "t2")
	require.False(t, out.Ran)
	require.Nil(t, out.Duplicate)
	require.ErrorIs(t, out.Err, verdict)
	require.ErrorContains(t, out.Err, "middleware: sync: asynq unreachable")
	_, ok = ev.find(guard.EventError)
	require.True(t, ok)

	verdict = nil
	require.True(t, run(g, "t3").Ran)
	require.Equal(t, []string{"t1", "t2", "t3"}, asked)

	verdict = errors.New("not asked")
	shadow, err := guard.New(l, admit, guard.WithShadow())
	require.NoError(t, err)
	require.True(t, run(shadow, "t4").Ran)
	require.Equal(t, []string{"t1", "t2", "t3"}, asked, "not asked under WithShadow")
}

// WithDone: a job that waited for an earlier run of the same work (its
// Origin) reads the runtime's record when it has the key: true completes it
// without running (ReasonCompleted, the engine's ErrCompleted) and frees
// the key; false runs it. A job that did not wait is not asked.
func TestDoneIsReadAfterWaitingForTheOwnRun(t *testing.T) {
	l := lockkittest.New(t)
	ctx := context.Background()
	var done atomic.Bool
	var asked atomic.Int32
	g, _ := newGuard(t, l, guard.WithDone(func(_ context.Context, job guard.Job) (bool, error) {
		asked.Add(1)
		return done.Load(), nil
	}))
	job := guard.With(guard.Job{Key: "k", Name: "sync", ID: "t1"}, guard.Work{Label: "t1"})
	for _, d := range []bool{true, false} {
		done.Store(d)
		started, release := make(chan struct{}), make(chan struct{})
		first := make(chan guard.Outcome, 1)
		go func() {
			first <- g.Run(ctx, job, func(context.Context) error { close(started); <-release; return nil })
		}()
		<-started
		second := make(chan guard.Outcome, 1)
		ran := false
		go func() {
			second <- g.Run(ctx, job, func(context.Context) error { ran = true; return nil })
		}()
		require.Eventually(t, func() bool {
			info, err := l.Inspect(ctx, "k")
			return err == nil && info.Waiters == 1
		}, 5*time.Second, time.Millisecond, "the second delivery waits for its own run")
		close(release)
		require.True(t, (<-first).Ran)
		out := <-second
		require.Equal(t, !d, out.Ran)
		require.Equal(t, !d, ran)
		if d {
			require.NotNil(t, out.Duplicate)
			require.Equal(t, guard.ReasonCompleted, out.Duplicate.Reason)
			require.ErrorIs(t, out.Err, lockcore.ErrCompleted)
		}
		info, err := l.Inspect(ctx, "k")
		require.NoError(t, err)
		require.Empty(t, info.Holders, "the key is free")
	}
	require.EqualValues(t, 2, asked.Load())
	require.True(t, g.Run(ctx, job, func(context.Context) error { return nil }).Ran, "a job that did not wait runs")
	require.EqualValues(t, 2, asked.Load(), "and is not asked")
}

// A job that took its key after waiting for its own earlier run, whose
// runtime's record (WithDone) cannot be read (a Redis error), fails
// without running: it frees the key and returns the record's error with an
// EventError, for the runtime to deliver it again. Running it would make a
// second run of work its own run most often did.
func TestDoneThatCannotBeReadFailsTheJobWithoutRunning(t *testing.T) {
	l := lockkittest.New(t)
	ctx := context.Background()
	unread := errors.New("CLUSTERDOWN The cluster is down")
	g, rec := newGuard(t, l, guard.WithDone(func(context.Context, guard.Job) (bool, error) { return false, unread }))
	job := guard.With(guard.Job{Key: "k", Name: "sync", ID: "t1"}, guard.Work{Label: "t1"})
	release, first := runHeld(ctx, g, job)
	second := make(chan guard.Outcome, 1)
	var ran atomic.Bool
	go func() {
		second <- g.Run(ctx, job, func(context.Context) error { ran.Store(true); return nil })
	}()
	require.Eventually(t, func() bool {
		info, err := l.Inspect(ctx, "k")
		return err == nil && info.Waiters == 1
	}, 5*time.Second, time.Millisecond, "the second delivery waits for its own run")
	release()
	require.True(t, (<-first).Ran)
	out := <-second
	require.False(t, ran.Load(), "the job does not run on a record it could not read")
	require.False(t, out.Ran)
	require.Nil(t, out.Duplicate)
	require.ErrorIs(t, out.Err, unread)
	require.NotErrorIs(t, out.Err, lockcore.ErrCompleted)
	ev, found := rec.find(guard.EventError)
	require.True(t, found, "an EventError reports it")
	require.ErrorIs(t, ev.Err, unread)
	info, err := l.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "the key is free")
}

// A job whose wait for its own earlier run fails (here its ctx ends; a
// Redis error does the same) reads the runtime's record too: when it says
// the work is done, the job completes without running, so that its next
// delivery, which may find the key free, does not run it again; otherwise
// the wait's error is returned.
func TestDoneIsReadWhenTheWaitForTheOwnRunFails(t *testing.T) {
	l := lockkittest.New(t)
	ctx := context.Background()
	var done atomic.Bool
	g, _ := newGuard(t, l, guard.WithDone(func(dctx context.Context, job guard.Job) (bool, error) {
		return dctx.Err() == nil && done.Load(), nil
	}))
	job := guard.With(guard.Job{Key: "k", Name: "sync", ID: "t1"}, guard.Work{Label: "t1"})
	release, first := runHeld(ctx, g, job)
	for _, d := range []bool{true, false} {
		done.Store(d)
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		ran := false
		out := g.Run(wctx, job, func(context.Context) error { ran = true; return nil })
		cancel()
		require.False(t, ran)
		require.False(t, out.Ran)
		if d {
			require.NotNil(t, out.Duplicate, "%v", out.Err)
			require.Equal(t, guard.ReasonCompleted, out.Duplicate.Reason)
			require.ErrorIs(t, out.Err, lockcore.ErrCompleted)
		} else {
			require.Nil(t, out.Duplicate)
			require.ErrorIs(t, out.Err, context.DeadlineExceeded)
		}
	}
	release()
	require.True(t, (<-first).Ran)
}

// runHeld starts job on g with work that holds its key until release is
// called, and returns once the work runs, with the Run's outcome to come.
func runHeld(ctx context.Context, g *guard.Guard, job guard.Job) (release func(), out <-chan guard.Outcome) {
	started, stop := make(chan struct{}), make(chan struct{})
	first := make(chan guard.Outcome, 1)
	go func() {
		first <- g.Run(ctx, job, func(context.Context) error { close(started); <-stop; return nil })
	}()
	<-started
	return func() { close(stop) }, first
}

// A Requeue duplicate of a job's own earlier run, parked behind it
// (WithParking), whose wait for that run fails while the runtime's record
// says the run did the work, completes without running and gives up its
// place in the key's parked queue: no entry stays, and the run's end
// reserves the key for nobody.
func TestDoneAfterAFailedWaitGivesUpTheParkedPlace(t *testing.T) {
	for name, locker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			l := locker(t)
			ctx := context.Background()
			parking := guard.Parking{
				ID:     func(_ context.Context, job guard.Job) string { return "id-" + guard.WorkOf(job).Label },
				Resume: func(string, string) {},
			}
			g, _ := newGuard(t, l, guard.WithPolicy(guard.Requeue(time.Minute)), guard.WithParking(parking),
				guard.WithDone(func(dctx context.Context, job guard.Job) (bool, error) { return dctx.Err() == nil, nil }))
			job := guard.With(guard.Job{Key: "k", Name: "sync", ID: "t1"}, guard.Work{Label: "t1"})
			release, first := runHeld(ctx, g, job)

			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			ran := false
			out := g.Run(wctx, job, func(context.Context) error { ran = true; return nil })
			cancel()
			require.False(t, ran)
			require.NotNil(t, out.Duplicate, "%v", out.Err)
			require.Equal(t, guard.ReasonCompleted, out.Duplicate.Reason)
			parked, err := coretest.Of(t, l).Inspect(ctx, "k")
			require.NoError(t, err)
			require.Zero(t, parked.Parked, "the done job's place in the parked queue is given up")

			release()
			require.True(t, (<-first).Ran)
			info, err := l.Inspect(ctx, "k")
			require.NoError(t, err)
			require.Empty(t, info.Holders, "the run's end reserved the key for nobody")
		})
	}
}

// Under WithParking a requeued duplicate is parked: the run that frees its
// key reserves the key for it and resumes it, and its next run adopts the
// reservation while other jobs stay out.
func TestParkingResumesTheOldestDuplicate(t *testing.T) {
	l, parking, resumed := parkingLocker(t)
	g, rec := newGuard(t, l, guard.WithPolicy(guard.Requeue(time.Minute)), guard.WithParking(parking))
	ctx := context.Background()
	holding := make(chan struct{})
	done := make(chan struct{})
	go func() {
		_ = runErr(g, ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "a"}), func(context.Context) error {
			close(holding)
			<-done
			return nil
		})
	}()
	<-holding
	for _, origin := range []string{"b", "c"} {
		out := g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: origin}), func(context.Context) error { return nil })
		require.False(t, out.Ran)
		require.NotNil(t, out.Duplicate)
		require.Equal(t, guard.ActionRequeue, out.Duplicate.Action)
		require.True(t, out.Duplicate.Parked)
	}
	close(done)
	require.Equal(t, "k id-b", <-resumed, "the oldest parked job")
	out := g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "d"}), func(context.Context) error { return nil })
	require.True(t, out.Duplicate.Parked, "the key is reserved for b")
	out = g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "b"}), func(context.Context) error { return nil })
	require.True(t, out.Ran, "b adopts its reservation")
	require.Equal(t, "k id-c", <-resumed)

	// A parked job that cannot be started passes the key on to the next.
	out = g.Run(ctx, guard.With(guard.Job{Key: "k2"}, guard.Work{Label: "x"}), func(ctx context.Context) error {
		for _, origin := range []string{"y", "z"} {
			dup := g.Run(ctx, guard.With(guard.Job{Key: "k2"}, guard.Work{Label: origin}), func(context.Context) error { return nil })
			require.True(t, dup.Duplicate.Parked)
		}
		return nil
	})
	require.True(t, out.Ran)
	require.Equal(t, "k2 id-y", <-resumed)
	guard.PassOn(g, ctx, "k2", "y")
	require.Equal(t, "k2 id-z", <-resumed)
	guard.PassOn(g, ctx, "k2", "y") // nothing reserved for y any more: no-op
	require.Empty(t, resumed)

	// Once the Locker is closed there is nothing to pass on: z's
	// reservation ends with its hold. No error is reported.
	require.NoError(t, l.Close(ctx))
	guard.PassOn(g, ctx, "k2", "z")
	_, failed := rec.find(guard.EventError)
	require.False(t, failed, "a closed Locker is no error")

	_, err := guard.New(l, guard.WithParking(guard.Parking{}))
	require.ErrorIs(t, err, guard.ErrInvalid)
}

// Under WithParking a KeepNewest follow-up parks instead of waiting: a newer
// one takes its place and names it for the adapter to start (the guard does
// not call the adapter), so that it completes without running, and the run
// that frees the key resumes the newest.
func TestParkingKeepsTheNewestFollowUp(t *testing.T) {
	l, parking, resumed := parkingLocker(t)
	g, _ := newGuard(t, l, guard.WithPolicy(guard.KeepNewest()), guard.WithParking(parking))
	ctx := context.Background()
	nop := func(context.Context) error { return nil }
	out := g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "a"}), func(ctx context.Context) error {
		for _, origin := range []string{"b", "c"} {
			dup := g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: origin}), nop)
			require.False(t, dup.Ran)
			require.Equal(t, guard.ActionRequeue, dup.Duplicate.Action, origin)
			require.True(t, dup.Duplicate.Parked, origin)
			var ce *lockcore.ConflictError
			require.ErrorAs(t, dup.Duplicate.Cause, &ce)
			if origin == "c" {
				require.Equal(t, "id-b", ce.Superseded, "c took b's place and names it")
			} else {
				require.Empty(t, ce.Superseded)
			}
		}
		require.Empty(t, resumed, "the guard calls no adapter: the one whose job c is starts b")
		dup := g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "b"}), nop)
		require.Equal(t, guard.ReasonSuperseded, dup.Duplicate.Reason, "b completes without running")
		require.Equal(t, guard.ActionSkip, dup.Duplicate.Action)
		return nil
	})
	require.True(t, out.Ran)
	require.Equal(t, "k id-c", <-resumed, "a's end starts the newest")
	out = g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "c"}), nop)
	require.True(t, out.Ran)
	require.Empty(t, resumed)
}

// Under WithParking a Coalesce follow-up parks, and the key reserved for it
// stands for it: a job delivered before it starts folds into it. A job that
// asks after its run began parks behind it and runs.
func TestParkingCoalesceReservedFollowUpCovers(t *testing.T) {
	l, parking, resumed := parkingLocker(t)
	g, _ := newGuard(t, l, guard.WithPolicy(guard.Coalesce()), guard.WithParking(parking))
	ctx := context.Background()
	var ran []string
	asked := map[string]time.Time{}
	job := func(origin string) guard.Job {
		if _, ok := asked[origin]; !ok {
			asked[origin] = time.Now() // its enqueue
		}
		return guard.With(guard.Job{Key: "k"}, guard.Work{Label: origin, EnqueuedAt: asked[origin]})
	}
	work := func(origin string) func(context.Context) error {
		return func(context.Context) error { ran = append(ran, origin); return nil }
	}
	out := g.Run(ctx, job("h"), func(ctx context.Context) error {
		dup := g.Run(ctx, job("p"), work("p"))
		require.True(t, dup.Duplicate.Parked, "p parks as the follow-up")
		return nil
	})
	require.True(t, out.Ran)
	require.Equal(t, "k id-p", <-resumed)
	// Delivered before p's worker takes the key: p will begin later.
	out = g.Run(ctx, job("t4"), work("t4"))
	require.False(t, out.Ran)
	require.NotNil(t, out.Duplicate)
	require.Equal(t, guard.ReasonCovered, out.Duplicate.Reason, "t4 folds into p, for which the key is reserved")
	out = g.Run(ctx, job("p"), func(ctx context.Context) error {
		dup := g.Run(ctx, job("t5"), work("t5"))
		require.True(t, dup.Duplicate.Parked, "t5 asked after p began: it parks as the next follow-up")
		ran = append(ran, "p")
		return nil
	})
	require.True(t, out.Ran)
	require.Equal(t, "k id-t5", <-resumed)
	out = g.Run(ctx, job("t5"), work("t5"))
	require.True(t, out.Ran, "p began before t5 asked: it does not cover t5")
	require.Equal(t, []string{"p", "t5"}, ran)
}

// parkingLocker returns a Locker, closed when the test ends, and a Parking
// whose Resume sends "<key> <id>" to resumed.
func parkingLocker(t *testing.T) (*lockkit.Locker, guard.Parking, chan string) {
	l := lockkittest.New(t)
	resumed := make(chan string, 4)
	return l, guard.Parking{
		ID:     func(_ context.Context, job guard.Job) string { return "id-" + guard.WorkOf(job).Label },
		Resume: func(key, id string) { resumed <- key + " " + id },
	}, resumed
}

// A Reserved job takes over a reservation carrying its Origin whatever the
// policy; a job that is not Reserved finds the key held by it.
func TestReservedJobAdoptsItsReservation(t *testing.T) {
	l := lockkittest.New(t)
	ctx := context.Background()
	g, _ := newGuard(t, l, guard.WithPolicy(guard.Skip()))
	_, err := coretest.Of(t, l).TryAcquire(ctx, "k", &lockcore.AcquireOptions{Label: "a", Reserve: true, TTL: time.Minute})
	require.NoError(t, err)

	out := g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "b"}), func(context.Context) error { return nil })
	require.NotNil(t, out.Duplicate, "another job finds the key reserved")
	require.Equal(t, guard.ActionSkip, out.Duplicate.Action)

	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	out = g.Run(cctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "a"}), func(context.Context) error { return nil })
	require.False(t, out.Ran, "without Reserved, the job waits for what it takes for its own run")

	out = g.Run(ctx, guard.With(guard.Job{Key: "k"}, guard.Work{Label: "a", Reserved: true}), func(context.Context) error { return nil })
	require.True(t, out.Ran, "a Reserved job adopts the reservation")
	info, err := l.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "and its release ends it")
}

// Only a run spends a throttle start: a duplicate that found the key held
// spends none, nor does a delivery that waited for its own earlier run (that
// run's retry); runs past the budget are still refused.
func TestThrottleCountsOnlyRuns(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			ctx := context.Background()
			ran := func(context.Context) error { return nil }
			throttled := []guard.Option{guard.WithThrottle(2, time.Minute, guard.ActionSkip)}
			a, _ := newGuard(t, newLocker(t), throttled...)
			release := holdKey(t, a, "k") // start 1 of 2
			b, _ := newGuard(t, newLocker(t), throttled...)
			out := b.Run(ctx, guard.Job{Key: "k", Name: "b"}, ran)
			require.NotNil(t, out.Duplicate)
			require.Equal(t, guard.ReasonHeld, out.Duplicate.Reason)
			release()
			out = b.Run(ctx, guard.Job{Key: "k", Name: "c"}, ran)
			require.True(t, out.Ran, "start 2 of 2: the duplicate spent none (%v)", out.Err)
			out = b.Run(ctx, guard.Job{Key: "k", Name: "d"}, ran)
			require.NotNil(t, out.Duplicate, "start 3 of 2")
			require.Equal(t, guard.ReasonThrottled, out.Duplicate.Reason)

			// A redelivery waits for its own earlier run, which fails, and
			// runs: it is that run's retry, and spends no start of its own.
			again := redeliveryRunsAfterItsOwnRunFails(t, newLocker, guard.With(guard.Job{Key: "own", Name: "t1"}, guard.Work{Label: "t1"}), throttled)
			out = again.Run(ctx, guard.Job{Key: "own", Name: "t2"}, ran)
			require.True(t, out.Ran, "start 2 of 2: the redelivery spent none (%v)", out.Err)
		})
	}
}

// With a budget of one start, the one its own earlier run spent does not
// throttle a redelivery of that work: it waits for the run and, the run
// failed, runs (it was skipped as throttled, and the work was lost); also a
// job that holds a reservation of its own (Reserved, as a task parked at
// enqueue), whose run then holds the key.
func TestThrottleOfOneLetsARedeliveryWaitForItsOwnRun(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			for i, c := range []struct {
				policy   guard.Policy
				reserved bool
			}{{guard.Skip(), false}, {guard.Wait(time.Minute, guard.Skip()), false}, {guard.Skip(), true}} {
				throttled := []guard.Option{guard.WithThrottle(1, time.Minute, guard.ActionSkip), guard.WithPolicy(c.policy)}
				key := fmt.Sprint("own-", i)
				again := redeliveryRunsAfterItsOwnRunFails(t, newLocker, guard.With(guard.Job{Key: key, Name: "t1"}, guard.Work{Label: "t1", Reserved: c.reserved}), throttled)
				out := again.Run(context.Background(), guard.Job{Key: key, Name: "t2"}, func(context.Context) error { return nil })
				require.NotNil(t, out.Duplicate, "start 2 of 1")
				require.Equal(t, guard.ReasonThrottled, out.Duplicate.Reason)
			}
		})
	}
}

// redeliveryRunsAfterItsOwnRunFails runs job with opts and, while it runs,
// a redelivery of it on a second guard; it checks that the redelivery waits
// for the run, which then fails, and runs. It returns the second guard.
func redeliveryRunsAfterItsOwnRunFails(t *testing.T, newLocker func(*testing.T, ...redis.Hook) *lockkit.Locker, job guard.Job, opts []guard.Option) *guard.Guard {
	t.Helper()
	ctx := context.Background()
	first, _ := newGuard(t, newLocker(t), opts...)
	again, _ := newGuard(t, newLocker(t), opts...)
	fail := make(chan struct{})
	firstDone := make(chan guard.Outcome, 1)
	started := make(chan struct{})
	go func() {
		firstDone <- first.Run(ctx, job, func(context.Context) error {
			close(started)
			<-fail
			return errors.New("interrupted")
		})
	}()
	select {
	case <-started:
	case out := <-firstDone:
		t.Fatalf("the first run did not start: %v", out.Err)
	}
	redelivered := make(chan guard.Outcome, 1)
	go func() { redelivered <- again.Run(ctx, job, func(context.Context) error { return nil }) }()
	l := newLocker(t)
	waiting := func() bool {
		info, err := l.Inspect(ctx, job.Key)
		return err == nil && info.Waiters == 1
	}
	for !waiting() {
		select {
		case out := <-redelivered:
			close(fail)
			<-firstDone
			t.Fatalf("the redelivery returned while its own run ran: ran %v, %v", out.Ran, out.Err)
		case <-time.After(time.Millisecond):
		}
	}
	close(fail)
	require.True(t, (<-firstDone).Ran)
	out := <-redelivered
	require.True(t, out.Ran, "the redelivery runs after its own run failed (%v)", out.Err)
	return again
}

// WithHoldAtLeast spaces out runs that did their work: a run that failed
// holds nothing back, and its retry (the same Origin) runs at once instead of
// waiting out the hold as if its earlier delivery still ran.
func TestHoldAtLeastLetsTheRetryOfAFailedRunRun(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			opts := []guard.Option{guard.WithHoldAtLeast(time.Minute)}
			job := guard.With(guard.Job{Key: "k", ID: "t1"}, guard.Work{Label: "t1"})
			a, _ := newGuard(t, newLocker(t), opts...)
			out := a.Run(context.Background(), job, func(context.Context) error { return errors.New("failed") })
			require.True(t, out.Ran)
			b, _ := newGuard(t, newLocker(t), opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			out = b.Run(ctx, job, func(context.Context) error { return nil })
			require.True(t, out.Ran, "the retry runs (%v)", out.Err)
			out = b.Run(ctx, guard.Job{Key: "k", Name: "other"}, func(context.Context) error { return nil })
			require.NotNil(t, out.Duplicate, "the successful retry holds the key")
		})
	}
}

// A job that waits for its key holds no throttle start meanwhile: another
// job meets its policy, not the throttle, while fewer than n runs began, and
// runs once the key is free; the waiting job that gave up spent nothing.
func TestThrottleWaitingJobHoldsNoStart(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			ctx := context.Background()
			opts := []guard.Option{guard.WithThrottle(2, time.Minute, guard.ActionSkip),
				guard.WithPolicy(guard.Wait(time.Minute, guard.Skip()))}
			a, _ := newGuard(t, newLocker(t), opts...)
			release := sync.OnceFunc(holdKey(t, a, "k")) // start 1 of 2
			defer release()
			w, _ := newGuard(t, newLocker(t), opts...)
			wctx, giveUp := context.WithCancel(ctx)
			defer giveUp()
			waited := make(chan guard.Outcome, 1)
			go func() {
				waited <- w.Run(wctx, guard.Job{Key: "k", Name: "w"}, func(context.Context) error { return nil })
			}()
			l := newLocker(t)
			waiters := func(n int) func() bool {
				return func() bool {
					info, err := l.Inspect(ctx, "k")
					return err == nil && info.Waiters == n
				}
			}
			require.Eventually(t, waiters(1), 10*time.Second, time.Millisecond, "w waits for the key")

			c, _ := newGuard(t, newLocker(t), opts...)
			ran := make(chan guard.Outcome, 1)
			go func() {
				ran <- c.Run(ctx, guard.Job{Key: "k", Name: "c"}, func(context.Context) error { return nil })
			}()
			require.Eventually(t, func() bool { return len(ran) == 1 || waiters(2)() }, 10*time.Second, time.Millisecond)
			giveUp()
			out := <-waited
			require.False(t, out.Ran)
			release()
			out = <-ran
			require.True(t, out.Ran, "start 2 of 2: only one run had begun (%v)", out.Err)

			// Nor does a KeepNewest follow-up: a newer job takes its place.
			opts = []guard.Option{guard.WithThrottle(2, time.Minute, guard.ActionSkip),
				guard.WithPolicy(guard.KeepNewest())}
			a, _ = newGuard(t, newLocker(t), opts...)
			release = sync.OnceFunc(holdKey(t, a, "f")) // start 1 of 2
			defer release()
			w, _ = newGuard(t, newLocker(t), opts...)
			go func() {
				waited <- w.Run(ctx, guard.Job{Key: "f", Name: "w"}, func(context.Context) error { return nil })
			}()
			require.Eventually(t, func() bool {
				info, err := l.Inspect(ctx, "f")
				return err == nil && info.Waiters == 1
			}, 10*time.Second, time.Millisecond, "w waits as the key's follow-up")
			c, _ = newGuard(t, newLocker(t), opts...)
			go func() {
				ran <- c.Run(ctx, guard.Job{Key: "f", Name: "c"}, func(context.Context) error { return nil })
			}()
			select {
			case out = <-waited:
			case out = <-ran:
				require.True(t, out.Ran, "c, the newest follow-up, ran (%v)", out.Err)
			}
			require.NotNil(t, out.Duplicate, "w gives way to c")
			require.Equal(t, guard.ReasonSuperseded, out.Duplicate.Reason)
			release()
			out = <-ran
			require.True(t, out.Ran, "c, the newest follow-up, runs: start 2 of 2 (%v)", out.Err)
		})
	}
}

// A run's throttle start is dated when the run begins, not when its job
// asked for the key: after a job that waited, the next start opens one
// period after that run began.
func TestThrottleDatesTheStartWhenTheRunBegins(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			ctx := context.Background()
			const period = time.Second
			opts := []guard.Option{guard.WithThrottle(1, period, guard.ActionSkip),
				guard.WithPolicy(guard.Wait(time.Minute, guard.Skip()))}
			l := newLocker(t)
			held, err := l.TryAcquire(ctx, "k", nil) // not a throttled run
			require.NoError(t, err)
			a, _ := newGuard(t, newLocker(t), opts...)
			began := make(chan time.Time, 1)
			done := make(chan guard.Outcome, 1)
			go func() {
				done <- a.Run(ctx, guard.Job{Key: "k", Name: "a"}, func(context.Context) error {
					began <- time.Now()
					return nil
				})
			}()
			require.Eventually(t, func() bool {
				info, err := l.Inspect(ctx, "k")
				return err == nil && info.Waiters == 1
			}, 10*time.Second, time.Millisecond, "a waits for the key")
			asked := time.Now() // a asked for its start before this
			time.Sleep(period * 4 / 5)
			require.NoError(t, held.Release(ctx))
			aBegan := <-began
			require.True(t, (<-done).Ran)
			time.Sleep(time.Until(asked.Add(period + 50*time.Millisecond)))

			b, _ := newGuard(t, newLocker(t), opts...)
			var bBegan time.Time
			out := b.Run(ctx, guard.Job{Key: "k", Name: "b"}, func(context.Context) error {
				bBegan = time.Now()
				return nil
			})
			require.False(t, out.Ran, "b would begin %s after a began", bBegan.Sub(aBegan))
			require.NotNil(t, out.Duplicate)
			require.Equal(t, guard.ReasonThrottled, out.Duplicate.Reason)
			require.LessOrEqual(t, out.Duplicate.RetryAfter, time.Until(aBegan.Add(period))+50*time.Millisecond,
				"the next start opens one period after a began")
		})
	}
}

// Jobs put back when throttled (ActionRequeue) are told to come back in
// turns of their Origin: each when a start opens for it, one period after
// the one before; a job back in its turn runs before a newcomer.
func TestThrottleRequeueTellsTurns(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			ctx := context.Background()
			const period = 300 * time.Millisecond
			g, _ := newGuard(t, newLocker(t), guard.WithThrottle(1, period, guard.ActionRequeue), guard.WithLimit(10))
			work := func(context.Context) error { return nil }
			require.True(t, g.Run(ctx, guard.With(guard.Job{Key: "k", Name: "a"}, guard.Work{Label: "a"}), work).Ran)
			var waits []time.Duration
			for _, origin := range []string{"b", "c", "d"} {
				out := g.Run(ctx, guard.With(guard.Job{Key: "k", Name: origin}, guard.Work{Label: origin}), work)
				require.False(t, out.Ran)
				require.Equal(t, guard.ReasonThrottled, out.Duplicate.Reason)
				require.Equal(t, guard.ActionRequeue, out.Duplicate.Action)
				waits = append(waits, out.Duplicate.RetryAfter)
			}
			require.InDelta(t, period, waits[0], float64(50*time.Millisecond))
			require.InDelta(t, waits[0]+period, waits[1], float64(50*time.Millisecond), "c's turn is after b's")
			require.InDelta(t, waits[1]+period, waits[2], float64(50*time.Millisecond), "d's turn is after c's")
			time.Sleep(waits[0])
			out := g.Run(ctx, guard.Job{Key: "k", Name: "e"}, work)
			require.False(t, out.Ran, "a newcomer without an Origin is behind the turns")
			require.True(t, g.Run(ctx, guard.With(guard.Job{Key: "k", Name: "b"}, guard.Work{Label: "b"}), work).Ran, "b back in its turn runs")
		})
	}
}

// A job that would wait for its key is throttled at once only if n runs
// began: a start reserved by a job that may not run does not drop it. It
// waits, and runs if that job did not.
func TestThrottleReservedStartDoesNotDropAWaitingJob(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			ctx := context.Background()
			l := newLocker(t)
			held, err := l.TryAcquire(ctx, "k", nil) // not a throttled run
			require.NoError(t, err)
			client, prefix := coretest.Of(t, l).Redis()
			starts, err := throttle.New(client, 1, time.Minute, throttle.WithPrefix(prefix))
			require.NoError(t, err)
			wait, err := starts.Reserve(ctx, "k", "x") // a job about to take the key
			require.NoError(t, err)
			require.Zero(t, wait)

			c, _ := newGuard(t, newLocker(t), guard.WithThrottle(1, time.Minute, guard.ActionSkip),
				guard.WithPolicy(guard.Wait(time.Minute, guard.Skip())))
			ran := make(chan guard.Outcome, 1)
			go func() {
				ran <- c.Run(ctx, guard.Job{Key: "k", Name: "c"}, func(context.Context) error { return nil })
			}()
			require.Eventually(t, func() bool {
				if len(ran) == 1 {
					return true
				}
				info, err := l.Inspect(ctx, "k")
				return err == nil && info.Waiters == 1
			}, 10*time.Second, time.Millisecond)
			require.NoError(t, starts.Return(ctx, "k", "x"), "x found the key held and did not run")
			require.NoError(t, held.Release(ctx))
			out := <-ran
			require.True(t, out.Ran, "no run had begun (%v)", out.Err)
		})
	}
}

// gatedStart holds a throttle start taken (not reserved, not only looked
// at: throttle.lua with an id and "0") until gate closes: the run that took
// the key dates its start a moment after its acquire.
type gatedStart struct{ gate chan struct{} }

func (gatedStart) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s gatedStart) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && len(a) == 12 &&
			strings.HasSuffix(fmt.Sprint(a[3]), "}:t") && fmt.Sprint(a[8]) != "" && fmt.Sprint(a[9]) == "0" {
			<-s.gate
		}
		return next(ctx, cmd)
	}
}

func (gatedStart) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A Coalesce follow-up that others folded into is never dropped by the
// throttle: R holds the key but has not dated its start yet, F waits as the
// follow-up, X folds into F; R's start spends the budget, so F, given the
// key, is throttled: it is put back to run later (ActionRequeue, whatever
// WithThrottle's action), since X's work rests on it.
func TestThrottledFollowUpIsPutBackNotSkipped(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			opts := []guard.Option{guard.WithThrottle(1, time.Minute, guard.ActionSkip),
				guard.WithPolicy(guard.Coalesce())}
			gate := make(chan struct{})
			r, _ := newGuard(t, newLocker(t, gatedStart{gate}), opts...)
			f, _ := newGuard(t, newLocker(t), opts...)
			x, _ := newGuard(t, newLocker(t), opts...)
			l := newLocker(t)
			work := func(context.Context) error { return nil }
			rOut := make(chan guard.Outcome, 1)
			go func() {
				rOut <- r.Run(ctx, guard.With(guard.Job{Key: "k", Name: "R"}, guard.Work{EnqueuedAt: time.Now()}), work)
			}()
			require.Eventually(t, func() bool { i, err := l.Inspect(ctx, "k"); return err == nil && len(i.Holders) == 1 }, 5*time.Second, time.Millisecond)
			fOut := make(chan guard.Outcome, 1)
			// Enqueued after R began: R does not cover F.
			go func() {
				fOut <- f.Run(ctx, guard.With(guard.Job{Key: "k", Name: "F"}, guard.Work{EnqueuedAt: time.Now().Add(time.Hour)}), work)
			}()
			require.Eventually(t, func() bool { i, err := l.Inspect(ctx, "k"); return err == nil && i.Waiters == 1 }, 5*time.Second, time.Millisecond,
				"F waits as the key's follow-up")
			xo := x.Run(ctx, guard.With(guard.Job{Key: "k", Name: "X"}, guard.Work{EnqueuedAt: time.Now()}), work)
			require.False(t, xo.Ran)
			require.NotNil(t, xo.Duplicate)
			require.Equal(t, guard.ReasonCovered, xo.Duplicate.Reason, "X folds into F")
			close(gate)
			require.True(t, (<-rOut).Ran)
			fo := <-fOut
			require.False(t, fo.Ran, "R's start spent the budget")
			require.NotNil(t, fo.Duplicate)
			require.Equal(t, guard.ReasonThrottled, fo.Duplicate.Reason)
			require.Equal(t, guard.ActionRequeue, fo.Duplicate.Action, "F, which X folded into, is put back, not skipped")
		})
	}
}

// pauseAfterAcquire holds the reply of the first script call (the acquire)
// for d, as a process paused between sending the acquire and reading its
// reply: the lease's validity, counted from the send, runs out meanwhile.
type pauseAfterAcquire struct {
	d    time.Duration
	once *sync.Once
}

func (h pauseAfterAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h pauseAfterAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.once.Do(func() { time.Sleep(h.d) })
		}
		return err
	}
}

func (h pauseAfterAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A job whose lease ran out before it could start (its process paused
// between the acquire and the run) does not run, and fails, so that the
// runtime runs it again: it is not completed unrun.
func TestJobWhoseLeaseRanOutBeforeItsStartFails(t *testing.T) {
	for name, locker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			l := locker(t, pauseAfterAcquire{d: 500 * time.Millisecond, once: &sync.Once{}})
			g, _ := newGuard(t, l, guard.WithTTL(300*time.Millisecond))
			ran := false
			err := runErr(g, context.Background(), guard.Job{Key: "k"}, func(context.Context) error { ran = true; return nil })
			require.False(t, ran, "the job did not start")
			require.ErrorIs(t, err, lockkit.ErrLost)
		})
	}
}
