package singleton_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// A parked follow-up with no retries left (MaxRetry(0)) is parked under the
// ID of its copy. When the run holding the key lasts longer than the
// backstop, the copy comes back by itself (brought forward here with
// Inspector.RunTask) while the key is still held and parks again under a new
// copy ID. The follow-up must still run once the key frees.
func TestFollowUpCopySurvivesItsBackstop(t *testing.T) {
	for _, policy := range []middleware.Policy{middleware.KeepNewest(), middleware.Coalesce()} {
		t.Run(policy.String(), func(t *testing.T) {
			e := newEnvOn(t, standalone)
			ev := &events{}
			mw, err := singleton.Middleware(e.locker(), singleton.WithPolicy(policy), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
			require.NoError(t, err)
			mux, runs, release := blockingMux(mw, "sync")
			e.start(e.config(2), mux)
			e.Enqueue(asynq.NewTask("sync", []byte("v1")))
			require.Eventually(t, func() bool { return len(runs.payloads()) == 1 }, 10*time.Second, 5*time.Millisecond)
			e.Enqueue(asynq.NewTask("sync", []byte("v2")), asynq.MaxRetry(0))
			ev.waitRequeued(t, 1)
			// The copy, scheduled at the backstop: bring it forward (v1 still runs).
			var copyID string
			require.Eventually(t, func() bool {
				l, err := e.Inspector.ListScheduledTasks(e.Queue)
				if err != nil || len(l) != 1 {
					return false
				}
				copyID = l[0].ID
				return true
			}, 10*time.Second, 5*time.Millisecond)
			require.NoError(t, e.Inspector.RunTask(e.Queue, copyID))
			require.Eventually(t, func() bool {
				l, err := e.Inspector.ListScheduledTasks(e.Queue)
				a, err2 := e.Inspector.ListActiveTasks(e.Queue)
				p, err3 := e.Inspector.ListPendingTasks(e.Queue)
				return err == nil && err2 == nil && err3 == nil && len(a) == 1 && len(p) == 0 && (len(l) == 1 && l[0].ID != copyID || len(l) == 0)
			}, 10*time.Second, 5*time.Millisecond, "the backstop delivery is handled")
			t.Logf("events before release: %d requeued, %d skipped", ev.count(middleware.EventRequeued, 0), ev.count(middleware.EventDuplicate, middleware.ActionSkip))
			close(release)
			e.Drained(10 * time.Second)
			for _, d := range ev.all() {
				t.Logf("event %s %s %v", d.Kind, d.Job.ID, d.Err)
			}
			require.Equal(t, []string{"v1", "v2"}, runs.payloads(), "v2, the key's only follow-up, runs")
		})
	}
}

// Rolling deploy under KeepNewest with WithRedis: v1 runs on server A, v2
// parks as the key's follow-up (the newest). A shuts down; asynq puts v1
// back and server B gets it while v1's first run still holds the key. The
// re-delivery of v1 is not a newer task: it must not take v2's place, and
// v2, the newest task, must run after v1.
func TestRedeliveryDuringADeployKeepsTheNewestFollowUp(t *testing.T) {
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
			<-finish // still working after the cancellation; succeeds
		}
		return nil
	})
	newMW := func(l *lockkit.Locker) asynq.MiddlewareFunc {
		mw, err := singleton.Middleware(l, singleton.WithPolicy(middleware.KeepNewest()), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		return mw
	}
	cfgA := e.config(2)
	cfgA.ShutdownTimeout = 200 * time.Millisecond
	srvA := e.start(cfgA, newMW(e.locker(lockkit.WithOwner("server-a")))(handler))
	e.Enqueue(asynq.NewTask("sync", []byte("v1")))
	recv(t, firstStarted, 10*time.Second)
	e.Enqueue(asynq.NewTask("sync", []byte("v2")))
	ev.waitRequeued(t, 1, "v2 parks")

	e.start(e.config(2), newMW(e.locker(lockkit.WithOwner("server-b")))(handler))
	srvA.Shutdown() // v1 goes back to pending, its first run's ctx is cancelled
	recv(t, firstCancelled, 10*time.Second)
	ev.waitRequeued(t, 2, "v1's re-delivery parks")
	close(finish) // v1's first run succeeds
	defer func() {
		for _, d := range ev.all() {
			t.Logf("event %s %s %s %v", d.Kind, d.Job.ID, d.Action, d.Err)
		}
		mu.Lock()
		t.Logf("ran %v", ran)
		mu.Unlock()
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range ran {
			if p == "v2" {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "v2, the newest task, runs")
}

// Rolling deploy under Coalesce, the task enqueued by singleton.Client
// (stamped): v1's first run, cancelled by server A's shutdown, fails. Its
// re-delivery on server B must not be covered by that run (it is the same
// task, and asynq will not retry the interrupted run): the work must be done.
func TestRedeliveryDuringADeployIsNotCoveredByItsOwnRun(t *testing.T) {
	for _, park := range []bool{false, true} {
		name := "waiting"
		if park {
			name = "parking"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnvOn(t, standalone)
			ev := &events{}
			var calls, done atomic.Int32
			firstStarted := make(chan struct{})
			firstCancelled := make(chan struct{})
			finish := make(chan struct{})
			var once sync.Once
			handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
				if calls.Add(1) == 1 {
					close(firstStarted)
					<-ctx.Done()
					once.Do(func() { close(firstCancelled) })
					<-finish
					return errors.New("interrupted")
				}
				done.Add(1)
				return nil
			})
			newMW := func(l *lockkit.Locker) asynq.MiddlewareFunc {
				opts := []singleton.ServerOption{singleton.WithPolicy(middleware.Coalesce()), singleton.WithObserver(ev.observe)}
				if park {
					opts = append(opts, singleton.WithRedis(e.RDB))
				}
				mw, err := singleton.Middleware(l, opts...)
				require.NoError(t, err)
				return mw
			}
			client, err := singleton.NewClient(e.Client, e.RDB)
			require.NoError(t, err)
			cfgA := e.config(2)
			cfgA.ShutdownTimeout = 200 * time.Millisecond
			srvA := e.start(cfgA, newMW(e.locker(lockkit.WithOwner("server-a")))(handler))
			// Server B's acquire finds the key held by the first run.
			contended := make(chan struct{}, 1)
			lockerB := e.locker(lockkit.WithOwner("server-b"), lockkit.WithObserver(func(ev lockkit.Event) {
				if ev.Kind == lockkit.LeaseContended {
					select {
					case contended <- struct{}{}:
					default:
					}
				}
			}))
			_, err = client.Enqueue(asynq.NewTask("sync", nil), asynq.Queue(e.Queue), asynq.MaxRetry(3))
			require.NoError(t, err)
			recv(t, firstStarted, 10*time.Second)
			e.start(e.config(2), newMW(lockerB)(handler))
			srvA.Shutdown()
			recv(t, firstCancelled, 10*time.Second)
			// Server B gets the re-delivery while the first run still holds
			// the key: it waits or parks, and is not covered.
			recv(t, contended, 10*time.Second)
			close(finish) // the first run fails
			defer func() {
				for _, d := range ev.all() {
					t.Logf("event %s %s %s %v", d.Kind, d.Job.ID, d.Action, d.Err)
				}
			}()
			require.Eventually(t, func() bool { return done.Load() == 1 }, 10*time.Second, 10*time.Millisecond, "the work is done")
		})
	}
}
