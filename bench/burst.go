package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// burstRun is one policy over the duplicate burst.
type burstRun struct {
	name     string // "bare", "Skip", "Requeue(50ms)"
	policy   string // the option as written, for the report
	enqueued int64  // tasks accepted by the enqueue
	enq      counts // the enqueue's Redis commands
	ran      int64  // handler runs
	skipped  int64  // EventDuplicate with ActionSkip
	requeued int64  // EventRequeued
	// preempted is the runs whose ctx a newer task cancelled (Preempt).
	preempted int64
	// maxOverlap is the most runs of one key at once.
	maxOverlap int
	// gaps, sorted, are the times a key was idle between the end of one run
	// and the start of the next, seen by the handler.
	gaps []time.Duration
	runStats
	left string
}

// burst enqueues b.burstTasks tasks whose "k" field takes one of b.burstKeys
// values, drawn at random (fixed seed, so every policy sees the same
// sequence), and runs them with a b.burstWork handler: bare (every task runs,
// overlapping freely), then behind singleton.Middleware keyed by "k" with Skip
// with Requeue and with Coalesce. A run ends when every task is accounted for: ran or
// skipped for Skip, ran for bare and Requeue.
func (b *bench) burst(ctx context.Context, env *asynqEnv) ([]burstRun, counts, error) {
	variants := []burstVariant{
		{"bare", "no middleware", nil, false, "", nil, 0, false},
		{"Skip", "`middleware.Skip()`", ptr(middleware.Skip()), false, "", nil, 0, false},
		{fmt.Sprintf("Requeue(%s)", b.requeueDelay), fmt.Sprintf("`middleware.Requeue(%s)`", b.requeueDelay), ptr(middleware.Requeue(b.requeueDelay)), false, "", nil, 0, false},
		{fmt.Sprintf("Requeue(%s), parked at enqueue", b.requeueDelay), fmt.Sprintf("`middleware.Requeue(%s)`; enqueued with `singleton.Client` and `singleton.ParkAtEnqueue(locker, 0)`", b.requeueDelay),
			ptr(middleware.Requeue(b.requeueDelay)), false, "park", nil, 0, false},
		{"Coalesce", "`middleware.Coalesce()`", ptr(middleware.Coalesce()), false, "", nil, 0, false},
		{"Coalesce, stamped", "`middleware.Coalesce()`, tasks enqueued with `singleton.Client`", ptr(middleware.Coalesce()), true, "", nil, 0, false},
		{"asynq Unique", "no middleware; enqueued with `asynq.Unique(time.Hour)`", nil, false, "asynq", nil, 0, false},
		{"Unique", "`singleton.Unique(locker, UntilExecuted, 0)` at enqueue; `middleware.Skip()`", ptr(middleware.Skip()), false, "jobguard", nil, 0, false},
	}
	return b.burstRuns(ctx, env, "burst", b.burstTasks, variants)
}

// flow runs the flow-control features over a burst of b.flowTasks tasks.
func (b *bench) flow(ctx context.Context, env *asynqEnv) ([]burstRun, counts, error) {
	variants := []burstVariant{
		{"Skip", "`middleware.Skip()`", ptr(middleware.Skip()), false, "", nil, 0, false},
		{"KeepNewest", "`middleware.KeepNewest()`", ptr(middleware.KeepNewest()), false, "", nil, 0, false},
		{"Preempt", "`middleware.Preempt(0)`", ptr(middleware.Preempt(0)), false, "", nil, 0, false},
		{"Debounce(100ms), KeepNewest", "`singleton.Client` with `singleton.Debounce(locker, 100*time.Millisecond, 0)`; `middleware.KeepNewest()`, `WithRedis`",
			ptr(middleware.KeepNewest()), false, "debounce", nil, 0, false},
		{"Throttle(5 per s), skip", "`singleton.WithThrottle(5, time.Second, middleware.ActionSkip)`, `WithLimit(5)`", ptr(middleware.Skip()), false, "",
			[]singleton.ServerOption{singleton.WithThrottle(5, time.Second, middleware.ActionSkip), singleton.WithLimit(5)}, 0, false},
		{"HoldAtLeast(200ms)", "`singleton.WithHoldAtLeast(200 * time.Millisecond)`, Skip", ptr(middleware.Skip()), false, "",
			[]singleton.ServerOption{singleton.WithHoldAtLeast(200 * time.Millisecond)}, 0, false},
	}
	return b.burstRuns(ctx, env, "flow", b.flowTasks, variants)
}

// followUps runs Coalesce and KeepNewest over a burst of b.flowTasks tasks
// with a b.followWork handler, each with its follow-up waiting on a worker
// (no WithRedis) and parked for its key (WithRedis).
func (b *bench) followUps(ctx context.Context, env *asynqEnv) ([]burstRun, counts, error) {
	variants := []burstVariant{
		{name: "bare", policy: "no middleware", work: b.followWork},
		{name: "Coalesce, waiting", policy: "`middleware.Coalesce()`, no `WithRedis`", p: ptr(middleware.Coalesce()), work: b.followWork, noRedis: true},
		{name: "Coalesce, parked", policy: "`middleware.Coalesce()`, `WithRedis`", p: ptr(middleware.Coalesce()), work: b.followWork},
		{name: "KeepNewest, waiting", policy: "`middleware.KeepNewest()`, no `WithRedis`", p: ptr(middleware.KeepNewest()), work: b.followWork, noRedis: true},
		{name: "KeepNewest, parked", policy: "`middleware.KeepNewest()`, `WithRedis`", p: ptr(middleware.KeepNewest()), work: b.followWork},
	}
	return b.burstRuns(ctx, env, "followup", b.flowTasks, variants)
}

// burstVariant is one way to run the burst.
type burstVariant struct {
	name, policy string
	p            *middleware.Policy
	stamped      bool   // enqueued with singleton.Client
	unique       string // "asynq": asynq.Unique; "jobguard": singleton.Unique; "debounce": singleton.Debounce; "park": singleton.ParkAtEnqueue
	opts         []singleton.ServerOption
	work         time.Duration // the handler's time; zero means b.burstWork
	noRedis      bool          // the middleware without WithRedis: nothing is parked
}

// burstRuns enqueues tasks tasks over b.burstKeys keys for each variant and
// runs them with one server. It also returns the first variant's enqueue
// counts.
func (b *bench) burstRuns(ctx context.Context, env *asynqEnv, section string, tasks int, variants []burstVariant) ([]burstRun, counts, error) {
	srvClient, srvCtr := b.client()
	lockClient, lockCtr := b.client()
	var out []burstRun
	var enq counts
	for i, v := range variants {
		if section == "burst" && !strings.Contains(strings.ToLower(v.name), strings.ToLower(b.burstVariants)) {
			continue
		}
		work := cmp.Or(v.work, b.burstWork)
		progress("  %s: %d tasks over %d keys, %s handler", v.name, tasks, b.burstKeys, work)
		q := env.queue(fmt.Sprintf("%s-%d", section, i))
		// Each variant's locks live under a prefix of their own: what a run
		// cut off by the timeout leaves behind is no later variant's.
		prefix := fmt.Sprintf("%se2e:%s-%d:", b.prefix, section, i)
		rng := rand.New(rand.NewPCG(1, 2))
		keys := make([]int, tasks)
		for j := range keys {
			keys[j] = rng.IntN(b.burstKeys)
		}
		e0 := env.enqCtr.counts()
		var c enqueuer = env.enqueuer
		var opts []asynq.Option
		var reserver *lockkit.Locker
		switch {
		case v.unique == "asynq":
			opts = append(opts, asynq.Unique(time.Hour))
		case v.unique == "jobguard" || v.unique == "debounce" || v.unique == "park":
			var err error
			if reserver, err = lockkit.NewRedis(env.enqRedis, lockkit.WithPrefix(prefix)); err != nil {
				return nil, enq, err
			}
			opt := singleton.Unique(reserver, singleton.UntilExecuted, 0)
			switch v.unique {
			case "debounce":
				opt = singleton.Debounce(reserver, 100*time.Millisecond, 0)
			case "park":
				opt = singleton.ParkAtEnqueue(reserver, 0)
			}
			sc, err := singleton.NewClient(env.enqueuer, env.enqRedis, singleton.KeyByFields("k"), opt)
			if err != nil {
				return nil, enq, err
			}
			c = sc
		case v.stamped:
			sc, err := singleton.NewClient(env.enqueuer, env.enqRedis)
			if err != nil {
				return nil, enq, err
			}
			c = sc
		}
		_, accepted, err := env.enqueueCounting(ctx, c, q, tasks, func(j int) *asynq.Task {
			return asynq.NewTask("bench:burst", fmt.Appendf(nil, `{"k":"key-%d"}`, keys[j]))
		}, opts...)
		if reserver != nil {
			_ = reserver.Close(ctx)
		}
		if err != nil {
			return nil, enq, err
		}
		r := burstRun{name: v.name, policy: v.policy, enqueued: accepted, enq: env.enqCtr.counts().sub(e0)}
		if i == 0 {
			enq = r.enq // the first variant's enqueue is a plain one
		}
		t := newTally(int(accepted))
		var ran, skipped, requeued, preempted atomic.Int64
		var mu sync.Mutex
		running := make(map[string]int)
		lastEnd := make(map[string]time.Time)
		type payload struct {
			K string `json:"k"`
		}
		var h asynq.Handler = asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			var p payload
			if err := json.Unmarshal(task.Payload(), &p); err != nil {
				return err
			}
			k := p.K
			mu.Lock()
			running[k]++
			r.maxOverlap = max(r.maxOverlap, running[k])
			if end, ok := lastEnd[k]; ok && running[k] == 1 {
				r.gaps = append(r.gaps, time.Since(end))
			}
			mu.Unlock()
			timer := time.NewTimer(work)
			defer timer.Stop()
			select {
			case <-timer.C:
			case <-ctx.Done():
				mu.Lock()
				running[k]--
				mu.Unlock()
				if errors.Is(context.Cause(ctx), middleware.ErrPreempted) {
					preempted.Add(1)
					t.add()
				}
				return context.Cause(ctx)
			}
			mu.Lock()
			running[k]--
			lastEnd[k] = time.Now()
			mu.Unlock()
			ran.Add(1)
			t.add()
			return nil
		})
		var locker *lockkit.Locker
		if v.p != nil {
			var err error
			locker, err = lockkit.NewRedis(lockClient, lockkit.WithPrefix(prefix))
			if err != nil {
				return nil, enq, err
			}
			mwOpts := []singleton.ServerOption{singleton.KeyByFields("k"), singleton.WithPolicy(*v.p)}
			if !v.noRedis {
				mwOpts = append(mwOpts, singleton.WithRedis(srvClient))
			}
			guard, err := singleton.Middleware(locker, append(append(mwOpts,
				singleton.WithObserver(func(_ context.Context, e middleware.Event) {
					switch {
					case e.Kind == middleware.EventDuplicate && e.Action == middleware.ActionSkip:
						skipped.Add(1)
						t.add()
					case e.Kind == middleware.EventRequeued:
						requeued.Add(1)
					}
				})), v.opts...)...)
			if err != nil {
				return nil, enq, err
			}
			h = guard(h)
		}
		st, err := env.serve(ctx, srvClient, srvCtr, lockCtr, serverConfig(q, b.concurrency), h, t, b.burstTimeout)
		if locker != nil {
			_ = locker.Close(ctx)
		}
		if err != nil {
			return nil, enq, err
		}
		r.runStats = st
		slices.Sort(r.gaps)
		r.ran, r.skipped, r.requeued, r.preempted = ran.Load(), skipped.Load(), requeued.Load(), preempted.Load()
		if r.left, err = env.left(q); err != nil {
			return nil, enq, err
		}
		env.deleteQueue(q)
		out = append(out, r)
	}
	return out, enq, nil
}

func ptr[T any](v T) *T { return &v }
