package singleton_test

import (
	"context"
	"slices"
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
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// With WithRedis, a KeepNewest follow-up is parked, not waited for: while
// "v1" runs, "v2" parks, "v3" takes its place (v2, started again, completes
// without running), a task of another key runs on the worker a waiting
// follow-up would have held, and v1's end starts v3 at once, long before
// the parked tasks' backstop.
func TestKeepNewestParksItsFollowUp(t *testing.T) {
	testParkedFollowUp(t, middleware.KeepNewest(), []string{"v1", "v3"}, lockcore.ErrSuperseded)
}

// With WithRedis, a Coalesce follow-up is parked, not waited for: while "v1"
// runs, "v2" (delivered after v1 began) parks as the key's follow-up, "v3"
// folds into it and completes without running, and v1's end starts v2.
func TestCoalesceParksItsFollowUp(t *testing.T) {
	testParkedFollowUp(t, middleware.Coalesce(), []string{"v1", "v2"}, lockcore.ErrCovered)
}

// testParkedFollowUp runs v1, v2 and v3 of one key, and a task of another
// key while v1 runs, on two workers under policy, and checks that the key
// ran want, that the task left out completed without running for cause,
// and that no worker waited for the key.
func testParkedFollowUp(t *testing.T, policy middleware.Policy, want []string, cause error) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		other := make(chan struct{})
		mw, err := singleton.Middleware(e.locker(), singleton.WithPolicy(policy), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		mux, runs, release := blockingMux(mw, "sync")
		mux.HandleFunc("other", func(context.Context, *asynq.Task) error {
			close(other)
			return nil
		})
		e.start(e.config(2), mux)
		e.Enqueue(asynq.NewTask("sync", []byte("v1")))
		require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
		e.Enqueue(asynq.NewTask("sync", []byte("v2")))
		ev.waitRequeued(t, 1)
		e.Enqueue(asynq.NewTask("sync", []byte("v3")))
		require.Eventually(t, func() bool { return ev.count(middleware.EventDuplicate, middleware.ActionSkip) == 1 }, 10*time.Second, 5*time.Millisecond,
			"one of v2 and v3 completed without running")
		e.Enqueue(asynq.NewTask("other", nil))
		recv(t, other, 10*time.Second) // the second worker is free
		close(release)
		start := time.Now()
		e.Drained(10 * time.Second)
		require.Less(t, time.Since(start), parkBackstop/2, "started by v1's end, not by the backstop")
		require.Equal(t, want, runs.payloads())
		qi := e.QueueInfo()
		require.Zero(t, qi.FailedTotal)
		require.Zero(t, qi.Archived)
		require.Equal(t, 1, ev.count(middleware.EventDuplicate, middleware.ActionSkip))
		for _, d := range ev.all() {
			if d.Kind == middleware.EventDuplicate && d.Action == middleware.ActionSkip {
				require.ErrorIs(t, d.Err, cause)
			}
		}
	})
}

// firstBlocks is a handler that records the payloads it runs, in order, and
// holds the first run until release is closed.
type firstBlocks struct {
	release <-chan struct{}
	mu      sync.Mutex
	ran     []string
}

func (f *firstBlocks) handle(_ context.Context, task *asynq.Task) error {
	f.mu.Lock()
	f.ran = append(f.ran, string(task.Payload()))
	first := len(f.ran) == 1
	f.mu.Unlock()
	if first {
		<-f.release
	}
	return nil
}

// blockingMux serves tasks of type typ behind mw with a firstBlocks
// handler, whose first run blocks until release is closed.
func blockingMux(mw asynq.MiddlewareFunc, typ string) (mux *asynq.ServeMux, runs *firstBlocks, release chan struct{}) {
	release = make(chan struct{})
	runs = &firstBlocks{release: release}
	mux = asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc(typ, runs.handle)
	return mux, runs, release
}

func (f *firstBlocks) payloads() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ran)
}

// A parked follow-up that no run starts (its key's holder resumes no one:
// its process died, say) comes back by itself at its backstop, parkBackstop
// after it parked, and runs once its key is free. The backstop is brought
// forward here with Inspector.RunTask.
func TestParkedFollowUpComesBackAtItsBackstop(t *testing.T) {
	for _, policy := range []middleware.Policy{middleware.KeepNewest(), middleware.Coalesce()} {
		t.Run(policy.String(), func(t *testing.T) {
			onEachRedis(t, func(t *testing.T, r connect) {
				e := newEnvOn(t, r)
				ctx := context.Background()
				ev := &events{}
				keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
				mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithPolicy(policy), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
				require.NoError(t, err)
				mux, ran := payloadMux(mw)
				holder, err := e.locker().TryAcquire(ctx, "k", nil) // resumes no one
				require.NoError(t, err)
				e.start(e.config(2), mux)
				parkedAt := time.Now()
				info := e.Enqueue(asynq.NewTask("sync", []byte("v1")))
				ev.waitRequeued(t, 1)
				var back *asynq.TaskInfo
				require.Eventually(t, func() bool {
					back, err = e.Inspector.GetTaskInfo(e.Queue, info.ID)
					return err == nil && back.State == asynq.TaskStateRetry
				}, 10*time.Second, 5*time.Millisecond)
				require.WithinDuration(t, parkedAt.Add(parkBackstop), back.NextProcessAt, 5*time.Second, "the backstop")
				require.Zero(t, back.Retried, "a parked follow-up is no failure (ServerConfig's IsFailure)")
				require.NoError(t, holder.Release(ctx))
				select {
				case v := <-ran:
					t.Fatalf("%s ran before its backstop", v)
				case <-time.After(100 * time.Millisecond):
				}
				require.NoError(t, e.Inspector.RunTask(e.Queue, info.ID)) // the backstop
				require.Equal(t, "v1", recv(t, ran, 10*time.Second))
				e.Drained(10 * time.Second)
			})
		})
	}
}

// stallHook holds back, once, the command whose arguments end with suffix
// until the caller's ctx ends, and fails it unsent.
type stallHook struct {
	suffix string
	done   atomic.Bool
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.HasSuffix(s, h.suffix) && h.done.CompareAndSwap(false, true) {
				<-ctx.Done()
				cmd.SetErr(ctx.Err())
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

// A resume whose move of the parked task runs out of time passes the key
// on to the next parked task at once, as for a task that cannot be run: the
// reservation is not left for its backstop.
func TestResumeThatTimesOutPassesTheKeyOn(t *testing.T) {
	e := newEnvOn(t, standalone)
	slow := redis.NewClient(e.RDB.(*redis.Client).Options())
	t.Cleanup(func() { _ = slow.Close() })
	slow.AddHook(&stallHook{suffix: ":t:parked-a"})
	ev := &events{}
	mw, err := singleton.Middleware(e.locker(), singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil }),
		singleton.WithPolicy(middleware.Requeue(time.Hour)), singleton.WithRedis(slow), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	mux, runs, release := blockingMux(mw, "job")
	e.start(e.config(2), mux)
	e.Enqueue(asynq.NewTask("job", []byte("holder")))
	require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
	e.Enqueue(asynq.NewTask("job", []byte("a")), asynq.TaskID("parked-a"))
	ev.waitRequeued(t, 1)
	e.Enqueue(asynq.NewTask("job", []byte("b")), asynq.TaskID("parked-b"))
	ev.waitRequeued(t, 2)
	close(release)
	require.Eventually(t, func() bool { return slices.Contains(runs.payloads(), "b") }, 10*time.Second, 10*time.Millisecond,
		"the next parked task runs once the stalled resume gave up")
}

// A resumed task that does not run after all passes the key on at once, as
// one that cannot be run does: with Debounce and KeepNewest, the follow-up
// "v2" parked while "v1" ran is superseded by "v3", enqueued later and due
// later; v1's end reserves the key for v2 and resumes it, v2 completes
// without running, and the key is free for v3 at once, not after the 30 s
// that the reservation would otherwise wait for v2.
func TestResumedTaskThatDoesNotRunPassesTheKeyOn(t *testing.T) {
	e := newEnvOn(t, standalone)
	ctx := context.Background()
	keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
	ev := &events{}
	mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithPolicy(middleware.KeepNewest()), singleton.WithRedis(e.RDB),
		singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	mux, runs, release := blockingMux(mw, "sync")
	e.start(e.config(2), mux)
	soon, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB, keyOf, singleton.Debounce(e.locker(), time.Millisecond, 0))
	require.NoError(t, err)
	later, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB, keyOf, singleton.Debounce(e.locker(), time.Hour, 0))
	require.NoError(t, err)

	e.Enqueue(asynq.NewTask("sync", []byte("v1")))
	require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
	_, err = soon.Enqueue(asynq.NewTask("sync", []byte("v2")), asynq.Queue(e.Queue))
	require.NoError(t, err)
	ev.waitRequeued(t, 1) // v2 parked as the follow-up
	v3, err := later.Enqueue(asynq.NewTask("sync", []byte("v3")), asynq.Queue(e.Queue))
	require.NoError(t, err)
	close(release)
	require.Eventually(t, func() bool { return ev.count(middleware.EventDuplicate, middleware.ActionSkip) == 1 }, 10*time.Second, 5*time.Millisecond,
		"v2, resumed, completed without running")
	locker := e.locker()
	require.Eventually(t, func() bool {
		info, err := locker.Inspect(ctx, "k")
		require.NoError(t, err)
		return len(info.Holders) == 0
	}, 5*time.Second, 5*time.Millisecond, "nothing is left reserved for v2")
	require.NoError(t, e.Inspector.RunTask(e.Queue, v3.ID)) // v3 is due
	e.Drained(5 * time.Second)
	require.Equal(t, []string{"v1", "v3"}, runs.payloads())
}

// blockingErrors is an asynq.ErrorHandler that holds the error of the task
// with payload "a" until release is closed, after signalling entered.
type blockingErrors struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingErrors) HandleError(_ context.Context, task *asynq.Task, _ error) {
	if string(task.Payload()) == "a" {
		b.once.Do(func() { close(b.entered) })
		<-b.release
	}
}

// A parked task whose duplicate delivery is still finishing when the key is
// reserved for it (asynq calls Config.ErrorHandler before it moves the task
// back, and this one is slow) cannot be started: after a second the resume
// passes the key on to the next parked task, instead of leaving it
// reserved until the slow task's backstop. The slow task comes back at its
// backstop (brought forward here) and runs.
func TestSlowErrorHandlerDoesNotIdleTheKey(t *testing.T) {
	e := newEnvOn(t, standalone)
	ev := &events{}
	mw, err := singleton.Middleware(e.locker(), singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil }),
		singleton.WithPolicy(middleware.Requeue(time.Minute)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	mux, runs, release := blockingMux(mw, "job")
	slow := &blockingErrors{entered: make(chan struct{}), release: make(chan struct{})}
	cfg := e.config(4)
	cfg.ErrorHandler = slow
	e.start(cfg, mux)
	e.Enqueue(asynq.NewTask("job", []byte("holder")))
	require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
	a := e.Enqueue(asynq.NewTask("job", []byte("a")))
	recv(t, slow.entered, 10*time.Second)
	e.Enqueue(asynq.NewTask("job", []byte("b")))
	ev.waitRequeued(t, 2)
	close(release)
	require.Eventually(t, func() bool { return slices.Contains(runs.payloads(), "b") }, 5*time.Second, 10*time.Millisecond,
		"b runs once the resume of a gave up, not at its backstop")
	close(slow.release)
	require.Eventually(t, func() bool {
		ti, err := e.Inspector.GetTaskInfo(e.Queue, a.ID)
		return err == nil && ti.State == asynq.TaskStateRetry
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, e.Inspector.RunTask(e.Queue, a.ID)) // its backstop
	e.Drained(10 * time.Second)
	require.Equal(t, []string{"holder", "b", "a"}, runs.payloads())
	require.Empty(t, ev.errs(middleware.EventError), "a slow ErrorHandler is no error of the resume")
}

// A parked Requeue duplicate comes back by itself only as a backstop: the
// next in line the policy's delay after the holder's lease would run out
// unrenewed, the others after parkBackstop. Each is then delivered once
// more, by the run that frees the key, in the order they parked.
func TestParkedDuplicatesComeBackOnlyAsABackstop(t *testing.T) {
	e := newEnvOn(t, standalone)
	ev := &events{}
	const ttl, delay = 2 * time.Second, 50 * time.Millisecond
	keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
	mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithTTL(ttl),
		singleton.WithPolicy(middleware.Requeue(delay)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	mux, runs, release := blockingMux(mw, "sync")
	e.start(e.config(1), mux)
	e.Enqueue(asynq.NewTask("sync", []byte("v0")))
	require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
	// Concurrency 1 is busy with v0: the duplicates are delivered on a
	// second server, one at a time, so that they park in order.
	mw2, err := singleton.Middleware(e.locker(), keyOf, singleton.WithTTL(ttl),
		singleton.WithPolicy(middleware.Requeue(delay)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	srv := asynq.NewServerFromRedisClient(e.RDB, e.config(1))
	require.NoError(t, srv.Start(mw2(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		t.Error("a parked duplicate ran while the key was held")
		return nil
	}))))
	for i, v := range []string{"v1", "v2", "v3"} {
		e.Enqueue(asynq.NewTask("sync", []byte(v)))
		ev.waitRequeued(t, i+1)
	}
	srv.Shutdown()
	var delays []time.Duration
	for _, x := range ev.all() {
		if x.Kind == middleware.EventRequeued {
			delays = append(delays, x.Delay)
		}
	}
	require.Len(t, delays, 3)
	// v1, next in line: the lease had about two thirds of its TTL (it is
	// renewed every TTL/3) to all of it left, plus the delay and its jitter;
	// the lower bound leaves room for a late renewal.
	require.GreaterOrEqual(t, delays[0], ttl/3, "next in line: when the holder's lease would run out")
	require.LessOrEqual(t, delays[0], ttl+delay*3/2+time.Millisecond)
	require.Equal(t, []time.Duration{parkBackstop, parkBackstop}, delays[1:], "the others: the backstop")

	close(release)
	e.Drained(10 * time.Second)
	require.Equal(t, []string{"v0", "v1", "v2", "v3"}, runs.payloads())
	require.Equal(t, 3, ev.count(middleware.EventRequeued, 0), "each delivered once more, by the run before it")
}

// The release of the run that frees a key may lose its reply after it ran
// and reserved the key for the duplicate parked behind that run. The
// duplicate starts at once all the same, not at its backstop (here 30 s,
// when the holder's lease would have run out): the Locker sends the release
// again, and the repeat names the task it reserved the key for.
func TestParkedDuplicateStartsWhenTheReleaseBeforeItLostItsReply(t *testing.T) {
	e := newEnvOn(t, standalone)
	rdb := redis.NewClient(e.RDB.(*redis.Client).Options())
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &testredis.Faults{Match: testredis.ScriptShape(8, 11)} // the release scripts' keys and arguments
	rdb.AddHook(hook)
	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(e.Prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	ev := &events{}
	keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
	mw, err := singleton.Middleware(locker, keyOf, singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)),
		singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	mux, runs, release := blockingMux(mw, "sync")
	e.start(e.config(2), mux)
	e.Enqueue(asynq.NewTask("sync", []byte("v0")))
	require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
	e.Enqueue(asynq.NewTask("sync", []byte("v1")))
	ev.waitRequeued(t, 1)

	hook.Arm(testredis.DropReply, 1)
	close(release)
	e.Drained(10 * time.Second)
	require.EqualValues(t, 1, hook.Hits(), "v0's release lost its reply")
	require.Equal(t, []string{"v0", "v1"}, runs.payloads())
	require.Equal(t, 1, ev.count(middleware.EventRequeued, 0), "v1 was delivered once more, by v0's release")
}

// Under WithHoldAtLeast a run shorter than the hold ends in a held release,
// which frees the key at the hold's end: its Locker then resumes the next
// parked duplicate, so the ones behind it do not wait for their backstop.
func TestParkedDuplicatesOfAHeldKeyComeBackSoon(t *testing.T) {
	e := newEnvOn(t, standalone)
	ev := &events{}
	const hold = 300 * time.Millisecond
	keyOf := singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "k", nil })
	mw, err := singleton.Middleware(e.locker(), keyOf, singleton.WithHoldAtLeast(hold),
		singleton.WithPolicy(middleware.Requeue(100*time.Millisecond)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	mux, runs, release := blockingMux(mw, "sync")
	e.start(e.config(2), mux)
	e.Enqueue(asynq.NewTask("sync", []byte("v0")))
	require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
	started := time.Now()
	l := e.locker()
	for i, v := range []string{"v1", "v2", "v3"} {
		e.Enqueue(asynq.NewTask("sync", []byte(v)))
		// Parked (a parked task that comes back by itself is put back in
		// its place, so the requeues counted may run ahead of the tasks).
		require.Eventually(t, func() bool {
			info, err := coretest.Of(t, l).Inspect(context.Background(), "k")
			require.NoError(t, err)
			return info.Parked == i+1
		}, 10*time.Second, 5*time.Millisecond, "%s parks behind v0's run", v)
	}
	// v0 runs past its hold, so its release resumes v1; v1's run, shorter
	// than the hold, ends in a held release, which resumes v2 at the hold's
	// end, and v2's resumes v3 at its own.
	time.Sleep(time.Until(started.Add(hold + 100*time.Millisecond)))
	close(release)
	ended := time.Now()
	e.Drained(60 * time.Second)
	require.Len(t, runs.payloads(), 4)
	require.Less(t, time.Since(ended), 10*time.Second, "v2 and v3 found the key free after v1's hold, not at their 30 s backstop")
}
