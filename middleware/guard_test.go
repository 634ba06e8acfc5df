package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backends returns, per implementation, a function making Lockers that share
// state like processes sharing one Redis.
func backends(t *testing.T) map[string]func(t *testing.T) lockkit.Locker {
	return map[string]func(*testing.T) lockkit.Locker{
		"memory": func() func(*testing.T) lockkit.Locker {
			var base *lockkit.MemoryLocker
			return func(t *testing.T) lockkit.Locker {
				var l *lockkit.MemoryLocker
				var err error
				if base == nil {
					base, err = lockkit.NewMemory()
					l = base
				} else {
					l, err = base.NewPeer()
				}
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				return l
			}
		}(),
		"redis": func() func(*testing.T) lockkit.Locker {
			var prefix string
			return func(t *testing.T) lockkit.Locker {
				c := testredis.Client(t)
				if prefix == "" {
					prefix = testredis.Prefix(t, c)
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
	events []middleware.Event
}

func (r *recorder) observe(_ context.Context, e middleware.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) kinds() []middleware.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []middleware.EventKind
	for _, e := range r.events {
		out = append(out, e.Kind)
	}
	return out
}

func (r *recorder) find(k middleware.EventKind) (middleware.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Kind == k {
			return e, true
		}
	}
	return middleware.Event{}, false
}

func newGuard(t *testing.T, l lockkit.Locker, opts ...middleware.Option) (*middleware.Guard, *recorder) {
	rec := &recorder{}
	g, err := middleware.New(l, append(opts, middleware.WithObserver(rec.observe))...)
	require.NoError(t, err)
	return g, rec
}

// holdKey runs a job on g that holds key until release is closed.
func holdKey(t *testing.T, g *middleware.Guard, key string) (release func()) {
	started := make(chan struct{})
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		err := g.Run(context.Background(), middleware.Job{Key: key, Name: "holder"}, func(context.Context) error {
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
				err := g.Run(ctx, middleware.Job{Key: "k", Name: "report"}, func(context.Context) error { ran = true; return nil })
				require.False(t, ran)
				require.ErrorIs(t, err, middleware.ErrDuplicate)
				require.ErrorIs(t, err, lockkit.ErrNotAcquired)
				var dup *middleware.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, middleware.ActionSkip, dup.Action)
				require.Equal(t, middleware.ReasonHeld, dup.Reason)
				ev, ok := rec.find(middleware.EventDuplicate)
				require.True(t, ok)
				require.Equal(t, middleware.ActionSkip, ev.Action)
				require.NotEmpty(t, ev.Holder)
			})
			t.Run("requeue", func(t *testing.T) {
				g, _ := newGuard(t, newLocker(t), middleware.WithPolicy(middleware.Requeue(time.Second)))
				err := g.Run(ctx, middleware.Job{Key: "k"}, func(context.Context) error { return nil })
				var dup *middleware.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, middleware.ActionRequeue, dup.Action)
				require.GreaterOrEqual(t, dup.RequeueIn, time.Second)
				require.LessOrEqual(t, dup.RequeueIn, 1500*time.Millisecond)
			})
			t.Run("fail", func(t *testing.T) {
				g, _ := newGuard(t, newLocker(t), middleware.WithPolicy(middleware.Fail()))
				err := g.Run(ctx, middleware.Job{Key: "k"}, func(context.Context) error { return nil })
				var dup *middleware.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, middleware.ActionFail, dup.Action)
			})
			t.Run("wait then fall back", func(t *testing.T) {
				g, rec := newGuard(t, newLocker(t), middleware.WithPolicy(middleware.Wait(150*time.Millisecond, middleware.Requeue(0))))
				err := g.Run(ctx, middleware.Job{Key: "k"}, func(context.Context) error { return nil })
				var dup *middleware.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, middleware.ActionRequeue, dup.Action)
				require.GreaterOrEqual(t, dup.Waited, 150*time.Millisecond)
				require.GreaterOrEqual(t, dup.RequeueIn, middleware.DefaultRequeueDelay)
				require.Equal(t, []middleware.EventKind{middleware.EventDuplicate}, rec.kinds())
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
			g, rec := newGuard(t, newLocker(t), middleware.WithPolicy(middleware.Wait(time.Minute, middleware.Skip())))
			done := make(chan error, 1)
			go func() {
				done <- g.Run(context.Background(), middleware.Job{Key: "k"}, func(context.Context) error { return nil })
			}()
			require.Eventually(t, func() bool {
				info, err := newLocker(t).Inspect(context.Background(), "k")
				return err == nil && info.Waiters == 1
			}, 10*time.Second, time.Millisecond)
			release()
			require.NoError(t, <-done)
			require.Equal(t, []middleware.EventKind{middleware.EventWaited, middleware.EventAcquired, middleware.EventReleased}, rec.kinds())
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
				g, _ := newGuard(t, newLocker(t), middleware.WithLimit(limit))
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := g.Run(context.Background(), middleware.Job{Key: "tenant"}, func(context.Context) error {
						n := running.Add(1)
						for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
						}
						ran.Add(1)
						<-gate
						running.Add(-1)
						return nil
					})
					if errors.Is(err, middleware.ErrDuplicate) {
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
			job := middleware.Job{Key: "cron:report", Name: "report", Epoch: 1700000000, EpochTTL: time.Minute}
			for i := range 3 {
				g, rec := newGuard(t, newLocker(t))
				err := g.Run(context.Background(), job, func(context.Context) error { runs.Add(1); return nil })
				if i == 0 {
					require.NoError(t, err)
					continue
				}
				var dup *middleware.DuplicateError
				require.ErrorAs(t, err, &dup)
				require.Equal(t, middleware.ReasonClaimed, dup.Reason)
				require.ErrorIs(t, err, lockkit.ErrEpochUsed)
				require.Equal(t, []middleware.EventKind{middleware.EventClaimed}, rec.kinds())
			}
			require.EqualValues(t, 1, runs.Load())
		})
	}
}

func TestPanicReleasesAndRepanics(t *testing.T) {
	l, err := lockkit.NewMemory()
	require.NoError(t, err)
	defer l.Close(context.Background())
	g, rec := newGuard(t, l)
	require.PanicsWithValue(t, "boom", func() {
		_ = g.Run(context.Background(), middleware.Job{Key: "k"}, func(context.Context) error { panic("boom") })
	})
	info, err := l.Inspect(context.Background(), "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders)
	ev, ok := rec.find(middleware.EventError)
	require.True(t, ok)
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
	ga, _ := newGuard(t, a, middleware.WithTTL(300*time.Millisecond))
	gb, _ := newGuard(t, b)

	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	cancelled := make(chan struct{})
	finish := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- ga.Run(ctx, middleware.Job{Key: "k"}, func(ctx context.Context) error {
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
		err := gb.Run(context.Background(), middleware.Job{Key: "k"}, func(context.Context) error {
			t.Error("a second run overlapped the cancelled one")
			return nil
		})
		require.ErrorIs(t, err, middleware.ErrDuplicate)
		time.Sleep(20 * time.Millisecond)
	}
	close(finish)
	require.NoError(t, <-done)
	require.NoError(t, gb.Run(context.Background(), middleware.Job{Key: "k"}, func(context.Context) error { return nil }))
}

func TestLostLeaseCancelsWork(t *testing.T) {
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer l.Close(context.Background())
	g, rec := newGuard(t, l, middleware.WithTTL(300*time.Millisecond))
	err = g.Run(context.Background(), middleware.Job{Key: "k"}, func(ctx context.Context) error {
		require.NoError(t, c.Del(context.Background(), prefix+"{k}:h").Err()) // the key is stolen
		<-ctx.Done()
		require.ErrorIs(t, context.Cause(ctx), lockkit.ErrLost)
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, lockkit.ErrLost)
	require.Eventually(t, func() bool { _, ok := rec.find(middleware.EventLost); return ok }, 5*time.Second, time.Millisecond)
}

func TestNewValidation(t *testing.T) {
	l, err := lockkit.NewMemory()
	require.NoError(t, err)
	cases := []struct {
		name string
		opts []middleware.Option
		want string
	}{
		{"limit", []middleware.Option{middleware.WithLimit(0)}, "WithLimit(0): must be at least 1"},
		{"ttl", []middleware.Option{middleware.WithTTL(time.Millisecond)}, "WithTTL(1ms): must be at least 100ms"},
		{"negative wait", []middleware.Option{middleware.WithPolicy(middleware.Wait(-time.Second, middleware.Skip()))}, "Wait -1s is negative"},
		{"negative delay", []middleware.Option{middleware.WithPolicy(middleware.Requeue(-time.Second))}, "RequeueDelay -1s is negative"},
		{"fair without wait", []middleware.Option{middleware.WithPolicy(middleware.Policy{Fair: true})}, "Fair needs a positive Wait"},
		{"unknown action", []middleware.Option{middleware.WithPolicy(middleware.Policy{OnConflict: 9})}, "unknown OnConflict action 9"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := middleware.New(l, c.opts...)
			require.ErrorContains(t, err, c.want)
		})
	}
	_, err = middleware.New(nil)
	require.ErrorContains(t, err, "locker is nil")

	g, err := middleware.New(l)
	require.NoError(t, err)
	require.Equal(t, middleware.Policy{OnConflict: middleware.ActionSkip, RequeueDelay: middleware.DefaultRequeueDelay}, g.Policy())
	err = g.Run(context.Background(), middleware.Job{Name: "report"}, func(context.Context) error { return nil })
	require.ErrorContains(t, err, "report: empty key")
}

func TestLogObserverLevels(t *testing.T) {
	var buf strings.Builder
	log := middleware.LogObserver(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx := context.Background()
	job := middleware.Job{Key: "k", Name: "report", ID: "t1"}
	log(ctx, middleware.Event{Kind: middleware.EventAcquired, Job: job})
	log(ctx, middleware.Event{Kind: middleware.EventReleased, Job: job})
	require.Empty(t, buf.String(), "routine events stay at Debug")
	log(ctx, middleware.Event{Kind: middleware.EventReleased, Job: job, Err: errors.New("smtp down")})
	log(ctx, middleware.Event{Kind: middleware.EventLost, Job: job, Err: lockkit.ErrLost})
	out := buf.String()
	require.Contains(t, out, `level=WARN msg="jobguard: released" key=k job=report id=t1 err="smtp down"`)
	require.Contains(t, out, `msg="jobguard: lost"`)
}
