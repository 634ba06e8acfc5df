package singleton_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqtest"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
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
	return asynqtest.Standalone(t, testDB)
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

// env is one test's share of a real Redis (asynqtest.Env) with the helpers
// of this package's tests.
type env struct {
	*asynqtest.Env
	t *testing.T
}

// newEnvOn returns an env on the Redis that c connects to.
func newEnvOn(t *testing.T, c connect) *env {
	t.Helper()
	return &env{Env: asynqtest.NewEnv(t, c(t)), t: t}
}

// locker returns a Locker with its own owner id, as on its own machine.
func (e *env) locker(opts ...lockkit.Option) *lockkit.Locker {
	e.t.Helper()
	l, err := lockkit.NewRedis(e.RDB, append([]lockkit.Option{lockkit.WithPrefix(e.Prefix)}, opts...)...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// holders returns the live holders of key.
func (e *env) holders(key string) []lockkit.Holder {
	e.t.Helper()
	info, err := e.locker().Inspect(context.Background(), key)
	require.NoError(e.t, err)
	return info.Holders
}

// waiters waits until key has n waiters.
func (e *env) waiters(key string, n int) {
	e.t.Helper()
	l := e.locker()
	require.Eventually(e.t, func() bool {
		info, err := l.Inspect(context.Background(), key)
		require.NoError(e.t, err)
		return info.Waiters == n
	}, 10*time.Second, 5*time.Millisecond)
}

// gone waits until asynq no longer has the task id (done, or revoked).
func (e *env) gone(id string, msg string) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		_, err := e.Inspector.GetTaskInfo(e.Queue, id)
		return errors.Is(err, asynq.ErrTaskNotFound)
	}, 10*time.Second, 5*time.Millisecond, msg)
}

// The defaults singleton's docs state, which the tests check.
const (
	// parkBackstop is the backstop of a parked duplicate (WithRedis) and of
	// a task parked at enqueue (ParkAtEnqueue's zero backstop): 30 seconds.
	parkBackstop = 30 * time.Second
	// defaultDecisionLogLen is about how many entries WithDecisionLog
	// keeps by default: 10,000.
	defaultDecisionLogLen = 10000
)

// config is the asynq.Config of the tests' servers: asynqtest.Config (made
// by singleton.ServerConfig, fast polling, a quiet logger) with a 3s
// ShutdownTimeout.
func (e *env) config(concurrency int) asynq.Config {
	return e.configRetrying(concurrency, nil)
}

// configRetrying is config whose other errors are retried after retry (nil:
// asynq's default).
func (e *env) configRetrying(concurrency int, retry asynq.RetryDelayFunc) asynq.Config {
	cfg := asynqtest.ConfigRetrying(e.Queue, concurrency, retry)
	cfg.ShutdownTimeout = 3 * time.Second
	return cfg
}

// start starts a server running h; it is shut down when the test ends.
func (e *env) start(cfg asynq.Config, h asynq.Handler) *asynq.Server {
	e.t.Helper()
	srv := asynq.NewServerFromRedisClient(e.RDB, cfg)
	require.NoError(e.t, srv.Start(h))
	e.t.Cleanup(srv.Shutdown)
	return srv
}

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
// waitRequeued waits until n EventRequeued were reported.
func (ev *events) waitRequeued(t *testing.T, n int, msg ...any) {
	t.Helper()
	require.Eventually(t, func() bool { return ev.count(middleware.EventRequeued, 0) == n }, 10*time.Second, 5*time.Millisecond, msg...)
}

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

func (ev *events) all() []middleware.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return slices.Clone(ev.list)
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

// reportOf decodes the payload of a "report" task: its tenant_id and n.
func reportOf(task *asynq.Task) (tenant string, n int, err error) {
	var p struct {
		Tenant string `json:"tenant_id"`
		N      int    `json:"n"`
	}
	err = json.Unmarshal(task.Payload(), &p)
	return p.Tenant, p.N, err
}

// payloadMux serves "sync" tasks behind mw; each run sends its payload on
// the returned channel (buffered for 4).
func payloadMux(mw asynq.MiddlewareFunc) (*asynq.ServeMux, <-chan string) {
	ran := make(chan string, 4)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("sync", func(_ context.Context, task *asynq.Task) error {
		ran <- string(task.Payload())
		return nil
	})
	return mux, ran
}

// holding is a handler that sends each task's ID on started and returns
// once release is closed.
func holding(started chan<- string, release <-chan struct{}) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-release
		return nil
	})
}
