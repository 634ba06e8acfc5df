package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/singleton"
)

// workload is one handler of the throughput section.
type workload struct {
	name  string
	work  time.Duration // 0: a no-op handler
	tasks int
	goal  float64 // guarded ÷ bare tasks/s to report against
	async bool    // guarded with singleton.WithAsyncRelease
}

// tputRun is one server run of the throughput section.
type tputRun struct {
	guarded bool
	runStats
	left string // the queue after the run
	// What a guarded run left in Redis after every task's lease was released.
	leftover leftover
}

func (r tputRun) rate(n int) float64 { return float64(n) / r.wall.Seconds() }

// tputResult is one workload, bare and guarded, over every round.
type tputResult struct {
	workload
	runs []tputRun // in the order they ran
}

func (r tputResult) of(guarded bool) []tputRun {
	var out []tputRun
	for _, x := range r.runs {
		if x.guarded == guarded {
			out = append(out, x)
		}
	}
	return out
}

func (r tputResult) rates(guarded bool) []float64 {
	var out []float64
	for _, x := range r.of(guarded) {
		out = append(out, x.rate(r.tasks))
	}
	return out
}

func (r tputResult) total(guarded bool) runStats {
	var s runStats
	for _, x := range r.of(guarded) {
		s.wall += x.wall
		s.cpu += x.cpu
		s.redisCPU += x.redisCPU
		s.srv = s.srv.add(x.srv)
		s.lock = s.lock.add(x.lock)
	}
	return s
}

// renewRun is the run that makes leases renew: handlers that outlast the
// renew interval of a short TTL.
type renewRun struct {
	tasks     int
	work, ttl time.Duration
	renewals  int64 // EventRenewed, from the Locker's observer
	runStats
	left string
}

// throughput measures asynq servers over a batch of b.tputTasks distinct
// tasks per workload, bare and behind singleton.Middleware, alternately for
// b.e2eRounds rounds. Each run enqueues the batch to a fresh queue first, then
// starts the server and times from Start until the last task has returned.
func (b *bench) throughput(ctx context.Context, env *asynqEnv) ([]tputResult, renewRun, error) {
	srvClient, srvCtr := b.client()
	lockClient, lockCtr := b.client()
	loads := []workload{
		{name: "no-op", tasks: b.tputTasks, goal: 0.75},
		{name: "5 ms", work: 5 * time.Millisecond, tasks: b.tputSleepTasks, goal: 0.97},
		{name: "no-op, `WithAsyncRelease()`", tasks: b.tputTasks, goal: 0.85, async: true},
		{name: "5 ms, `WithAsyncRelease()`", work: 5 * time.Millisecond, tasks: b.tputSleepTasks, goal: 0.98, async: true},
	}
	var out []tputResult
	run := 0
	for _, w := range loads {
		res := tputResult{workload: w}
		for round := range b.e2eRounds {
			order := []bool{false, true}
			if round%2 == 1 {
				order = []bool{true, false}
			}
			for _, guarded := range order {
				run++
				kind := "bare"
				if guarded {
					kind = "guarded"
				}
				q := env.queue(fmt.Sprintf("tput-%d", run))
				enqWall, err := env.enqueue(ctx, q, w.tasks, func(i int) *asynq.Task {
					return asynq.NewTask("bench:work", fmt.Appendf(nil, `{"n":%d}`, i))
				})
				if err != nil {
					return nil, renewRun{}, err
				}
				t := newTally(w.tasks)
				var h asynq.Handler = asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
					if w.work > 0 {
						time.Sleep(w.work)
					}
					return nil
				})
				var locker *lockkit.Locker
				if guarded {
					locker, err = lockkit.NewRedis(lockClient, b.e2eLockerOptions(lockkit.WithPrefix(b.prefix+"e2e:"))...)
					if err != nil {
						return nil, renewRun{}, err
					}
					opts := []singleton.ServerOption{singleton.KeyByPayload()}
					if w.async {
						opts = append(opts, singleton.WithAsyncRelease())
					}
					guard, err := singleton.Middleware(locker, opts...)
					if err != nil {
						return nil, renewRun{}, err
					}
					h = guard(h)
				}
				st, err := env.serve(ctx, srvClient, srvCtr, lockCtr, serverConfig(q, b.concurrency), countTasks(h, t), t, b.e2eTimeout)
				progress("  %s handler, round %d, %s: %d tasks enqueued in %s, processed in %s (%.0f/s)",
					w.name, round+1, kind, w.tasks, enqWall.Round(time.Millisecond), st.wall.Round(time.Millisecond), float64(w.tasks)/st.wall.Seconds())
				if locker != nil {
					_ = locker.Close(ctx)
				}
				if err != nil {
					return nil, renewRun{}, err
				}
				if !st.finished {
					return nil, renewRun{}, fmt.Errorf("throughput %s %s: %d of %d tasks in %s", w.name, kind, t.n.Load(), w.tasks, b.e2eTimeout)
				}
				left, err := env.left(q)
				if err != nil {
					return nil, renewRun{}, err
				}
				env.deleteQueue(q)
				var lo leftover
				if guarded {
					if lo, err = b.leftover(ctx, b.prefix+"e2e:"); err != nil {
						return nil, renewRun{}, err
					}
				}
				res.runs = append(res.runs, tputRun{guarded: guarded, runStats: st, left: left, leftover: lo})
			}
		}
		out = append(out, res)
	}

	// Renewal: handlers longer than the renew interval of a short TTL.
	rr := renewRun{tasks: 4 * b.concurrency, work: 350 * time.Millisecond, ttl: 300 * time.Millisecond}
	progress("  renewal: %d tasks of %s, TTL %s", rr.tasks, rr.work, rr.ttl)
	q := env.queue("tput-renew")
	if _, err := env.enqueue(ctx, q, rr.tasks, func(i int) *asynq.Task {
		return asynq.NewTask("bench:work", fmt.Appendf(nil, `{"n":%d}`, i))
	}); err != nil {
		return nil, rr, err
	}
	var renewals atomic.Int64
	locker, err := lockkit.NewRedis(lockClient, lockkit.WithPrefix(b.prefix+"e2e:"), lockkit.WithObserver(func(e lockkit.Event) {
		if e.Kind == lockkit.LeaseRenewed {
			renewals.Add(1)
		}
	}))
	if err != nil {
		return nil, rr, err
	}
	defer locker.Close(ctx)
	guard, err := singleton.Middleware(locker, singleton.KeyByPayload(), singleton.WithTTL(rr.ttl))
	if err != nil {
		return nil, rr, err
	}
	t := newTally(rr.tasks)
	h := guard(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		select {
		case <-time.After(rr.work):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}))
	if rr.runStats, err = env.serve(ctx, srvClient, srvCtr, lockCtr, serverConfig(q, b.concurrency), countTasks(h, t), t, b.e2eTimeout); err != nil {
		return nil, rr, err
	}
	if !rr.finished {
		return nil, rr, fmt.Errorf("throughput renewal: %d of %d tasks in %s", t.n.Load(), rr.tasks, b.e2eTimeout)
	}
	rr.renewals = renewals.Load()
	if rr.left, err = env.left(q); err != nil {
		return nil, rr, err
	}
	env.deleteQueue(q)
	return out, rr, nil
}

// leftover is what the Locker's keys under a prefix hold after every lease
// was released.
type leftover struct {
	keys      int
	types     map[string]int // by Redis type
	sampleKey string         // without the prefix
	sampleMem int64          // MEMORY USAGE of the sample
	sampleTTL time.Duration
}

// leftover counts the keys under prefix, samples one, and deletes them all.
func (b *bench) leftover(ctx context.Context, prefix string) (leftover, error) {
	lo := leftover{types: make(map[string]int)}
	iter := b.admin.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return lo, err
	}
	lo.keys = len(keys)
	for i, k := range keys {
		if i < 100 {
			t, err := b.admin.Type(ctx, k).Result()
			if err != nil {
				return lo, err
			}
			lo.types[t]++
		}
	}
	if len(keys) > 0 {
		lo.sampleKey = keys[0][len(prefix):]
		lo.sampleMem, _ = b.admin.MemoryUsage(ctx, keys[0]).Result()
		lo.sampleTTL, _ = b.admin.PTTL(ctx, keys[0]).Result()
	}
	for start := 0; start < len(keys); start += 1000 {
		if err := b.admin.Del(ctx, keys[start:min(start+1000, len(keys))]...).Err(); err != nil {
			return lo, err
		}
	}
	return lo, nil
}
