package singleton_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/asynqtest"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// An earlier delivery's retry write, sent again after a lost reply, lands
// while a later delivery of the task runs: asynq takes the task back and
// delivers it once more after that run succeeded. That delivery completes
// without running: the work is done once. The earlier delivery is a parked
// duplicate (its resumed delivery runs) or a failure that asynq retried.
func TestLateRetryWriteDoesNotRunTheTaskTwice(t *testing.T) {
	for _, earlier := range []string{"parked", "failed"} {
		t.Run(earlier, func(t *testing.T) { lateRetryWrite(t, earlier, false) })
	}
}

// The same, with a run longer than DelayedTaskCheckInterval: the retry the
// late write scheduled comes due while the run still goes, and asynq's next
// delivery waits for that run. When the run succeeds, that delivery completes
// without running: the work is done once.
func TestTakenBackTaskRedeliveredWhileItRunsRunsOnce(t *testing.T) {
	for _, earlier := range []string{"parked", "failed"} {
		t.Run(earlier, func(t *testing.T) { lateRetryWrite(t, earlier, true) })
	}
}

func lateRetryWrite(t *testing.T, earlier string, redeliveredWhileRunning bool) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(), singleton.WithRedis(e.RDB),
			singleton.WithPolicy(middleware.Requeue(time.Second)), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		holderStarted, releaseHolder := make(chan struct{}), make(chan struct{})
		xStarted, releaseX := make(chan string), make(chan struct{})
		var xRuns atomic.Int32
		cfg := e.configRetrying(4, func(int, error, *asynq.Task) time.Duration { return 0 })
		e.start(cfg, mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			switch string(task.Payload()) {
			case "holder":
				close(holderStarted)
				<-releaseHolder
			case "x":
				n := xRuns.Add(1)
				if earlier == "failed" && n == 1 {
					return errors.New("the first run fails")
				}
				if (earlier == "parked" && n == 1) || (earlier == "failed" && n == 2) {
					id, _ := asynq.GetTaskID(ctx)
					xStarted <- id
					<-releaseX
				}
			}
			return nil
		})))
		var x *asynq.TaskInfo
		if earlier == "parked" {
			e.Enqueue(asynq.NewTask("job", []byte("holder")))
			<-holderStarted
			x = e.Enqueue(asynq.NewTask("job", []byte("x")), asynq.MaxRetry(3))
			ev.waitRequeued(t, 1, "x is parked behind the holder")
			close(releaseHolder)
		} else {
			x = e.Enqueue(asynq.NewTask("job", []byte("x")), asynq.MaxRetry(3))
		}
		require.Equal(t, x.ID, <-xStarted)

		require.NoError(t, asynqtest.LateRetry(context.Background(), e.RDB, e.Queue, x.ID, time.Now()),
			"the late write takes the running delivery back")
		if redeliveredWhileRunning {
			// The retry is due at once: asynq delivers x again, and that
			// delivery waits for x's run, which still goes.
			e.waiters("asynq:job", 1)
		}
		close(releaseX)

		require.Eventually(t, func() bool {
			_, err := e.Inspector.GetTaskInfo(e.Queue, x.ID)
			return errors.Is(err, asynq.ErrTaskNotFound)
		}, 20*time.Second, 10*time.Millisecond, "asynq delivers x again, and that delivery completes")
		completedOf := func() int {
			n := 0
			for _, d := range ev.all() {
				if d.Kind == middleware.EventDuplicate && errors.Is(d.Err, lockcore.ErrCompleted) && d.Job.ID == x.ID {
					n++
				}
			}
			return n
		}
		// asynq may complete the task at the end of the taken-back run,
		// before the last delivery has returned.
		require.Eventually(t, func() bool { return completedOf() > 0 }, 5*time.Second, 10*time.Millisecond,
			"x's last delivery completed without running: %v", ev.all())
		want := int32(1)
		if earlier == "failed" {
			want = 2
		}
		require.Equal(t, want, xRuns.Load(), "x's work ran to success once")
		require.Equal(t, 1, completedOf(), "x's last delivery completed without running once: %v", ev.all())

		if redeliveredWhileRunning {
			// The success went with the task (its hash): nothing is kept
			// that a later task reusing x's ID could be taken for.
			return
		}
		// The success is kept until the retry was due plus a minute, not for
		// lockkit.CompletedRetention: a later task reusing x's ID runs.
		var keys []string
		var mu sync.Mutex
		scan := func(ctx context.Context, c *redis.Client) error {
			ks, err := c.Keys(ctx, e.Prefix+"*:h").Result()
			mu.Lock()
			keys = append(keys, ks...)
			mu.Unlock()
			return err
		}
		if cc, ok := e.RDB.(*redis.ClusterClient); ok {
			require.NoError(t, cc.ForEachMaster(context.Background(), scan))
		} else {
			require.NoError(t, scan(context.Background(), e.RDB.(*redis.Client)))
		}
		found := false
		for _, k := range keys {
			score, err := e.RDB.ZScore(context.Background(), k, "done:"+x.ID).Result()
			if err != nil {
				continue
			}
			found = true
			left := time.Until(time.UnixMilli(int64(-score)))
			require.Greater(t, left, 30*time.Second)
			require.Less(t, left, 2*time.Minute, "kept until the retry was due plus a minute")
		}
		require.True(t, found, "x's success is recorded")
	})
}

// A delivery that waited for its task's taken-back run, and cannot read the
// task's state when it has the key (a Redis error: a Cluster down while a
// master restarts), fails without running, with an EventError; meanwhile
// asynq's completion of that run has removed the task, so asynq does not
// deliver it again: the work is done once.
func TestTakenBackRedeliveryThatCannotReadTheTaskDoesNotRun(t *testing.T) {
	e := newEnvOn(t, standalone)
	faulty := redis.NewClient(e.RDB.(*redis.Client).Options())
	t.Cleanup(func() { _ = faulty.Close() })
	hook := &testredis.Faults{Match: func(cmd redis.Cmder) bool {
		args := cmd.Args()
		return strings.EqualFold(cmd.Name(), "hmget") && args[len(args)-1] == "jobguard-succeeded"
	}}
	faulty.AddHook(hook)
	ev := &events{}
	mw, err := singleton.Middleware(e.locker(), singleton.WithRedis(faulty),
		singleton.WithPolicy(middleware.Requeue(time.Second)), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	xStarted, releaseX := make(chan string), make(chan struct{})
	var xRuns atomic.Int32
	cfg := e.configRetrying(4, func(int, error, *asynq.Task) time.Duration { return 0 })
	e.start(cfg, mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		switch xRuns.Add(1) {
		case 1:
			return errors.New("the first run fails")
		case 2:
			id, _ := asynq.GetTaskID(ctx)
			xStarted <- id
			<-releaseX
		}
		return nil
	})))
	x := e.Enqueue(asynq.NewTask("job", []byte("x")), asynq.MaxRetry(3))
	require.Equal(t, x.ID, <-xStarted)
	gone := make(chan bool, 1)
	hook.Before = func(redis.Cmder) {
		// The read fails once asynq has completed the taken-back run.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if n, err := e.RDB.Exists(context.Background(), asynqkey.Task(e.Queue, x.ID)).Result(); err == nil && n == 0 {
				gone <- true
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		gone <- false
	}
	hook.Arm(testredis.DropReply, 1)

	require.NoError(t, asynqtest.LateRetry(context.Background(), e.RDB, e.Queue, x.ID, time.Now()),
		"the late write takes the running delivery back")
	e.waiters("asynq:job", 1) // asynq's next delivery waits for x's run
	close(releaseX)

	require.True(t, recv(t, gone, 15*time.Second), "asynq completed the taken-back run")
	var failed *middleware.Event
	require.Eventually(t, func() bool {
		for _, d := range ev.all() {
			if d.Kind == middleware.EventError && errors.Is(d.Err, testredis.ErrInjected) && d.Job.ID == x.ID {
				failed = &d
			}
		}
		return failed != nil || xRuns.Load() > 2
	}, 10*time.Second, 10*time.Millisecond, "the waiting delivery ends")
	require.EqualValues(t, 2, xRuns.Load(), "x's work ran to success once (after one failed run)")
	require.NotNil(t, failed, "an EventError reports the failed read: %v", ev.all())
	require.ErrorContains(t, failed.Err, "reading whether the earlier run")
	e.gone(x.ID, "asynq does not deliver x again")
	require.EqualValues(t, 2, xRuns.Load(), "x's work ran to success once (after one failed run)")
}
