package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// preemptResult is the latency of Preempt between two asynq servers, each
// with its own Locker and Redis clients, as on two machines.
type preemptResult struct {
	rounds int
	// cancel is, per round, the time from the newer task's arrival at the
	// middleware to the cancellation of the running task's ctx; start, to the
	// newer task's handler start. Both sorted.
	cancel, start []time.Duration
	cmds          int64 // Redis commands of both servers and Lockers
}

// nearestRank returns the nearest-rank q-quantile (0 < q <= 1) of sorted,
// zero when it is empty.
func nearestRank(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// preemptLatency runs b.preemptRounds rounds on one key: task i runs until
// its ctx is cancelled, task i+1 is enqueued once task i has started and
// preempts it. The handler returns the ctx's cause, so the preempted task is
// revoked.
func (b *bench) preemptLatency(ctx context.Context, env *asynqEnv) (preemptResult, error) {
	res := preemptResult{rounds: b.preemptRounds}
	q := env.queue("preempt")
	var (
		mu       sync.Mutex
		arrived  = map[int]time.Time{}
		started  = map[int]time.Time{}
		canceled = map[int]time.Time{}
	)
	startCh := make(chan int, 4)
	var ctrs []*counter
	var srvs []*asynq.Server
	defer func() {
		for _, s := range srvs {
			s.Shutdown()
		}
	}()
	for i := range 2 {
		srvClient, srvCtr := b.client()
		lockClient, lockCtr := b.client()
		ctrs = append(ctrs, srvCtr, lockCtr)
		locker, err := lockkit.NewRedis(lockClient, lockkit.WithPrefix(b.prefix+"e2e:"), lockkit.WithOwner(fmt.Sprint("server-", i)))
		if err != nil {
			return res, err
		}
		defer locker.Close(context.Background())
		guard, err := singleton.Middleware(locker, singleton.WithPolicy(middleware.Preempt(0)))
		if err != nil {
			return res, err
		}
		handler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			n, _ := strconv.Atoi(string(t.Payload()))
			mu.Lock()
			started[n] = time.Now()
			mu.Unlock()
			startCh <- n
			if n == res.rounds { // the last task returns at once
				return nil
			}
			<-ctx.Done()
			mu.Lock()
			canceled[n] = time.Now()
			mu.Unlock()
			return context.Cause(ctx)
		})
		arrival := func(next asynq.Handler) asynq.Handler {
			return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
				n, _ := strconv.Atoi(string(t.Payload()))
				mu.Lock()
				arrived[n] = time.Now()
				mu.Unlock()
				return next.ProcessTask(ctx, t)
			})
		}
		srv := asynq.NewServerFromRedisClient(srvClient, serverConfig(q, 2))
		if err := srv.Start(arrival(guard(handler))); err != nil {
			return res, err
		}
		srvs = append(srvs, srv)
	}
	total := func() (n int64) {
		for _, c := range ctrs {
			n += c.counts().cmds
		}
		return n
	}
	c0 := total()
	for i := 0; i <= res.rounds; i++ {
		if _, err := env.enqueuer.EnqueueContext(ctx, asynq.NewTask("bench:preempt", []byte(strconv.Itoa(i))), asynq.Queue(q), asynq.MaxRetry(0)); err != nil {
			return res, err
		}
		select {
		case n := <-startCh:
			if n != i {
				return res, fmt.Errorf("preempt: task %d started while waiting for %d", n, i)
			}
		case <-time.After(30 * time.Second):
			return res, fmt.Errorf("preempt: task %d did not start", i)
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	res.cmds = total() - c0
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i <= res.rounds; i++ {
		res.cancel = append(res.cancel, canceled[i-1].Sub(arrived[i]))
		res.start = append(res.start, started[i].Sub(arrived[i]))
	}
	slices.Sort(res.cancel)
	slices.Sort(res.start)
	return res, nil
}

func (r *report) preemptTable() string {
	x := r.preemptRes
	if x.rounds == 0 {
		return ""
	}
	var w strings.Builder
	fmt.Fprintf(&w, "Preemption latency: two asynq servers, each with its own Locker, `middleware.Preempt(0)`, one key; "+
		"%d rounds in which task i runs until its ctx is cancelled and task i+1, enqueued once task i has started, "+
		"preempts it. Times are from the newer task's arrival at the middleware (an outer middleware records it). "+
		"Redis commands over the rounds: %d (%s per task, both servers and Lockers).\n\n", x.rounds, x.cmds, perTask(x.cmds, x.rounds))
	rows := [][]string{
		{"old run's ctx cancelled", msec(nearestRank(x.cancel, 0.5)), msec(nearestRank(x.cancel, 0.99)), msec(x.cancel[len(x.cancel)-1])},
		{"new run's handler starts", msec(nearestRank(x.start, 0.5)), msec(nearestRank(x.start, 0.99)), msec(x.start[len(x.start)-1])},
	}
	table(&w, []string{"from the newer task's arrival to", "p50", "p99", "max"}, rows)
	return w.String()
}
