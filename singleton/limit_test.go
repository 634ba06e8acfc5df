package singleton_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
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

// tenantPayload is the payload of the tasks of the limit tests.
type tenantPayload struct {
	Tenant string `json:"tenant_id"`
	Tier   string `json:"tier"`
	N      int    `json:"n"`
}

func tenantOf(t *asynq.Task) tenantPayload {
	var p tenantPayload
	_ = json.Unmarshal(t.Payload(), &p)
	return p
}

// byTenant keys a task of any type by its tenant: "tenant:<id>".
var byTenant = singleton.KeyFunc(func(_ context.Context, t *asynq.Task) (string, error) {
	p := tenantOf(t)
	if p.Tenant == "" {
		return "", fmt.Errorf("no tenant_id")
	}
	return "tenant:" + p.Tenant, nil
})

// byTier gives premium tenants 2 runs at once, a "broken" tier 0 (out of
// range) and the others 1.
func byTier(_ context.Context, t *asynq.Task) int {
	switch tenantOf(t).Tier {
	case "premium":
		return 2
	case "broken":
		return 0
	}
	return 1
}

// Two task types whose key option gives the same tenant key count against
// one limit, the tenant's own (WithLimitFunc), across two servers: a
// premium tenant runs two of its tasks at once, whichever their types, and
// another tenant one; the others are duplicates (skipped).
func TestTaskTypesShareATenantKeyAndItsLimit(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		tr := newTracker()
		ev := &events{}
		release := make(chan struct{})
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(release) }) })
		types := map[string]map[string]bool{} // tenant → types that ran
		var mu sync.Mutex
		for i := range 2 {
			mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))),
				byTenant, singleton.WithLimitFunc(byTier), singleton.WithObserver(ev.observe))
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			h := func(_ context.Context, task *asynq.Task) error {
				p := tenantOf(task)
				mu.Lock()
				if types[p.Tenant] == nil {
					types[p.Tenant] = map[string]bool{}
				}
				types[p.Tenant][task.Type()] = true
				mu.Unlock()
				tr.start(p.Tenant)
				<-release
				tr.end(p.Tenant, fmt.Sprintf("%s/%d", p.Tenant, p.N))
				return nil
			}
			mux.HandleFunc("report", h)
			mux.HandleFunc("export", h)
			e.start(e.config(4), mux)
		}
		enqueue := func(typ, tenant, tier string, n int) {
			b, err := json.Marshal(tenantPayload{Tenant: tenant, Tier: tier, N: n})
			require.NoError(t, err)
			e.Enqueue(asynq.NewTask(typ, b))
		}
		enqueue("report", "acme", "premium", 1)
		enqueue("export", "acme", "premium", 2)
		enqueue("export", "acme", "premium", 3)
		enqueue("report", "globex", "basic", 4)
		enqueue("export", "globex", "basic", 5)
		skipped := func(tenant string) int {
			n := 0
			for _, x := range ev.all() {
				if x.Kind == middleware.EventDuplicate && x.Job.Key == "tenant:"+tenant {
					n++
				}
			}
			return n
		}
		require.Eventually(t, func() bool { return skipped("acme") == 1 && skipped("globex") == 1 }, 10*time.Second, 5*time.Millisecond)
		require.Len(t, e.holders("tenant:acme"), 2)
		require.Len(t, e.holders("tenant:globex"), 1)
		// Every holder's handler has begun (a lease is taken a moment
		// before its handler runs) before any ends.
		require.Eventually(t, func() bool { return tr.peaks()["acme"] == 2 && tr.peaks()["globex"] == 1 }, 10*time.Second, 5*time.Millisecond)
		once.Do(func() { close(release) })
		e.Drained(10 * time.Second)
		require.Equal(t, map[string]int{"acme": 2, "globex": 1}, tr.peaks())
		completed := 0
		for _, n := range tr.completed() {
			completed += n
		}
		require.Equal(t, 3, completed, "two tasks of acme and one of globex ran; the others were skipped")
		require.Empty(t, ev.errs(middleware.EventError))
	})
}

// A task whose limit is out of range fails as a task whose key cannot be
// derived does: archived, with an error naming its type, its key and the
// value, without running; the other tasks of its key are not held up.
func TestLimitOutOfRangeArchivesTheTask(t *testing.T) {
	e := newEnvOn(t, standalone)
	ev := &events{}
	mw, err := singleton.Middleware(e.locker(), byTenant, singleton.WithLimitFunc(byTier), singleton.WithObserver(ev.observe))
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
	require.Contains(t, info.LastErr, `task "report": report: key "tenant:acme": WithLimitFunc gave 0: a limit must be between 1 and 10000`)
	errs := ev.errs(middleware.EventError)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], singleton.ErrInvalid)
	require.ErrorIs(t, errs[0], asynq.SkipRetry)
	require.Empty(t, ran, "the task with the bad limit did not run")
}

// WithLimitFunc is refused where a limit above 1 cannot work: with
// Coalesce, KeepNewest and Preempt, nil, and with ParkAtEnqueue on the
// Guard's Client; it is no option of another package's constructor.
func TestLimitFuncRefusals(t *testing.T) {
	e := newEnvOn(t, standalone)
	for _, p := range []middleware.Policy{middleware.Coalesce(), middleware.KeepNewest(), middleware.Preempt(0)} {
		_, err := singleton.Middleware(e.locker(), singleton.WithLimitFunc(byTier), singleton.WithPolicy(p))
		require.ErrorIs(t, err, singleton.ErrInvalid)
		require.ErrorContains(t, err, "WithLimitFunc: "+strings.SplitN(p.String(), "(", 2)[0]+" runs one job per key at a time")
	}
	_, err := singleton.Middleware(e.locker(), singleton.WithLimitFunc(nil))
	require.ErrorIs(t, err, singleton.ErrInvalid)
	require.ErrorContains(t, err, "WithLimitFunc(nil)")
	_, err = middleware.New(e.locker(), singleton.WithLimitFunc(byTier))
	require.ErrorIs(t, err, middleware.ErrInvalid)
	g, err := singleton.New(e.RDB, byTenant, singleton.WithLimitFunc(byTier), singleton.WithLockerOptions(lockkit.WithPrefix(e.Prefix)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	_, err = g.Client(e.Client, singleton.ParkAtEnqueue(nil, 0))
	require.ErrorIs(t, err, singleton.ErrInvalid)
	require.ErrorContains(t, err, "ParkAtEnqueue with the Guard's WithLimitFunc")
}

// Task types that share a key with different limits (WithLimitFunc by
// type: reports 3 at once, exports 1) never run more tasks of the key at
// once than the smallest limit among the running ones: while an export
// runs nothing joins it, and while reports run an export does not join
// them, though another report does.
func TestTaskTypesWithDifferentLimitsOnOneKey(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		started := make(chan string, 8)
		release := map[string]chan struct{}{"report": make(chan struct{}), "export": make(chan struct{})}
		byType := func(_ context.Context, t *asynq.Task) int { return map[string]int{"report": 3, "export": 1}[t.Type()] }
		mw, err := singleton.Middleware(e.locker(), byTenant, singleton.WithLimitFunc(byType), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		mux := asynq.NewServeMux()
		mux.Use(mw)
		h := func(_ context.Context, task *asynq.Task) error {
			started <- task.Type()
			<-release[task.Type()]
			return nil
		}
		mux.HandleFunc("report", h)
		mux.HandleFunc("export", h)
		e.start(e.config(8), mux)
		enqueue := func(typ string) { e.Enqueue(asynq.NewTask(typ, []byte(`{"tenant_id":"acme"}`))) }
		skipped := func(n int) {
			t.Helper()
			require.Eventually(t, func() bool { return ev.count(middleware.EventDuplicate, middleware.ActionSkip) == n }, 10*time.Second, 5*time.Millisecond)
		}

		enqueue("export")
		require.Equal(t, "export", recv(t, started, 10*time.Second))
		enqueue("report")
		skipped(1) // the export holds the key with its limit of 1
		close(release["export"])
		e.Drained(10 * time.Second)

		enqueue("report")
		require.Equal(t, "report", recv(t, started, 10*time.Second))
		enqueue("report")
		require.Equal(t, "report", recv(t, started, 10*time.Second))
		enqueue("export")
		skipped(2) // two runs: at the export's limit
		enqueue("report")
		require.Equal(t, "report", recv(t, started, 10*time.Second), "a third report joins the two")
		require.Len(t, e.holders("tenant:acme"), 3)
		close(release["report"])
		e.Drained(10 * time.Second)
		require.Empty(t, started)
	})
}

// Under Requeue, tasks of one key with limits that differ (1 or 2, by the
// task) across three servers all run, once each, and never more at once
// than the smallest limit among the running ones: duplicates of limit 1
// are parked and started by the run that frees the key, whatever its own
// limit, the others come back after the policy's delay.
func TestRequeueWithPerTaskLimits(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		const tasks = 24
		byN := func(_ context.Context, t *asynq.Task) int { return 1 + tenantOf(t).N%2 }
		var (
			mu      sync.Mutex
			running []int // the limits of the running tasks
			ran     = map[int]int{}
			worst   string
		)
		for i := range 3 {
			mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))), byTenant,
				singleton.WithLimitFunc(byN), singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)), singleton.WithRedis(e.RDB))
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			mux.HandleFunc("report", func(ctx context.Context, task *asynq.Task) error {
				limit := byN(ctx, task)
				mu.Lock()
				running = append(running, limit)
				if len(running) > slices.Min(running) && worst == "" {
					worst = fmt.Sprint(running)
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // the work
				mu.Lock()
				i := slices.Index(running, limit)
				running = slices.Delete(running, i, i+1)
				ran[tenantOf(task).N]++
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
			e.Enqueue(asynq.NewTask("report", []byte(fmt.Sprintf(`{"tenant_id":"acme","n":%d}`, n))), opts...)
		}
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(ran) == tasks
		}, parkBackstop/2, 10*time.Millisecond, "every task ran before a parked task's backstop")
		e.Drained(10 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		for n := range tasks {
			require.Equal(t, 1, ran[n], "task %d ran once", n)
		}
		require.Empty(t, worst, "runs with these limits overlapped")
	})
}

// A task parked by a server that gives it a limit of 1 is delivered, once
// the key is reserved for it, to a server whose limit function gives it
// another limit (a rolling deploy of the function): it takes its
// reservation over and runs at once, and does not wait on the reservation
// as if its own earlier delivery held the key (until the reservation
// lapsed, at the parked task's backstop).
func TestParkedTaskTakesItsReservationOverUnderAnotherLimit(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ctx := context.Background()
		started, gate := make(chan int, 4), make(chan struct{})
		serve := func(owner string, limit, concurrency int) *asynq.Server {
			mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(owner)), byTenant,
				singleton.WithLimitFunc(func(context.Context, *asynq.Task) int { return limit }),
				singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)), singleton.WithRedis(e.RDB))
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			mux.HandleFunc("report", func(_ context.Context, task *asynq.Task) error {
				n := tenantOf(task).N
				started <- n
				if n == 0 {
					<-gate
				}
				return nil
			})
			return e.start(e.config(concurrency), mux)
		}
		// Task 0 runs on the server whose function gives a limit of 1;
		// task 1, a duplicate, is parked behind it.
		old := serve("old-function", 1, 2)
		e.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":0}`)))
		require.Equal(t, 0, <-started)
		e.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":1}`)))
		require.Eventually(t, func() bool {
			n, err := e.RDB.ZCard(ctx, e.Prefix+"{tenant:acme}:k").Result() // the key's parked queue
			require.NoError(t, err)
			return n == 1
		}, 10*time.Second, 5*time.Millisecond, "task 1 is parked")
		// The server with the new function starts and the old one stops
		// pulling tasks; task 0's end reserves the key for task 1 and
		// resumes it, which only the new server can then run.
		serve("new-function", 3, 2)
		old.Stop()
		close(gate)
		select {
		case n := <-started:
			require.Equal(t, 1, n)
		case <-time.After(parkBackstop / 3):
			t.Fatal("the resumed task did not run: it waited on its own reservation")
		}
	})
}

// A task parked by a server that gives it a limit of 1 and run by a server
// that gives it another limit, on a key free of any reservation (the run
// that held it was no parking server's), takes out its place in the key's
// parked queue when it takes the key: the place does not wait for a
// release to pass it over (a run whose lease was lost makes none), nor
// stay for the parked queue's retention.
func TestTaskRunUnderAnotherLimitLeavesNoParkedPlace(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ctx := context.Background()
		parkedQueue := e.Prefix + "{tenant:acme}:k"
		ran, gate := make(chan int, 4), make(chan struct{})
		serve := func(owner string, limit int) *asynq.Server {
			mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(owner)), byTenant,
				singleton.WithLimitFunc(func(context.Context, *asynq.Task) int { return limit }),
				singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)), singleton.WithRedis(e.RDB))
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			mux.HandleFunc("report", func(_ context.Context, task *asynq.Task) error {
				ran <- tenantOf(task).N
				<-gate
				return nil
			})
			return e.start(e.config(2), mux)
		}
		// A plain lease holds the key: its release reserves nothing.
		holder, err := e.locker(lockkit.WithOwner("holder")).TryAcquire(ctx, "tenant:acme", nil)
		require.NoError(t, err)
		old := serve("old-function", 1)
		info := e.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":1}`)))
		require.Eventually(t, func() bool {
			n, err := e.RDB.ZCard(ctx, parkedQueue).Result()
			require.NoError(t, err)
			return n == 1
		}, 10*time.Second, 5*time.Millisecond, "the task is parked")
		old.Stop()
		require.NoError(t, holder.Release(ctx))
		// The server with the new function runs the task at once.
		serve("new-function", 3)
		require.Eventually(t, func() bool {
			return e.Inspector.RunTask(e.Queue, info.ID) == nil
		}, 10*time.Second, 5*time.Millisecond, "the parked task is made pending")
		select {
		case n := <-ran:
			require.Equal(t, 1, n)
		case <-time.After(10 * time.Second):
			t.Fatal("the task did not run")
		}
		n, err := e.RDB.ZCard(ctx, parkedQueue).Result()
		require.NoError(t, err)
		require.Zero(t, n, "the running task's parked place is given up")
		close(gate)
	})
}
