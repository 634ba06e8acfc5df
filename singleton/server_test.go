package singleton_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/debounce"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/internal/testredis"
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
		opts   []singleton.ServerOption
	}{
		{"skip", middleware.Skip(), 1, nil},
		{"requeue, async release", middleware.Requeue(50 * time.Millisecond), 1, []singleton.ServerOption{singleton.WithAsyncRelease()}},
		{"requeue", middleware.Requeue(50 * time.Millisecond), 1, nil},
		// A minute's delay outlasts the test: only parking (the run that
		// frees the key starts the oldest parked duplicate) finishes it.
		{"requeue parks until the key is free", middleware.Requeue(time.Minute), 1, nil},
		{"wait in order then requeue", middleware.WaitInOrder(100*time.Millisecond, middleware.Requeue(50*time.Millisecond)), 1, nil},
		{"limit 2 then requeue", middleware.Requeue(50 * time.Millisecond), 2, nil},
		{"coalesce", middleware.Coalesce(), 1, nil},
		{"coalesce, async release", middleware.Coalesce(), 1, []singleton.ServerOption{singleton.WithAsyncRelease()}},
	}
	onEachRedis(t, func(t *testing.T, r connect) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) { testBurst(t, newEnvOn(t, r), c.policy, c.limit, c.opts...) })
		}
	})
}

// testBurst is one case of TestBurstAcrossServers.
func testBurst(t *testing.T, e *env, policy middleware.Policy, limit int, opts ...singleton.ServerOption) {
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
			append([]singleton.ServerOption{singleton.KeyByFields("tenant_id"),
				singleton.WithPolicy(policy),
				singleton.WithLimit(limit),
				singleton.WithRedis(e.RDB),
				singleton.WithObserver(ev.observe)}, opts...)...)
		require.NoError(t, err)
		mux := asynq.NewServeMux()
		mux.Use(mw)
		mux.HandleFunc("report", func(_ context.Context, task *asynq.Task) error {
			tenant, n, err := reportOf(task)
			if err != nil {
				return err
			}
			if task.Headers()[asynqkey.LabelHeader] != "" {
				copiesRan.Add(1)
			}
			tr.start(tenant)
			time.Sleep(30 * time.Millisecond) // the work
			tr.end(tenant, fmt.Sprintf("%s/%d", tenant, n))
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
	case strings.HasPrefix(policy.String(), "Wait"):
		// The waits outlast the work, so the duplicates waited and ran.
		require.Len(t, completed, tenants*perTenant, "every task ran")
		require.Positive(t, ev.count(middleware.EventWaited, 0))
	case guard.ActionOf(policy) == guard.ActionRequeue:
		require.Len(t, completed, tenants*perTenant, "every requeued task ran")
		require.Positive(t, ev.count(middleware.EventRequeued, 0))
		require.Positive(t, copiesRan.Load(), "MaxRetry(0) duplicates were re-enqueued as copies and ran")
	case guard.ModeOf(policy) == guard.ModeCoalesce:
		// Every task was enqueued before the servers started: a run covers
		// the tasks delivered after it began, a follow-up those delivered
		// while it ran. The deliveries spread over a few runs at most.
		runs := 0
		for _, n := range completed {
			runs += n
		}
		require.Positive(t, len(skips))
		require.Less(t, runs, tenants*perTenant, "duplicates were coalesced")
		t.Logf("coalesce: %d tasks, %d runs", tenants*perTenant, runs)
	default:
		require.Positive(t, len(skips))
	}
}

// Coalesce under a steady stream: tasks of one key, half of them stamped by
// singleton.Client, are enqueued while two servers process them, the first
// run lasting until the stream ends. A task completes without running only
// when a run of its key began after it was enqueued, and the stream costs
// far fewer runs than tasks. With WithRedis ("parked") the follow-up parks
// instead of holding a worker, and every task is accounted for long before
// a parked task's backstop.
func TestCoalesceSteadyStream(t *testing.T) {
	for _, parked := range []bool{false, true} {
		t.Run(map[bool]string{false: "waiting", true: "parked"}[parked], func(t *testing.T) { testCoalesceSteadyStream(t, parked) })
	}
}

func testCoalesceSteadyStream(t *testing.T, parked bool) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		const tasks = 60
		streamed := make(chan struct{}) // closed when every task is enqueued
		ev := &events{}
		var (
			mu       sync.Mutex
			starts   []time.Time              // handler starts
			enqueued = map[string]time.Time{} // task ID → when its enqueue began
			ran      = map[string]bool{}
		)
		for i := range 2 {
			opts := []singleton.ServerOption{singleton.WithPolicy(middleware.Coalesce()), singleton.WithObserver(ev.observe)}
			if parked {
				opts = append(opts, singleton.WithRedis(e.RDB))
			}
			mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))), opts...)
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			mux.HandleFunc("sync", func(ctx context.Context, task *asynq.Task) error {
				id, _ := asynq.GetTaskID(ctx)
				mu.Lock()
				starts = append(starts, time.Now())
				first := len(starts) == 1
				ran[id] = true
				mu.Unlock()
				if first {
					<-streamed // a long first run: the stream arrives while it lasts
				}
				time.Sleep(20 * time.Millisecond) // the work
				return nil
			})
			e.start(e.config(4), mux)
		}
		client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB)
		require.NoError(t, err)
		for n := range tasks {
			at := time.Now()
			task := asynq.NewTask("sync", []byte(fmt.Sprint(n)))
			var info *asynq.TaskInfo
			if n%2 == 0 {
				// Stamped: covered by a run that began after the enqueue.
				info, err = client.Enqueue(task, asynq.Queue(e.Queue))
				require.NoError(t, err)
			} else {
				// Plain: covered by a run that began after the delivery.
				info = e.Enqueue(task)
			}
			mu.Lock()
			enqueued[info.ID] = at
			mu.Unlock()
			time.Sleep(3 * time.Millisecond)
		}
		close(streamed)
		covered := func() map[string]bool {
			ev.mu.Lock()
			defer ev.mu.Unlock()
			out := map[string]bool{}
			for _, x := range ev.list {
				if x.Kind == middleware.EventDuplicate && x.Action == middleware.ActionSkip {
					require.ErrorIs(t, x.Err, lockcore.ErrCovered)
					out[x.Job.ID] = true
				}
			}
			return out
		}
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(ran)+len(covered()) == tasks
		}, parkBackstop/2, 10*time.Millisecond)
		e.Drained(10 * time.Second)

		mu.Lock()
		defer mu.Unlock()
		cov := covered()
		for id := range cov {
			require.False(t, ran[id], "task %s ran and was covered", id)
			later := false
			for _, s := range starts {
				later = later || s.After(enqueued[id])
			}
			require.True(t, later, "task %s completed without running, but no run began after its enqueue", id)
		}
		require.Positive(t, len(cov))
		require.Less(t, len(starts), tasks/2, "the stream was coalesced")
		require.Empty(t, ev.errs(middleware.EventError))
		qi := e.QueueInfo()
		require.Zero(t, qi.Archived)
		require.Zero(t, qi.FailedTotal)
		t.Logf("steady stream: %d tasks, %d runs, %d covered, %d parked", tasks, len(starts), len(cov), ev.count(middleware.EventRequeued, 0))
	})
}

// A rolling deploy: server A shuts down while a handler runs past its
// ShutdownTimeout, so asynq puts the task back while the handler still works;
// server B gets the re-delivery. With every key option and policy, the
// re-delivery waits for the run in progress (it is never skipped as a
// duplicate of itself). If that run then succeeds, the work is done and the
// re-delivery completes without running; if it fails, the re-delivery runs.
// Either way the work is done exactly once and the runs never overlap.
func TestRollingDeployDoesTheWorkOnce(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		cases := []struct {
			name     string
			opts     []singleton.ServerOption
			maxRetry int
			firstErr error
		}{
			{"defaults", nil, 3, nil},
			{"defaults/first run fails", nil, 3, errors.New("interrupted")},
			{"KeyByTaskID/Requeue", []singleton.ServerOption{singleton.KeyByTaskID(), singleton.WithPolicy(middleware.Requeue(50 * time.Millisecond))}, 3, nil},
			{"KeyByTaskID/Requeue/MaxRetry(0)", []singleton.ServerOption{singleton.KeyByTaskID(), singleton.WithPolicy(middleware.Requeue(50 * time.Millisecond))}, 0, nil},
			{"Fail/first run fails", []singleton.ServerOption{singleton.WithPolicy(middleware.Fail())}, 3, errors.New("interrupted")},
			// The first run spent the throttle's only start: its re-delivery
			// still waits for it, and runs when it failed.
			{"Throttle(1)/first run fails", []singleton.ServerOption{singleton.WithThrottle(1, time.Minute, middleware.ActionSkip)}, 3, errors.New("interrupted")},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnvOn(t, r)
				tr := newTracker()
				var calls, done atomic.Int32
				firstStarted := make(chan struct{})
				firstCancelled := make(chan error, 1)
				finish := make(chan struct{})
				firstReturned := make(chan struct{})
				handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
					tr.start("task")
					defer tr.end("task", "run")
					if calls.Add(1) == 1 {
						defer close(firstReturned)
						close(firstStarted)
						<-ctx.Done()
						firstCancelled <- context.Cause(ctx)
						<-finish // still working after the cancellation
						if tc.firstErr != nil {
							return tc.firstErr
						}
						done.Add(1)
						return nil
					}
					done.Add(1)
					return nil
				})
				newMW := func(l *lockkit.Locker) asynq.MiddlewareFunc {
					mw, err := singleton.Middleware(l, append([]singleton.ServerOption{singleton.WithRedis(e.RDB)}, tc.opts...)...)
					require.NoError(t, err)
					return mw
				}
				cfgA := e.config(2)
				cfgA.ShutdownTimeout = 200 * time.Millisecond
				srvA := e.start(cfgA, newMW(e.locker(lockkit.WithOwner("server-a")))(handler))
				info := e.Enqueue(asynq.NewTask("sync", nil), asynq.MaxRetry(tc.maxRetry))
				recv(t, firstStarted, 10*time.Second)

				lockerB := e.locker(lockkit.WithOwner("server-b"))
				cfgB := e.configRetrying(2, func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond })
				e.start(cfgB, newMW(lockerB)(handler))
				srvA.Shutdown() // after 200ms: the task goes back to pending and the first run's ctx is cancelled
				require.ErrorIs(t, recv(t, firstCancelled, 10*time.Second), context.Canceled)

				key := "asynq:sync"
				if strings.HasPrefix(tc.name, "KeyByTaskID") {
					key = "asynq:sync:id:" + info.ID
				}
				// Server B holds the re-delivery while the first run holds the key.
				require.Eventually(t, func() bool {
					i, err := lockerB.Inspect(context.Background(), key)
					require.NoError(t, err)
					return i.Waiters == 1
				}, 10*time.Second, 5*time.Millisecond, "the re-delivery waits for the run in progress")
				require.EqualValues(t, 1, calls.Load(), "the re-delivery did not run")

				close(finish)
				recv(t, firstReturned, 10*time.Second)
				e.Drained(10 * time.Second)
				require.EqualValues(t, 1, done.Load(), "the work was done exactly once")
				wantCalls := 1
				if tc.firstErr != nil {
					wantCalls = 2
				}
				require.EqualValues(t, wantCalls, calls.Load())
				require.Equal(t, map[string]int{"task": 1}, tr.peaks(), "the runs never overlapped")
				qi := e.QueueInfo()
				require.Zero(t, qi.Archived)
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
		keyFn := func(key string, err error) singleton.ServerOption {
			return singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return key, err })
		}
		cases := []struct {
			typ, payload string
			key          singleton.ServerOption
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
		// At least a second apart (asynq schedules in whole seconds): the 25
		// retries outlast the test by far.
		cfg := e.configRetrying(2, func(int, error, *asynq.Task) time.Duration { return 2 * time.Second })
		cfg.ErrorHandler = errs
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
// original's ID in asynqkey.LabelHeader and needs no Unique lock.
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
		require.NotEmpty(t, copied.Headers["jobguard-copy"])
		delete(copied.Headers, "jobguard-copy")
		require.Equal(t, map[string]string{"trace": "abc", asynqkey.LabelHeader: "invoice-42"}, copied.Headers)
		require.Equal(t, e.Queue, copied.Queue)
		require.Zero(t, copied.MaxRetry)
		require.Equal(t, 7*time.Minute, copied.Timeout)
		require.Equal(t, time.Hour, copied.Retention)
		require.WithinDuration(t, time.Now().Add(time.Hour), copied.NextProcessAt, 31*time.Minute, "the policy's delay plus jitter")
		require.Equal(t, 1, ev.count(middleware.EventRequeued, 0))

		require.NoError(t, lease.Release(context.Background()))
		require.NoError(t, e.Inspector.RunTask(e.Queue, copied.ID))
		task := recv(t, ran, 10*time.Second)
		require.Equal(t, "invoice-42", task.Headers()[asynqkey.LabelHeader])
		require.Eventually(t, func() bool {
			ti, err := e.Inspector.GetTaskInfo(e.Queue, copied.ID)
			return err == nil && ti.State == asynq.TaskStateCompleted
		}, 10*time.Second, 5*time.Millisecond)
		qi := e.QueueInfo()
		require.Zero(t, qi.Archived)
		require.Zero(t, qi.FailedTotal)
	})
}

// A caller that reuses its task ID (free once Requeue replaced the first
// task with it by a copy) and keeps completed tasks (asynq.Retention): each
// round's task is requeued as a copy whose ID no earlier round's copy has,
// and every round's work runs once, none archived.
func TestRequeueCopyIDsAreUniquePerEnqueue(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(), singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil }),
			singleton.WithPolicy(middleware.Requeue(time.Hour)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		holderStarted, ran := make(chan string, 1), make(chan string, 4)
		var release chan struct{}
		var mu sync.Mutex
		e.start(e.config(2), mw(asynq.HandlerFunc(func(_ context.Context, task *asynq.Task) error {
			if string(task.Payload()) == "holder" {
				mu.Lock()
				rel := release
				mu.Unlock()
				holderStarted <- ""
				<-rel
				return nil
			}
			ran <- string(task.Payload())
			return nil
		})))
		copies := map[string]bool{}
		for round := 1; round <= 3; round++ {
			mu.Lock()
			release = make(chan struct{})
			mu.Unlock()
			e.Enqueue(asynq.NewTask("report", []byte("holder")))
			recv(t, holderStarted, 10*time.Second)
			work := fmt.Sprintf("work-%d", round)
			e.Enqueue(asynq.NewTask("report", []byte(work)), asynq.TaskID("invoice-7"), asynq.MaxRetry(0), asynq.Retention(time.Hour))
			ev.waitRequeued(t, round, "round %d: the task is parked behind the holder, as a copy", round)
			require.Eventually(t, func() bool {
				_, err := e.Inspector.GetTaskInfo(e.Queue, "invoice-7")
				return errors.Is(err, asynq.ErrTaskNotFound)
			}, 10*time.Second, 5*time.Millisecond, "round %d: the copy replaced the task", round)
			close(release)
			require.Equal(t, work, recv(t, ran, 10*time.Second), "round %d", round)
			require.Eventually(t, func() bool {
				done, err := e.Inspector.ListCompletedTasks(e.Queue)
				for _, ti := range done {
					if ti.Headers[asynqkey.LabelHeader] == "invoice-7" {
						copies[ti.ID] = true
					}
				}
				return err == nil && len(copies) == round
			}, 10*time.Second, 5*time.Millisecond, "round %d: the copy completed, kept by Retention, with an ID of its own", round)
		}
		require.Empty(t, ran, "no work ran twice")
		require.Empty(t, ev.errs(middleware.EventError))
		require.Zero(t, e.QueueInfo().Archived)
	})
}

// Without ServerConfig's IsFailure in the server's config a requeue is retried as a
// failure and uses up the retries; then copies take over, so the task is still
// never archived for being a duplicate.
func TestRequeueWithoutIsFailureStillNeverArchives(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		// A parked duplicate comes back by itself when the holder's lease
		// would run out unrenewed: a short one, renewed.
		mw, err := singleton.Middleware(e.locker(), singleton.WithTTL(time.Second),
			singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		cfg := e.config(2)
		cfg.IsFailure = nil
		mux, runs, release := blockingMux(mw, "report")
		e.start(cfg, mux)
		e.Enqueue(asynq.NewTask("report", []byte("holder")))
		require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
		e.Enqueue(asynq.NewTask("report", []byte("dup")), asynq.MaxRetry(2))

		// Two retries counted as failures, then copies (the third and the
		// fourth), parked in the original's place.
		require.Eventually(t, func() bool { return ev.count(middleware.EventRequeued, 0) >= 4 }, 20*time.Second, 5*time.Millisecond,
			"two retries counted as failures, then copies")
		close(release) // the holder's run ends, and its release resumes the copy
		require.Eventually(t, func() bool { return len(runs.payloads()) == 2 }, 10*time.Second, 5*time.Millisecond)
		e.Drained(10 * time.Second)
		qi := e.QueueInfo()
		require.Zero(t, qi.Archived)
		require.Equal(t, 2, qi.FailedTotal)
		require.Equal(t, []string{"holder", "dup"}, runs.payloads())
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

// A Redis error or an acquire whose outcome is unknown fails the task (asynq
// retries it); it never completes the task as a duplicate. Here the lock's
// client loses the reply of the acquire script (it ran) or sends it twice.
func TestRedisErrorIsNeverADuplicate(t *testing.T) {
	for _, f := range []testredis.Fault{testredis.DropReply, testredis.Repeat, testredis.Late} {
		t.Run(f.String(), func(t *testing.T) {
			e := newEnvOn(t, standalone)
			c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), DB: testDB})
			t.Cleanup(func() { _ = c.Close() })
			// The acquire script: plain_acquire.lua for the plain lock of a
			// Skip policy, acquire.lua for the others.
			plain, full := testredis.ScriptShape(1, 2), testredis.ScriptShape(8, 20)
			hook := &testredis.Faults{Match: func(c redis.Cmder) bool { return plain(c) || full(c) }, Delay: 100 * time.Millisecond}
			c.AddHook(hook)
			l, err := lockkit.NewRedis(c, lockkit.WithPrefix(e.Prefix))
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			ev := &events{}
			mw, err := singleton.Middleware(l, singleton.WithObserver(ev.observe))
			require.NoError(t, err)
			var runs atomic.Int32
			cfg := e.configRetrying(1, func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond })
			hook.Arm(f, 1)
			e.start(cfg, mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
				runs.Add(1)
				return nil
			})))
			e.Enqueue(asynq.NewTask("sync", nil), asynq.MaxRetry(3))
			e.Drained(10 * time.Second)
			require.EqualValues(t, 1, hook.Hits())
			require.EqualValues(t, 1, runs.Load(), "the task ran")
			require.Zero(t, ev.count(middleware.EventDuplicate, 0), "no delivery was taken for a duplicate")
			require.Zero(t, e.QueueInfo().Archived)
		})
	}
}

// Coalesce with tasks stamped by singleton.Client: every task enqueued before
// the first run of its key began is covered by that run, so a burst enqueued
// before the servers start runs exactly once per key.
func TestCoalesceStampedBurstRunsOncePerKey(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		const tenants, perTenant = 3, 10
		client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB)
		require.NoError(t, err)
		var last int64
		for n := range tenants * perTenant {
			info, err := client.Enqueue(asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":"t%d"}`, n%tenants)), asynq.Queue(e.Queue))
			require.NoError(t, err)
			us, err := strconv.ParseInt(info.Headers[asynqkey.EnqueuedAtHeader], 10, 64)
			require.NoError(t, err)
			last = max(last, us)
		}
		// The stamps are upper bounds of the Redis clock: start once it has
		// passed them all, as any later enqueue-then-process would.
		require.Eventually(t, func() bool {
			now, err := e.RDB.Time(context.Background()).Result()
			require.NoError(t, err)
			return now.UnixMicro() > last
		}, 5*time.Second, time.Millisecond)

		ev := &events{}
		tr := newTracker()
		for i := range 2 {
			mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))),
				singleton.KeyByFields("tenant_id"), singleton.WithPolicy(middleware.Coalesce()), singleton.WithObserver(ev.observe))
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			mux.HandleFunc("report", func(ctx context.Context, task *asynq.Task) error {
				id, _ := asynq.GetTaskID(ctx)
				var p struct {
					Tenant string `json:"tenant_id"`
				}
				if err := json.Unmarshal(task.Payload(), &p); err != nil {
					return err
				}
				tr.start(p.Tenant)
				time.Sleep(20 * time.Millisecond) // the work
				tr.end(p.Tenant, id)
				return nil
			})
			e.start(e.config(4), mux)
		}
		require.Eventually(t, func() bool {
			return len(tr.completed())+ev.count(middleware.EventDuplicate, middleware.ActionSkip) == tenants*perTenant
		}, 30*time.Second, 10*time.Millisecond)
		e.Drained(10 * time.Second)
		require.Len(t, tr.completed(), tenants, "one run per key")
		for tenant, peak := range tr.peaks() {
			require.Equal(t, 1, peak, "tenant %s", tenant)
		}
		require.Empty(t, ev.errs(middleware.EventError))
		qi := e.QueueInfo()
		require.Zero(t, qi.Archived)
		require.Zero(t, qi.FailedTotal)
	})
}

// Coalesce: a task completed without running because a run of its key that
// began after it was in progress rests on that run. If the run fails, asynq's
// retry does the work. A run that asynq does not retry (MaxRetry(0), or its
// last retry) covers no other task: a task delivered meanwhile waits for it
// and runs, so its failure loses no other task's work.
func TestCoalesceFailedCoveringRunLosesNoWork(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		for _, maxRetry := range []int{1, 0} {
			t.Run(fmt.Sprintf("MaxRetry(%d)", maxRetry), func(t *testing.T) {
				e := newEnvOn(t, r)
				client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB)
				require.NoError(t, err)
				var last int64
				for range 2 {
					info, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"t"}`)), asynq.Queue(e.Queue), asynq.MaxRetry(maxRetry))
					require.NoError(t, err)
					us, err := strconv.ParseInt(info.Headers[asynqkey.EnqueuedAtHeader], 10, 64)
					require.NoError(t, err)
					last = max(last, us)
				}
				require.Eventually(t, func() bool {
					now, err := e.RDB.Time(context.Background()).Result()
					require.NoError(t, err)
					return now.UnixMicro() > last
				}, 5*time.Second, time.Millisecond)
				ev := &events{}
				mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"),
					singleton.WithPolicy(middleware.Coalesce()), singleton.WithObserver(ev.observe))
				require.NoError(t, err)
				mux := asynq.NewServeMux()
				mux.Use(mw)
				var runs atomic.Int32
				mux.HandleFunc("report", func(ctx context.Context, _ *asynq.Task) error {
					if runs.Add(1) > 1 {
						return nil
					}
					// The first run fails once the other task was delivered:
					// completed without running (it is retried), or active,
					// waiting for the key (it is not).
					for ev.count(middleware.EventDuplicate, middleware.ActionSkip) == 0 {
						if qi, err := e.Inspector.GetQueueInfo(e.Queue); err == nil && qi.Active == 2 && maxRetry == 0 {
							break
						}
						select {
						case <-ctx.Done():
							return ctx.Err()
						case <-time.After(time.Millisecond):
						}
					}
					return errors.New("the work failed")
				})
				cfg := e.config(2)
				cfg.RetryDelayFunc = func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond }
				e.start(cfg, mux)
				require.Eventually(t, func() bool { return runs.Load() == 2 }, 10*time.Second, 5*time.Millisecond, "the work is done after the failure")
				if maxRetry > 0 {
					require.Equal(t, 1, ev.count(middleware.EventDuplicate, middleware.ActionSkip), "covered by the run, done by its retry")
					e.Drained(10 * time.Second)
					return
				}
				require.Eventually(t, func() bool { return e.QueueInfo().Archived == 1 }, 10*time.Second, 5*time.Millisecond, "the failed run")
				require.Zero(t, ev.count(middleware.EventDuplicate, middleware.ActionSkip), "a run that is not retried covers nothing")
				require.Equal(t, int32(2), runs.Load())
			})
		}
	})
}

// WithHoldAtLeast: a key runs at most once per period. A duplicate delivered
// after a fast run ended, but within the period of its start, is skipped;
// one delivered after the period runs.
func TestHoldAtLeastRunsAKeyOncePerPeriod(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		const hold = time.Second
		ev := &events{}
		starts := make(chan time.Time, 8)
		mw, err := singleton.Middleware(e.locker(), singleton.WithHoldAtLeast(hold), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		mux := asynq.NewServeMux()
		mux.Use(mw)
		mux.HandleFunc("refresh", func(context.Context, *asynq.Task) error {
			starts <- time.Now()
			return nil
		})
		e.start(e.config(2), mux)

		e.Enqueue(asynq.NewTask("refresh", nil))
		first := recv(t, starts, 10*time.Second)
		e.Drained(10 * time.Second)
		e.Enqueue(asynq.NewTask("refresh", nil))
		require.Eventually(t, func() bool { return ev.count(middleware.EventDuplicate, middleware.ActionSkip) == 1 }, 10*time.Second, 5*time.Millisecond,
			"a duplicate within the period is skipped")
		require.Empty(t, starts)

		time.Sleep(time.Until(first.Add(hold + 50*time.Millisecond))) // the period ends
		e.Enqueue(asynq.NewTask("refresh", nil))
		second := recv(t, starts, 10*time.Second)
		require.GreaterOrEqual(t, second.Sub(first), hold)
	})
}

// WithThrottle: at most n starts of a key per period. Over the budget a task
// is skipped, or put back to run when the next start opens.
func TestThrottle(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		for _, then := range []middleware.Action{middleware.ActionSkip, middleware.ActionRequeue} {
			t.Run(then.String(), func(t *testing.T) {
				e := newEnvOn(t, r)
				const n, tasks, period = 2, 4, 1500 * time.Millisecond
				ev := &events{}
				var mu sync.Mutex
				var starts []time.Time
				for range tasks {
					e.Enqueue(asynq.NewTask("sync", nil))
				}
				mw, err := singleton.Middleware(e.locker(), singleton.WithThrottle(n, period, then), singleton.WithLimit(n),
					singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
				require.NoError(t, err)
				mux := asynq.NewServeMux()
				mux.Use(mw)
				mux.HandleFunc("sync", func(context.Context, *asynq.Task) error {
					mu.Lock()
					starts = append(starts, time.Now())
					mu.Unlock()
					return nil
				})
				e.start(e.config(4), mux)
				ran := func() int {
					mu.Lock()
					defer mu.Unlock()
					return len(starts)
				}
				if then == middleware.ActionSkip {
					require.Eventually(t, func() bool {
						return ran()+ev.count(middleware.EventDuplicate, middleware.ActionSkip) == tasks
					}, 10*time.Second, 5*time.Millisecond)
					e.Drained(10 * time.Second)
					require.Equal(t, n, ran(), "the budget's starts ran; the others were skipped")
					return
				}
				require.Eventually(t, func() bool { return ran() == tasks }, 20*time.Second, 10*time.Millisecond, "every task ran in the end")
				e.Drained(10 * time.Second)
				require.GreaterOrEqual(t, ev.count(middleware.EventRequeued, 0), tasks-n)
				mu.Lock()
				defer mu.Unlock()
				require.GreaterOrEqual(t, starts[tasks-1].Sub(starts[0]), period/2, "the requeued ones waited for the next starts")
				qi := e.QueueInfo()
				require.Zero(t, qi.Archived)
				require.Zero(t, qi.FailedTotal, "a throttled task is no failure")
			})
		}
	})
}

// A burst of tasks of one key over WithThrottle's budget, put back
// (ActionRequeue): each comes back about when a start opens for it, not all
// at the first opening, so every task runs once after about two deliveries.
func TestThrottledBurstComesBackInTurn(t *testing.T) {
	e := newEnvOn(t, standalone)
	const n, tasks, period = 2, 16, 1000 * time.Millisecond
	var deliveries, runs atomic.Int64
	ran := make(map[string]int)
	var mu sync.Mutex
	mw, err := singleton.Middleware(e.locker(), singleton.WithThrottle(n, period, middleware.ActionRequeue), singleton.WithLimit(tasks),
		singleton.WithRedis(e.RDB))
	require.NoError(t, err)
	mux := asynq.NewServeMux()
	mux.Use(func(h asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			deliveries.Add(1)
			return h.ProcessTask(ctx, t)
		})
	}, mw)
	mux.HandleFunc("sync", func(_ context.Context, t *asynq.Task) error {
		mu.Lock()
		ran[string(t.Payload())]++
		mu.Unlock()
		runs.Add(1)
		return nil
	})
	for i := range tasks {
		e.Enqueue(asynq.NewTask("sync", []byte(strconv.Itoa(i))))
	}
	e.start(e.config(tasks), mux)
	require.Eventually(t, func() bool { return runs.Load() == tasks }, 20*time.Second, 10*time.Millisecond, "every task ran in the end")
	e.Drained(10 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	for i := range tasks {
		require.Equal(t, 1, ran[strconv.Itoa(i)], "task %d ran once", i)
	}
	t.Logf("%d tasks, %d deliveries", tasks, deliveries.Load())
	require.LessOrEqual(t, deliveries.Load(), int64(tasks*5/2), "about two deliveries a task")
}

// KeepNewest: while a run holds the key, one follow-up waits, the newest; the
// one it replaces completes without running. Temporal's BufferOne.
func TestKeepNewestRunsTheLatestFollowUp(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		locker := e.locker()
		release := make(chan struct{})
		runs := &firstBlocks{release: release}
		mw, err := singleton.Middleware(locker, singleton.WithPolicy(middleware.KeepNewest()), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		mux := asynq.NewServeMux()
		mux.Use(mw)
		mux.HandleFunc("sync", runs.handle)
		e.start(e.config(4), mux)
		waiters := func(n int) { e.waiters("asynq:sync", n) }
		e.Enqueue(asynq.NewTask("sync", []byte("v1")))
		require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
		e.Enqueue(asynq.NewTask("sync", []byte("v2")))
		waiters(1)
		e.Enqueue(asynq.NewTask("sync", []byte("v3")))
		require.Eventually(t, func() bool { return ev.count(middleware.EventDuplicate, middleware.ActionSkip) == 1 }, 10*time.Second, 5*time.Millisecond,
			"v2 gave its place to v3")
		waiters(1)
		close(release)
		e.Drained(10 * time.Second)
		require.Equal(t, []string{"v1", "v3"}, runs.payloads())
		require.Zero(t, e.QueueInfo().FailedTotal)
	})
}

// Preempt: a newer task cancels the run holding its key (ctx cause
// lockkit.ErrPreempted) and runs once that run returns; a task it replaces
// as the pending follow-up completes without running; the preempted task is
// revoked: neither retried nor archived.
func TestPreemptCancelsTheRunningTask(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		errs := &errorLog{}
		release := make(chan struct{})
		cancelled := make(chan error, 1)
		var mu sync.Mutex
		var ran []string
		tokens := map[string]int64{}
		for range 2 { // two servers, as on two machines
			mw, err := singleton.Middleware(e.locker(), singleton.WithPolicy(middleware.Preempt(0)), singleton.WithObserver(ev.observe))
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			mux.HandleFunc("sync", func(ctx context.Context, task *asynq.Task) error {
				lease, _ := lockkit.LeaseFromContext(ctx)
				mu.Lock()
				ran = append(ran, string(task.Payload()))
				tokens[string(task.Payload())] = lease.Token()
				first := len(ran) == 1
				mu.Unlock()
				if !first {
					return nil
				}
				<-ctx.Done()
				cancelled <- context.Cause(ctx)
				<-release // keeps going a while after it was told to stop
				return ctx.Err()
			})
			cfg := e.config(2)
			cfg.ErrorHandler = errs
			e.start(cfg, mux)
		}
		waiters := func(n int) { e.waiters("asynq:sync", n) }
		e.Enqueue(asynq.NewTask("sync", []byte("v1")))
		require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 1 }, 10*time.Second, 5*time.Millisecond)
		e.Enqueue(asynq.NewTask("sync", []byte("v2")))
		cause := recv(t, cancelled, 10*time.Second)
		require.ErrorIs(t, cause, lockcore.ErrPreempted)
		require.ErrorIs(t, cause, lockkit.ErrLost)
		waiters(1)
		e.Enqueue(asynq.NewTask("sync", []byte("v3")))
		require.Eventually(t, func() bool { return ev.count(middleware.EventDuplicate, middleware.ActionSkip) == 1 }, 10*time.Second, 5*time.Millisecond,
			"v2 gave its place to v3")
		mu.Lock()
		require.Equal(t, []string{"v1"}, ran, "the follow-up waits for the preempted run to return")
		mu.Unlock()
		close(release)
		e.Drained(10 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"v1", "v3"}, ran)
		require.Greater(t, tokens["v3"], tokens["v1"])
		require.True(t, errs.any(func(err error) bool { return errors.Is(err, lockcore.ErrPreempted) && errors.Is(err, asynq.RevokeTask) }), errs.String())
		qi := e.QueueInfo()
		require.Zero(t, qi.FailedTotal)
		require.Zero(t, qi.Archived)
		require.Zero(t, qi.Retry)
	})
}

// Debounce: bursts of tasks enqueued at once by three clients (as three
// processes) over three keys run once per key, the newest task of the key,
// after the key was quiet; every older task completes without running and
// says why.
func TestDebounceRunsTheNewestTask(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		const quiet = 300 * time.Millisecond
		var mu sync.Mutex
		ran := map[string][]int64{}       // key → generations that ran
		started := map[string]time.Time{} // key → when its run started
		for range 2 {
			mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("k"), singleton.WithPolicy(middleware.KeepNewest()),
				singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
			require.NoError(t, err)
			mux := asynq.NewServeMux()
			mux.Use(mw)
			mux.HandleFunc("sync", func(_ context.Context, task *asynq.Task) error {
				var p struct{ K string }
				require.NoError(t, json.Unmarshal(task.Payload(), &p))
				gen, err := strconv.ParseInt(task.Headers()[asynqkey.DebounceGenHeader], 10, 64)
				require.NoError(t, err)
				mu.Lock()
				ran[p.K] = append(ran[p.K], gen)
				started[p.K] = time.Now()
				mu.Unlock()
				return nil
			})
			e.start(e.config(4), mux)
		}
		var wg sync.WaitGroup
		var last atomic.Int64      // when the last enqueue returned (unix ns)
		gens := map[string]int64{} // task ID → generation
		for c := range 3 {
			cl, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB, singleton.KeyByFields("k"),
				singleton.Debounce(e.locker(), quiet, 0))
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 20 {
					task := asynq.NewTask("sync", fmt.Appendf(nil, `{"k":"tenant-%d","n":%d}`, i%3, c*100+i))
					info, err := cl.Enqueue(task, asynq.Queue(e.Queue))
					if !assert.NoError(t, err) {
						continue
					}
					gen, err := strconv.ParseInt(info.Headers[asynqkey.DebounceGenHeader], 10, 64)
					assert.NoError(t, err)
					mu.Lock()
					gens[info.ID] = gen
					mu.Unlock()
					last.Store(time.Now().UnixNano())
				}
			}()
		}
		wg.Wait()
		require.Eventually(t, func() bool {
			return ev.count(middleware.EventDuplicate, middleware.ActionSkip)+ev.count(middleware.EventReleased, 0) == 60
		}, 20*time.Second, 10*time.Millisecond)
		e.Drained(10 * time.Second)

		enqueued := map[string]int{}
		for range 3 {
			for i := range 20 {
				enqueued[fmt.Sprint("tenant-", i%3)]++
			}
		}
		skipped := map[string][]int64{}
		for _, x := range ev.all() {
			if x.Kind == middleware.EventDuplicate {
				require.Contains(t, x.Err.Error(), "a newer request of the key")
				skipped[x.Job.Key] = append(skipped[x.Job.Key], gens[x.Job.ID])
			}
		}
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, ran, 3)
		for k, gens := range ran {
			require.Len(t, gens, 1, "key %s ran once", k)
			var older []int64
			for key, gens := range skipped {
				if strings.Contains(key, `"`+k+`"`) {
					older = append(older, gens...)
				}
			}
			require.Len(t, older, enqueued[k]-1, "the other tasks of %s completed without running", k)
			for _, g := range older {
				require.Less(t, g, gens[0], "the newest task of %s ran", k)
			}
			require.GreaterOrEqual(t, started[k].Sub(time.Unix(0, last.Load())), quiet-5*time.Millisecond, "ran after the key was quiet")
		}
		require.Zero(t, e.QueueInfo().FailedTotal)
	})
}

// Debounce: when the newest request's task does not exist (its enqueue
// failed), an older task of the burst runs in its place.
func TestDebounceRunsAnOlderTaskWhenTheNewestIsMissing(t *testing.T) {
	testDebounceOlderRuns(t, func(t *testing.T, e *env, _ *singleton.Client, locker *lockkit.Locker) {
		client, prefix := coretest.Of(t, locker).Redis()
		requests, err := debounce.New(client, debounce.WithPrefix(prefix))
		require.NoError(t, err)
		_, err = requests.Debounce(context.Background(), "asynq:sync", "lost-task", 50*time.Millisecond, 0)
		require.NoError(t, err)
	})
}

// An operator archived the newest task of a debounced burst before it
// started: it will not run, so an older task of the burst runs in its place
// instead of completing as superseded.
func TestDebounceRunsAnOlderTaskWhenTheNewestWasArchived(t *testing.T) {
	testDebounceOlderRuns(t, func(t *testing.T, e *env, cl *singleton.Client, _ *lockkit.Locker) {
		newer, err := cl.Enqueue(asynq.NewTask("sync", []byte("newer")), asynq.Queue(e.Queue), asynq.MaxRetry(0))
		require.NoError(t, err)
		require.NoError(t, e.Inspector.ArchiveTask(e.Queue, newer.ID))
	})
}

// Debounce keys tasks across queues (without PerQueue): the newest task of
// a key, in another queue than an older one, is found there, so the older
// task completes without running instead of running in its place.
func TestDebounceFindsTheNewestTaskInAnotherQueue(t *testing.T) {
	e := newEnvOn(t, standalone)
	other := e.Queue + "-b"
	t.Cleanup(func() { _ = e.Inspector.DeleteQueue(other, true) })
	locker := e.locker()
	ev := &events{}
	mw, err := singleton.Middleware(locker, singleton.WithPolicy(middleware.KeepNewest()), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	mux, ran := payloadMux(mw)
	soon, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB, singleton.Debounce(locker, time.Millisecond, 0))
	require.NoError(t, err)
	later, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB, singleton.Debounce(locker, time.Hour, 0))
	require.NoError(t, err)
	_, err = soon.Enqueue(asynq.NewTask("sync", []byte("older")), asynq.Queue(e.Queue))
	require.NoError(t, err)
	newer, err := later.Enqueue(asynq.NewTask("sync", []byte("newer")), asynq.Queue(other))
	require.NoError(t, err)
	cfg := e.config(2)
	cfg.Queues = map[string]int{e.Queue: 1, other: 1}
	e.start(cfg, mux)
	require.Eventually(t, func() bool { return ev.count(middleware.EventDuplicate, middleware.ActionSkip) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the older task gave way to the newer one")
	require.NoError(t, e.Inspector.RunTask(other, newer.ID)) // the newer task is due
	require.Equal(t, "newer", recv(t, ran, 10*time.Second))
	select {
	case v := <-ran:
		t.Fatalf("%s ran too", v)
	default:
	}
}

// testDebounceOlderRuns enqueues an older task of a debounced burst, lets
// newer make a newer request that will not run, and checks that the older
// task runs.
func testDebounceOlderRuns(t *testing.T, newer func(t *testing.T, e *env, cl *singleton.Client, locker *lockkit.Locker)) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		locker := e.locker()
		mw, err := singleton.Middleware(locker, singleton.WithPolicy(middleware.KeepNewest()), singleton.WithRedis(e.RDB))
		require.NoError(t, err)
		mux, ran := payloadMux(mw)
		cl, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB, singleton.Debounce(locker, 50*time.Millisecond, 0))
		require.NoError(t, err)
		_, err = cl.Enqueue(asynq.NewTask("sync", []byte("older")), asynq.Queue(e.Queue))
		require.NoError(t, err)
		newer(t, e, cl, locker)
		e.start(e.config(2), mux)
		require.Equal(t, "older", recv(t, ran, 10*time.Second))
		require.Eventually(t, func() bool {
			qi := e.QueueInfo()
			return qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0
		}, 10*time.Second, 10*time.Millisecond, "nothing left to run")
	})
}

// A duplicate with no retries left is put back as a copy; when go-redis
// sends the copy's enqueue again after a lost reply, the second run finds
// the copy the first made: the original is revoked, not archived, and one
// copy waits to run.
func TestRequeueCopyEnqueueRetriedByGoRedis(t *testing.T) {
	e := newEnvOn(t, standalone)
	faulty := redis.NewClient(e.RDB.(*redis.Client).Options())
	t.Cleanup(func() { _ = faulty.Close() })
	hook := &testredis.Faults{Match: func(cmd redis.Cmder) bool {
		var task, scheduled bool
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok {
				task = task || strings.Contains(s, "}:t:")
				scheduled = scheduled || strings.HasSuffix(s, "}:scheduled")
			}
		}
		return task && scheduled // asynq's script that schedules a task
	}}
	faulty.AddHook(hook)
	ctx := context.Background()
	holder, err := e.locker().TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	defer holder.Release(ctx)

	ev := &events{}
	mw, err := singleton.Middleware(e.locker(), singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil }),
		singleton.WithPolicy(middleware.Requeue(time.Hour)), singleton.WithRedis(faulty), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	e.Enqueue(asynq.NewTask("report", nil), asynq.MaxRetry(0))
	hook.Arm(testredis.Repeat, 1)
	e.start(e.config(1), mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })))

	require.Eventually(t, func() bool {
		qi := e.QueueInfo()
		return ev.count(middleware.EventRequeued, 0)+len(ev.errs(middleware.EventError)) > 0 && qi.Pending+qi.Active == 0
	}, 10*time.Second, 5*time.Millisecond)
	require.EqualValues(t, 1, hook.Hits(), "the copy's enqueue ran twice")
	require.Empty(t, ev.errs(middleware.EventError))
	require.Equal(t, 1, ev.count(middleware.EventRequeued, 0))
	qi := e.QueueInfo()
	require.Zero(t, qi.Archived, "the original was revoked, not archived")
	require.Equal(t, 1, qi.Scheduled, "one copy waits to run")
}

// A parked task that is resumed and then throttled keeps the key's
// reservation for its own return, when the next start opens: the tasks
// parked behind it are not resumed at once, one after the other, only to be
// throttled too (each an extra delivery, and all of them put back together).
func TestThrottledResumedTaskKeepsTheOthersParked(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		const parked, period = 5, time.Second
		// Throttled deliveries: task ID and when.
		type throttle struct {
			id string
			at time.Time
		}
		var mu sync.Mutex
		var throttled []throttle
		var started []string // task IDs, in the order their runs began
		startedAt := map[string]time.Time{}
		release := make(chan struct{})
		l := e.locker()
		// A long requeue delay: a parked task comes back by itself (its
		// backstop) only after the test.
		mw, err := singleton.Middleware(l, singleton.WithPolicy(middleware.Requeue(10*time.Second)),
			singleton.WithThrottle(2, period, middleware.ActionRequeue), singleton.WithRedis(e.RDB),
			singleton.WithObserver(func(_ context.Context, x middleware.Event) {
				// A throttled job's event carries the budget in its error.
				if x.Kind == middleware.EventDuplicate && x.Err != nil && strings.Contains(x.Err.Error(), " starts per ") {
					mu.Lock()
					throttled = append(throttled, throttle{x.Job.ID, time.Now()})
					mu.Unlock()
				}
			}))
		require.NoError(t, err)
		e.start(e.config(parked+1), mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			mu.Lock()
			first := len(started) == 0
			started = append(started, id)
			startedAt[id] = time.Now()
			mu.Unlock()
			if first {
				<-release
			}
			return nil
		})))
		e.Enqueue(asynq.NewTask("sync", nil))
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(started) == 1
		}, 10*time.Second, 5*time.Millisecond)
		// One at a time: a task reserves the budget's second start while it
		// tries the key, so tasks that arrive together are throttled.
		for i := range parked {
			e.Enqueue(asynq.NewTask("sync", nil))
			require.Eventually(t, func() bool {
				info, err := coretest.Of(t, l).Inspect(context.Background(), "asynq:sync")
				require.NoError(t, err)
				return info.Parked == i+1
			}, 10*time.Second, 5*time.Millisecond, "the others park behind the first run")
		}
		close(release)
		// The second start of the period runs the first parked task; the
		// next parked task is throttled, and put back until the next start.
		var first throttle
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(throttled) > 0 {
				first = throttled[0]
			}
			return len(throttled) > 0
		}, 10*time.Second, 5*time.Millisecond)
		var ran time.Time
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			ran = startedAt[first.id]
			return !ran.IsZero()
		}, 10*time.Second, 5*time.Millisecond, "the throttled task runs when the next start opens")
		mu.Lock()
		for _, x := range throttled {
			if x.id != first.id {
				assert.Falsef(t, x.at.Before(ran), "task %s was resumed and throttled before %s, throttled first, ran", x.id, first.id)
			}
		}
		mu.Unlock()
		info, err := coretest.Of(t, l).Inspect(context.Background(), "asynq:sync")
		require.NoError(t, err)
		require.Greater(t, info.Parked, 0, "the tasks behind it stayed parked")
	})
}

// A parked task that is resumed and then skipped by the throttle
// (WithThrottle's ActionSkip) passes the key on at once: the tasks parked
// behind it do not wait for their backstop.
func TestThrottleSkippedResumedTaskPassesTheKeyOn(t *testing.T) {
	e := newEnvOn(t, standalone)
	const parked = 4
	ev := &events{}
	var runs atomic.Int32
	release := make(chan struct{})
	l := e.locker()
	// A long requeue delay: a parked task comes back by itself (its
	// backstop) only after the test.
	mw, err := singleton.Middleware(l, singleton.WithPolicy(middleware.Requeue(10*time.Second)),
		singleton.WithThrottle(2, time.Minute, middleware.ActionSkip), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	e.start(e.config(parked+1), mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if runs.Add(1) == 1 {
			<-release
		}
		return nil
	})))
	e.Enqueue(asynq.NewTask("sync", nil))
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	for i := range parked {
		e.Enqueue(asynq.NewTask("sync", nil))
		require.Eventually(t, func() bool {
			info, err := coretest.Of(t, l).Inspect(context.Background(), "asynq:sync")
			require.NoError(t, err)
			return info.Parked == i+1
		}, 10*time.Second, 5*time.Millisecond)
	}
	close(release)
	// The budget's second start runs one; the others are skipped, each
	// resumed by the one before it.
	require.Eventually(t, func() bool {
		return runs.Load() == 2 && ev.count(middleware.EventDuplicate, middleware.ActionSkip) == parked-1
	}, 5*time.Second, 5*time.Millisecond, "runs %d", runs.Load())
}

// An operator's release (lockkit's Locker.CancelRun, as the page and
// jobguard release send it) of a run whose handler ignores its ctx, under
// Wait and under Requeue: the run's ctx is cancelled (lockkit.ErrCancelled),
// no other task of the key starts while it goes on (past the lease TTL),
// the next task starts as soon as it returns (no backstop wait), and the
// cancelled task is revoked: neither retried nor archived.
func TestOperatorReleaseOfAHungHandler(t *testing.T) {
	policies := map[string]middleware.Policy{"wait": middleware.Wait(time.Minute, middleware.Skip()), "requeue": middleware.Requeue(time.Millisecond)}
	for name, policy := range policies {
		t.Run(name, func(t *testing.T) {
			e := newEnvOn(t, standalone)
			const ttl = 1500 * time.Millisecond
			errs := &errorLog{}
			tr := newTracker()
			cancelled, release, started := make(chan error, 1), make(chan struct{}), make(chan string, 4)
			for i := range 2 { // two servers, as on two machines
				mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))), singleton.WithPolicy(policy), singleton.WithTTL(ttl), singleton.WithRedis(e.RDB))
				require.NoError(t, err)
				mux := asynq.NewServeMux()
				mux.Use(mw)
				mux.HandleFunc("sync", func(ctx context.Context, task *asynq.Task) error {
					tr.start("sync")
					defer tr.end("sync", string(task.Payload()))
					started <- string(task.Payload())
					if string(task.Payload()) != "v1" {
						return nil
					}
					<-ctx.Done()
					cancelled <- context.Cause(ctx)
					<-release // a call that ignores ctx goes on
					return ctx.Err()
				})
				cfg := e.config(2)
				cfg.ErrorHandler = errs
				e.start(cfg, mux)
			}
			e.Enqueue(asynq.NewTask("sync", []byte("v1")))
			require.Equal(t, "v1", recv(t, started, 10*time.Second))
			e.Enqueue(asynq.NewTask("sync", []byte("v2")))
			op := e.locker()
			require.Eventually(t, func() bool { // v2 waits, or is parked, for the key
				info, err := coretest.Of(t, op).Inspect(context.Background(), "asynq:sync")
				require.NoError(t, err)
				return info.Waiters+info.Parked > 0
			}, 10*time.Second, 5*time.Millisecond)

			n, err := op.CancelRun(context.Background(), "asynq:sync", lockkit.Select{})
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.ErrorIs(t, recv(t, cancelled, 10*time.Second), lockkit.ErrCancelled)
			select {
			case v := <-started:
				t.Fatalf("%s started beside the cancelled run", v)
			case <-time.After(2 * ttl): // past the lease TTL: the key is still held
			}
			returned := time.Now()
			close(release)
			require.Equal(t, "v2", recv(t, started, 10*time.Second))
			late := time.Since(returned)
			t.Logf("v2 started %s after the cancelled run returned", late)
			require.Less(t, late, ttl, "the release hands the key on; no backstop")
			e.Drained(10 * time.Second)
			require.Equal(t, map[string]int{"sync": 1}, tr.peaks())
			require.Equal(t, map[string]int{"v1": 1, "v2": 1}, tr.completed())
			require.True(t, errs.any(func(err error) bool { return errors.Is(err, lockkit.ErrCancelled) && errors.Is(err, asynq.RevokeTask) }), errs.String())
			qi := e.QueueInfo()
			require.Zero(t, qi.Archived)
			require.Zero(t, qi.Retry)
		})
	}
}
