package singleton

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// A resumed task goes to the head of its queue's pending list, where asynq
// dequeues next, not behind the tasks already pending; asynq's Inspector
// sees it pending.
func TestRunFirstPutsTheTaskAtTheHead(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue := fmt.Sprintf("runfirst-%d", time.Now().UnixNano())
	client := asynq.NewClientFromRedisClient(rdb)
	for i := range 3 {
		_, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(fmt.Sprint("p", i)))
		require.NoError(t, err)
	}
	_, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("parked"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	m := &guarded{rdb: rdb}
	require.NoError(t, m.runFirst(ctx, queue, "parked"))
	pending, err := rdb.LRange(ctx, asynqkey.Pending(queue), 0, -1).Result()
	require.NoError(t, err)
	// asynq takes from the right end (RPOPLPUSH).
	require.Equal(t, []string{"p2", "p1", "p0", "parked"}, pending)
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo(queue, "parked")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)

	require.ErrorContains(t, m.runFirst(ctx, queue, "parked"), "already in pending state")
	require.ErrorIs(t, m.runFirst(ctx, queue, "missing"), asynq.ErrTaskNotFound)
}

// A resume never runs a task that is done again: one that completed (kept
// by asynq.Retention) or was archived stays as it is, and the resume passes
// the key on without an error, as for a task that is gone. (A parked task
// can come back by itself and complete while the run before it, ending,
// tries to resume it.)
func TestResumeLeavesADoneTaskDone(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue, insp := testQueue(t, rdb, "resume-done")
	client := asynq.NewClientFromRedisClient(rdb)

	_, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("done"), asynq.Retention(time.Hour))
	require.NoError(t, err)
	var runs atomic.Int32
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{queue: 1}, TaskCheckInterval: 10 * time.Millisecond,
		LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { runs.Add(1); return nil })))
	defer srv.Shutdown()
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo(queue, "done")
		return err == nil && info.State == asynq.TaskStateCompleted
	}, 10*time.Second, 5*time.Millisecond)
	_, err = client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("archived"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	require.NoError(t, insp.ArchiveTask(queue, "archived"))

	m, errs := parkedGuard(t, rdb)

	for id, state := range map[string]asynq.TaskState{"done": asynq.TaskStateCompleted, "archived": asynq.TaskStateArchived} {
		require.ErrorIs(t, m.runFirst(ctx, queue, id), errNotWaiting)
		m.resume("k", parkEntry(queue, id, id))
		info, err := insp.GetTaskInfo(queue, id)
		require.NoError(t, err)
		require.Equal(t, state, info.State, "task %s", id)
	}
	require.Zero(t, errs.Load(), "a done task is no error")
	require.EqualValues(t, 1, runs.Load(), "the completed task ran once")
}

// Every delivery of one work is parked under one entry, named by its
// origin: a resume starts whichever is waiting, the task or the copy that
// replaced it (a task with no retries left), and leaves the others as they
// are, a done one done. An entry parked under a copy's ID (as before) is
// resumed the same way, and so are the copies an earlier version named
// "<origin>~a" and "<origin>~b" (a rolling upgrade).
func TestResumeStartsTheDeliveryThatIsWaiting(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue, insp := testQueue(t, rdb, "resume-copy")
	client := asynq.NewClientFromRedisClient(rdb)
	for _, id := range []string{"o", "o~a", "p~a", "p~b"} {
		_, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(id), asynq.ProcessIn(time.Hour))
		require.NoError(t, err)
	}
	require.NoError(t, insp.ArchiveTask(queue, "o")) // its copy o~a replaced it; a process died before it was revoked
	require.NoError(t, insp.ArchiveTask(queue, "p~a"))

	m, errs := parkedGuard(t, rdb)

	m.resume("k", parkEntry(queue, "o", "o"))
	m.resume("k", parkEntry(queue, "p~b", "p"))
	for id, state := range map[string]asynq.TaskState{"o": asynq.TaskStateArchived, "o~a": asynq.TaskStatePending,
		"p~a": asynq.TaskStateArchived, "p~b": asynq.TaskStatePending} {
		info, err := insp.GetTaskInfo(queue, id)
		require.NoError(t, err)
		require.Equal(t, state, info.State, "task %s", id)
	}
	pending, err := rdb.LRange(ctx, asynqkey.Pending(queue), 0, -1).Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"o~a", "p~b"}, pending)
	// Sent again (go-redis after a lost reply), the move finds it pending.
	require.ErrorContains(t, m.runFirst(ctx, queue, "o"), "task o~a is already in pending state")
	require.Zero(t, errs.Load())
}

// A done task under a copy's ID (an earlier work's, enqueued with the same
// task ID and archived) does not say that the parked work is done: the
// resume of a task parked at enqueue, whose enqueue is still on its way,
// waits for it as for a task not found, and starts it.
func TestResumeWaitsForAParkedTaskPastADoneCopyID(t *testing.T) {
	rdb := testredis.Client(t)
	queue, insp := testQueue(t, rdb, "resume-done-copy")
	client := asynq.NewClientFromRedisClient(rdb)
	_, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("x~a"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	require.NoError(t, insp.ArchiveTask(queue, "x~a"))

	m, _ := parkedGuard(t, rdb)
	var once sync.Once
	m.onResumeWait = func() {
		once.Do(func() { // the enqueue lands while the resume waits
			_, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("x"), asynq.ProcessIn(time.Hour))
			require.NoError(t, err)
		})
	}
	m.resume("k", parkEntry(queue, "x", "x"))
	info, err := insp.GetTaskInfo(queue, "x")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State, "x was started")
	info, err = insp.GetTaskInfo(queue, "x~a")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateArchived, info.State)
}

// Each copy gets an ID of its own, also a copy of a copy whose creator is
// still active (chaos seed 425: copies that alternated between two IDs met
// their creator under the ID they needed), named by its work's asynqkey.Copy: a
// resume of the parked work finds it and starts it.
func TestCopyHasAnIDOfItsOwnThatAResumeFinds(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue, insp := testQueue(t, rdb, "copy-id")
	client := asynq.NewClientFromRedisClient(rdb)
	// A copy of "o", made by an earlier version, is the creator.
	_, err := client.Enqueue(asynq.NewTaskWithHeaders("t", nil, map[string]string{asynqkey.LabelHeader: "o", copyHeader: "first"}),
		asynq.Queue(queue), asynq.TaskID("o~a"), asynq.MaxRetry(0), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	m, errs := parkedGuard(t, rdb)
	ids := map[string]bool{"o~a": true}
	creator := "o~a"
	for range 2 {
		task := asynq.NewTaskWithHeaders("t", nil, map[string]string{asynqkey.LabelHeader: "o", copyHeader: "earlier"})
		id, err := m.enqueueCopy(ctx, task, creator, queue, time.Hour)
		require.NoError(t, err)
		require.False(t, ids[id], "copy ID %s is new", id)
		require.True(t, strings.HasPrefix(id, "o~"), id)
		ids[id] = true
		named, err := rdb.Get(ctx, asynqkey.Copy(queue, "o")).Result()
		require.NoError(t, err)
		fields := strings.Fields(named)
		require.Equal(t, id, fields[len(fields)-1], "the copy key names the latest copy last")
		if len(ids) > 2 {
			require.Len(t, fields, 2, "and the copy it replaces before it: %q", named)
		}
		info, err := insp.GetTaskInfo(queue, id)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStateScheduled, info.State, "the copy waits for its delay")
		require.Equal(t, "o", info.Headers[asynqkey.LabelHeader])
		require.NotEqual(t, "earlier", info.Headers[copyHeader])
		require.NoError(t, insp.DeleteTask(queue, creator)) // revoked once its copy is there
		creator = id
	}
	m.resume("k", parkEntry(queue, "o", "o"))
	info, err := insp.GetTaskInfo(queue, creator)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State, "the resume started the latest copy")
	require.Zero(t, errs.Load())
}

// parkedGuard is a middleware with WithRedis(rdb) on a Locker of its own
// prefix, closed at the end of the test, and the count of the error events
// it reported.
func parkedGuard(t *testing.T, rdb redis.UniversalClient) (*guarded, *atomic.Int32) {
	t.Helper()
	l, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(testredis.Prefix(t, rdb)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	var errs atomic.Int32
	cfg := serverConfig([]ServerOption{WithRedis(rdb), WithObserver(func(_ context.Context, e middleware.Event) {
		if e.Kind == middleware.EventError {
			errs.Add(1)
		}
	})})
	m, err := cfg.build(l)
	require.NoError(t, err)
	return m, &errs
}
