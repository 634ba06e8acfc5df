package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/singleton"
)

// The asynq.Config of every end-to-end run, guarded or bare: small polling
// intervals so that neither an empty queue nor a requeued task waits for the
// defaults (1s and 5s), and the two Config fields that make a requeued
// duplicate no failure and bring it back after the policy's delay.
const (
	taskCheckInterval    = 5 * time.Millisecond
	delayedCheckInterval = 50 * time.Millisecond
)

func serverConfig(queue string, concurrency int) asynq.Config {
	return singleton.ServerConfig(asynq.Config{
		Concurrency:              concurrency,
		Queues:                   map[string]int{queue: 1},
		TaskCheckInterval:        taskCheckInterval,
		DelayedTaskCheckInterval: delayedCheckInterval,
		ShutdownTimeout:          5 * time.Second,
		// asynq warns on every revoked task; nothing here should be logged.
		LogLevel: asynq.ErrorLevel,
	})
}

// asynqEnv is what the end-to-end sections share: the queues they made (to
// delete at the end), an uncounted Inspector, and a counted client that
// enqueues.
type asynqEnv struct {
	b        *bench
	insp     *asynq.Inspector // on the admin client: not counted
	enqueuer *asynq.Client
	enqRedis redis.UniversalClient // the enqueuer's Redis client (counted)
	enqCtr   *counter
	queues   []string
}

func (b *bench) asynqEnv() *asynqEnv {
	c, ctr := b.client()
	return &asynqEnv{
		b:        b,
		insp:     asynq.NewInspectorFromRedisClient(b.admin),
		enqueuer: asynq.NewClientFromRedisClient(c),
		enqRedis: c,
		enqCtr:   ctr,
	}
}

// queue returns a new queue name of this run.
func (e *asynqEnv) queue(name string) string {
	q := "jobguard-bench-" + e.b.runID + "-" + name
	e.queues = append(e.queues, q)
	return q
}

// deleteQueue deletes q with whatever tasks it still holds, then the keys
// asynq keeps about it after that (its processed and failed counters): every
// key named "asynq:{q}:...", q being a queue name of this run only.
func (e *asynqEnv) deleteQueue(q string) {
	err := e.insp.DeleteQueue(q, true)
	if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
		progress("delete queue %s: %v", q, err)
	}
	ctx := context.Background()
	iter := e.b.admin.Scan(ctx, 0, asynqkey.Queue(q)+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		e.b.admin.Del(ctx, keys...)
	}
}

// cleanup deletes every queue this run made.
func (e *asynqEnv) cleanup() {
	for _, q := range e.queues {
		e.deleteQueue(q)
	}
}

// enqueue enqueues n tasks made by task(i) to queue q with 8 goroutines and
// returns the wall time.
// enqueuer is what enqueues a task: an asynq.Client or a singleton.Client.
type enqueuer interface {
	EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error)
}

func (e *asynqEnv) enqueue(ctx context.Context, q string, n int, task func(i int) *asynq.Task) (time.Duration, error) {
	return e.enqueueWith(ctx, e.enqueuer, q, n, task)
}

// enqueueWith enqueues n tasks into q with c, from 8 goroutines.
func (e *asynqEnv) enqueueWith(ctx context.Context, c enqueuer, q string, n int, task func(i int) *asynq.Task, opts ...asynq.Option) (time.Duration, error) {
	d, _, err := e.enqueueCounting(ctx, c, q, n, task, opts...)
	return d, err
}

// enqueueCounting is enqueueWith that counts the tasks accepted: a task
// refused as a duplicate (asynq.ErrDuplicateTask) is not an error.
func (e *asynqEnv) enqueueCounting(ctx context.Context, c enqueuer, q string, n int, task func(i int) *asynq.Task, opts ...asynq.Option) (time.Duration, int64, error) {
	var accepted atomic.Int64
	start := time.Now()
	err := inParallel(n, func(i int) error {
		_, err := c.EnqueueContext(ctx, task(i), append([]asynq.Option{asynq.Queue(q)}, opts...)...)
		switch {
		case err == nil:
			accepted.Add(1)
		case errors.Is(err, asynq.ErrDuplicateTask):
		default:
			return err
		}
		return nil
	})
	return time.Since(start), accepted.Load(), err
}

// tally counts tasks as they are accounted for and notes when the count
// reaches its target.
type tally struct {
	target int64
	n      atomic.Int64
	once   sync.Once
	done   chan struct{}
	at     time.Time // written once, before done is closed
}

func newTally(target int) *tally { return &tally{target: int64(target), done: make(chan struct{})} }

func (t *tally) add() {
	if t.n.Add(1) == t.target {
		t.once.Do(func() {
			t.at = time.Now()
			close(t.done)
		})
	}
}

// runStats is what one server run cost.
type runStats struct {
	wall     time.Duration // from srv.Start to the last task accounted for
	finished bool          // every task was accounted for before the timeout
	cpu      time.Duration // this process
	redisCPU time.Duration
	srv      counts // the server's client (asynq's own traffic, and Requeue's copies)
	lock     counts // the Locker's client
}

// serve starts an asynq.Server on srvClient with cfg and h, waits until t
// reaches its target or timeout passes, and shuts the server down. The counts
// and CPU times are taken when the target is reached (or at the timeout),
// before the shutdown.
func (e *asynqEnv) serve(ctx context.Context, srvClient redis.UniversalClient, srvCtr, lockCtr *counter,
	cfg asynq.Config, h asynq.Handler, t *tally, timeout time.Duration) (runStats, error) {
	var st runStats
	srv := asynq.NewServerFromRedisClient(srvClient, cfg)
	rcpu0, err := redisCPU(ctx, e.b.admin)
	if err != nil {
		return st, err
	}
	s0, l0 := srvCtr.counts(), lockCtr.counts()
	cpu0 := cpuTime()
	start := time.Now()
	if err := srv.Start(h); err != nil {
		return st, err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-t.done:
		st.finished = true
		st.wall = t.at.Sub(start)
	case <-timer.C:
		st.wall = time.Since(start)
	case <-ctx.Done():
		srv.Shutdown()
		return st, ctx.Err()
	}
	st.cpu = cpuTime() - cpu0
	st.srv, st.lock = srvCtr.counts().sub(s0), lockCtr.counts().sub(l0)
	rcpu1, err := redisCPU(ctx, e.b.admin)
	if err != nil {
		srv.Shutdown()
		return st, err
	}
	st.redisCPU = rcpu1 - rcpu0
	srv.Shutdown()
	return st, nil
}

// left returns how many tasks queue q still holds, by state, after a run.
func (e *asynqEnv) left(q string) (string, error) {
	qi, err := e.insp.GetQueueInfo(q)
	if err != nil {
		return "", err
	}
	if n := qi.Pending + qi.Active + qi.Scheduled + qi.Retry + qi.Archived; n == 0 {
		return "empty", nil
	}
	return fmt.Sprintf("pending %d, active %d, scheduled %d, retry %d, archived %d",
		qi.Pending, qi.Active, qi.Scheduled, qi.Retry, qi.Archived), nil
}

// countTasks wraps h so that every task it returns from is added to t.
func countTasks(h asynq.Handler, t *tally) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		err := h.ProcessTask(ctx, task)
		t.add()
		return err
	})
}
