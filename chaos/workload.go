package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Policies a family's middleware can have.
const (
	polSkip       = "skip"
	polRequeue    = "requeue"
	polWait       = "wait"
	polCoalesce   = "coalesce"
	polKeepNewest = "keepnewest"
	polPreempt    = "preempt"
)

// Enqueue modes of a family.
const (
	cliPlain    = "plain"    // asynq.Client
	cliStamped  = "stamped"  // singleton.NewClient (asynqkey.EnqueuedAtHeader)
	cliPark     = "park"     // singleton.NewClient with ParkAtEnqueue
	cliUnique   = "unique"   // singleton.NewClient with Unique(UntilExecuted)
	cliDebounce = "debounce" // singleton.NewClient with Debounce(Quiet, MaxWait)
	cliPeriodic = "periodic" // a periodic.Scheduler in every worker, "@every 1s"; no enqueue of the driver's
)

// How an op of a family is enqueued when not by the family's client (Op.Enq).
const (
	enqNoKey    = "nokey"    // asynq.Client, a payload without the key field: the middleware cannot derive its key
	enqOtherKey = "otherkey" // singleton.NewClient with KeyByPayload(): its asynqkey.KeyHeader names other key options
)

// Fault kinds.
const (
	faultKill = "kill" // SIGKILL a worker mid-run, start a replacement
	faultTerm = "term" // SIGTERM: asynq's graceful shutdown (rolling deploy), then a replacement
	faultStop = "stop" // SIGSTOP a worker past the lease TTL, then SIGCONT
	// faultRedis SIGKILLs the redis-server (its AOF fsyncs every write) and
	// starts it again after Hold: every connection, pub/sub included, is
	// cut. Only when the run started its redis-server itself.
	faultRedis = "redis"
	// faultReply* (faults.go): go-redis reply faults the workers inject into
	// their own lock scripts, recorded by the worker, not planned here.
	//
	// faultPubsub cuts every pub/sub connection of the Redis (CLIENT KILL
	// TYPE pubsub) and nothing else: the Lockers' lease notices and wake-ups
	// are lost until they reconnect and resubscribe.
	faultPubsub = "pubsub"
	// faultRelease is an operator's release (lockkit's Locker.CancelRun, as
	// the page and jobguard release send it) of the run of a task whose
	// handler ignores its ctx (Op.IgnoreCtx): the run goes on, and no other
	// run of its key may start until it returns (no excuse for the overlap
	// rule). Recorded with the key and the run's task when one was found.
	faultRelease = "release"
	// faultFailover (sentinel.go), in a Sentinel topology only (it takes the
	// place of faultRedis): the master is SIGKILLed and the sentinels promote
	// a replica; the killed server comes back as a replica of the new master.
	// Lossy (Fault.Lossy, recorded as faultFailoverLossy), the replicas are
	// cut off first and the workers write on for Hold: the promoted replica
	// lacks those writes.
	faultFailover      = "failover"
	faultFailoverLossy = "failover-lossy"
)

// Family is a group of keys sharing a task type and a middleware setup.
type Family struct {
	Name   string `json:"name"` // also the task type's suffix: "chaos:<name>"
	Policy string `json:"policy"`
	Limit  int    `json:"limit"`
	Keys   int    `json:"keys"`
	Client string `json:"client"`
	// Throttle, when not zero, is WithThrottle's n: at most Throttle runs of
	// a key begin in any window of Period (ActionSkip under Skip,
	// ActionRequeue under Requeue).
	Throttle int           `json:"throttle,omitempty"`
	Period   time.Duration `json:"period,omitempty"`
	// Quiet and MaxWait are the Debounce options of a debounce family.
	// Shadow: the middleware runs under singleton.WithShadow (every task
	// runs; a conflict is reported, not acted on).
	Shadow  bool          `json:"shadow,omitempty"`
	Quiet   time.Duration `json:"quiet,omitempty"`
	MaxWait time.Duration `json:"max_wait,omitempty"`
	// HoldAtLeast, when not zero, is WithHoldAtLeast's: a run that
	// succeeded keeps its key that long after its start.
	HoldAtLeast time.Duration `json:"hold_at_least,omitempty"`
	// TTL, when not zero, is the family's lease TTL instead of the
	// workload's.
	TTL time.Duration `json:"ttl,omitempty"`
	// LimitFunc: the middleware takes each task's limit from the task
	// (singleton.WithLimitFunc, limitOf) instead of Limit: its Op.Limit,
	// which half the workers change, as a rolling deploy of another
	// function would.
	LimitFunc bool `json:"limit_func,omitempty"`
	// Fenced: the handler writes to its key's stream and last value through
	// a fence.Writer (fencer.write), ignoring its ctx, so that a run paused
	// past its lease attempts its write once a newer run of the key wrote.
	Fenced bool `json:"fenced,omitempty"`
	// ExtraKeys: the middleware makes each task hold the extra keys its
	// payload names besides its own (singleton.WithExtraKeys, Op.Extra),
	// all or none.
	ExtraKeys bool `json:"extra_keys,omitempty"`
}

// TaskType is the asynq task type of the family's tasks.
func (f Family) TaskType() string { return "chaos:" + f.Name }

// Op is one enqueue of the plan.
type Op struct {
	At        time.Duration `json:"at"` // since the plan began
	Fam       int           `json:"fam"`
	Key       string        `json:"key"`
	ID        string        `json:"id"` // the task's name: seed-unique
	N         int           `json:"n"`  // its number within its key, in enqueue order
	Dur       time.Duration `json:"dur"`
	FailOnce  bool          `json:"fail_once,omitempty"`  // the first delivery fails
	PanicOnce bool          `json:"panic_once,omitempty"` // the first delivery panics
	IgnoreCtx bool          `json:"ignore_ctx,omitempty"` // the handler runs on after its ctx ends
	// TakeBack: the run that follows an earlier put back of the task (a
	// failure asynq retried, or a parked duplicate) moves its own delivery
	// back to retry, as asynq's retry write of that earlier delivery does
	// when go-redis sends it again after a lost reply, and runs on past the
	// servers' DelayedTaskCheckInterval: asynq delivers the task again while
	// the run goes (once per task).
	TakeBack bool `json:"take_back,omitempty"`
	MaxRetry int  `json:"max_retry"`
	TaskID   bool `json:"task_id,omitempty"` // enqueued with asynq.TaskID(ID)
	// Limit is the task's limit in a LimitFunc family (payload "l"), 1 to 3.
	Limit int `json:"limit,omitempty"`
	// Extra are the task's extra keys with their limits in an ExtraKeys
	// family (payload "x"): extraShared, extraSecond or both, or none.
	Extra map[string]int `json:"extra,omitempty"`
	// In, when not zero, delays the task: enqueued with asynq.ProcessIn(In).
	In time.Duration `json:"in,omitempty"`
	// Enq, when not empty, is how the op is enqueued instead of by its
	// family's client: enqNoKey (Key is then empty) or enqOtherKey.
	Enq string `json:"enq,omitempty"`
}

// Fault is one fault of the plan.
type Fault struct {
	At     time.Duration `json:"at"`
	Kind   string        `json:"kind"`
	Target int           `json:"target"` // index of the live worker it hits, modulo their number
	Hold   time.Duration `json:"hold,omitempty"`
	Lossy  bool          `json:"lossy,omitempty"` // a failover that loses what was written for Hold before it
	// Fam, when not empty, is the family a stop is aimed at (Target is not
	// used): it pauses a worker running a task of that family with
	// fencedLeft of its work left, looking for one for up to fencedLook, and
	// is not made if none is found.
	Fam string `json:"fam,omitempty"`
}

// Workload is everything a seed decides: families, enqueues and faults.
type Workload struct {
	Seed    uint64        `json:"seed"`
	TTL     time.Duration `json:"ttl"`     // the lease TTL of every middleware
	Workers int           `json:"workers"` // worker processes alive at once
	Length  time.Duration `json:"length"`  // how long enqueues and faults go on
	// Cluster: the run's Redis is a 3-master Redis Cluster (a Redis fault
	// restarts one master, Target modulo 3), not a standalone server.
	Cluster bool `json:"cluster,omitempty"`
	// Failover: the run's Redis is a master with replicas behind sentinels,
	// and the Redis fault is a failover (faultFailover).
	Failover bool `json:"failover,omitempty"`
	// Batching: every Locker of the run batches its calls
	// (lockkit.WithBatching), so that the reply faults hit pipelines of
	// them: the runs of odd seeds.
	Batching bool     `json:"batching,omitempty"`
	Families []Family `json:"families"`
	Ops      []Op     `json:"ops"`
	Faults   []Fault  `json:"faults"`
	// Offsets are the clocks of the worker processes' Schedulers: the n-th
	// process started (replacements included) fires by the wall clock plus
	// Offsets[(n-1) % len(Offsets)].
	Offsets []time.Duration `json:"offsets"`
	// ReplyGap, when not zero, is the mean gap between the go-redis reply
	// faults (faultReply*) each worker injects into its lock scripts, one at
	// a time; ReplyDelay is how long a late reply keeps the caller waiting
	// when its ctx has no deadline.
	ReplyGap   time.Duration `json:"reply_gap,omitempty"`
	ReplyDelay time.Duration `json:"reply_delay,omitempty"`
	// Crons are the robfig/cron entries every worker runs under
	// cronguard.Wrap, on its clock offset.
	Crons []CronEntry `json:"crons"`
}

// CronEntry is a cron entry every worker process runs (spec with a seconds
// field), whose job runs for Dur.
type CronEntry struct {
	Name  string        `json:"name"`
	Spec  string        `json:"spec"`
	Every time.Duration `json:"every"` // the spec's interval
	Dur   time.Duration `json:"dur"`
}

// ttl is the lease TTL of the middleware of family f.
func (w Workload) ttl(f Family) time.Duration {
	if f.TTL > 0 {
		return f.TTL
	}
	return w.TTL
}

// maxTTL is the longest lease TTL of the workload's middleware.
func (w Workload) maxTTL() time.Duration {
	d := w.TTL
	for _, f := range w.Families {
		d = max(d, f.TTL)
	}
	return d
}

// topology is the Redis the workload runs against.
func (w Workload) topology() topology { return topologyOf(w.Cluster, w.Failover) }

// offset is the clock offset of the n-th worker process (from 1).
func (w Workload) offset(n int) time.Duration {
	if len(w.Offsets) == 0 {
		return 0
	}
	return w.Offsets[(n-1)%len(w.Offsets)]
}

// leaseTTL is the lease TTL of every chaos middleware: short, so that a
// killed or paused holder's keys free within the run.
const leaseTTL = 1500 * time.Millisecond

// failoverTTL is the lease TTL of a Sentinel run's: longer than a failover
// takes (the sentinels' downAfter, an election, the clients' reconnection:
// 2 to 3 s here), as any deployment's is, so that leases live through a
// failover, and one lost with it is lost while its run goes on.
const failoverTTL = 6 * time.Second

// longRun is the shortest run of the long family of a Sentinel run, which
// outlasts a failover: a lease it took after the replicas were cut off is
// missing on the promoted replica while it still runs. Its lease TTL,
// longTTL (lockkit's default is 30 s), makes the first renewal of a lease
// taken just before a failover come after the failover is over: the lease
// is found missing no sooner than that, while the run goes on.
const (
	longRun = 3 * time.Second
	longTTL = 15 * time.Second
)

// How the stops aimed at the fenced family (Fault.Fam) find their run: one
// with at least fencedLeft of its work left, so that it writes after the
// pause, looked for up to fencedLook.
const (
	fencedLeft = 300 * time.Millisecond
	fencedLook = 3 * time.Second
)

// The extra keys of the ExtraKeys family's tasks: extraShared, under a
// limit of 1 or 2 drawn for the seed, and extraSecond, under 1. The first
// sorts before every task's own key ("asynq:..."), the second after it:
// under Wait a task waits for the first before its own key, and for the
// second while it holds its own.
const (
	extraShared = "api:x0"
	extraSecond = "x1"
)

// newWorkload draws a workload from seed for a run of length (enqueues and
// faults; the quiet phase comes after) against a Redis of topology topo.
// faults false draws none. The draws of a standalone run and of a Cluster
// run are the same; a Sentinel run's differ in its faults only.
func newWorkload(seed uint64, length time.Duration, faults bool, topo topology) Workload {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w := Workload{Seed: seed, TTL: leaseTTL, Workers: 3, Length: length, Cluster: topo == topoCluster, Failover: topo == topoSentinel,
		Batching: seed%2 == 1}
	if w.Failover {
		w.TTL = failoverTTL
	}
	pols := []string{polSkip, polRequeue, polWait, polCoalesce, polKeepNewest, polPreempt}
	for i, p := range pols {
		f := Family{Name: fmt.Sprintf("f%d%s", i, p), Policy: p, Limit: 1, Keys: 1 + r.IntN(2), Client: cliPlain}
		if r.IntN(2) == 0 {
			f.Client = cliStamped
		}
		switch p {
		case polSkip, polRequeue:
			if r.IntN(3) == 0 {
				f.Limit = 2
			}
		}
		if p == polRequeue && f.Limit == 1 && r.IntN(2) == 0 {
			f.Client = cliPark
		}
		w.Families = append(w.Families, f)
	}
	// Unique at enqueue, under Skip.
	w.Families = append(w.Families, Family{Name: "f6unique", Policy: polSkip, Limit: 1, Keys: 1 + r.IntN(2), Client: cliUnique})
	// A throttle, under Skip or Requeue: bursts meet the budget of starts.
	th := Family{Name: "f7throttle", Policy: polSkip, Limit: 1 + r.IntN(2), Keys: 1 + r.IntN(2), Client: cliPlain,
		Throttle: 1 + r.IntN(2), Period: time.Duration(500+r.IntN(1500)) * time.Millisecond}
	if r.IntN(3) > 0 {
		th.Policy = polRequeue
	}
	if r.IntN(2) == 0 {
		th.Client = cliStamped
	}
	w.Families = append(w.Families, th)
	// Debounce at enqueue, under KeepNewest or Preempt (as its doc says).
	db := Family{Name: "f8debounce", Policy: polKeepNewest, Limit: 1, Keys: 1 + r.IntN(2), Client: cliDebounce,
		Quiet: time.Duration(100+r.IntN(600)) * time.Millisecond}
	if r.IntN(2) == 0 {
		db.Policy = polPreempt
	}
	if r.IntN(2) == 0 {
		db.MaxWait = db.Quiet + time.Duration(r.IntN(2000))*time.Millisecond
	}
	w.Families = append(w.Families, db)
	// Ticks every worker's Scheduler fires, under Requeue (a tick delivered
	// while the previous one runs is run after it, not skipped).
	w.Families = append(w.Families, Family{Name: "f9periodic", Policy: polRequeue, Limit: 1, Keys: 1, Client: cliPeriodic})
	var enqueued []int // the families the driver enqueues
	for i, f := range w.Families {
		if f.Client != cliPeriodic {
			enqueued = append(enqueued, i)
		}
	}
	// task draws a task of key of family fi enqueued at at: its run's
	// length, and whether it fails, panics or ignores its ctx, its retries
	// and its task ID.
	task := func(fi int, key string, at time.Duration) Op {
		op := Op{At: at, Fam: fi, Key: key, MaxRetry: 3, Dur: time.Duration(20+r.IntN(300)) * time.Millisecond}
		switch x := r.IntN(100); {
		case x < 8:
			op.Dur = time.Duration(1000+r.IntN(2500)) * time.Millisecond // past the TTL: renewals
		case x < 16:
			op.FailOnce = true
		case x < 20:
			op.PanicOnce = true
		case x < 35:
			op.MaxRetry = 0
		}
		op.IgnoreCtx = r.IntN(8) == 0
		op.TaskID = r.IntN(6) == 0
		return op
	}
	// burst draws a burst or a stream of tasks of one key of family fi.
	burst := func(fi int) {
		f := w.Families[fi]
		key := fmt.Sprintf("k%d", r.IntN(f.Keys))
		at := time.Duration(r.Int64N(int64(length * 9 / 10)))
		count, gap := 3+r.IntN(6), time.Duration(r.IntN(20))*time.Millisecond // a burst
		if r.IntN(3) == 0 {
			count, gap = 4+r.IntN(8), time.Duration(100+r.IntN(300))*time.Millisecond // a stream
		}
		for range count {
			w.Ops = append(w.Ops, task(fi, key, at))
			at += gap
		}
	}
	// About 4 tasks a second, in bursts and streams of one key.
	budget := int(length.Seconds() * 4)
	// Every family gets a burst or stream, however short the run; the
	// others fall at random.
	for b := 0; b < len(enqueued) || len(w.Ops) < budget; b++ {
		fi := enqueued[b%len(enqueued)]
		if b >= len(enqueued) {
			fi = enqueued[r.IntN(len(enqueued))]
		}
		burst(fi)
	}
	if faults {
		n := 1 + int(length/(8*time.Second))
		kinds := []string{faultKill, faultTerm, faultStop, faultRedis, faultPubsub}
		if w.Failover {
			kinds[3] = faultFailover
		}
		first := r.IntN(len(kinds))
		for i := range n {
			f := Fault{At: length/10 + time.Duration(r.Int64N(int64(length*8/10))), Kind: kinds[(first+i)%len(kinds)], Target: r.IntN(w.Workers)}
			switch f.Kind {
			case faultStop:
				f.Hold = w.TTL + time.Duration(500+r.IntN(1000))*time.Millisecond
			case faultRedis:
				f.Hold = time.Duration(100+r.IntN(400)) * time.Millisecond
			case faultFailover:
				drawFailover(r, &f)
			}
			w.Faults = append(w.Faults, f)
		}
		slices.SortStableFunc(w.Faults, func(a, b Fault) int { return int(a.At - b.At) })
	}
	// Clocks up to 400ms apart either way, as replicas' clocks drift.
	for range 8 {
		w.Offsets = append(w.Offsets, time.Duration(r.IntN(801)-400)*time.Millisecond)
	}
	// Drawn after everything else, so that the draws above are those of
	// seeds run before the cron entries and reply faults came.
	w.Crons = []CronEntry{
		{Name: "c0every1s", Spec: "* * * * * *", Every: time.Second, Dur: time.Duration(5+r.IntN(150)) * time.Millisecond},
		{Name: "c1every2s", Spec: "*/2 * * * * *", Every: 2 * time.Second, Dur: time.Duration(5+r.IntN(600)) * time.Millisecond},
	}
	if faults {
		w.ReplyGap = time.Duration(300+r.IntN(1200)) * time.Millisecond
		w.ReplyDelay = time.Duration(200+r.IntN(800)) * time.Millisecond
	}
	// Shadow mode over Skip, Requeue or Coalesce: every task runs, and each
	// conflict is reported as the decision the policy would have taken.
	sh := Family{Name: "f10shadow", Policy: []string{polSkip, polRequeue, polCoalesce}[r.IntN(3)], Limit: 1, Keys: 1 + r.IntN(2), Client: cliPlain, Shadow: true}
	if r.IntN(2) == 0 {
		sh.Client = cliStamped
	}
	w.Families = append(w.Families, sh)
	for range 2 + int(length/(10*time.Second)) {
		burst(len(w.Families) - 1)
	}
	// Hold at least, under Skip or Requeue (duplicates parked behind a held
	// key, plainly or at enqueue): runs of a key start at most once per hold.
	hold := Family{Name: "f11hold", Policy: polRequeue, Limit: 1, Keys: 1 + r.IntN(2), Client: cliPlain,
		HoldAtLeast: time.Duration(200+r.IntN(500)) * time.Millisecond}
	switch r.IntN(3) {
	case 0:
		hold.Policy = polSkip
	case 1:
		hold.Client = cliPark
	}
	w.Families = append(w.Families, hold)
	for range 2 + int(length/(10*time.Second)) {
		burst(len(w.Families) - 1)
	}
	// Shadow mode over Requeue with tasks the middleware would refuse: keys
	// that cannot be derived, keys derived with other options, and tasks
	// parked at enqueue under WithLimit(2); under WithLimit(1) the parked
	// tasks take their reservations over and hand the key on. Every task
	// runs.
	sk := Family{Name: "f12shadowkeys", Policy: polRequeue, Limit: 1, Keys: 1 + r.IntN(2), Client: cliPark, Shadow: true}
	if r.IntN(2) == 0 {
		sk.Limit = 2
	}
	w.Families = append(w.Families, sk)
	from := len(w.Ops)
	for range 2 + int(length/(10*time.Second)) {
		burst(len(w.Families) - 1)
	}
	for i := from; i < len(w.Ops); i++ {
		switch r.IntN(5) {
		case 0:
			w.Ops[i].Enq, w.Ops[i].Key = enqNoKey, ""
		case 1:
			w.Ops[i].Enq = enqOtherKey
		}
	}
	// Long runs taken back, under Requeue: each task's run after a failure
	// or a park is taken back by a late retry write (Op.TakeBack) and
	// delivered again while it goes; its work is done once.
	tb := Family{Name: "f13takenback", Policy: polRequeue, Limit: 1, Keys: 1 + r.IntN(2), Client: cliPlain}
	w.Families = append(w.Families, tb)
	for range 1 + int(length/(10*time.Second)) {
		from := len(w.Ops)
		burst(len(w.Families) - 1)
		for i := from; i < len(w.Ops); i++ {
			op := &w.Ops[i]
			op.TakeBack, op.PanicOnce, op.IgnoreCtx, op.MaxRetry = true, false, false, 3
			op.FailOnce = r.IntN(2) == 0
			op.Dur = time.Duration(400+r.IntN(600)) * time.Millisecond
		}
	}
	// Operators' releases of hung handlers, drawn after everything else.
	if faults {
		for range 1 + int(length/(15*time.Second)) {
			w.Faults = append(w.Faults, Fault{At: length/10 + time.Duration(r.Int64N(int64(length*8/10))), Kind: faultRelease, Target: r.IntN(w.Workers)})
		}
		slices.SortStableFunc(w.Faults, func(a, b Fault) int { return int(a.At - b.At) })
	}
	// In a Sentinel run, runs that outlast a failover, of tasks due at
	// times spread over three times the run's length (ProcessIn), which a
	// lossy failover's cut can come just before (seedRun.awaitLongDue), under
	// Skip over keys mostly free; and more failovers: drawn after everything
	// else.
	if w.Failover {
		w.Families = append(w.Families, Family{Name: "f14long", Policy: polSkip, Limit: 1, Keys: 8, Client: cliPlain, TTL: longTTL})
		for range 2 * int(length/time.Second) {
			w.Ops = append(w.Ops, Op{At: time.Duration(r.Int64N(int64(length * 9 / 10))), Fam: len(w.Families) - 1, Key: fmt.Sprintf("k%d", r.IntN(8)),
				MaxRetry: 3, Dur: longRun + time.Duration(r.IntN(2000))*time.Millisecond, In: time.Duration(500+r.Int64N(int64(3*length/time.Millisecond))) * time.Millisecond})
		}
	}
	if faults && w.Failover {
		for range 1 + int(length/(10*time.Second)) {
			f := Fault{At: length/10 + time.Duration(r.Int64N(int64(length*8/10))), Kind: faultFailover}
			drawFailover(r, &f)
			w.Faults = append(w.Faults, f)
		}
		slices.SortStableFunc(w.Faults, func(a, b Fault) int { return int(a.At - b.At) })
	}
	// Per-task limits (WithLimitFunc) under Skip, Requeue or Wait: each task
	// brings its own limit, and the workers disagree about it (limitOf), so
	// that runs of one key hold it with different limits. Drawn after
	// everything else.
	lf := Family{Name: "f15limitfunc", Policy: []string{polSkip, polRequeue, polWait}[r.IntN(3)], Limit: 1, Keys: 1 + r.IntN(2), Client: cliPlain, LimitFunc: true}
	w.Families = append(w.Families, lf)
	for range 2 + int(length/(10*time.Second)) {
		from := len(w.Ops)
		burst(len(w.Families) - 1)
		for i := from; i < len(w.Ops); i++ {
			w.Ops[i].Limit = 1 + r.IntN(3)
		}
	}
	// Fenced writes, under Skip (each run writes as it begins and after its
	// work: Family.Fenced): in each burst, a long run, a stop aimed at it
	// (Fault.Fam) that outlasts its lease by half a TTL or more, and a
	// stream of tasks of its key, some TTL/4 apart at most, until the stop
	// is over: one of them takes the key once the lease ran out, and its run
	// writes while the paused run waits to write, which the fence then
	// refuses. (Under Requeue the tasks put back would stay parked until
	// the paused run's release or their backstop.) Drawn after everything
	// else.
	fe := Family{Name: "f16fenced", Policy: polSkip, Limit: 1, Keys: 1 + r.IntN(2), Client: cliPlain, Fenced: true}
	w.Families = append(w.Families, fe)
	ttl := w.ttl(fe)
	span := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo))) }
	for range 1 + int(length/(10*time.Second)) {
		key := fmt.Sprintf("k%d", r.IntN(fe.Keys))
		at := time.Duration(r.Int64N(int64(length * 6 / 10)))
		w.Ops = append(w.Ops, Op{At: at, Fam: len(w.Families) - 1, Key: key, MaxRetry: 3, Dur: span(ttl, ttl*3/2)})
		for next := at + span(ttl/6, ttl/4); next < at+ttl*5/2; next += span(ttl/6, ttl/4) {
			w.Ops = append(w.Ops, Op{At: next, Fam: len(w.Families) - 1, Key: key, MaxRetry: 3, Dur: span(ttl/5, ttl/2)})
		}
		if faults {
			w.Faults = append(w.Faults, Fault{At: at + span(ttl/5, ttl/2), Kind: faultStop, Hold: ttl + span(ttl/2, ttl), Fam: fe.Name})
		}
	}
	slices.SortStableFunc(w.Faults, func(a, b Fault) int { return int(a.At - b.At) })
	// Extra keys (WithExtraKeys) under Skip, Requeue or Wait: each task of
	// a tenant's own key (k0 to k2, under a limit of 1 or 2) also holds the
	// extra keys its payload names (Op.Extra), all or none: mostly
	// extraShared, sometimes extraSecond too. In each wave every tenant's
	// tasks arrive within about 150 ms, so that tasks of every tenant and
	// worker contend for the shared keys. Drawn after everything else.
	ek := Family{Name: "f17extrakeys", Policy: []string{polSkip, polRequeue, polWait}[r.IntN(3)], Limit: 1 + r.IntN(2), Keys: 3, Client: cliPlain, ExtraKeys: true}
	w.Families = append(w.Families, ek)
	shared := 1 + r.IntN(2)
	for range 2 + int(length/(10*time.Second)) {
		at := time.Duration(r.Int64N(int64(length * 9 / 10)))
		for k := range ek.Keys {
			next := at + time.Duration(r.IntN(100))*time.Millisecond
			for range 2 + r.IntN(3) {
				op := task(len(w.Families)-1, fmt.Sprintf("k%d", k), next)
				op.Extra = map[string]int{}
				if r.IntN(6) > 0 {
					op.Extra[extraShared] = shared
				}
				if r.IntN(3) == 0 {
					op.Extra[extraSecond] = 1
				}
				w.Ops = append(w.Ops, op)
				next += time.Duration(r.IntN(20)) * time.Millisecond
			}
		}
	}
	// Numbers within a key follow enqueue order.
	slices.SortStableFunc(w.Ops, func(a, b Op) int { return int(a.At - b.At) })
	seen := map[string]int{}
	for i := range w.Ops {
		op := &w.Ops[i]
		name := w.Families[op.Fam].Name + "/" + op.Key
		seen[name]++
		op.N = seen[name]
		op.ID = fmt.Sprintf("s%d-%s-%s-%d", seed, w.Families[op.Fam].Name, op.Key, op.N)
	}
	return w
}

// drawFailover draws whether failover f loses writes, one in two, and for
// how long the workers write before the master is killed: 50 to 500 ms.
func drawFailover(r *rand.Rand, f *Fault) {
	f.Lossy = r.IntN(2) == 0
	if f.Lossy {
		f.Hold = time.Duration(50+r.IntN(451)) * time.Millisecond
	}
}
