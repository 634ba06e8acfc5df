package singleton_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// apiOf gives every task the extra key "api" with limit 2, and a task of
// the "broken" tier an empty extra key.
func apiOf(_ context.Context, t *asynq.Task) map[string]int {
	if tenantOf(t).Tier == "broken" {
		return map[string]int{"": 1}
	}
	return map[string]int{"api": 2}
}

// Tasks of many tenants, each tenant one at a time (its key), and all of
// them at most two at once on a shared key (WithExtraKeys), across three
// servers under Requeue: every task runs once, never two of one tenant at
// once, never three at once in all; a task held back by the shared key is
// requeued, not parked.
func TestExtraKeyBoundsTasksOfEveryTenant(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		const tasks = 24
		var (
			mu      sync.Mutex
			running = map[string]int{} // tenant → running tasks
			total   int
			worst   string
			ran     = map[int]int{}
		)
		for i := range 3 {
			mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))), byTenant,
				singleton.WithExtraKeys(apiOf), singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)), singleton.WithRedis(e.RDB))
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			mux.HandleFunc("report", func(ctx context.Context, task *asynq.Task) error {
				p := tenantOf(task)
				mu.Lock()
				running[p.Tenant]++
				total++
				if (running[p.Tenant] > 1 || total > 2) && worst == "" {
					worst = fmt.Sprintf("%v, %d in all", running, total)
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond) // the work
				mu.Lock()
				running[p.Tenant]--
				total--
				ran[p.N]++
				mu.Unlock()
				return nil
			})
			e.start(e.config(4), mux)
		}
		for n := range tasks {
			opts := []asynq.Option{}
			if n%3 == 0 {
				opts = append(opts, asynq.MaxRetry(0))
			}
			e.Enqueue(asynq.NewTask("report", []byte(fmt.Sprintf(`{"tenant_id":"t%d","n":%d}`, n%4, n))), opts...)
		}
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(ran) == tasks
		}, 30*time.Second, 10*time.Millisecond)
		e.Drained(10 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		for n := range tasks {
			require.Equal(t, 1, ran[n], "task %d ran once", n)
		}
		require.Empty(t, worst, "runs overlapped beyond a limit")
		require.Zero(t, e.QueueInfo().Archived)
	})
}

// A task whose extra keys are bad fails as a task whose key cannot be
// derived does: archived, with an error naming its type, its key and the
// bad key, without running; WithExtraKeys is refused where it cannot work.
func TestBadExtraKeysArchiveTheTask(t *testing.T) {
	e := newEnvOn(t, standalone)
	ev := &events{}
	mw, err := singleton.Middleware(e.locker(), byTenant, singleton.WithExtraKeys(apiOf), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	ran := make(chan string, 2)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("report", func(_ context.Context, task *asynq.Task) error {
		ran <- tenantOf(task).Tier
		return nil
	})
	e.start(e.config(2), mux)
	bad := e.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","tier":"broken"}`)))
	e.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","tier":"basic"}`)))
	require.Equal(t, "basic", recv(t, ran, 10*time.Second))
	require.Eventually(t, func() bool { return e.QueueInfo().Archived == 1 }, 10*time.Second, 5*time.Millisecond)
	info, err := e.Inspector.GetTaskInfo(e.Queue, bad.ID)
	require.NoError(t, err)
	require.Contains(t, info.LastErr, `task "report": report: key "tenant:acme": WithExtraKeys gave an empty key`)
	errs := ev.errs(middleware.EventError)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], singleton.ErrInvalid)
	require.ErrorIs(t, errs[0], asynq.SkipRetry)
	require.Empty(t, ran)

	for _, p := range []middleware.Policy{middleware.Coalesce(), middleware.KeepNewest(), middleware.Preempt(0), middleware.WaitInOrder(time.Second, middleware.Skip())} {
		_, err := singleton.Middleware(e.locker(), singleton.WithExtraKeys(apiOf), singleton.WithPolicy(p))
		require.ErrorIs(t, err, singleton.ErrInvalid, p.String())
		require.ErrorContains(t, err, "WithExtraKeys")
	}
	_, err = singleton.Middleware(e.locker(), singleton.WithExtraKeys(nil))
	require.ErrorIs(t, err, singleton.ErrInvalid)
	require.True(t, strings.Contains(err.Error(), "WithExtraKeys(nil)"))
	_, err = middleware.New(e.locker(), singleton.WithExtraKeys(apiOf))
	require.ErrorIs(t, err, middleware.ErrInvalid)
}
