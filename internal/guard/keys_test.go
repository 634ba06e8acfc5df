package guard_test

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

	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
)

// extraKeys gives every job the keys of m.
func extraKeys(m map[string]int) guard.Option {
	return guard.WithExtraKeys(func(context.Context, guard.Job) map[string]int { return m })
}

// holders is how many runs hold key now.
func holders(t *testing.T, l *lockkit.Locker, key string) int {
	t.Helper()
	info, err := l.Inspect(context.Background(), key)
	require.NoError(t, err)
	return len(info.Holders)
}

// A job whose extra key is full does not run, is a duplicate of that key's
// holder, and holds none of its keys afterwards; it runs once the key is
// free.
func TestExtraKeyFullGivesEveryKeyBack(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			l := newLocker(t)
			g, rec := newGuard(t, l, extraKeys(map[string]int{"api": 1, "db": 5}))
			release, first := runHeld(context.Background(), g, guard.Job{Key: "t1", Name: "a"})
			require.Equal(t, 1, holders(t, l, "api"))
			require.Equal(t, 1, holders(t, l, "db"))

			out := g.Run(context.Background(), guard.Job{Key: "t2", Name: "b"}, func(context.Context) error {
				t.Error("ran beside the holder of its extra key")
				return nil
			})
			require.False(t, out.Ran)
			require.NotNil(t, out.Duplicate, "%v", out.Err)
			require.Equal(t, guard.ReasonHeld, out.Duplicate.Reason)
			require.Equal(t, guard.ActionSkip, out.Duplicate.Action)
			var ce *lockcore.ConflictError
			require.ErrorAs(t, out.Err, &ce)
			require.Equal(t, "api", ce.Key)
			require.Contains(t, out.Err.Error(), `"api"`)
			ev, ok := rec.find(guard.EventDuplicate)
			require.True(t, ok)
			require.Equal(t, "b", ev.Job.Name)
			// No partial hold: its own key is free, db has only the holder.
			require.Equal(t, 0, holders(t, l, "t2"))
			require.Equal(t, 1, holders(t, l, "db"))

			release()
			require.True(t, (<-first).Ran)
			require.Equal(t, 0, holders(t, l, "api"))
			require.Equal(t, 0, holders(t, l, "db"))
			ran := false
			out = g.Run(context.Background(), guard.Job{Key: "t2", Name: "b"}, func(context.Context) error { ran = true; return nil })
			require.NoError(t, out.Err)
			require.True(t, ran)
		})
	}
}

// An extra key's limit is its own: with {"api": 2} two jobs of different
// keys run at once and a third is a duplicate.
func TestExtraKeyHasItsOwnLimit(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			l := newLocker(t)
			g, _ := newGuard(t, l, extraKeys(map[string]int{"api": 2}))
			r1, o1 := runHeld(context.Background(), g, guard.Job{Key: "t1"})
			r2, o2 := runHeld(context.Background(), g, guard.Job{Key: "t2"})
			require.Equal(t, 2, holders(t, l, "api"))
			out := g.Run(context.Background(), guard.Job{Key: "t3"}, func(context.Context) error { return nil })
			require.NotNil(t, out.Duplicate, "%v", out.Err)
			r1()
			r2()
			require.True(t, (<-o1).Ran)
			require.True(t, (<-o2).Ran)
		})
	}
}

// Jobs whose keys overlap in opposite orders (one's own key is the other's
// extra key) never deadlock under Wait, and never hold a key beyond its
// limit: every job takes its keys in the order of their names.
func TestExtraKeysInOppositeOrdersDoNotDeadlock(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			var inA, inB atomic.Int32
			var over atomic.Bool
			run := func(g *guard.Guard, own string) error {
				out := g.Run(context.Background(), guard.Job{Key: own}, func(context.Context) error {
					a, b := inA.Add(1), inB.Add(1)
					if a > 1 || b > 1 {
						over.Store(true)
					}
					time.Sleep(time.Millisecond)
					inA.Add(-1)
					inB.Add(-1)
					return nil
				})
				if !out.Ran {
					return fmt.Errorf("%s did not run: %w", own, out.Err)
				}
				return out.Err
			}
			// Two processes: one's jobs take "a" then "b", the other's "b"
			// then "a".
			ga, _ := newGuard(t, newLocker(t), guard.WithPolicy(guard.Wait(time.Minute, guard.Fail())), extraKeys(map[string]int{"b": 1}))
			gb, _ := newGuard(t, newLocker(t), guard.WithPolicy(guard.Wait(time.Minute, guard.Fail())), extraKeys(map[string]int{"a": 1}))
			var wg sync.WaitGroup
			errs := make(chan error, 40)
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if i%2 == 0 {
						errs <- run(ga, "a")
					} else {
						errs <- run(gb, "b")
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.False(t, over.Load(), "two runs held one key")
		})
	}
}

// touches calls seen after each command that names key n ({key} in its
// arguments), once per command.
type touches struct {
	key  string
	seen chan struct{}
}

func (touches) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h touches) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.Contains(fmt.Sprint(cmd.Args()), "{"+h.key+"}") {
			select {
			case h.seen <- struct{}{}:
			default:
			}
		}
		return err
	}
}

func (h touches) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if strings.Contains(fmt.Sprint(cmd.Args()), "{"+h.key+"}") {
				select {
				case h.seen <- struct{}{}:
				default:
				}
			}
		}
		return err
	}
}

// Under Wait a job whose extra key, which comes before its own key in the
// order of their names, is full holds none of its keys while it waits, and
// runs when the key is released.
func TestWaitForAnExtraKeyBeforeItsOwnHoldsNoKey(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			l := newLocker(t)
			policy := guard.WithPolicy(guard.Wait(time.Minute, guard.Skip()))
			g, rec := newGuard(t, l, policy, extraKeys(map[string]int{"api": 1}))
			release, first := runHeld(context.Background(), g, guard.Job{Key: "t1"})
			// The waiter, in a process of its own, whose commands on api are
			// seen: its try, then its wait's first attempt.
			seen := make(chan struct{}, 10)
			gw, wrec := newGuard(t, newLocker(t, touches{key: "api", seen: seen}), policy, extraKeys(map[string]int{"api": 1}))
			second := make(chan guard.Outcome, 1)
			var runs atomic.Int32
			go func() {
				second <- gw.Run(context.Background(), guard.Job{Key: "t2", Name: "waiter"}, func(context.Context) error {
					runs.Add(1)
					return nil
				})
			}()
			<-seen
			<-seen
			require.Equal(t, 0, holders(t, l, "t2"), "the waiting job holds its own key")
			select {
			case o := <-second:
				t.Fatalf("returned while api was held: %+v", o)
			default:
			}
			release()
			require.True(t, (<-first).Ran)
			out := <-second
			require.True(t, out.Ran, "%v", out.Err)
			require.Equal(t, int32(1), runs.Load())
			_, dup := rec.find(guard.EventDuplicate)
			_, wdup := wrec.find(guard.EventDuplicate)
			require.False(t, dup || wdup)
			_, waited := wrec.find(guard.EventWaited)
			require.True(t, waited)
		})
	}
}

// Under Wait the bound counts from the job's first attempt: once it is
// spent the wrapped policy applies, naming the extra key.
func TestWaitForAnExtraKeyEndsAtTheBound(t *testing.T) {
	l := backends(t)["redis"](t)
	g, _ := newGuard(t, l, guard.WithPolicy(guard.Wait(200*time.Millisecond, guard.Fail())), extraKeys(map[string]int{"api": 1}))
	release, first := runHeld(context.Background(), g, guard.Job{Key: "t1"})
	defer func() { release(); <-first }()
	start := time.Now()
	out := g.Run(context.Background(), guard.Job{Key: "t2"}, func(context.Context) error { return nil })
	require.NotNil(t, out.Duplicate, "%v", out.Err)
	require.Equal(t, guard.ActionFail, out.Duplicate.Action)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	require.GreaterOrEqual(t, out.Duplicate.Waited, 200*time.Millisecond)
	var ce *lockcore.ConflictError
	require.ErrorAs(t, out.Err, &ce)
	require.Equal(t, "api", ce.Key)
	require.Equal(t, 0, holders(t, l, "t2"))
}

// The run's ctx is cancelled, with a cause matching ErrLost that names the
// key, when an extra key's lease is lost; the job's error says so.
func TestLostExtraKeyCancelsTheRun(t *testing.T) {
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer l.Close(context.Background())
	g, rec := newGuard(t, l, guard.WithTTL(300*time.Millisecond), extraKeys(map[string]int{"api": 1}))
	err = runErr(g, context.Background(), guard.Job{Key: "k"}, func(ctx context.Context) error {
		require.NoError(t, c.Del(context.Background(), prefix+"{api}:h").Err()) // the extra key is stolen
		<-ctx.Done()
		require.ErrorIs(t, context.Cause(ctx), lockkit.ErrLost)
		require.Contains(t, context.Cause(ctx).Error(), `"api"`)
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, lockkit.ErrLost)
	ev, ok := rec.find(guard.EventLost)
	require.True(t, ok)
	require.ErrorIs(t, ev.Err, lockkit.ErrLost)
	require.Equal(t, 0, holders(t, l, "k"))
}

// An operator's CancelRun on an extra key cancels the run (cause matching
// ErrCancelled); the keys stay held until the work returns.
func TestCancelRunOnAnExtraKeyCancelsTheRun(t *testing.T) {
	l := backends(t)["redis"](t)
	g, _ := newGuard(t, l, extraKeys(map[string]int{"api": 1}))
	started := make(chan struct{})
	cancelled := make(chan struct{})
	proceed := make(chan struct{})
	out := make(chan guard.Outcome, 1)
	go func() {
		out <- g.Run(context.Background(), guard.Job{Key: "k"}, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			close(cancelled)
			<-proceed
			return context.Cause(ctx)
		})
	}()
	<-started
	n, err := l.CancelRun(context.Background(), "api", lockkit.Select{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	<-cancelled
	require.Equal(t, 1, holders(t, l, "k"))
	require.Equal(t, 1, holders(t, l, "api"))
	close(proceed)
	o := <-out
	require.True(t, o.Ran)
	require.ErrorIs(t, o.Err, lockkit.ErrCancelled)
	require.Equal(t, 0, holders(t, l, "api"))
}

// A delivery whose own earlier run still holds one of its extra keys (its
// release did not reach Redis) waits for it, as for its own key, and then
// runs: it is not its duplicate. The extra key's holder is labelled with
// the job's label and its own key, quoted.
func TestExtraKeyHeldByTheOwnEarlierRunIsWaitedFor(t *testing.T) {
	l := backends(t)["redis"](t)
	g, rec := newGuard(t, l, extraKeys(map[string]int{"api": 1}))
	job := guard.With(guard.Job{Key: "k"}, guard.Work{Label: "task-1"})
	core, err := lockcore.Of("test", l)
	require.NoError(t, err)
	earlier, err := core.TryAcquire(context.Background(), "api", &lockcore.AcquireOptions{Label: `task-1@"k"`})
	require.NoError(t, err)
	out := make(chan guard.Outcome, 1)
	go func() {
		out <- g.Run(context.Background(), job, func(ctx context.Context) error {
			info, err := l.Inspect(ctx, "api")
			require.NoError(t, err)
			require.Len(t, info.Holders, 1)
			require.Equal(t, `task-1@"k"`, info.Holders[0].Label)
			return nil
		})
	}()
	require.Eventually(t, func() bool { return holders(t, l, "k") == 1 }, 5*time.Second, time.Millisecond)
	select {
	case o := <-out:
		t.Fatalf("ran or returned beside its own earlier run: %+v", o)
	case <-time.After(20 * time.Millisecond):
	}
	require.NoError(t, earlier.Release(context.Background()))
	o := <-out
	require.True(t, o.Ran, "%v", o.Err)
	_, dup := rec.find(guard.EventDuplicate)
	require.False(t, dup)

	// Another job's delivery with the same label (cron entries share their
	// tick) is no earlier run of it: a duplicate.
	earlier, err = core.TryAcquire(context.Background(), "api", &lockcore.AcquireOptions{Label: `task-1@"other"`})
	require.NoError(t, err)
	defer earlier.Release(context.Background())
	o = g.Run(context.Background(), job, func(context.Context) error { return nil })
	require.NotNil(t, o.Duplicate, "%v", o.Err)
}

// A job whose extra keys are bad fails without running (ErrInvalid naming
// the bad key or limit); New refuses a nil function and the policies that
// cannot take several keys.
func TestExtraKeysValidation(t *testing.T) {
	l := backends(t)["miniredis"](t)
	for _, c := range []struct {
		keys map[string]int
		want string
	}{
		{map[string]int{"": 1}, "empty key"},
		{map[string]int{"k": 1}, "own key"},
		{map[string]int{"api": 0}, `"api" the limit 0`},
		{map[string]int{"api": 10001}, `"api" the limit 10001`},
	} {
		g, rec := newGuard(t, l, extraKeys(c.keys))
		out := g.Run(context.Background(), guard.Job{Key: "k"}, func(context.Context) error {
			t.Error("ran")
			return nil
		})
		require.False(t, out.Ran)
		require.ErrorIs(t, out.Err, guard.ErrInvalid)
		require.ErrorIs(t, out.Err, lockkit.ErrInvalid)
		require.Contains(t, out.Err.Error(), c.want)
		_, ok := rec.find(guard.EventError)
		require.True(t, ok)
	}
	for _, opts := range [][]guard.Option{
		{guard.WithExtraKeys(nil)},
		{extraKeys(nil), guard.WithPolicy(guard.Coalesce())},
		{extraKeys(nil), guard.WithPolicy(guard.KeepNewest())},
		{extraKeys(nil), guard.WithPolicy(guard.Preempt(time.Second))},
		{extraKeys(nil), guard.WithPolicy(guard.WaitInOrder(time.Second, guard.Skip()))},
	} {
		_, err := guard.New(l, opts...)
		require.ErrorIs(t, err, guard.ErrInvalid)
		require.Contains(t, err.Error(), "WithExtraKeys")
	}
	// A job with no extra keys holds its own only.
	g, _ := newGuard(t, l, extraKeys(nil))
	require.NoError(t, runErr(g, context.Background(), guard.Job{Key: "k"}, func(context.Context) error { return nil }))
}

// Under WithShadow a job whose extra key is full runs anyway, without its
// keys, and the duplicate it would have been is reported.
func TestShadowReportsAFullExtraKey(t *testing.T) {
	l := backends(t)["redis"](t)
	g, rec := newGuard(t, l, guard.WithShadow(), extraKeys(map[string]int{"api": 1}))
	release, first := runHeld(context.Background(), g, guard.Job{Key: "t1"})
	ran := false
	out := g.Run(context.Background(), guard.Job{Key: "t2"}, func(context.Context) error {
		ran = true
		require.Equal(t, 0, holders(t, l, "t2"))
		return nil
	})
	require.True(t, out.Ran)
	require.True(t, ran)
	ev, ok := rec.find(guard.EventShadowed)
	require.True(t, ok)
	var ce *lockcore.ConflictError
	require.True(t, errors.As(ev.Err, &ce))
	require.Equal(t, "api", ce.Key)
	release()
	<-first
}

// The extra keys are renewed with the own key: a run three times as long
// as the TTL keeps all of them, and its ctx is not cancelled.
func TestExtraKeysAreRenewedWhileTheWorkRuns(t *testing.T) {
	l := backends(t)["redis"](t)
	g, rec := newGuard(t, l, guard.WithTTL(500*time.Millisecond), extraKeys(map[string]int{"api": 1, "db": 2}))
	err := runErr(g, context.Background(), guard.Job{Key: "k"}, func(ctx context.Context) error {
		deadline := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(50 * time.Millisecond):
			}
			for _, key := range []string{"k", "api", "db"} {
				if n := holders(t, l, key); n != 1 {
					return fmt.Errorf("%q has %d holders", key, n)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	_, lost := rec.find(guard.EventLost)
	require.False(t, lost)
	require.Equal(t, 0, holders(t, l, "api"))
}

// A full extra key gives back the extra keys taken before it, not only the
// job's own: under Skip (each tried once, after the own key) and under
// Wait (in the order of their names, the own key among them) once the
// bound is spent.
func TestFullExtraKeyGivesBackTheKeysTakenBeforeIt(t *testing.T) {
	for _, policy := range []guard.Policy{guard.Skip(), guard.Wait(100*time.Millisecond, guard.Skip())} {
		t.Run(policy.String(), func(t *testing.T) {
			l := backends(t)["redis"](t)
			holder, _ := newGuard(t, l, extraKeys(map[string]int{"z-full": 1}))
			release, first := runHeld(context.Background(), holder, guard.Job{Key: "other"})
			defer func() { release(); <-first }()
			g, _ := newGuard(t, l, guard.WithPolicy(policy), extraKeys(map[string]int{"a-free": 1, "m-free": 2, "z-full": 1}))
			out := g.Run(context.Background(), guard.Job{Key: "k"}, func(context.Context) error {
				t.Error("ran without z-full")
				return nil
			})
			require.NotNil(t, out.Duplicate, "%v", out.Err)
			for _, key := range []string{"k", "a-free", "m-free"} {
				require.Equal(t, 0, holders(t, l, key), "%q still held", key)
			}
		})
	}
}

// A job whose own lease ran out after it took its keys and before its work
// could start (an operator's ForceRelease, a pause) does not run, and gives
// its extra keys back: nothing renews them after Run returns.
func TestJobThatCouldNotStartGivesItsExtraKeysBack(t *testing.T) {
	l := backends(t)["redis"](t)
	var g *guard.Guard
	g, _ = newGuard(t, l, extraKeys(map[string]int{"api": 1}), guard.WithObserver(func(ctx context.Context, e guard.Event) {
		if e.Kind != guard.EventAcquired {
			return
		}
		// Between the acquire and the start: the own key is taken away.
		n, err := l.ForceRelease(context.Background(), "k", lockkit.Select{})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Eventually(t, func() bool { return l.Held() == 1 }, 5*time.Second, time.Millisecond, "the Locker heard of the release")
	}))
	out := g.Run(context.Background(), guard.Job{Key: "k"}, func(context.Context) error {
		t.Error("started under a lease taken away")
		return nil
	})
	require.ErrorIs(t, out.Err, lockkit.ErrLost)
	require.Equal(t, 0, holders(t, l, "api"))
	require.Equal(t, 0, l.Held(), "a lease is still renewed")
}

// The release of an extra key starts the oldest job parked for it, when
// the key is another job's own (WithParking): a key's end, whoever held
// it, resumes its parked jobs.
func TestReleaseOfAnExtraKeyResumesAJobParkedForIt(t *testing.T) {
	l, parking, resumed := parkingLocker(t)
	requeue := guard.WithPolicy(guard.Requeue(time.Minute))
	owner, _ := newGuard(t, l, requeue, guard.WithParking(parking))
	user, _ := newGuard(t, l, requeue, guard.WithParking(parking), extraKeys(map[string]int{"tenant": 1}))
	release, first := runHeld(context.Background(), user, guard.With(guard.Job{Key: "report"}, guard.Work{Label: "user-1"}))
	out := owner.Run(context.Background(), guard.With(guard.Job{Key: "tenant"}, guard.Work{Label: "parked-1"}), func(context.Context) error { return nil })
	require.NotNil(t, out.Duplicate, "%v", out.Err)
	require.True(t, out.Duplicate.Parked)
	release()
	require.True(t, (<-first).Ran)
	select {
	case id := <-resumed:
		require.Contains(t, id, "parked-1")
	case <-time.After(5 * time.Second):
		t.Fatal("the parked job was not resumed by the extra key's release")
	}
}
