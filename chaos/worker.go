package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/asynqtest"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/periodic"
	"github.com/jobguard/jobguard/singleton"
)

// payload is a chaos task's payload: who it is and what its handler does.
type payload struct {
	ID        string        `json:"id"`
	Fam       string        `json:"fam"`
	K         string        `json:"k"` // the key field (KeyByFields("k"))
	N         int           `json:"n"`
	Dur       time.Duration `json:"dur"`
	FailOnce  bool          `json:"fail_once,omitempty"`
	PanicOnce bool          `json:"panic_once,omitempty"`
	IgnoreCtx bool          `json:"ignore_ctx,omitempty"`
	TakeBack  bool          `json:"take_back,omitempty"`
	L         int           `json:"l,omitempty"` // the task's limit (Op.Limit; see limitOf)
	// X are the task's extra keys with their limits (Op.Extra), which the
	// ExtraKeys family's middleware gives WithExtraKeys.
	X map[string]int `json:"x,omitempty"`
}

// limitOf is the limit that the worker proc gives the task p of a LimitFunc
// family: p.L on the even-numbered workers (w0, w2, ...), and on the others
// the function of another deploy, which turns 1, 2, 3 into 2, 3, 1. A run
// records the limit it was given (Record.Limit).
func limitOf(proc string, p payload) int {
	if n, err := strconv.Atoi(strings.TrimPrefix(proc, "w")); err == nil && n%2 == 1 {
		return 1 + p.L%3
	}
	return p.L
}

// runInfo travels in a delivery's ctx, so that the guard's events name the
// task and the run they belong to.
type runInfo struct {
	p   payload
	aid string
	mu  sync.Mutex
	run int64
}

type runInfoKey struct{}

func (ri *runInfo) current() int64 {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	return ri.run
}

// policyOf is the middleware policy of a family.
func policyOf(f Family) middleware.Policy {
	switch f.Policy {
	case polRequeue:
		return middleware.Requeue(200 * time.Millisecond)
	case polWait:
		return middleware.Wait(time.Second, middleware.Requeue(200*time.Millisecond))
	case polCoalesce:
		return middleware.Coalesce()
	case polKeepNewest:
		return middleware.KeepNewest()
	case polPreempt:
		return middleware.Preempt(preemptGrace)
	}
	return middleware.Skip()
}

// throttleAction is what a throttled task of f does: it is put back under
// Requeue, skipped otherwise.
func throttleAction(f Family) middleware.Action {
	if f.Policy == polRequeue {
		return middleware.ActionRequeue
	}
	return middleware.ActionSkip
}

// Negative controls (-broken): workers that break the rules on purpose.
const (
	brokenNone  = "none"  // no middleware at all
	brokenSkip  = "skip"  // every family under Skip, whatever its policy
	brokenAcks  = "acks"  // in a Sentinel run, Lockers that wait for no replica
	brokenFence = "fence" // the fenced family writes with plain XADD and SET, which no fence checks
	// brokenExtraKeys: the ExtraKeys family's middleware has no
	// WithExtraKeys, so that its tasks hold their own keys only.
	brokenExtraKeys = "extrakeys"
)

// ackTimeout is how long a lease write of a Sentinel run's Lockers waits
// for a replica to acknowledge it.
const ackTimeout = 100 * time.Millisecond

// lockerOptions are the options of every Locker of w's run: waiting for
// one replica (lockkit.WithReplicaAcks) in a Sentinel run, but under
// -broken acks; batching (lockkit.WithBatching) when w.Batching.
func lockerOptions(w Workload, broken string) []lockkit.Option {
	var opts []lockkit.Option
	if w.Failover && broken != brokenAcks {
		opts = append(opts, lockkit.WithReplicaAcks(1, ackTimeout))
	}
	if w.Batching {
		opts = append(opts, lockkit.WithBatching())
	}
	return opts
}

// preemptGrace is the Grace of every Preempt family.
const preemptGrace = 500 * time.Millisecond

// workerConfig is the asynq.Config of every worker process, made by
// singleton.ServerConfig: other errors are retried after 100ms.
func workerConfig(queue string) asynq.Config {
	return singleton.ServerConfig(asynq.Config{
		Concurrency:              4,
		Queues:                   map[string]int{queue: 1},
		TaskCheckInterval:        20 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 100 * time.Millisecond },
		ShutdownTimeout:          time.Second,
		Logger:                   quietLogger{},
	})
}

// workerMain runs one worker process until SIGTERM: an asynq server whose
// handlers run under singleton.Middleware (none with -broken), recording
// its history in <dir>/<id>.jsonl.
func workerMain(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	id := fs.String("id", "w1", "process name")
	addr := fs.String("addr", "", "Redis address (comma-separated: the Cluster's masters, or the sentinels)")
	topo := fs.String("topology", string(topoStandalone), "the Redis: standalone, cluster or sentinel")
	dir := fs.String("dir", "", "run directory (workload.json, histories)")
	prefix := fs.String("prefix", "", "lock key prefix")
	queue := fs.String("queue", "", "asynq queue")
	broken := fs.String("broken", "", "negative control: none (no middleware), skip (every family under Skip), acks (Lockers that wait for no replica), fence (the fenced family's writes unfenced) or extrakeys (the ExtraKeys family's tasks hold their own keys only)")
	offset := fs.Duration("offset", 0, "the offset of the Scheduler's clock from the wall clock")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(*dir, "workload.json"))
	if err != nil {
		return err
	}
	var w Workload
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	rec, err := newRecorder(filepath.Join(*dir, *id+".jsonl"), *id)
	if err != nil {
		return err
	}
	defer rec.close()
	addrs := strings.Split(*addr, ",")
	rdb := newClient(addrs, topology(*topo), "chaos-"+*id)
	defer rdb.Close()
	locker, err := lockkit.NewRedis(rdb, append(lockerOptions(w, *broken), lockkit.WithPrefix(*prefix), lockkit.WithOwner(*id))...)
	if err != nil {
		return err
	}

	var inflight sync.WaitGroup
	observe := func(ctx context.Context, e middleware.Event) {
		r := Record{Ev: evDecision, Kind: e.Kind.String(), AID: e.Job.ID}
		if ri, ok := ctx.Value(runInfoKey{}).(*runInfo); ok {
			r.Task, r.Fam, r.Key, r.N, r.Run = ri.p.ID, ri.p.Fam, ri.p.K, ri.p.N, ri.current()
		}
		if e.Action != 0 {
			r.Action = e.Action.String()
		}
		r.Token = e.Token
		if e.Err != nil {
			r.Reason, r.Err = reasonOf(e.Err), e.Err.Error()
		}
		rec.add(r)
	}
	fc, err := newFencer(rdb, rec, *prefix, *broken)
	if err != nil {
		return err
	}
	mux := asynq.NewServeMux()
	for _, f := range w.Families {
		var fenced *fencer
		if f.Fenced {
			fenced = fc
		}
		var h asynq.Handler = work(rec, rdb, *prefix, fenced)
		if *broken != brokenNone {
			pol := policyOf(f)
			if *broken == brokenSkip {
				pol = middleware.Skip()
			}
			opts := []singleton.ServerOption{singleton.KeyByFields("k"),
				singleton.WithPolicy(pol), singleton.WithLimit(f.Limit), singleton.WithTTL(w.ttl(f)),
				singleton.WithRedis(rdb), singleton.WithObserver(observe)}
			if f.Throttle > 0 {
				opts = append(opts, singleton.WithThrottle(f.Throttle, f.Period, throttleAction(f)))
			}
			if f.Shadow {
				opts = append(opts, singleton.WithShadow())
			}
			if f.HoldAtLeast > 0 {
				opts = append(opts, singleton.WithHoldAtLeast(f.HoldAtLeast))
			}
			if f.LimitFunc {
				opts = append(opts, singleton.WithLimitFunc(func(_ context.Context, t *asynq.Task) int {
					var p payload
					_ = json.Unmarshal(t.Payload(), &p)
					return limitOf(*id, p)
				}))
			}
			if f.ExtraKeys && *broken != brokenExtraKeys {
				opts = append(opts, singleton.WithExtraKeys(func(_ context.Context, t *asynq.Task) map[string]int {
					var p payload
					_ = json.Unmarshal(t.Payload(), &p)
					return p.X
				}))
			}
			guard, err := singleton.Middleware(locker, opts...)
			if err != nil {
				return err
			}
			h = guard(h)
		}
		mux.Handle(f.TaskType(), deliver(rec, &inflight, h))
	}
	// SIGUSR1 stops the Scheduler and the cron (the run goes quiet), SIGTERM
	// the process.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt, syscall.SIGUSR1)
	var srv *asynq.Server
	if topology(*topo) == topoSentinel {
		// A client of its own, made as asynq's users make one.
		srv = asynq.NewServer(asynq.RedisFailoverClientOpt{MasterName: sentinelMaster, SentinelAddrs: addrs}, workerConfig(*queue))
	} else {
		srv = asynq.NewServerFromRedisClient(rdb, workerConfig(*queue))
	}
	if err := srv.Start(mux); err != nil {
		return err
	}
	sched, err := startScheduler(rec, rdb, w, *prefix, *queue, *offset)
	if err != nil {
		return err
	}
	crons, err := startCron(rec, locker, w, *offset, *broken)
	if err != nil {
		return err
	}
	stopFaults := injectReplyFaults(rdb, rec, w, *id, *prefix)
	rec.add(Record{Ev: evReady, Offset: int64(*offset)})
	fmt.Println("ready")

	firing := true
	stopScheduler := func() {
		if firing {
			firing = false
			sched.Shutdown()
			<-crons.Stop().Done()
			stopFaults()
		}
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case s := <-sig:
			stopScheduler()
			done = s != syscall.SIGUSR1
		case <-tick.C:
			recordClock(rec, rdb)
		}
	}
	srv.Shutdown()
	// asynq does not wait for handlers that outlive its ShutdownTimeout: the
	// process does, a while, before closing the Locker (README: close it
	// after the handlers returned).
	waited := make(chan struct{})
	go func() { inflight.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
	}
	err = locker.Close(context.Background())
	rec.add(Record{Ev: evExit})
	return err
}

// periodicMaxRetry is the MaxRetry of the ticks' tasks.
const periodicMaxRetry = 3

// startScheduler starts the process's periodic.Scheduler, whose clock is
// the wall clock plus offset: it fires the ticks of every periodic family
// and records each enqueue it made (accepted or failed; one refused because
// another replica enqueued the tick first is not reported to it). Its marks
// live under a prefix of their own, outside the lock key prefix.
func startScheduler(rec *recorder, rdb redis.UniversalClient, w Workload, prefix, queue string, offset time.Duration) (*periodic.Scheduler, error) {
	var fams []Family
	for _, f := range w.Families {
		if f.Client == cliPeriodic {
			fams = append(fams, f)
		}
	}
	post := func(info *asynq.TaskInfo, err error) {
		r := Record{Ev: evEnqueue, Accepted: err == nil}
		if err != nil {
			r.Err = err.Error()
		} else {
			var p payload
			_ = json.Unmarshal(info.Payload, &p)
			r.Task, r.AID, r.Fam, r.Key, r.Retry = info.ID, info.ID, p.Fam, p.K, info.MaxRetry
		}
		rec.add(r)
	}
	s := periodic.NewSchedulerFromRedisClient(rdb, &asynq.SchedulerOpts{PostEnqueueFunc: post},
		periodic.WithClock(func() time.Time { return time.Now().Add(offset) }), periodic.WithPrefix("periodic:"+prefix))
	for _, f := range fams {
		b, _ := json.Marshal(payload{Fam: f.Name, K: "k0", Dur: 30 * time.Millisecond})
		if _, err := s.Register("@every 1s", asynq.NewTask(f.TaskType(), b), asynq.Queue(queue), asynq.MaxRetry(periodicMaxRetry), asynq.Timeout(time.Minute)); err != nil {
			return nil, err
		}
	}
	return s, s.Start()
}

// recordClock records the Redis server's clock.
func recordClock(rec *recorder, rdb redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if t, err := rdb.Time(ctx).Result(); err == nil {
		rec.add(Record{Ev: evClock, RedisUS: t.UnixMicro()})
	}
}

// deliver records each delivery and what the chain returned to asynq.
func deliver(rec *recorder, inflight *sync.WaitGroup, next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) (err error) {
		inflight.Add(1)
		defer inflight.Done()
		var p payload
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return fmt.Errorf("chaos: payload: %w", err)
		}
		aid, _ := asynq.GetTaskID(ctx)
		if p.ID == "" {
			p.ID = aid // a Scheduler's tick: named by its task ID
		}
		retry, _ := asynq.GetRetryCount(ctx)
		ri := &runInfo{p: p, aid: aid}
		r := Record{Task: p.ID, AID: aid, Fam: p.Fam, Key: p.K, N: p.N, Retry: retry}
		if s := t.Headers()[asynqkey.EnqueuedAtHeader]; s != "" {
			_, _ = fmt.Sscan(s, &r.Stamp)
		}
		r.Ev = evDeliver
		rec.add(r)
		r.Stamp = 0
		defer func() {
			r.Ev = evReturn
			if v := recover(); v != nil {
				r.Err = fmt.Sprint("panic: ", v)
				rec.add(r)
				panic(v)
			}
			if err != nil {
				r.Err, r.Reason = err.Error(), reasonOf(err)
			}
			rec.add(r)
		}()
		return next.ProcessTask(context.WithValue(ctx, runInfoKey{}, ri), t)
	})
}

// work is the handler: it records its start and end, and does what the
// payload says (run for Dur, fail or panic on its first run, ignore its ctx).
// The run of a fenced family (fc not nil) writes through fc as it begins
// and after its work (fencer.write), and ignores its ctx.
func work(rec *recorder, rdb redis.UniversalClient, prefix string, fc *fencer) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		ri, _ := ctx.Value(runInfoKey{}).(*runInfo)
		p := ri.p
		base := Record{Task: p.ID, AID: ri.aid, Fam: p.Fam, Key: p.K, N: p.N}
		start := base
		start.Ev = evStart
		if p.L > 0 {
			start.Limit = limitOf(rec.proc, p)
		}
		start.Extra = p.X
		run := rec.add(start).Seq
		ri.mu.Lock()
		ri.run = run
		ri.mu.Unlock()
		end := base
		end.Ev, end.Run = evEnd, run
		addEnd := func() {
			end.Lost = lostOf(ctx)
			rec.add(end)
		}
		ended := make(chan struct{})
		var watch sync.WaitGroup
		watch.Add(1)
		go func() {
			defer watch.Done()
			select {
			case <-ctx.Done():
				c := base
				c.Ev, c.Run, c.Cause = evCancel, run, causeOf(ctx)
				rec.add(c)
			case <-ended:
			}
		}()
		defer func() { close(ended); watch.Wait() }()

		// The first run of a task that fails once, across every process.
		first := false
		if p.FailOnce || p.PanicOnce {
			first, _ = rdb.SetNX(context.WithoutCancel(ctx), "chaosrun:first:"+prefix+p.ID, 1, time.Hour).Result()
		}
		if p.TakeBack && !first {
			takeBack(ctx, rdb, prefix, p)
		}
		if fc != nil {
			fc.write(ctx, base, run, writeBegin)
		}
		timer := time.NewTimer(p.Dur)
		defer timer.Stop()
		if p.IgnoreCtx || fc != nil {
			<-timer.C
		} else {
			select {
			case <-timer.C:
			case <-ctx.Done():
				end.Outcome, end.Cause = "cancelled", causeOf(ctx)
				addEnd()
				return fmt.Errorf("chaos: cancelled: %w", context.Cause(ctx))
			}
		}
		switch {
		case first && p.PanicOnce:
			end.Outcome = "panic"
			addEnd()
			panic("chaos: panic on the first run")
		case first:
			end.Outcome = "error"
			addEnd()
			return errors.New("chaos: failure on the first run")
		}
		if fc != nil {
			// A write the fence refused is no failure: a newer run of the
			// key has written, and its writes stand.
			fc.write(ctx, base, run, writeEnd)
			fc.write(ctx, base, run, writeLast)
		}
		end.Outcome = "ok"
		if ctx.Err() != nil {
			end.Cause = causeOf(ctx)
		}
		addEnd()
		return nil
	})
}

// takeBack moves the delivery of ctx back to retry, due now, as a late
// retry write of an earlier delivery of its task does, if the delivery
// follows one (asynq retried it, or its acquire had been parked), once per
// task across every process.
func takeBack(ctx context.Context, rdb redis.UniversalClient, prefix string, p payload) {
	retried, _ := asynq.GetRetryCount(ctx)
	lease, ok := lockcore.LeaseFromContext(ctx)
	if retried == 0 && !(ok && lease.WasParked()) {
		return
	}
	wctx := context.WithoutCancel(ctx)
	if once, err := rdb.SetNX(wctx, "chaosrun:takeback:"+prefix+p.ID, 1, time.Hour).Result(); err != nil || !once {
		return
	}
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	_ = asynqtest.LateRetry(wctx, rdb, queue, id, time.Now())
}

func causeOf(ctx context.Context) string {
	c := context.Cause(ctx)
	switch {
	case c == nil:
		return ""
	case errors.Is(c, lockcore.ErrPreempted):
		return "preempted"
	case errors.Is(c, lockkit.ErrLost):
		return "lost"
	case errors.Is(c, lockkit.ErrCancelled):
		return "cancelled" // an operator's release: the key stays held, no excuse
	}
	return c.Error()
}

// lostOf names how the lease of ctx's run ended when that is not what
// ctx's cause says: "preempted" if a newer task's acquire preempted it
// after ctx was cancelled for another cause (an operator's release, say,
// which sets the cause first), else "".
func lostOf(ctx context.Context) string {
	lease, ok := lockcore.LeaseFromContext(ctx)
	if !ok || !errors.Is(lease.Err(), lockcore.ErrPreempted) || causeOf(ctx) == "preempted" {
		return ""
	}
	return "preempted"
}

// reasonOf names why a guard event's job did not run, or how its lease ended.
func reasonOf(err error) string {
	var dup *middleware.DuplicateError
	if errors.As(err, &dup) {
		switch dup.Reason {
		case middleware.ReasonHeld:
			return "held"
		case middleware.ReasonClaimed:
			return "claimed"
		case middleware.ReasonSuperseded:
			return "superseded"
		case middleware.ReasonThrottled:
			return "throttled"
		case middleware.ReasonCovered:
			return "covered"
		case middleware.ReasonCompleted:
			return "completed"
		}
	}
	switch {
	case errors.Is(err, lockcore.ErrCovered):
		return "covered"
	case errors.Is(err, lockcore.ErrCompleted):
		return "completed"
	case errors.Is(err, lockcore.ErrSuperseded):
		return "superseded"
	case errors.Is(err, lockcore.ErrPreempted):
		return "preempted"
	case errors.Is(err, lockkit.ErrLost):
		return "lost"
	case errors.Is(err, lockkit.ErrNotAcquired):
		return "held"
	case errors.Is(err, middleware.ErrDuplicate):
		return "duplicate"
	}
	return ""
}

// quietLogger is an asynq.Logger that writes warnings and errors to
// stderr (the worker's log file) and drops the rest.
type quietLogger struct{}

func (quietLogger) Debug(...any)   {}
func (quietLogger) Info(...any)    {}
func (quietLogger) Warn(a ...any)  { log.Print(append([]any{"asynq WARN: "}, a...)...) }
func (quietLogger) Error(a ...any) { log.Print(append([]any{"asynq ERROR: "}, a...)...) }
func (quietLogger) Fatal(a ...any) { log.Print(append([]any{"asynq FATAL: "}, a...)...) }
