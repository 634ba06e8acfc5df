package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// runLog records, per key, the order in which tasks ran, and counts every
// delivery of a task to the handler chain.
type runLog struct {
	mu         sync.Mutex
	order      map[string][]int
	deliveries atomic.Int32
}

// count is an outer asynq middleware that counts deliveries.
func (l *runLog) count(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		l.deliveries.Add(1)
		return next.ProcessTask(ctx, t)
	})
}

func (l *runLog) ran(key string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.order[key] = append(l.order[key], n)
}

func (l *runLog) runs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.order {
		n += len(o)
	}
	return n
}

// reportMux is a mux whose "report" handler (payload tenant_id and n) runs
// for 20ms, recorded by tr and log, behind log.count and mw.
func reportMux(mw asynq.MiddlewareFunc, tr *tracker, log *runLog) *asynq.ServeMux {
	mux := asynq.NewServeMux()
	mux.Use(log.count, mw)
	mux.HandleFunc("report", func(_ context.Context, task *asynq.Task) error {
		tenant, n, err := reportOf(task)
		if err != nil {
			return err
		}
		tr.start(tenant)
		log.ran(tenant, n)
		time.Sleep(20 * time.Millisecond) // the work
		tr.end(tenant, fmt.Sprint(n))
		return nil
	})
	return mux
}

// A burst enqueued with ParkAtEnqueue runs each task once, one at a time
// per key and in the order of the enqueues, with one delivery per task: the
// first task of a key reserves it, the others wait parked (scheduled at the
// backstop) and each run's end starts the next. The policies' own delays
// (a minute) and the backstop (30s) outlast the test, so only the parking
// can finish it. Under Skip too, no task is skipped: a task reserved for
// its key takes the reservation over whatever the policy.
func TestParkAtEnqueueRunsEachTaskOnceInOrder(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		for _, policy := range []middleware.Policy{middleware.Requeue(time.Minute), middleware.Skip()} {
			t.Run(policy.String(), func(t *testing.T) {
				e := newEnvOn(t, r)
				const servers, tenants, perTenant = 2, 3, 10
				client, err := singleton.NewClient(e.Client, e.RDB, singleton.KeyByFields("tenant_id"), singleton.ParkAtEnqueue(e.locker(), 0))
				require.NoError(t, err)
				for n := range tenants * perTenant {
					task := asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":"t%d","n":%d}`, n%tenants, n))
					info, err := client.Enqueue(task, asynq.Queue(e.Queue))
					require.NoError(t, err)
					require.Equal(t, "1", info.Headers["jobguard-parked"])
					if n < tenants {
						require.Equal(t, asynq.TaskStatePending, info.State, "task %d reserved its key", n)
					} else {
						require.Equal(t, asynq.TaskStateScheduled, info.State, "task %d was parked", n)
						require.WithinDuration(t, time.Now().Add(parkBackstop), info.NextProcessAt, 2*time.Second)
					}
				}

				tr, log, ev := newTracker(), &runLog{order: map[string][]int{}}, &events{}
				for i := range servers {
					mw, err := singleton.Middleware(e.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))),
						singleton.KeyByFields("tenant_id"), singleton.WithPolicy(policy), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
					require.NoError(t, err)
					e.start(e.config(4), reportMux(mw, tr, log))
				}
				require.Eventually(t, func() bool { return log.runs() == tenants*perTenant }, 20*time.Second, 5*time.Millisecond)
				e.Drained(10 * time.Second)

				for tenant := range tenants {
					var want []int
					for n := tenant; n < tenants*perTenant; n += tenants {
						want = append(want, n)
					}
					require.Equal(t, want, log.order[fmt.Sprintf("t%d", tenant)], "tenant t%d ran each task once, in enqueue order", tenant)
				}
				for tenant, peak := range tr.peaks() {
					require.Equal(t, 1, peak, "tenant %s", tenant)
				}
				require.EqualValues(t, tenants*perTenant, log.deliveries.Load(), "one delivery per task")
				require.Zero(t, ev.count(middleware.EventRequeued, 0))
				require.Zero(t, ev.count(middleware.EventDuplicate, 0))
				require.Empty(t, ev.errs(middleware.EventError))
				require.Zero(t, e.QueueInfo().Archived)
			})
		}
	})
}

// A task parked at enqueue that is still parked at its backstop is
// delivered, finds its key held and is parked again in its place, whether
// it has retries left (it is put back) or none (MaxRetry(0): a copy replaces
// it, parked as the same work), so the key's tasks still run in enqueue
// order.
func TestParkAtEnqueueTaskDeliveredAgainKeepsItsPlace(t *testing.T) {
	for _, maxRetry := range []int{25, 0} {
		t.Run(fmt.Sprint("MaxRetry", maxRetry), func(t *testing.T) {
			e := newEnvOn(t, standalone)
			keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
			client, err := singleton.NewClient(e.Client, e.RDB, keyOf, singleton.ParkAtEnqueue(e.locker(), time.Second))
			require.NoError(t, err)
			ev := &events{}
			mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)),
				singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
			require.NoError(t, err)
			mux, runs, release := blockingMux(mw, "sync")
			e.start(e.config(2), mux)
			_, err = client.Enqueue(asynq.NewTask("sync", []byte("holder")), asynq.Queue(e.Queue))
			require.NoError(t, err)
			require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
			want := []string{"holder"}
			for n := range 6 {
				v := fmt.Sprint("v", n)
				want = append(want, v)
				_, err := client.Enqueue(asynq.NewTask("sync", []byte(v)), asynq.Queue(e.Queue), asynq.MaxRetry(maxRetry))
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool { return ev.count(middleware.EventRequeued, 0) == 6 }, 10*time.Second, 5*time.Millisecond,
				"each delivered at its 1 s backstop and parked again")
			close(release)
			e.Drained(60 * time.Second)
			require.Equal(t, want, runs.payloads(), "in enqueue order")
			require.Empty(t, ev.errs(middleware.EventError))
			require.Zero(t, e.QueueInfo().Archived)
		})
	}
}

// What could strand a parked task does not: a task parked behind a holder
// that never resumes anyone (a plain lease, as a process that died would
// leave) is delivered at its backstop and runs; a parked entry whose task
// was never enqueued (its Client died between the park and the enqueue)
// is passed over by the run that reaches it. A task scheduled by the
// caller is enqueued as asked, neither reserved nor parked.
func TestParkAtEnqueueNeverStrandsATask(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ctx := context.Background()
		keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
		client, err := singleton.NewClient(e.Client, e.RDB, keyOf, singleton.ParkAtEnqueue(e.locker(), time.Second))
		require.NoError(t, err)
		enqueue := func(n int, opts ...asynq.Option) *asynq.TaskInfo {
			t.Helper()
			info, err := client.Enqueue(asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":"k","n":%d}`, n)), append(opts, asynq.Queue(e.Queue))...)
			require.NoError(t, err)
			return info
		}

		later := enqueue(99, asynq.ProcessIn(time.Hour))
		require.Equal(t, asynq.TaskStateScheduled, later.State)
		require.Empty(t, later.Headers["jobguard-parked"], "a scheduled task is not parked")
		info, err := e.locker().Inspect(ctx, "k")
		require.NoError(t, err)
		require.Empty(t, info.Holders, "nor does it reserve its key")

		// A holder that resumes no one, then parked tasks behind it.
		holder, err := e.locker().TryAcquire(ctx, "k", nil)
		require.NoError(t, err)
		for n := range 3 {
			require.Equal(t, asynq.TaskStateScheduled, enqueue(n).State)
		}
		require.NoError(t, holder.Release(ctx))

		tr, log, ev := newTracker(), &runLog{order: map[string][]int{}}, &events{}
		mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithPolicy(middleware.Requeue(time.Minute)),
			singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		e.start(e.config(4), reportMux(mw, tr, log))
		require.Eventually(t, func() bool { return log.runs() == 3 }, 10*time.Second, 5*time.Millisecond, "the backstop brought the parked tasks back")

		// A parked entry with no task, between a reserved task and a parked
		// one whose backstop (30s) outlasts the test.
		slow, err := singleton.NewClient(e.Client, e.RDB, keyOf, singleton.ParkAtEnqueue(e.locker(), 0))
		require.NoError(t, err)
		enqueueSlow := func(n int) asynq.TaskState {
			t.Helper()
			info, err := slow.Enqueue(asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":"k","n":%d}`, n)), asynq.Queue(e.Queue))
			require.NoError(t, err)
			return info.State
		}
		// The last run has released the key (its handler returns first).
		watcher := e.locker()
		require.Eventually(t, func() bool {
			info, err := watcher.Inspect(ctx, "k")
			require.NoError(t, err)
			return len(info.Holders) == 0
		}, 5*time.Second, time.Millisecond)
		require.Equal(t, asynq.TaskStatePending, enqueueSlow(10))
		_, err = coretest.Of(t, e.locker()).TryAcquire(ctx, "k", &lockcore.AcquireOptions{Label: "ghost", Reserve: true,
			Park: &lockcore.Parking{ID: e.Queue + "\nghost\nghost", Hold: parkBackstop}})
		require.ErrorIs(t, err, lockkit.ErrNotAcquired)
		require.Equal(t, asynq.TaskStateScheduled, enqueueSlow(11))
		require.Eventually(t, func() bool { return log.runs() == 5 }, 10*time.Second, 5*time.Millisecond, "the ghost was passed over")
		log.mu.Lock()
		require.Equal(t, []int{10, 11}, log.order["k"][3:])
		log.mu.Unlock()

		for _, peak := range tr.peaks() {
			require.Equal(t, 1, peak)
		}
		require.Empty(t, ev.errs(middleware.EventError))
		still, err := e.Inspector.GetTaskInfo(e.Queue, later.ID)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStateScheduled, still.State, "the task scheduled for later waits for its time")

		// A task whose ID the task scheduled for later has is refused, and
		// not parked: no run would start that task early.
		var busy *lockkit.Lease
		holder2 := e.locker()
		require.Eventually(t, func() bool { // once the last run released the key
			busy, err = holder2.TryAcquire(ctx, "k", nil)
			return err == nil
		}, 5*time.Second, time.Millisecond)
		_, err = client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"k","n":98}`)), asynq.Queue(e.Queue), asynq.TaskID(later.ID))
		require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
		kinfo, err := coretest.Of(t, e.locker()).Inspect(ctx, "k")
		require.NoError(t, err)
		require.Zero(t, kinfo.Parked, "the refused task is not parked")
		require.NoError(t, busy.Release(ctx))
	})
}

// ParkAtEnqueue needs a middleware with WithLimit(1): under a higher limit
// no run starts a parked task and none leaves the parked queue, which would
// grow with every park. Such a middleware refuses a task parked at enqueue:
// it fails with an error matching ErrInvalid (and asynq.SkipRetry, so asynq
// archives it) without running, and gives back the key's reservation.
func TestParkAtEnqueueRefusedUnderAHigherLimit(t *testing.T) {
	e := newEnvOn(t, standalone)
	ctx := context.Background()
	keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
	client, err := singleton.NewClient(e.Client, e.RDB, keyOf, singleton.ParkAtEnqueue(e.locker(), 0))
	require.NoError(t, err)
	first, err := client.Enqueue(asynq.NewTask("report", []byte("1")), asynq.Queue(e.Queue))
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, first.State, "reserved its key")
	second, err := client.Enqueue(asynq.NewTask("report", []byte("2")), asynq.Queue(e.Queue))
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, second.State, "parked")

	mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithLimit(2), singleton.WithPolicy(middleware.Requeue(time.Minute)),
		singleton.WithRedis(e.RDB))
	require.NoError(t, err)
	var ran atomic.Int32
	errs := &errorLog{}
	cfg := e.config(2)
	cfg.ErrorHandler = errs
	e.start(cfg, mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran.Add(1); return nil })))
	archived := func(id string) func() bool {
		return func() bool {
			ti, err := e.Inspector.GetTaskInfo(e.Queue, id)
			return err == nil && ti.State == asynq.TaskStateArchived
		}
	}
	require.Eventually(t, archived(first.ID), 10*time.Second, 5*time.Millisecond)
	info, err := e.locker().Inspect(ctx, "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "the reservation was given back")
	require.NoError(t, e.Inspector.RunTask(e.Queue, second.ID)) // its backstop
	require.Eventually(t, archived(second.ID), 10*time.Second, 5*time.Millisecond)
	require.Zero(t, ran.Load())
	require.True(t, errs.any(func(err error) bool { return errors.Is(err, singleton.ErrInvalid) && errors.Is(err, asynq.SkipRetry) }), errs.String())
}

// failHook fails, unsent, the first script run with an argument ending
// with suffix, after calling before.
type failHook struct {
	suffix string
	before func()
	done   atomic.Bool
}

func (h *failHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.HasSuffix(s, h.suffix) && h.done.CompareAndSwap(false, true) {
				h.before()
				err := errors.New("injected: enqueue failed")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// A reservation that ParkAtEnqueue gives back because the enqueue failed
// starts the task parked behind it meanwhile at once, as the end of a run
// does, instead of leaving it for its backstop.
func TestParkAtEnqueueGivenBackReservationStartsTheNextTask(t *testing.T) {
	e := newEnvOn(t, standalone)
	keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
	other, err := singleton.NewClient(e.Client, e.RDB, keyOf, singleton.ParkAtEnqueue(e.locker(), 0))
	require.NoError(t, err)
	var second *asynq.TaskInfo
	faulty := redis.NewClient(e.RDB.(*redis.Client).Options())
	t.Cleanup(func() { _ = faulty.Close() })
	faulty.AddHook(&failHook{suffix: "}:t:first", before: func() {
		// Another process enqueues a task of the key: it parks behind the
		// reservation the failing enqueue made.
		second, err = other.Enqueue(asynq.NewTask("report", []byte("2")), asynq.Queue(e.Queue))
		require.NoError(t, err)
	}})
	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(faulty), faulty, keyOf, singleton.ParkAtEnqueue(e.locker(), 0))
	require.NoError(t, err)

	mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithPolicy(middleware.Requeue(time.Minute)), singleton.WithRedis(e.RDB))
	require.NoError(t, err)
	ran := make(chan string, 2)
	e.start(e.config(2), mw(asynq.HandlerFunc(func(_ context.Context, task *asynq.Task) error {
		ran <- string(task.Payload())
		return nil
	})))
	_, err = client.Enqueue(asynq.NewTask("report", []byte("1")), asynq.Queue(e.Queue), asynq.TaskID("first"))
	require.ErrorContains(t, err, "injected")
	require.NotNil(t, second)
	require.Equal(t, asynq.TaskStateScheduled, second.State, "parked")
	require.Equal(t, "2", recv(t, ran, 5*time.Second), "started at once, not at its backstop")
}

// A reservation that lapses (its task never started: its process died
// between the reserve and the enqueue, say) starts nobody: the task parked
// behind it comes back by itself at its backstop, finds the key free and
// runs.
func TestParkAtEnqueueLapsedReservationLeavesTheNextTaskToItsBackstop(t *testing.T) {
	e := newEnvOn(t, standalone)
	ctx := context.Background()
	keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
	client, err := singleton.NewClient(e.Client, e.RDB, keyOf, singleton.ParkAtEnqueue(e.locker(), 2*time.Second))
	require.NoError(t, err)
	_, err = coretest.Of(t, e.locker()).TryAcquire(ctx, "k", &lockcore.AcquireOptions{Label: "ghost", Reserve: true, TTL: 200 * time.Millisecond})
	require.NoError(t, err)
	enqueued := time.Now()
	parked, err := client.Enqueue(asynq.NewTask("report", []byte("1")), asynq.Queue(e.Queue))
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, parked.State)
	mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithPolicy(middleware.Requeue(time.Minute)), singleton.WithRedis(e.RDB))
	require.NoError(t, err)
	ran := make(chan time.Time, 1)
	e.start(e.config(2), mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- time.Now()
		return nil
	})))
	at := recv(t, ran, 10*time.Second)
	require.GreaterOrEqual(t, at.Sub(enqueued), time.Second, "at its backstop (asynq schedules in whole seconds), not when the reservation lapsed")
	e.Drained(10 * time.Second)
}

// A task parked at enqueue takes its entry in the key's parked queue with
// it when it will not run: refused by a middleware with WithLimit(n > 1)
// (and archived), archived or deleted by an operator. Under WithLimit(2)
// the refusals of two rounds leave no entry (the refused task gives up its
// own, and a refusal removes those of tasks no longer waiting); under
// WithLimit(1) the run that frees the key passes over the entries of the
// deleted and archived tasks and starts the one still waiting.
func TestParkAtEnqueueEntriesGoWithTheirTasks(t *testing.T) {
	ctx := context.Background()
	keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
	parked := func(t *testing.T, e *env) int {
		t.Helper()
		info, err := coretest.Of(t, e.locker()).Inspect(ctx, "k")
		require.NoError(t, err)
		return info.Parked
	}
	t.Run("WithLimit2", func(t *testing.T) {
		onEachRedis(t, func(t *testing.T, r connect) {
			e := newEnvOn(t, r)
			client, err := singleton.NewClient(e.Client, e.RDB, keyOf, singleton.ParkAtEnqueue(e.locker(), 0))
			require.NoError(t, err)
			mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithLimit(2), singleton.WithPolicy(middleware.Requeue(time.Minute)),
				singleton.WithRedis(e.RDB))
			require.NoError(t, err)
			var ran atomic.Int32
			e.start(e.config(2), mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran.Add(1); return nil })))
			archived := 0
			for round := range 2 {
				// Paused, so that the first task's refusal does not free the
				// key before the others park.
				require.NoError(t, e.Inspector.PauseQueue(e.Queue))
				var ids []string
				for n := range 6 {
					info, err := client.Enqueue(asynq.NewTask("report", fmt.Appendf(nil, "%d-%d", round, n)), asynq.Queue(e.Queue))
					require.NoError(t, err)
					if n > 0 {
						require.Equal(t, asynq.TaskStateScheduled, info.State, "parked")
					}
					ids = append(ids, info.ID)
				}
				require.Equal(t, 5, parked(t, e))
				refused := ids[1:]
				if round == 1 {
					require.NoError(t, e.Inspector.DeleteTask(e.Queue, ids[1]))
					require.NoError(t, e.Inspector.ArchiveTask(e.Queue, ids[2]))
					archived++
					refused = ids[3:]
				}
				for _, id := range refused {
					require.NoError(t, e.Inspector.RunTask(e.Queue, id)) // their backstop
				}
				require.NoError(t, e.Inspector.UnpauseQueue(e.Queue))
				archived += 1 + len(refused)
				require.Eventually(t, func() bool { return e.QueueInfo().Archived == archived }, 10*time.Second, 5*time.Millisecond)
				require.Zero(t, parked(t, e), "round %d: no entry outlives its task", round)
			}
			require.Zero(t, ran.Load())
		})
	})
	t.Run("WithLimit1", func(t *testing.T) {
		e := newEnvOn(t, standalone)
		client, err := singleton.NewClient(e.Client, e.RDB, keyOf, singleton.ParkAtEnqueue(e.locker(), 0))
		require.NoError(t, err)
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithPolicy(middleware.Requeue(time.Minute)),
			singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		mux, runs, release := blockingMux(mw, "sync")
		e.start(e.config(2), mux)
		var ids []string
		for _, p := range []string{"holder", "deleted", "archived", "waiting"} {
			info, err := client.Enqueue(asynq.NewTask("sync", []byte(p)), asynq.Queue(e.Queue))
			require.NoError(t, err)
			ids = append(ids, info.ID)
		}
		require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, 3, parked(t, e))
		require.NoError(t, e.Inspector.DeleteTask(e.Queue, ids[1]))
		require.NoError(t, e.Inspector.ArchiveTask(e.Queue, ids[2]))
		close(release)
		require.Eventually(t, func() bool { return len(runs.payloads()) == 2 }, 10*time.Second, 5*time.Millisecond,
			"the waiting task starts long before its backstop")
		require.Equal(t, []string{"holder", "waiting"}, runs.payloads())
		require.Zero(t, parked(t, e))
		require.Empty(t, ev.errs(middleware.EventError))
	})
}
