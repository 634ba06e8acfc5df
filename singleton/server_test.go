package singleton_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

func recv[T any](t *testing.T, ch <-chan T, timeout time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("nothing received within %s", timeout)
		panic("unreachable")
	}
}

// Several servers (separate lock owners, as on separate machines), each with
// concurrency > 1, take a burst of duplicate tasks over a few keys. No key ever
// runs more than its limit at once, and every task is accounted for: it ran,
// or it was skipped, or it was requeued and then ran. No task is archived or
// counted as a failure for being a duplicate, MaxRetry(0) ones included.
func TestBurstAcrossServers(t *testing.T) {
	cases := []struct {
		name   string
		policy middleware.Policy
		limit  int
	}{
		{"skip", middleware.Skip(), 1},
		{"requeue", middleware.Requeue(50 * time.Millisecond), 1},
		{"wait in order then requeue", middleware.Policy{OnConflict: middleware.ActionRequeue, RequeueDelay: 50 * time.Millisecond, Wait: 100 * time.Millisecond, Fair: true}, 1},
		{"limit 2 then requeue", middleware.Requeue(50 * time.Millisecond), 2},
	}
	onEachRedis(t, func(t *testing.T, r connect) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) { testBurst(t, newEnvOn(t, r), c.policy, c.limit) })
		}
	})
}

// testBurst is one case of TestBurstAcrossServers.
func testBurst(t *testing.T, e *env, policy middleware.Policy, limit int) {
	const servers, concurrency, tenants, perTenant = 3, 4, 3, 8
	tr := newTracker()
	ev := &events{}
	var copiesRan atomic.Int32

	labels := map[string]string{} // task ID → label
	for n := range tenants * perTenant {
		tenant := fmt.Sprintf("tenant-%d", n%tenants)
		payload := fmt.Sprintf(`{"tenant_id":%q,"n":%d}`, tenant, n)
		opts := []asynq.Option{}
		if n%2 == 0 {
			opts = append(opts, asynq.MaxRetry(0))
		}
		info := e.Enqueue(asynq.NewTask("report", []byte(payload)), opts...)
		labels[info.ID] = fmt.Sprintf("%s/%d", tenant, n)
	}
	for i := range servers {
		mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))),
			singleton.KeyByFields("tenant_id"),
			singleton.WithPolicy(policy),
			singleton.WithLimit(limit),
			singleton.WithRedis(e.RDB),
			singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		mux := asynq.NewServeMux()
		mux.Use(mw)
		mux.HandleFunc("report", func(_ context.Context, task *asynq.Task) error {
			var p struct {
				Tenant string `json:"tenant_id"`
				N      int    `json:"n"`
			}
			if err := json.Unmarshal(task.Payload(), &p); err != nil {
				return err
			}
			if task.Headers()[singleton.OriginHeader] != "" {
				copiesRan.Add(1)
			}
			tr.start(p.Tenant)
			time.Sleep(30 * time.Millisecond) // the work
			tr.end(p.Tenant, fmt.Sprintf("%s/%d", p.Tenant, p.N))
			return nil
		})
		e.start(e.config(concurrency), mux)
	}

	skipped := func() map[string]int {
		ev.mu.Lock()
		defer ev.mu.Unlock()
		out := map[string]int{}
		for _, x := range ev.list {
			if x.Kind == middleware.EventDuplicate && x.Action == middleware.ActionSkip {
				out[labels[x.Job.ID]]++
			}
		}
		return out
	}
	accounted := func() int {
		n := 0
		for _, v := range tr.completed() {
			n += v
		}
		for _, v := range skipped() {
			n += v
		}
		return n
	}
	require.Eventually(t, func() bool { return accounted() == tenants*perTenant }, 30*time.Second, 10*time.Millisecond)
	e.Drained(10 * time.Second)

	completed, skips := tr.completed(), skipped()
	for _, label := range labels {
		require.Equal(t, 1, completed[label]+skips[label], "task %s ran or was skipped exactly once", label)
	}
	peaks := tr.peaks()
	require.Len(t, peaks, tenants)
	for tenant, peak := range peaks {
		if limit == 1 {
			require.Equal(t, 1, peak, "tenant %s ran more than once at a time", tenant)
		} else {
			require.LessOrEqual(t, peak, limit, "tenant %s ran more than its limit at once", tenant)
		}
	}
	if limit > 1 {
		best := 0
		for _, peak := range peaks {
			best = max(best, peak)
		}
		require.Equal(t, limit, best, "the limit is used")
	}
	qi := e.QueueInfo()
	require.Zero(t, qi.Archived)
	require.Zero(t, qi.FailedTotal, "duplicates are not counted as failures")
	require.Empty(t, ev.errs(middleware.EventError))
	switch {
	case policy.Wait > 0:
		// The waits outlast the work, so the duplicates waited and ran.
		require.Len(t, completed, tenants*perTenant, "every task ran")
		require.Positive(t, ev.count(middleware.EventWaited, 0))
	case policy.OnConflict == middleware.ActionRequeue:
		require.Len(t, completed, tenants*perTenant, "every requeued task ran")
		require.Positive(t, ev.count(middleware.EventRequeued, 0))
		require.Positive(t, copiesRan.Load(), "MaxRetry(0) duplicates were re-enqueued as copies and ran")
	default:
		require.Positive(t, len(skips))
	}
}

// With KeyByTaskID, asynq's own re-delivery of a task cannot overlap the run
// still in progress: here a shutdown puts the task back while its handler
// keeps working past the ctx cancellation; the other server gets the
// re-delivery, finds the key held and requeues it until the old run returns.
func TestTaskIDKeyKeepsRedeliveryFromOverlapping(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		for _, maxRetry := range []int{3, 0} {
			t.Run(fmt.Sprintf("MaxRetry(%d)", maxRetry), func(t *testing.T) {
				e := newEnvOn(t, r)
				tr := newTracker()
				evB := &events{}
				var calls atomic.Int32
				firstStarted := make(chan struct{})
				firstCancelled := make(chan error, 1)
				finish := make(chan struct{})
				firstDone := make(chan struct{})
				handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
					if calls.Add(1) == 1 {
						defer close(firstDone)
						tr.start("task")
						defer tr.end("task", "run")
						close(firstStarted)
						<-ctx.Done()
						firstCancelled <- context.Cause(ctx)
						<-finish // still working after the cancellation
						return nil
					}
					tr.start("task")
					tr.end("task", "run")
					return nil
				})
				newMW := func(owner string, obs middleware.Observer) asynq.MiddlewareFunc {
					opts := []singleton.Option{singleton.KeyByTaskID(), singleton.WithPolicy(middleware.Requeue(50 * time.Millisecond)), singleton.WithRedis(e.RDB)}
					if obs != nil {
						opts = append(opts, singleton.WithObserver(obs))
					}
					mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(owner)), opts...)
					require.NoError(t, err)
					return mw
				}
				cfgA := e.config(2)
				cfgA.ShutdownTimeout = 200 * time.Millisecond
				srvA := e.start(cfgA, newMW("server-a", nil)(handler))
				e.Enqueue(asynq.NewTask("sync", nil), asynq.MaxRetry(maxRetry))
				recv(t, firstStarted, 10*time.Second)

				e.start(e.config(2), newMW("server-b", evB.observe)(handler))
				srvA.Shutdown() // after 200ms: the task goes back to pending and the first run's ctx is cancelled
				require.ErrorIs(t, recv(t, firstCancelled, 10*time.Second), context.Canceled)

				require.Eventually(t, func() bool { return evB.count(middleware.EventRequeued, 0) >= 2 }, 10*time.Second, 5*time.Millisecond,
					"server B keeps requeuing the re-delivered task while the first run holds its key")
				require.EqualValues(t, 1, calls.Load(), "the re-delivery did not run")

				close(finish)
				recv(t, firstDone, 10*time.Second)
				require.Eventually(t, func() bool { return tr.completed()["run"] == 2 }, 10*time.Second, 5*time.Millisecond)
				e.Drained(10 * time.Second)
				require.Equal(t, map[string]int{"task": 1}, tr.peaks(), "the two runs never overlapped")
				qi := e.QueueInfo()
				require.Zero(t, qi.Archived)
				require.Zero(t, qi.FailedTotal)
			})
		}
	})
}

// If the lease is lost mid-run (here its key is deleted), the handler's ctx is
// cancelled with a cause matching lockkit.ErrLost, and the task's error says so.
// The lease's holders live in "<prefix>{<key>}:h"; on a cluster the
// ClusterClient sends the DEL to the node that owns the key's slot.
func TestLostLockCancelsTheHandler(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		mw, err := singleton.Middleware(e.locker(), singleton.WithTTL(300*time.Millisecond))
		require.NoError(t, err)
		started := make(chan struct{})
		causes := make(chan error, 1)
		e.start(e.config(2), mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		})))
		info := e.Enqueue(asynq.NewTask("sync", nil), asynq.MaxRetry(0))
		recv(t, started, 10*time.Second)
		n, err := e.RDB.Del(context.Background(), e.Prefix+"{asynq:sync}:h").Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the lease's holders key existed")

		cause := recv(t, causes, 5*time.Second)
		require.ErrorIs(t, cause, lockkit.ErrLost)
		require.Eventually(t, func() bool {
			ti, err := e.Inspector.GetTaskInfo(e.Queue, info.ID)
			return err == nil && ti.State == asynq.TaskStateArchived
		}, 10*time.Second, 10*time.Millisecond)
		ti, err := e.Inspector.GetTaskInfo(e.Queue, info.ID)
		require.NoError(t, err)
		require.Contains(t, ti.LastErr, "lockkit: lease lost")
	})
}

// A task whose key cannot be derived is archived (not retried, not completed)
// with a message naming its type and the reason.
func TestUnderivableKeyArchivesTheTask(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		l := e.locker()
		errs := &errorLog{}
		cfg := e.config(4)
		cfg.ErrorHandler = errs
		keyFn := func(key string, err error) singleton.Option {
			return singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return key, err })
		}
		cases := []struct {
			typ, payload string
			key          singleton.Option
			want         string
		}{
			{"report:not-json", `tenant=acme`, singleton.KeyByFields("tenant_id"), "payload is not a JSON object"},
			{"report:missing-field", `{"tenant":"acme"}`, singleton.KeyByFields("tenant_id"), `payload has no field "tenant_id"`},
			{"report:null-field", `{"tenant_id":null}`, singleton.KeyByFields("tenant_id"), `field "tenant_id" is null`},
			{"report:empty-field", `{"tenant_id":""}`, singleton.KeyByFields("tenant_id"), `field "tenant_id" is empty`},
			{"report:func-error", `{}`, keyFn("", errors.New("no region")), "no region"},
			{"report:empty-key", `{}`, keyFn("", nil), "the key is empty"},
		}
		var ran atomic.Int32
		mux := asynq.NewServeMux()
		for _, c := range cases {
			mw, err := singleton.Middleware(l, c.key)
			require.NoError(t, err)
			mux.Handle(c.typ, mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran.Add(1); return nil })))
		}
		ids := map[string]string{}
		for _, c := range cases {
			// The default MaxRetry (25) and a Retention: a retry or a completion would show.
			ids[c.typ] = e.Enqueue(asynq.NewTask(c.typ, []byte(c.payload)), asynq.Retention(time.Hour)).ID
		}
		e.start(cfg, mux)
		for _, c := range cases {
			t.Run(c.typ, func(t *testing.T) {
				var ti *asynq.TaskInfo
				require.Eventually(t, func() bool {
					var err error
					ti, err = e.Inspector.GetTaskInfo(e.Queue, ids[c.typ])
					return err == nil && ti.State == asynq.TaskStateArchived
				}, 10*time.Second, 10*time.Millisecond)
				require.Zero(t, ti.Retried)
				require.Contains(t, ti.LastErr, "singleton: cannot derive key")
				require.Contains(t, ti.LastErr, fmt.Sprintf("task %q", c.typ))
				require.Contains(t, ti.LastErr, c.want)
			})
		}
		require.Zero(t, ran.Load())
		qi := e.QueueInfo()
		require.Zero(t, qi.Completed)
		require.Equal(t, len(cases), qi.Archived)
		require.True(t, errs.any(func(err error) bool { return errors.Is(err, singleton.ErrKey) && errors.Is(err, asynq.SkipRetry) }), errs.String())
	})
}

// Fail leaves a duplicate to asynq's normal retry: it counts as a failure and
// uses a retry, and the error matches middleware.ErrDuplicate.
func TestFailPolicyUsesAsynqRetry(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		lease, err := e.locker().TryAcquire(context.Background(), "asynq:report", nil)
		require.NoError(t, err)
		mw, err := singleton.Middleware(e.locker(), singleton.WithPolicy(middleware.Fail()))
		require.NoError(t, err)
		errs := &errorLog{}
		cfg := e.config(2)
		cfg.ErrorHandler = errs
		// At least a second apart (asynq schedules in whole seconds): the 25
		// retries outlast the test by far.
		cfg.RetryDelayFunc = singleton.RetryDelay(func(int, error, *asynq.Task) time.Duration { return 2 * time.Second })
		var ran atomic.Int32
		e.start(cfg, mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran.Add(1); return nil })))
		info := e.Enqueue(asynq.NewTask("report", nil))

		require.Eventually(t, func() bool {
			ti, err := e.Inspector.GetTaskInfo(e.Queue, info.ID)
			return err == nil && ti.Retried >= 1
		}, 10*time.Second, 5*time.Millisecond)
		require.Zero(t, ran.Load())
		require.NoError(t, lease.Release(context.Background()))
		require.Eventually(t, func() bool { return ran.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
		e.Drained(10 * time.Second)

		require.True(t, errs.any(func(err error) bool { return errors.Is(err, middleware.ErrDuplicate) }), errs.String())
		require.Positive(t, e.QueueInfo().FailedTotal)
	})
}

// A duplicate with no retries left is re-enqueued as a copy that keeps the
// queue, payload, headers, Timeout and Retention; the original is revoked (not
// archived, not completed, not counted as a failure). The copy carries the
// original's ID in OriginHeader and needs no Unique lock.
func TestRequeueCopiesATaskWithNoRetriesLeft(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		lease, err := e.locker().TryAcquire(context.Background(), "asynq:report", nil)
		require.NoError(t, err)
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(),
			singleton.WithPolicy(middleware.Requeue(time.Hour)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		ran := make(chan *asynq.Task, 1)
		e.start(e.config(2), mw(asynq.HandlerFunc(func(_ context.Context, task *asynq.Task) error {
			ran <- task
			return nil
		})))
		orig := e.Enqueue(asynq.NewTaskWithHeaders("report", []byte(`{"n":1}`), map[string]string{"trace": "abc"}),
			asynq.MaxRetry(0), asynq.Timeout(7*time.Minute), asynq.Retention(time.Hour), asynq.Unique(time.Hour),
			asynq.TaskID("invoice-42"))

		var copied *asynq.TaskInfo
		require.Eventually(t, func() bool {
			tasks, err := e.Inspector.ListScheduledTasks(e.Queue)
			if err != nil || len(tasks) != 1 {
				return false
			}
			copied = tasks[0]
			return true
		}, 10*time.Second, 5*time.Millisecond)
		// The copy is enqueued before the original is revoked, so the
		// original may still be active for a moment.
		require.Eventually(t, func() bool {
			_, err := e.Inspector.GetTaskInfo(e.Queue, orig.ID)
			return errors.Is(err, asynq.ErrTaskNotFound)
		}, 10*time.Second, 5*time.Millisecond, "the original was revoked")
		require.NotEqual(t, orig.ID, copied.ID)
		require.Equal(t, "report", copied.Type)
		require.Equal(t, `{"n":1}`, string(copied.Payload))
		require.Equal(t, map[string]string{"trace": "abc", singleton.OriginHeader: "invoice-42"}, copied.Headers)
		require.Equal(t, e.Queue, copied.Queue)
		require.Zero(t, copied.MaxRetry)
		require.Equal(t, 7*time.Minute, copied.Timeout)
		require.Equal(t, time.Hour, copied.Retention)
		require.WithinDuration(t, time.Now().Add(time.Hour), copied.NextProcessAt, 31*time.Minute, "the policy's delay plus jitter")
		require.Equal(t, 1, ev.count(middleware.EventRequeued, 0))

		require.NoError(t, lease.Release(context.Background()))
		require.NoError(t, e.Inspector.RunTask(e.Queue, copied.ID))
		task := recv(t, ran, 10*time.Second)
		require.Equal(t, "invoice-42", task.Headers()[singleton.OriginHeader])
		require.Eventually(t, func() bool {
			ti, err := e.Inspector.GetTaskInfo(e.Queue, copied.ID)
			return err == nil && ti.State == asynq.TaskStateCompleted
		}, 10*time.Second, 5*time.Millisecond)
		qi := e.QueueInfo()
		require.Zero(t, qi.Archived)
		require.Zero(t, qi.FailedTotal)
	})
}

// Without singleton.IsFailure in the server's config a requeue is retried as a
// failure and uses up the retries; then copies take over, so the task is still
// never archived for being a duplicate.
func TestRequeueWithoutIsFailureStillNeverArchives(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		lease, err := e.locker().TryAcquire(context.Background(), "asynq:report", nil)
		require.NoError(t, err)
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(),
			singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		cfg := e.config(2)
		cfg.IsFailure = nil
		var ran atomic.Int32
		e.start(cfg, mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran.Add(1); return nil })))
		e.Enqueue(asynq.NewTask("report", nil), asynq.MaxRetry(2))

		require.Eventually(t, func() bool { return ev.count(middleware.EventRequeued, 0) >= 4 }, 10*time.Second, 5*time.Millisecond,
			"two retries counted as failures, then copies")
		require.NoError(t, lease.Release(context.Background()))
		require.Eventually(t, func() bool { return ran.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
		e.Drained(10 * time.Second)
		qi := e.QueueInfo()
		require.Zero(t, qi.Archived)
		require.Equal(t, 2, qi.FailedTotal)
	})
}

// PerQueue scopes keys to the queue: the same work in two queues runs at once.
func TestPerQueueScopesTheKey(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		other := e.Queue + "-b"
		t.Cleanup(func() { _ = e.Inspector.DeleteQueue(other, true) })
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(), singleton.PerQueue(), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		started := make(chan string, 2)
		release := make(chan struct{})
		cfg := e.config(4)
		cfg.Queues = map[string]int{e.Queue: 1, other: 1}
		e.start(cfg, mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			q, _ := asynq.GetQueueName(ctx)
			started <- q
			<-release
			return nil
		})))
		e.Enqueue(asynq.NewTask("report", nil))
		e.Enqueue(asynq.NewTask("report", nil), asynq.Queue(other))
		got := map[string]bool{recv(t, started, 10*time.Second): true, recv(t, started, 10*time.Second): true}
		require.Equal(t, map[string]bool{e.Queue: true, other: true}, got, "both ran at the same time")
		close(release)
		require.Eventually(t, func() bool { return ev.count(middleware.EventReleased, 0) == 2 }, 10*time.Second, 5*time.Millisecond)
		ev.mu.Lock()
		defer ev.mu.Unlock()
		keys := map[string]bool{}
		for _, x := range ev.list {
			keys[x.Job.Key] = true
		}
		require.Equal(t, map[string]bool{"asynq:report@" + e.Queue: true, "asynq:report@" + other: true}, keys)
	})
}
