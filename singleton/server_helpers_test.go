package singleton_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// testDB is the database of the standalone Redis these tests use: asynq's
// keys (asynq:*) are global to a database, so this package keeps them away
// from the other packages' tests running at the same time. A Redis Cluster
// has no databases: there each test relies on its own queue names (asynq
// keeps a queue's keys under the hash tag {<queue>}) and lock key prefix.
const testDB = 11

// connect returns a client of one Redis deployment, closed when the test ends.
type connect func(t *testing.T) redis.UniversalClient

// standalone connects to the standalone Redis at REDIS_ADDR, database testDB.
func standalone(t *testing.T) redis.UniversalClient {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), DB: testDB})
	require.NoError(t, rdb.Ping(context.Background()).Err())
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// cluster connects to the Redis Cluster at REDIS_CLUSTER_ADDRS.
func cluster(t *testing.T) redis.UniversalClient {
	t.Helper()
	return testredis.Cluster(t)
}

// onEachRedis runs test as the subtests "standalone" and "cluster", each
// with a connect for that deployment.
func onEachRedis(t *testing.T, test func(t *testing.T, c connect)) {
	t.Run("standalone", func(t *testing.T) { test(t, standalone) })
	t.Run("cluster", func(t *testing.T) { test(t, cluster) })
}

// env is one test's share of a real Redis: a client, a lock key prefix and a
// queue name, all cleaned up when the test ends.
type env struct {
	t      *testing.T
	rdb    redis.UniversalClient
	prefix string
	queue  string
	insp   *asynq.Inspector
	client *asynq.Client
}

// newEnv returns an env on the standalone Redis.
func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(t, standalone)
}

// newEnvOn returns an env on the Redis that c connects to.
func newEnvOn(t *testing.T, c connect) *env {
	t.Helper()
	rdb := c(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	e := &env{
		t:      t,
		rdb:    rdb,
		prefix: testredis.Prefix(t, rdb),
		queue:  "jg-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + "-" + hex.EncodeToString(b),
		insp:   asynq.NewInspectorFromRedisClient(rdb),
		client: asynq.NewClientFromRedisClient(rdb),
	}
	// Registered before any server, so it runs after every server has shut down.
	t.Cleanup(func() { _ = e.insp.DeleteQueue(e.queue, true) })
	return e
}

// locker returns a RedisLocker with its own owner id, as on its own machine.
func (e *env) locker(opts ...lockkit.Option) *lockkit.RedisLocker {
	e.t.Helper()
	l, err := lockkit.NewRedis(e.rdb, append([]lockkit.Option{lockkit.WithPrefix(e.prefix)}, opts...)...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// config is the asynq.Config of the tests' servers: the singleton pieces,
// fast polling and forwarding so that requeues come back within ~100ms, and a
// quiet logger.
func (e *env) config(concurrency int) asynq.Config {
	return asynq.Config{
		Concurrency:              concurrency,
		Queues:                   map[string]int{e.queue: 1},
		TaskCheckInterval:        20 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		ShutdownTimeout:          3 * time.Second,
		IsFailure:                singleton.IsFailure(nil),
		RetryDelayFunc:           singleton.RetryDelay(nil),
		Logger:                   quietLogger{},
	}
}

// start starts a server running h; it is shut down when the test ends.
func (e *env) start(cfg asynq.Config, h asynq.Handler) *asynq.Server {
	e.t.Helper()
	srv := asynq.NewServerFromRedisClient(e.rdb, cfg)
	require.NoError(e.t, srv.Start(h))
	e.t.Cleanup(srv.Shutdown)
	return srv
}

func (e *env) enqueue(task *asynq.Task, opts ...asynq.Option) *asynq.TaskInfo {
	e.t.Helper()
	info, err := e.client.Enqueue(task, append([]asynq.Option{asynq.Queue(e.queue)}, opts...)...)
	require.NoError(e.t, err)
	return info
}

func (e *env) queueInfo() *asynq.QueueInfo {
	e.t.Helper()
	qi, err := e.insp.GetQueueInfo(e.queue)
	require.NoError(e.t, err)
	return qi
}

// drained waits until the queue holds no pending, active, scheduled, retry or
// archived task.
func (e *env) drained(timeout time.Duration) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		qi, err := e.insp.GetQueueInfo(e.queue)
		return err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry+qi.Archived == 0
	}, timeout, 10*time.Millisecond)
}

// quietLogger drops asynq's logs.
type quietLogger struct{}

func (quietLogger) Debug(...any) {}
func (quietLogger) Info(...any)  {}
func (quietLogger) Warn(...any)  {}
func (quietLogger) Error(...any) {}
func (quietLogger) Fatal(...any) {}

// tracker records every handler start and end per key and the most runs of
// one key seen at the same time.
type tracker struct {
	mu      sync.Mutex
	running map[string]int
	peak    map[string]int
	runs    map[string]int // task label → completed runs
}

func newTracker() *tracker {
	return &tracker{running: map[string]int{}, peak: map[string]int{}, runs: map[string]int{}}
}

func (tr *tracker) start(key string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.running[key]++
	tr.peak[key] = max(tr.peak[key], tr.running[key])
}

func (tr *tracker) end(key, label string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.running[key]--
	tr.runs[label]++
}

func (tr *tracker) peaks() map[string]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make(map[string]int, len(tr.peak))
	for k, v := range tr.peak {
		out[k] = v
	}
	return out
}

func (tr *tracker) completed() map[string]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make(map[string]int, len(tr.runs))
	for k, v := range tr.runs {
		out[k] = v
	}
	return out
}

// events records a guard's events.
type events struct {
	mu   sync.Mutex
	list []middleware.Event
}

func (ev *events) observe(_ context.Context, e middleware.Event) {
	ev.mu.Lock()
	ev.list = append(ev.list, e)
	ev.mu.Unlock()
}

func (ev *events) count(k middleware.EventKind, action middleware.Action) int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := 0
	for _, e := range ev.list {
		if e.Kind == k && (action == 0 || e.Action == action) {
			n++
		}
	}
	return n
}

func (ev *events) errs(k middleware.EventKind) []error {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []error
	for _, e := range ev.list {
		if e.Kind == k {
			out = append(out, e.Err)
		}
	}
	return out
}

// errorLog is an asynq.ErrorHandler that keeps every handler error.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) HandleError(_ context.Context, _ *asynq.Task, err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorLog) any(match func(error) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		if match(err) {
			return true
		}
	}
	return false
}

func (l *errorLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.errs)
}
