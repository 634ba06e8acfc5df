package singleton_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// Under WithShadow every task runs: the duplicates of a held key run
// anyway, each reported with what the policy (Requeue) would have done, and
// none is requeued, parked or completed without running.
func TestShadowRunsEveryTask(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(), singleton.WithShadow(), singleton.WithRedis(e.RDB),
			singleton.WithPolicy(middleware.Requeue(time.Second)), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		started, release := make(chan struct{}, 1), make(chan struct{})
		var runs atomic.Int32
		e.start(e.config(4), mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			if runs.Add(1) == 1 {
				started <- struct{}{}
				<-release
			}
			return nil
		})))
		e.Enqueue(asynq.NewTask("report", nil))
		<-started
		for range 3 {
			e.Enqueue(asynq.NewTask("report", nil), asynq.MaxRetry(0))
		}
		require.Eventually(t, func() bool { return runs.Load() == 4 }, 10*time.Second, 5*time.Millisecond,
			"the duplicates run while the first holds the key")
		close(release)
		e.Drained(10 * time.Second)
		var shadowed int
		for _, x := range ev.all() {
			if x.Kind == middleware.EventShadowed {
				shadowed++
				require.Equal(t, middleware.ActionRequeue, x.Action)
			}
		}
		require.Equal(t, 3, shadowed)
		require.Zero(t, ev.count(middleware.EventDuplicate, 0), "nothing was treated as a duplicate")
		require.Zero(t, ev.count(middleware.EventRequeued, 0))
		require.Equal(t, 0, e.QueueInfo().Archived)
	})
}

// Under WithShadow a task the middleware would refuse runs too: one whose key
// cannot be derived (ErrKey), one enqueued keyed otherwise (ErrKeyMismatch)
// and one parked at enqueue under WithLimit(n > 1) (ErrInvalid). None is
// archived; each is reported once as an EventShadowed with ActionFail and the
// refusal as its Err, and recorded in the decision log (reason would_archive,
// cause the refusal). The refused reservation is given back, as the refusal
// gives it back.
func TestShadowRunsTasksTheMiddlewareWouldRefuse(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ctx := context.Background()
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"), singleton.WithShadow(), singleton.WithLimit(2),
			singleton.WithRedis(e.RDB), singleton.WithPolicy(middleware.Requeue(time.Second)), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		ran, now := make(chan string, 3), make(chan struct{})
		close(now)
		e.start(e.config(4), mw(holding(ran, now)))

		noKey := e.Enqueue(asynq.NewTask("report", []byte(`{"other":"acme"}`)))
		otherKey := e.Enqueue(asynq.NewTaskWithHeaders("report", []byte(`{"tenant_id":"acme"}`),
			map[string]string{asynqkey.KeyHeader: keyHeaderOf("asynq:report:acme", `KeyFunc(...)`)}))
		parker, err := singleton.NewClient(e.Client, e.RDB, singleton.KeyByFields("tenant_id"), singleton.ParkAtEnqueue(e.locker(), 0))
		require.NoError(t, err)
		parked, err := parker.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"globex"}`)), asynq.Queue(e.Queue))
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStatePending, parked.State, "reserved its key")

		var got []string
		for range 3 {
			got = append(got, recv(t, ran, 10*time.Second))
		}
		require.ElementsMatch(t, []string{noKey.ID, otherKey.ID, parked.ID}, got, "every task ran")
		e.Drained(10 * time.Second)
		require.Zero(t, e.QueueInfo().Archived)

		want := map[string]error{noKey.ID: singleton.ErrKey, otherKey.ID: singleton.ErrKeyMismatch, parked.ID: singleton.ErrInvalid}
		shadowed := map[string]int{}
		for _, x := range ev.all() {
			switch x.Kind {
			case middleware.EventShadowed:
				shadowed[x.Job.ID]++
				require.Equal(t, middleware.ActionFail, x.Action, "%s", x.Err)
				require.ErrorIs(t, x.Err, want[x.Job.ID])
				require.ErrorIs(t, x.Err, asynq.SkipRetry, "what asynq would have done: archive it")
			case middleware.EventError:
				t.Errorf("an error event for a task shadow mode runs: %v", x.Err)
			}
		}
		require.Equal(t, map[string]int{noKey.ID: 1, otherKey.ID: 1, parked.ID: 1}, shadowed)

		entries, err := e.RDB.XRevRangeN(ctx, decisionlog.Stream, "+", "-", 1000).Result()
		require.NoError(t, err)
		logged := map[string]string{}
		for _, x := range entries {
			if id, _ := x.Values["task"].(string); want[id] != nil {
				require.Equal(t, "would_archive", x.Values["reason"])
				logged[id], _ = x.Values["cause"].(string)
			}
		}
		require.Len(t, logged, 3, "each refusal is in the decision log")
		require.Contains(t, logged[noKey.ID], "tenant_id")
		require.Contains(t, logged[otherKey.ID], "KeyFunc(...)")
		require.Contains(t, logged[parked.ID], "WithLimit(2)")

		require.Empty(t, e.holders(`asynq:report:tenant_id="globex"`), "the refused task's reservation was given back")
	})
}

// Under WithShadow a task parked at enqueue takes over its reservation and
// gives it back when its run ends, which starts the next parked task, as
// without shadow: a burst of one key runs one at a time, in order, long
// before the backstop (30s), and nothing is reported as shadowed.
func TestShadowTaskParkedAtEnqueueHandsItsKeyOn(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		client, err := singleton.NewClient(e.Client, e.RDB, singleton.KeyByFields("tenant_id"), singleton.ParkAtEnqueue(e.locker(), 0))
		require.NoError(t, err)
		const n = 4
		for i := range n {
			info, err := client.Enqueue(asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":"acme","n":%d}`, i)), asynq.Queue(e.Queue))
			require.NoError(t, err)
			if i > 0 {
				require.Equal(t, asynq.TaskStateScheduled, info.State, "task %d was parked", i)
			}
		}
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"), singleton.WithShadow(),
			singleton.WithPolicy(middleware.Requeue(time.Minute)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		tr, log := newTracker(), &runLog{order: map[string][]int{}}
		e.start(e.config(4), reportMux(mw, tr, log))
		require.Eventually(t, func() bool { return log.runs() == n }, 10*time.Second, 5*time.Millisecond,
			"each run's end starts the next parked task (the backstop is 30s)")
		e.Drained(10 * time.Second)
		require.Equal(t, []int{0, 1, 2, 3}, log.order["acme"])
		require.Equal(t, 1, tr.peaks()["acme"])
		require.Zero(t, ev.count(middleware.EventShadowed, 0), "no task was kept from running: each ran in its turn")
		require.Empty(t, e.holders(`asynq:report:tenant_id="acme"`), "no reservation is left")
	})
}

// In a fleet where some servers run WithShadow and others not (a rollout), a
// Requeue duplicate parked by a server without shadow and resumed with the
// key reserved for it takes that reservation over on a shadow server, and
// its run's end resumes the next parked task, instead of leaving both to
// their backstops.
func TestShadowServerTakesOverAReservationOfAMixedFleet(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		policy := singleton.WithPolicy(middleware.Requeue(time.Minute))
		plain, err := singleton.Middleware(e.locker(), policy, singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		started, release := make(chan string, 3), make(chan struct{})
		a := e.start(e.config(3), plain(holding(started, release)))
		first := e.Enqueue(asynq.NewTask("report", nil))
		require.Equal(t, first.ID, recv(t, started, 10*time.Second))
		second := e.Enqueue(asynq.NewTask("report", nil))
		ev.waitRequeued(t, 1, "the second task is parked")
		third := e.Enqueue(asynq.NewTask("report", nil))
		ev.waitRequeued(t, 2, "the third task is parked")
		a.Stop() // it takes no more tasks: the resumed ones go to the shadow server

		shadow, err := singleton.Middleware(e.locker(), policy, singleton.WithShadow(), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		close(release)
		ran := make(chan string, 2)
		e.start(e.config(3), shadow(holding(ran, release)))
		require.Equal(t, second.ID, recv(t, ran, 10*time.Second), "resumed when the first run ended")
		require.Equal(t, third.ID, recv(t, ran, 10*time.Second), "resumed when the second run ended, not at its backstop")
		require.Zero(t, ev.count(middleware.EventShadowed, 0))
	})
}
