// Package asynqtest gives tests of asynq servers a share of a real Redis: a
// client, a lock key prefix and a queue of their own, cleaned up when the test
// ends, plus the asynq.Config of a test server running the singleton
// middleware. It is for tests only, in the spirit of River's rivertest.
//
// asynq's global keys (asynq:queues, asynq:servers) are per database, so each
// package's tests keep to their own database of the standalone Redis
// (Standalone). A Redis Cluster has no databases: there a test relies on its
// own queue name (asynq keeps a queue's keys under the hash tag {<queue>}) and
// lock key prefix.
package asynqtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/singleton"
)

// Standalone returns a client of database db of the standalone Redis at
// REDIS_ADDR (testredis.Addr), closed when the test ends.
func Standalone(t *testing.T, db int) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), DB: db})
	require.NoError(t, rdb.Ping(context.Background()).Err())
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Env is one test's share of a real Redis: a client, a lock key prefix and a
// queue name, with an asynq.Inspector and asynq.Client on that Redis. The
// queue is deleted when the test ends.
type Env struct {
	t *testing.T

	// RDB is the client of the test's Redis.
	RDB redis.UniversalClient
	// Prefix is a lock key prefix of the test's own (testredis.Prefix).
	Prefix string
	// Queue is a queue name of the test's own: "jg-", the test's name and a
	// random suffix.
	Queue string
	// Inspector is an asynq.Inspector on RDB.
	Inspector *asynq.Inspector
	// Client is an asynq.Client on RDB.
	Client *asynq.Client
}

// NewEnv returns an Env on rdb. Call it before starting any server: the
// queue's deletion, registered with t.Cleanup here, then runs after every
// server registered later has shut down.
func NewEnv(t *testing.T, rdb redis.UniversalClient) *Env {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	e := &Env{
		t:         t,
		RDB:       rdb,
		Prefix:    testredis.Prefix(t, rdb),
		Queue:     "jg-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + "-" + hex.EncodeToString(b),
		Inspector: asynq.NewInspectorFromRedisClient(rdb),
		Client:    asynq.NewClientFromRedisClient(rdb),
	}
	t.Cleanup(func() { _ = e.Inspector.DeleteQueue(e.Queue, true) })
	return e
}

// Enqueue enqueues task on the Env's queue (opts may add to that) and fails
// the test on an error.
func (e *Env) Enqueue(task *asynq.Task, opts ...asynq.Option) *asynq.TaskInfo {
	e.t.Helper()
	info, err := e.Client.Enqueue(task, append([]asynq.Option{asynq.Queue(e.Queue)}, opts...)...)
	require.NoError(e.t, err)
	return info
}

// QueueInfo returns the Env's queue's asynq.QueueInfo and fails the test on
// an error.
func (e *Env) QueueInfo() *asynq.QueueInfo {
	e.t.Helper()
	qi, err := e.Inspector.GetQueueInfo(e.Queue)
	require.NoError(e.t, err)
	return qi
}

// Drained waits up to timeout until the queue holds no pending, active,
// scheduled, retry or archived task, and fails the test if it never does.
func (e *Env) Drained(timeout time.Duration) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		qi, err := e.Inspector.GetQueueInfo(e.Queue)
		return err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry+qi.Archived == 0
	}, timeout, 10*time.Millisecond)
}

// Config returns the asynq.Config of a test server with concurrency workers on
// queue: made by singleton.ServerConfig (with asynq's defaults for other
// errors), fast polling and forwarding so that requeues come back within
// ~100ms, and a QuietLogger. ShutdownTimeout is asynq's default; callers set
// it as they need.
func Config(queue string, concurrency int) asynq.Config {
	return ConfigRetrying(queue, concurrency, nil)
}

// ConfigRetrying is Config whose errors other than the duplicates a
// middleware puts back are retried after retry (nil: asynq's default).
func ConfigRetrying(queue string, concurrency int, retry asynq.RetryDelayFunc) asynq.Config {
	return singleton.ServerConfig(asynq.Config{
		Concurrency:              concurrency,
		Queues:                   map[string]int{queue: 1},
		TaskCheckInterval:        20 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		RetryDelayFunc:           retry,
		Logger:                   QuietLogger{},
	})
}

// QuietLogger is an asynq.Logger that drops every log.
type QuietLogger struct{}

// Debug drops the log.
func (QuietLogger) Debug(...any) {}

// Info drops the log.
func (QuietLogger) Info(...any) {}

// Warn drops the log.
func (QuietLogger) Warn(...any) {}

// Error drops the log.
func (QuietLogger) Error(...any) {}

// Fatal drops the log.
func (QuietLogger) Fatal(...any) {}

// lateRetryCmd is asynq v0.26's retry write (rdb.Retry's script, less its
// statistics and its new msg): it moves the task from active to retry,
// whatever delivery of it is active. KEYS[1] the task's hash, KEYS[2] the
// active list, KEYS[3] the lease set, KEYS[4] the retry set; ARGV[1] the
// task ID, ARGV[2] when the retry is due (Unix seconds).
var lateRetryCmd = redis.NewScript(`
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then
	return redis.error_reply("NOT FOUND")
end
if redis.call("ZREM", KEYS[3], ARGV[1]) == 0 then
	return redis.error_reply("NOT FOUND")
end
redis.call("ZADD", KEYS[4], ARGV[2], ARGV[1])
redis.call("HSET", KEYS[1], "state", "retry")
return 1
`)

// LateRetry does what asynq's retry write of an earlier delivery of task id
// in queue does when go-redis or asynq's syncer sends it again after its
// reply was lost: it moves the task's active delivery back to retry, due at
// due. The delivery runs on; asynq's completion of it then fails, and asynq
// delivers the task again once the retry is due.
func LateRetry(ctx context.Context, rdb redis.UniversalClient, queue, id string, due time.Time) error {
	keys := []string{asynqkey.Task(queue, id), asynqkey.Active(queue), asynqkey.Lease(queue), asynqkey.Retry(queue)}
	return lateRetryCmd.Run(ctx, rdb, keys, id, due.Unix()).Err()
}
