package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// asynq's enqueue runs but its reply is lost: the Client returns the error
// and keeps the reservation, since the task is there; a second task of the
// key is refused.
func TestUniqueKeepsTheReservationOfATaskWhoseEnqueueReplyWasLost(t *testing.T) {
	e := newEnvOn(t, standalone)
	client, hook := faultyUniqueClient(t, e, "}:t:")
	task := asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`), asynq.Queue(e.Queue))

	hook.Arm(testredis.DropReply, 1)
	_, err := client.Enqueue(task)
	require.Error(t, err, "the reply was lost")
	require.Equal(t, 2, e.QueueInfo().Pending, "but the task was enqueued")
	_, err = client.Enqueue(task)
	require.Error(t, err, fmt.Sprintf("a second task of the key was accepted while the first is pending (pending now %d)", e.QueueInfo().Pending))
}

// asynq gives up on a run at shutdown (ShutdownTimeout): it puts the task
// back to pending and cancels the handler's ctx. Even for a task with no
// retries left, the UntilExecuted reservation stays: the task runs again, and
// a second task of the key is refused.
func TestUniqueKeepsTheReservationOfATaskPutBackAtShutdown(t *testing.T) {
	e := newEnvOn(t, standalone)
	locker := e.locker()
	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB,
		singleton.KeyByFields("tenant_id"), singleton.Unique(locker, singleton.UntilExecuted, 0))
	require.NoError(t, err)
	mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"))
	require.NoError(t, err)
	started := make(chan string, 4)
	returned := make(chan struct{}, 4)
	mux := asynq.NewServeMux()
	// The outer middleware reports when the guard, and its reservation
	// handling, is done with the task.
	mux.Use(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			defer func() { returned <- struct{}{} }()
			return next.ProcessTask(ctx, task)
		})
	}, mw)
	mux.HandleFunc("report", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-ctx.Done()
		return ctx.Err()
	})
	cfg := e.config(1)
	cfg.ShutdownTimeout = 500 * time.Millisecond
	srv := asynq.NewServerFromRedisClient(e.RDB, cfg)
	require.NoError(t, srv.Start(mux))

	a, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(e.Queue), asynq.MaxRetry(0))
	require.NoError(t, err)
	require.Equal(t, a.ID, recv(t, started, 10*time.Second))
	srv.Shutdown() // after 500ms asynq puts A back to pending and cancels its ctx
	recv(t, returned, 10*time.Second)
	info, err := e.Inspector.GetTaskInfo(e.Queue, a.ID)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State, "asynq will run A again")
	b, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(e.Queue))
	if err == nil {
		t.Fatalf("B (%s) accepted while A (%s, same key) is pending: the reservation was released at the shutdown requeue", b.ID, a.ID)
	}
	var dup *singleton.DuplicateTaskError
	require.ErrorAs(t, err, &dup)
}

// UntilStarted frees the reservation when the task's run starts, not when a
// delivery finds its key held and is requeued without running: while the
// task waits to retry, a second task is refused.
func TestUntilStartedKeepsTheReservationOfADeliveryThatDidNotStart(t *testing.T) {
	e := newEnvOn(t, standalone)
	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB,
		singleton.KeyByFields("tenant_id"), singleton.Unique(e.locker(), singleton.UntilStarted, 0))
	require.NoError(t, err)
	mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"),
		singleton.WithPolicy(middleware.Requeue(time.Minute)), singleton.WithRedis(e.RDB))
	require.NoError(t, err)
	block := make(chan struct{})
	defer close(block)
	started := make(chan string, 8)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("report", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-block
		return nil
	})
	e.start(e.config(4), mux)
	a, err := e.Client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":0}`)), asynq.Queue(e.Queue))
	require.NoError(t, err)
	require.Equal(t, a.ID, recv(t, started, 10*time.Second))
	b, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":1}`)), asynq.Queue(e.Queue), asynq.MaxRetry(5))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ti, err := e.Inspector.GetTaskInfo(e.Queue, b.ID)
		return err == nil && ti.State == asynq.TaskStateRetry
	}, 10*time.Second, 5*time.Millisecond, "B was requeued without running")
	select {
	case id := <-started:
		t.Fatalf("unexpected start of %s", id)
	default:
	}
	c, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":2}`)), asynq.Queue(e.Queue))
	if err == nil {
		t.Fatalf("C (%s) accepted while B (%s) is waiting to retry and never started", c.ID, b.ID)
	}
}

// The reservation's reply is lost (go-redis gives up): EnqueueContext
// returns the Redis error and enqueues nothing, and frees the reservation it
// may have made, so the caller's retry is not refused as a duplicate of a
// task that does not exist (a caller may take asynq.ErrDuplicateTask for
// "already enqueued").
func TestUniqueLostReservationReplyDoesNotRefuseTheRetry(t *testing.T) {
	e := newEnvOn(t, standalone)
	client, hook := faultyUniqueClient(t, e, "unique:")
	task := asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`), asynq.Queue(e.Queue))

	hook.Arm(testredis.DropReply, 1)
	_, err := client.Enqueue(task)
	require.Error(t, err)
	require.NotErrorIs(t, err, asynq.ErrDuplicateTask)
	require.Equal(t, 1, e.QueueInfo().Size, "nothing was enqueued (the warm-up task is)")
	_, err = client.Enqueue(task)
	require.NoError(t, err, "the caller's retry is refused although no task of the key exists (queue size %d)", e.QueueInfo().Size)
}

// An UntilExecuted task with no retries left that the middleware requeues is
// revoked and replaced by a copy, whose ID (named by its work's asynqkey.Copy) the
// next enqueue of the key finds from the reservation's: the key stays reserved for the copy,
// past the grace of an enqueue in flight, and a second task is refused.
func TestUniqueReservationFollowsTheRequeuedCopy(t *testing.T) {
	e := newEnvOn(t, standalone)
	locker := e.locker()
	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB,
		singleton.KeyByFields("tenant_id"), singleton.Unique(locker, singleton.UntilExecuted, 8*time.Second)) // enqueue grace: 2s
	require.NoError(t, err)

	var mu sync.Mutex
	runs := map[string]int{} // task ID (or origin) → runs
	block := make(chan struct{})
	started := make(chan string, 16)
	mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"),
		singleton.WithPolicy(middleware.Requeue(time.Minute)), singleton.WithRedis(e.RDB))
	require.NoError(t, err)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("report", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		if string(task.Payload()) == `{"tenant_id":"acme","n":0}` {
			<-block
		}
		mu.Lock()
		runs[id]++
		mu.Unlock()
		return nil
	})
	e.start(e.config(4), mux)

	// A: enqueued by a plain asynq client (a scheduler, another service);
	// it holds the run key "acme" for a while.
	a, err := e.Client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":0}`)), asynq.Queue(e.Queue))
	require.NoError(t, err)
	require.Equal(t, a.ID, recv(t, started, 10*time.Second))

	// B: unique, no retries left. Delivered while A runs: a duplicate,
	// copied and revoked.
	b, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":1}`)), asynq.Queue(e.Queue), asynq.MaxRetry(0))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := e.Inspector.GetTaskInfo(e.Queue, b.ID)
		return errors.Is(err, asynq.ErrTaskNotFound)
	}, 10*time.Second, 5*time.Millisecond, "B revoked")
	scheduled, err := e.Inspector.ListScheduledTasks(e.Queue)
	require.NoError(t, err)
	require.Len(t, scheduled, 1, "B's copy is scheduled")
	copyID := scheduled[0].ID
	require.True(t, strings.HasPrefix(copyID, b.ID+"~"), "a copy of B: %s", copyID)
	require.Equal(t, b.ID, scheduled[0].Headers[asynqkey.LabelHeader])

	// Past the "enqueue in flight" grace of B's reservation (ttl/4).
	time.Sleep(2500 * time.Millisecond)
	_, err = e.Inspector.GetTaskInfo(e.Queue, copyID)
	require.NoError(t, err, "B's copy still exists")
	c, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":2}`)), asynq.Queue(e.Queue))
	if err == nil {
		close(block)
		// Both B's copy and C run.
		_ = e.Inspector.RunTask(e.Queue, copyID)
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return runs[copyID] == 1 && runs[c.ID] == 1
		}, 20*time.Second, 10*time.Millisecond)
		t.Fatalf("C (%s) was accepted while B's copy %s (same key, reservation not ended) was scheduled; both ran", c.ID, copyID)
	}
	close(block)
	var dup *singleton.DuplicateTaskError
	require.ErrorAs(t, err, &dup)
}

// A repeat of an enqueue with an explicit TaskID whose reservation reply is
// lost frees nothing: the reservation it conflicted with is its task's, which
// is pending, and an equivalent task is still refused.
func TestUniqueLostReplyOfARepeatKeepsTheLiveReservation(t *testing.T) {
	e := newEnvOn(t, standalone)
	client, hook := faultyUniqueClient(t, e, "unique:")
	task := asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`), asynq.Queue(e.Queue))
	_, err := client.Enqueue(task, asynq.TaskID("T"))
	require.NoError(t, err)
	hook.Arm(testredis.DropReply, 1)
	_, err = client.Enqueue(task, asynq.TaskID("T")) // the repeat: its reply is lost
	require.Error(t, err)
	require.Equal(t, 2, e.QueueInfo().Pending, "T and the warm-up task")
	_, err = client.Enqueue(task) // an equivalent task, new ID
	require.ErrorIs(t, err, singleton.ErrDuplicate, "accepted while task T is pending (pending now %d)", e.QueueInfo().Pending)
}

// faultyUniqueClient is a Client with Unique (keyed by tenant_id) whose Redis
// client injects faults into the scripts with an argument containing arg
// ("}:t:" for asynq's enqueue, "unique:" for the reservation), once armed.
// The scripts are loaded first by a warm-up enqueue, so that a fault hits a
// run of a script, not the EVALSHA that finds the cache empty.
func faultyUniqueClient(t *testing.T, e *env, arg string) (*singleton.Client, *testredis.Faults) {
	t.Helper()
	rdb := redis.NewClient(e.RDB.(*redis.Client).Options())
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &testredis.Faults{Match: func(cmd redis.Cmder) bool {
		if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" {
			return false
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, arg) {
				return true
			}
		}
		return false
	}}
	rdb.AddHook(hook)
	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(e.Prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(rdb), rdb,
		singleton.KeyByFields("tenant_id"), singleton.Unique(locker, 0, 0))
	require.NoError(t, err)
	_, err = client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"warm-up"}`), asynq.Queue(e.Queue)))
	require.NoError(t, err)
	return client, hook
}

// A delivery adopts its UntilExecuted reservation, and the adopt's reply is
// lost: the Locker removes what the adopt may have taken, the reservation
// with it. The middleware reserves the key again: while the task runs, a
// second task of the key is refused, and the key frees when it succeeds.
func TestUniqueAdoptWhoseReplyWasLostKeepsTheReservation(t *testing.T) {
	u := newUniqueEnv(t, standalone, singleton.UntilExecuted, 0)
	rdb := redis.NewClient(u.RDB.(*redis.Client).Options())
	t.Cleanup(func() { _ = rdb.Close() })
	onReservation := func(cmd redis.Cmder) bool {
		if name := strings.ToLower(cmd.Name()); name != "evalsha" && name != "eval" {
			return false
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, "unique:") {
				return true
			}
		}
		return false
	}
	hook := &testredis.Faults{Match: onReservation}
	// Never armed: counts the releases of the reservation's key, the
	// removal of the failed adopt's holder among them.
	releases := &testredis.Faults{Match: func(cmd redis.Cmder) bool { return onReservation(cmd) && testredis.ScriptShape(8, 11)(cmd) }}
	rdb.AddHook(hook)
	rdb.AddHook(releases)
	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(u.Prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close(context.Background()) })

	a, err := u.enqueue("acme")
	require.NoError(t, err)
	u.block = make(chan struct{})
	hook.Arm(testredis.DropReply, 1)
	u.serveOn(locker)
	require.Equal(t, "acme", recv(t, u.started, 10*time.Second))
	require.EqualValues(t, 1, hook.Hits(), "the adopt's reply was lost")
	require.Eventually(t, func() bool { return releases.Done() > 0 }, 10*time.Second, 5*time.Millisecond,
		"the Locker never removed the failed adopt's holder")
	u.refusedWhileActive(a)
}
