package singleton_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

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
