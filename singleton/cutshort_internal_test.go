package singleton

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// A run that ends before its work did is in the decision log too: a task that a
// newer one preempted (middleware.Preempt) with reason "preempted" and the
// newer task, run and token that took its key over; a run whose key an
// operator released, with reason "lost" and the cause.
func TestDecisionLogRecordsRunsCutShort(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue, _ := testQueue(t, rdb, "cutshort")
	l, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(testredis.Prefix(t, rdb)), lockkit.WithOwner("worker-1"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	cfg := serverConfig([]ServerOption{WithRedis(rdb), WithPolicy(middleware.Preempt(0))})
	m, err := cfg.build(l)
	require.NoError(t, err)
	newerRuns, finish := make(chan struct{}), make(chan struct{})
	// The preempted run's decision looks for the newer task once that one
	// runs, so that the test knows what it finds.
	m.onPreempted = func() {
		select {
		case <-newerRuns:
		case <-time.After(10 * time.Second):
		}
	}
	running := make(chan string, 4)
	mux := asynq.NewServeMux()
	mux.Use(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error { return m.process(ctx, next, t) })
	})
	mux.HandleFunc("sync", func(ctx context.Context, t *asynq.Task) error {
		if string(t.Payload()) == "newer" {
			close(newerRuns)
			<-finish
			return nil
		}
		running <- string(t.Payload())
		<-ctx.Done()
		return context.Cause(ctx)
	})
	mux.HandleFunc("op", func(ctx context.Context, t *asynq.Task) error {
		running <- "op"
		<-ctx.Done()
		return context.Cause(ctx)
	})
	srv := asynq.NewServerFromRedisClient(rdb, ServerConfig(asynq.Config{Concurrency: 4, Queues: map[string]int{queue: 1},
		TaskCheckInterval: 20 * time.Millisecond, LogLevel: asynq.FatalLevel}))
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)
	client := asynq.NewClientFromRedisClient(rdb)
	stamp := fmt.Sprint(time.Now().UnixNano())
	enqueue := func(typ, payload, id string) {
		_, err := client.Enqueue(asynq.NewTask(typ, []byte(payload)), asynq.Queue(queue), asynq.TaskID(id), asynq.MaxRetry(0))
		require.NoError(t, err)
	}
	decision := func(id string) map[string]any {
		var found map[string]any
		require.Eventually(t, func() bool {
			entries, err := rdb.XRevRangeN(ctx, decisionlog.Stream, "+", "-", 1000).Result()
			require.NoError(t, err)
			for _, e := range entries {
				if e.Values["task"] == id {
					found = e.Values
					return true
				}
			}
			return false
		}, 10*time.Second, 5*time.Millisecond, "no decision for %s", id)
		return found
	}

	enqueue("sync", "older", "older-"+stamp)
	require.Equal(t, "older", <-running)
	enqueue("sync", "newer", "newer-"+stamp)
	got := decision("older-" + stamp)
	close(finish)
	require.Equal(t, "preempted", got["reason"])
	require.Equal(t, "newer-"+stamp, got["by_task"], "the newer task")
	require.Equal(t, "worker-1", got["by_owner"])
	require.NotEmpty(t, got["by_token"])
	require.Contains(t, got["cause"], "preempted")
	require.Equal(t, "asynq:sync", got["key"])
	require.Equal(t, queue, got["queue"])

	enqueue("op", "", "op-"+stamp)
	require.Equal(t, "op", <-running)
	n, err := l.ForceRelease(ctx, "asynq:op", lockkit.Select{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got = decision("op-" + stamp)
	require.Equal(t, "lost", got["reason"])
	require.Contains(t, got["cause"], "released by an operator")
	require.NotContains(t, got, "by_task")
}

// testQueue returns a queue name of the test's own, deleted with its tasks
// when the test ends, and an Inspector.
func testQueue(t *testing.T, rdb *redis.Client, name string) (string, *asynq.Inspector) {
	queue := fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
	insp := asynq.NewInspectorFromRedisClient(rdb)
	t.Cleanup(func() { _ = insp.DeleteQueue(queue, true) })
	return queue, insp
}
