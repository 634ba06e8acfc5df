package singleton_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// holdHook holds back the first command that carries arg (a task's label:
// its acquire) until gate is closed or the caller's ctx ends.
type holdHook struct {
	arg     string
	gate    <-chan struct{}
	arrived chan struct{} // closed when the command is held
	once    sync.Once
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if slices.Contains(cmd.Args(), any(h.arg)) {
			held := false
			h.once.Do(func() { held = true })
			if held {
				close(h.arrived)
				select {
				case <-h.gate:
				case <-ctx.Done():
				}
			}
		}
		return next(ctx, cmd)
	}
}

// orderRuns records the payloads that ran, in order, and whether a run was
// preempted.
type orderRuns struct {
	mu        sync.Mutex
	ran       []string
	preempted []string
	started   chan string
	finish    map[string]chan struct{} // a run of the payload waits for it
}

func (o *orderRuns) handle(ctx context.Context, task *asynq.Task) error {
	p := string(task.Payload())
	o.mu.Lock()
	o.ran = append(o.ran, p)
	finish := o.finish[p]
	o.mu.Unlock()
	o.started <- p
	if finish != nil {
		select {
		case <-finish:
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), lockcore.ErrPreempted) {
				o.mu.Lock()
				o.preempted = append(o.preempted, p)
				o.mu.Unlock()
			}
			<-finish
		}
	}
	return nil
}

func (o *orderRuns) runs() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.ran)
}

// Under KeepNewest and Preempt, "newest" is the newest enqueued (by
// singleton.Client), whatever order the deliveries reach Redis in. On three
// servers, v0 runs; v1 then v2 are enqueued, and v1's acquire is held back
// until v2 parked or waits as the key's follow-up, or (a late re-delivery)
// until v2 ran: v1, the older, completes without running (superseded), it
// neither takes v2's place nor preempts v2's run, and v2 is the key's last
// run.
func TestNewestMeansNewestEnqueued(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy middleware.Policy
		// until is what v1's acquire waits for: "queued" (v2 is the key's
		// follow-up), or "ran" (v2 ran, or runs under Preempt).
		until string
	}{
		{"KeepNewest/behind-the-follow-up", middleware.KeepNewest(), "queued"},
		{"KeepNewest/after-the-newer-run", middleware.KeepNewest(), "ran"},
		{"Preempt/behind-the-follow-up", middleware.Preempt(0), "queued"},
		{"Preempt/during-the-newer-run", middleware.Preempt(0), "ran"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvOn(t, standalone)
			ctx := context.Background()
			ev := &events{}
			gate := make(chan struct{})
			hook := &holdHook{arg: "ord-v1", gate: gate, arrived: make(chan struct{})}
			held := redis.NewClient(e.RDB.(*redis.Client).Options())
			t.Cleanup(func() { _ = held.Close() })
			held.AddHook(hook)
			runs := &orderRuns{started: make(chan string, 8), finish: map[string]chan struct{}{"v0": make(chan struct{}), "v2": make(chan struct{})}}
			for i := range 3 {
				l, err := lockkit.NewRedis(held, lockkit.WithPrefix(e.Prefix), lockkit.WithOwner("server-"+string(rune('a'+i))))
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				mw, err := singleton.Middleware(l, singleton.WithPolicy(tc.policy), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
				require.NoError(t, err)
				e.start(e.config(2), mw(asynq.HandlerFunc(runs.handle)))
			}
			client, err := singleton.NewClient(e.Client, e.RDB)
			require.NoError(t, err)
			enqueue := func(p string) {
				_, err := client.EnqueueContext(ctx, asynq.NewTask("sync", []byte(p)), asynq.Queue(e.Queue), asynq.TaskID("ord-"+p))
				require.NoError(t, err)
			}
			enqueue("v0")
			require.Equal(t, "v0", recv(t, runs.started, 10*time.Second))
			enqueue("v1")
			recv(t, hook.arrived, 10*time.Second) // v1's acquire is held back
			enqueue("v2")
			switch {
			case guard.ModeOf(tc.policy) == guard.ModePreempt && tc.until == "queued":
				e.waiters("asynq:sync", 1) // v2 preempted v0 and waits for it
			case guard.ModeOf(tc.policy) == guard.ModePreempt:
				close(runs.finish["v0"]) // v2 preempted v0, and runs
				require.Equal(t, "v2", recv(t, runs.started, 10*time.Second))
			case tc.until == "queued":
				ev.waitRequeued(t, 1, "v2 parks as the follow-up")
			default:
				ev.waitRequeued(t, 1, "v2 parks as the follow-up")
				close(runs.finish["v0"])
				require.Equal(t, "v2", recv(t, runs.started, 10*time.Second))
				close(runs.finish["v2"])
				require.Eventually(t, func() bool { return e.QueueInfo().Active == 1 }, 10*time.Second, 5*time.Millisecond, "v2 ran")
			}
			close(gate) // v1's acquire reaches Redis last
			require.Eventually(t, func() bool {
				for _, d := range ev.all() {
					if d.Kind == middleware.EventDuplicate && d.Job.ID == "ord-v1" && d.Action == middleware.ActionSkip {
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond, "v1, the older, completes without running")
			for _, ch := range runs.finish {
				select {
				case <-ch:
				default:
					close(ch)
				}
			}
			e.Drained(10 * time.Second)
			for _, d := range ev.all() {
				t.Logf("event %s %s %s %v", d.Kind, d.Job.ID, d.Action, d.Err)
			}
			require.Equal(t, []string{"v0", "v2"}, runs.runs(), "the newest task runs last; the older never")
			runs.mu.Lock()
			defer runs.mu.Unlock()
			if guard.ModeOf(tc.policy) == guard.ModePreempt {
				require.NotContains(t, runs.preempted, "v2", "the older task preempts no newer run")
			}
		})
	}
}

// Rolling deploy under KeepNewest, the tasks enqueued by singleton.Client:
// v1 runs on server A, v2 parks as the key's follow-up. A shuts down: asynq
// puts v1 back, server B gets it while v1's first run still holds the key,
// and that run then fails. v1's re-delivery is older than v2: it completes
// without running, and v2, the newest accepted payload, is the key's last
// run (not v1, v2, v1).
func TestRedeliveryOfAnOlderTaskDoesNotRunAfterTheNewer(t *testing.T) {
	e := newEnvOn(t, standalone)
	ev := &events{}
	var mu sync.Mutex
	var ran []string
	firstStarted := make(chan struct{})
	firstCancelled := make(chan struct{})
	finish := make(chan struct{})
	var once sync.Once
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		p := string(task.Payload())
		mu.Lock()
		ran = append(ran, p)
		first := len(ran) == 1
		mu.Unlock()
		if first {
			close(firstStarted)
			<-ctx.Done()
			once.Do(func() { close(firstCancelled) })
			<-finish
			return errors.New("interrupted")
		}
		return nil
	})
	newMW := func(l *lockkit.Locker) asynq.MiddlewareFunc {
		mw, err := singleton.Middleware(l, singleton.WithPolicy(middleware.KeepNewest()), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		return mw
	}
	client, err := singleton.NewClient(e.Client, e.RDB)
	require.NoError(t, err)
	enqueue := func(p string) {
		_, err := client.Enqueue(asynq.NewTask("sync", []byte(p)), asynq.Queue(e.Queue), asynq.MaxRetry(3))
		require.NoError(t, err)
	}
	cfgA := e.config(2)
	cfgA.ShutdownTimeout = 200 * time.Millisecond
	srvA := e.start(cfgA, newMW(e.locker(lockkit.WithOwner("server-a")))(handler))
	enqueue("v1")
	recv(t, firstStarted, 10*time.Second)
	enqueue("v2")
	ev.waitRequeued(t, 1, "v2 parks")

	e.start(e.config(2), newMW(e.locker(lockkit.WithOwner("server-b")))(handler))
	srvA.Shutdown() // v1 goes back to pending, its first run's ctx is cancelled
	recv(t, firstCancelled, 10*time.Second)
	require.Eventually(t, func() bool { return ev.count(middleware.EventDuplicate, middleware.ActionSkip) == 1 }, 10*time.Second, 5*time.Millisecond,
		"v1's re-delivery completes without running")
	close(finish) // v1's first run fails
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(ran, "v2")
	}, 10*time.Second, 5*time.Millisecond, "v2 runs")
	e.Drained(10 * time.Second)
	for _, d := range ev.all() {
		t.Logf("event %s %s %s %v", d.Kind, d.Job.ID, d.Action, d.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"v1", "v2"}, ran, "the newest payload runs last")
}

// singleton.Client gives each task of a key a greater order than the one
// before (asynqkey.OrderHeader), and a task of another key one too, at the cost of
// one command per enqueue.
func TestClientOrdersTasksForOneCommand(t *testing.T) {
	e := newEnvOn(t, standalone)
	rdb := redis.NewClient(e.RDB.(*redis.Client).Options())
	t.Cleanup(func() { _ = rdb.Close() })
	rt := &testredis.Counter{}
	rdb.AddHook(rt)
	ac := asynq.NewClientFromRedisClient(rdb)
	client, err := singleton.NewClient(ac, rdb, singleton.KeyByFields("tenant"))
	require.NoError(t, err)
	enqueue := func(tenant string) int64 {
		t.Helper()
		info, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant":"`+tenant+`"}`)), asynq.Queue(e.Queue))
		require.NoError(t, err)
		task, err := e.Inspector.GetTaskInfo(e.Queue, info.ID)
		require.NoError(t, err)
		require.NotEmpty(t, task.Headers[asynqkey.OrderHeader])
		order, err := strconv.ParseInt(task.Headers[asynqkey.OrderHeader], 10, 64)
		require.NoError(t, err)
		return order
	}
	last := enqueue("warm") // the clock read, the script's first load
	for i := range 5 {
		next := enqueue([]string{"a", "b"}[i%2])
		require.Greater(t, next, last)
		last = next
	}
	rt.Reset()
	_, err = ac.Enqueue(asynq.NewTask("report", []byte(`{"tenant":"a"}`)), asynq.Queue(e.Queue))
	require.NoError(t, err)
	plain := rt.Count()
	rt.Reset()
	_, err = client.Enqueue(asynq.NewTask("report", []byte(`{"tenant":"a"}`)), asynq.Queue(e.Queue))
	require.NoError(t, err)
	require.Equal(t, plain+1, rt.Count(), "one command more than asynq's enqueue")
	_, err = client.Enqueue(asynq.NewTask("report", []byte(`{}`)), asynq.Queue(e.Queue))
	require.ErrorIs(t, err, singleton.ErrKey)
}

// gateHook holds back every command that carries one of the labels in
// held (the acquires of those tasks) until gate is closed.
type gateHook struct {
	held map[string]bool
	gate <-chan struct{}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && h.held[s] {
				select {
				case <-h.gate:
				case <-ctx.Done():
				}
				break
			}
		}
		return next(ctx, cmd)
	}
}

// Bursts of tasks over several keys on three servers, enqueued by
// singleton.Client, with the acquires of some older tasks of each key held
// back until every other task is done, so that they reach Redis last: under
// KeepNewest and Preempt, each key's runs come in enqueue order, the last
// one is the key's newest task, and every held-back task completes without
// running.
func TestBurstsRunTheNewestLast(t *testing.T) {
	const keys, perKey = 4, 8
	for _, policy := range []middleware.Policy{middleware.KeepNewest(), middleware.Preempt(0)} {
		t.Run(policy.String(), func(t *testing.T) {
			e := newEnvOn(t, standalone)
			ctx := context.Background()
			gate := make(chan struct{})
			held := map[string]bool{}
			for k := range keys {
				for _, i := range []int{1 + k%3, 4 + k%3} { // never the newest
					held["t-"+strconv.Itoa(k)+"-"+strconv.Itoa(i)] = true
				}
			}
			hooked := redis.NewClient(e.RDB.(*redis.Client).Options())
			t.Cleanup(func() { _ = hooked.Close() })
			hooked.AddHook(&gateHook{held: held, gate: gate})
			var mu sync.Mutex
			ran := map[string][]int{} // key → the n of each run, in order
			done := map[string]bool{} // task ID → ran or completed without running
			observe := func(_ context.Context, ev middleware.Event) {
				if ev.Kind == middleware.EventReleased || ev.Kind == middleware.EventDuplicate && ev.Action == middleware.ActionSkip {
					mu.Lock()
					done[ev.Job.ID] = true
					mu.Unlock()
				}
			}
			handler := asynq.HandlerFunc(func(_ context.Context, task *asynq.Task) error {
				tenant, n, err := reportOf(task)
				mu.Lock()
				ran[tenant] = append(ran[tenant], n)
				mu.Unlock()
				return err
			})
			for i := range 3 {
				l, err := lockkit.NewRedis(hooked, lockkit.WithPrefix(e.Prefix), lockkit.WithOwner("server-"+strconv.Itoa(i)))
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				mw, err := singleton.Middleware(l, singleton.KeyByFields("tenant_id"), singleton.WithPolicy(policy), singleton.WithRedis(e.RDB),
					singleton.WithObserver(observe))
				require.NoError(t, err)
				e.start(e.config(5), mw(handler))
			}
			client, err := singleton.NewClient(e.Client, e.RDB, singleton.KeyByFields("tenant_id"))
			require.NoError(t, err)
			for i := range perKey {
				for k := range keys {
					_, err := client.EnqueueContext(ctx, asynq.NewTask("report", []byte(`{"tenant_id":"k`+strconv.Itoa(k)+`","n":`+strconv.Itoa(i)+`}`)),
						asynq.Queue(e.Queue), asynq.TaskID("t-"+strconv.Itoa(k)+"-"+strconv.Itoa(i)))
					require.NoError(t, err)
				}
			}
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				n := 0
				for id := range done {
					if !held[id] {
						n++
					}
				}
				return n == keys*perKey-len(held)
			}, 20*time.Second, 5*time.Millisecond, "every task not held back is done")
			close(gate) // the held-back acquires reach Redis last
			e.Drained(20 * time.Second)
			mu.Lock()
			defer mu.Unlock()
			for k := range keys {
				runs := ran["k"+strconv.Itoa(k)]
				require.NotEmpty(t, runs)
				require.True(t, slices.IsSorted(runs) && len(slices.Compact(slices.Clone(runs))) == len(runs), "key k%d ran in enqueue order: %v", k, runs)
				require.Equal(t, perKey-1, runs[len(runs)-1], "key k%d's last run is its newest task: %v", k, runs)
				for _, n := range runs {
					require.False(t, held["t-"+strconv.Itoa(k)+"-"+strconv.Itoa(n)], "key k%d: held-back task %d ran: %v", k, n, runs)
				}
			}
		})
	}
}
