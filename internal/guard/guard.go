// Package guard is the engine of package middleware: key → lease → run →
// release, the policies, the events. middleware is its public front
// (aliases of its types, its options and policies, documented there); the
// adapters (singleton, cronguard) build on it directly, with what only an
// adapter sets: the Work a job carries besides its key (With, WorkOf),
// their own checks (WithAdmit, WithDone), parking (WithParking, PassOn),
// their own options in the same list (Settings.Adapter), and what they
// read of a built Guard (PolicyOf, ModeOf, ActionOf, DelayOf, Emit).
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jobguard/jobguard/internal/invalid"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/throttle"
	"github.com/jobguard/jobguard/lockkit"
)

// Defaults of a Guard.
const (
	// DefaultRequeueDelay is the base delay of Requeue when none is given.
	DefaultRequeueDelay = 5 * time.Second
)

// Errors of the guard. Compare with errors.Is.
var (
	// ErrDuplicate is matched (errors.Is) by every *DuplicateError: the work
	// did not run because another run holds its key or already claimed its
	// epoch.
	ErrDuplicate = errors.New("middleware: duplicate")
	// ErrInvalid is matched by every error New returns for a nil locker or an
	// invalid option; it also matches lockkit.ErrInvalid. The message names
	// the option and the bad value.
	ErrInvalid = invalid.New("middleware: invalid option")
	// ErrPreempted is the cause (context.Cause) of the cancellation of a
	// run's ctx when a newer job of its key took over (Preempt): the run's
	// lease is lost, so it also matches lockkit.ErrLost.
	ErrPreempted = lockcore.ErrPreempted
)

// Job is one run of work to guard: what every runtime has (Key, Name, ID),
// and what an adapter knows of the work besides (Work, set with With).
type Job struct {
	// Key is the lock key; required.
	Key string
	// Name names the work in events and errors (a task type, a cron entry).
	Name string
	// ID identifies this run in events (a task id, a tick). Optional.
	ID string
	w  Work
}

// Work is what an adapter may know of a job's work beyond its key, name and
// ID: which work it is across deliveries, when and in which order it was
// asked for, whether it is run again after a failure, whether the key was
// reserved for it, a claim of it. One that does not know a field leaves it
// zero: cronguard sets the Epoch fields (a tick is claimed once), singleton
// every field but those.
type Work struct {
	// Label identifies the work across the deliveries a runtime may make of
	// it (an asynq task's ID, kept by its requeued copies), and is the label
	// of its lease (lockkit's Holder.Label). Optional. A job whose key is
	// held by a run with the same Label is never a duplicate of it: it waits
	// for that run to end, bounded only by ctx, and then runs; unless that
	// run succeeded after its ctx had ended, or the runtime's record says
	// that it did the work (WithDone), in which case the job does not run
	// (ReasonCompleted, ActionSkip). Two runs with one Label never hold a
	// key at once, whatever WithLimit says.
	Label string
	// EnqueuedAt is when the work was asked for, on the Redis server's clock
	// (singleton.Client stamps it); zero means unknown. Under Coalesce only a
	// run that began after it, or after Run was called if that is earlier,
	// covers the job.
	EnqueuedAt time.Time
	// Order, when positive, is the job's place in its key's order, taken
	// when the work was asked for (singleton.Client takes a per-key sequence
	// at enqueue). Under KeepNewest and Preempt a job with a lower order than
	// the key's follow-up, or than its latest run (for ten minutes after that
	// run started, and while it runs), does not run (ReasonSuperseded,
	// ActionSkip): it neither takes a newer job's place nor preempts a newer
	// run, whatever order the deliveries arrive in. Deliveries of one work
	// share its order. Zero means none: the job is placed by its arrival at
	// Redis. Must not be negative.
	Order int64
	// Epoch, when positive, claims the unit of work once: a later run with an
	// epoch not greater than the last claimed one fails with ReasonClaimed.
	Epoch int64
	// EpochTTL is how long the claim is remembered. Zero means the lease TTL.
	EpochTTL time.Duration
	// EpochTag, with Epoch, is kept with the claim: a run whose tag is not
	// the last claim's finds that one in its lease (the engine's
	// Lease.OtherEpochTag) or in the engine's EpochUsedError its
	// DuplicateError wraps. Empty means none.
	EpochTag string
	// Reserved says that the key may be reserved for the job (a reservation
	// carrying its Label, such as singleton.ParkAtEnqueue makes, or the
	// reservation a run's end makes for a parked job): its acquire takes
	// such a reservation over, whatever the policy. It needs Label.
	Reserved bool
	// Final says that the runtime does not run the job again if this run
	// fails (an asynq task with no retries left). Under Coalesce such a job
	// covers no other (the engine's Coalesce.Final): a failure of its run
	// loses no other job's work.
	Final bool
	// Limit, when positive, is the job's holder limit (an adapter's
	// WithLimitFunc, which derives it from the work itself); zero means the
	// guard's (WithLimit, WithLimitFunc). Run checks it as LimitOf does.
	Limit int
	// Extra, when not nil, are the job's extra keys with their limits (an
	// adapter's WithExtraKeys, which derives them from the work itself); nil
	// means WithExtraKeys's function's. Run checks them as ExtraKeysOf does.
	Extra map[string]int
}

// With returns job carrying w.
func With(job Job, w Work) Job {
	job.w = w
	return job
}

// WorkOf returns what job carries besides its key, name and ID.
func WorkOf(job Job) Work { return job.w }

func (j Job) what() string {
	if j.Name == "" {
		return "job"
	}
	return j.Name
}

// Guard runs work under a lease on the work's key. It is safe for concurrent
// use and holds no goroutine of its own.
type Guard struct {
	locker     *lockkit.Locker
	core       *lockcore.RedisLocker // the engine under locker
	policy     Policy
	limit      int
	limitOf    func(ctx context.Context, job Job) int // WithLimitFunc
	limitSet   bool                                   // WithLimitFunc was the last limit option
	hold       time.Duration
	throttle   *throttleSpec
	starts     *throttle.Throttle // the throttle's budgets
	ttl        time.Duration
	logger     *slog.Logger
	loggerSet  bool
	log        Observer
	observers  []Observer
	admit      Admit
	admitSet   bool
	done       Done
	doneSet    bool
	parking    *Parking
	parkingSet bool
	async      bool
	shadow     bool
	extraOf    func(ctx context.Context, job Job) map[string]int // WithExtraKeys
	extraSet   bool
}

// New returns a Guard that takes leases from locker. It returns an error
// matching ErrInvalid for a nil locker or an invalid option, naming the
// option and the value.
func New(locker *lockkit.Locker, opts ...Option) (*Guard, error) {
	if locker == nil {
		return nil, fmt.Errorf("%w: New: locker is nil", ErrInvalid)
	}
	core, err := lockcore.Of("middleware.New", locker)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	g := &Guard{locker: locker, core: core, policy: Skip(), limit: 1}
	s := &Settings{}
	for _, o := range opts {
		if o != nil {
			o.Apply(s)
		}
	}
	if s.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, s.err)
	}
	for _, fn := range s.fns {
		fn(g)
	}
	g.policy.action, g.policy.delay = ActionOf(g.policy), DelayOf(g.policy)
	if err := g.policy.validate(); err != nil {
		return nil, err
	}
	// most is the largest limit a job may have: WithLimit's, or any that
	// WithLimitFunc's function may give.
	most, limitName := g.limit, fmt.Sprintf("WithLimit(%d)", g.limit)
	if g.limitSet {
		most, limitName = lockcore.MaxLimit, "WithLimitFunc"
	}
	switch {
	case g.limitSet && g.limitOf == nil:
		return nil, fmt.Errorf("%w: WithLimitFunc(nil): the limit function must not be nil", ErrInvalid)
	case !g.limitSet && (g.limit < 1 || g.limit > lockcore.MaxLimit):
		return nil, fmt.Errorf("%w: %s: must be between 1 and %d", ErrInvalid, limitName, lockcore.MaxLimit)
	case g.throttle != nil && (g.throttle.n < 1 || g.throttle.period < time.Millisecond || g.throttle.period > lockcore.MaxTTL):
		return nil, fmt.Errorf("%w: WithThrottle(%d, %s): n must be at least 1 and period between 1ms and %s", ErrInvalid, g.throttle.n, g.throttle.period, lockcore.MaxTTL)
	case g.throttle != nil && g.throttle.then != ActionSkip && g.throttle.then != ActionRequeue:
		return nil, fmt.Errorf("%w: WithThrottle: then must be ActionSkip or ActionRequeue, not %s", ErrInvalid, g.throttle.then)
	case g.hold < 0 || g.hold > lockcore.MaxTTL:
		return nil, fmt.Errorf("%w: WithHoldAtLeast(%s): must not be negative nor longer than %s", ErrInvalid, g.hold, lockcore.MaxTTL)
	case most > 1 && g.policy.mode == ModeKeepNewest:
		return nil, fmt.Errorf("%w: %s: KeepNewest runs one job per key at a time", ErrInvalid, limitName)
	case most > 1 && g.policy.mode == ModePreempt:
		return nil, fmt.Errorf("%w: %s: Preempt runs one job per key at a time", ErrInvalid, limitName)
	case g.hold > 0 && g.policy.mode == ModePreempt:
		return nil, fmt.Errorf("%w: WithHoldAtLeast(%s): Preempt ends runs early, so it cannot keep a key held", ErrInvalid, g.hold)
	case most > 1 && g.policy.mode == ModeCoalesce:
		return nil, fmt.Errorf("%w: %s: Coalesce runs one job per key at a time", ErrInvalid, limitName)
	case g.ttl != 0 && (g.ttl < lockcore.MinTTL || g.ttl > lockcore.MaxTTL):
		return nil, fmt.Errorf("%w: WithTTL(%s): must be zero (the Locker's) or between %s and %s", ErrInvalid, g.ttl, lockcore.MinTTL, lockcore.MaxTTL)
	case slices.ContainsFunc(g.observers, func(o Observer) bool { return o == nil }):
		return nil, fmt.Errorf("%w: WithObserver #%d is nil", ErrInvalid, slices.IndexFunc(g.observers, func(o Observer) bool { return o == nil })+1)
	case g.loggerSet && g.logger == nil:
		return nil, fmt.Errorf("%w: WithLogger(nil)", ErrInvalid)
	case g.admitSet && g.admit == nil:
		return nil, fmt.Errorf("%w: WithAdmit(nil)", ErrInvalid)
	case g.doneSet && g.done == nil:
		return nil, fmt.Errorf("%w: WithDone(nil)", ErrInvalid)
	case g.parkingSet && (g.parking.ID == nil || g.parking.Resume == nil):
		return nil, fmt.Errorf("%w: WithParking: ID and Resume must not be nil", ErrInvalid)
	case g.parkingSet && (g.parking.Hold < 0 || g.parking.Hold > lockcore.MaxTTL):
		return nil, fmt.Errorf("%w: WithParking: Hold %s must not be negative nor longer than %s", ErrInvalid, g.parking.Hold, lockcore.MaxTTL)
	case g.extraSet && g.extraOf == nil:
		return nil, fmt.Errorf("%w: WithExtraKeys(nil): the keys function must not be nil", ErrInvalid)
	case g.extraSet && g.policy.mode != ModeAction:
		return nil, fmt.Errorf("%w: WithExtraKeys: Coalesce, KeepNewest and Preempt follow up on the job's own key alone", ErrInvalid)
	case g.extraSet && g.policy.fair:
		return nil, fmt.Errorf("%w: WithExtraKeys: WaitInOrder's arrival order cannot hold across several keys (use Wait)", ErrInvalid)
	}
	for i, o := range g.observers {
		if o == nil {
			return nil, fmt.Errorf("%w: WithObserver #%d is nil", ErrInvalid, i+1)
		}
	}
	if g.throttle != nil {
		client, prefix := core.Redis()
		if g.starts, err = throttle.New(client, g.throttle.n, g.throttle.period, throttle.WithPrefix(prefix)); err != nil {
			return nil, fmt.Errorf("%w: WithThrottle: %w", ErrInvalid, err)
		}
	}
	if g.logger == nil {
		g.logger = core.Logger()
	}
	g.log = logObserver(g.logger)
	return g, nil
}

// PolicyOf returns g's conflict policy with defaults filled in.
func PolicyOf(g *Guard) Policy { return g.policy }

// Emit reports an event to g's observers. Adapters use it for what happens
// outside Run, such as a requeue.
func Emit(g *Guard, ctx context.Context, e Event) { g.emit(ctx, e) }

func (g *Guard) emit(ctx context.Context, e Event) {
	g.log(ctx, e)
	for _, o := range g.observers {
		o(ctx, e)
	}
}

// Outcome is what Run did with a job: exactly one of ran, duplicate, or
// failed to take the lease.
type Outcome struct {
	// Ran reports that fn was called. Err is then what it returned,
	// annotated with the loss cause if the lease was lost and fn failed; nil
	// when fn succeeded, even if the lease was lost meanwhile (an EventLost
	// reports it).
	Ran bool
	// Duplicate is set when the work did not run because the key was held,
	// the epoch claimed, or the work completed already. Duplicate.Action is
	// what the policy says to do with it. Err is then Duplicate.
	Duplicate *DuplicateError
	// Err is fn's error when Ran, the *DuplicateError when Duplicate is set,
	// and otherwise the error that kept fn from running: an empty key, Redis
	// unreachable, or an acquire whose outcome is unknown. Such an error is
	// never a *DuplicateError.
	Err error
}

// Run acquires job.Key under the guard's policy, runs fn with a context that
// is cancelled (cause matching lockkit.ErrLost) if the lease is lost, or
// (cause matching lockkit.ErrCancelled) if an operator asked the run to stop
// (lockkit's Locker.CancelRun: the key stays held until fn returns; an
// error fn returns then is annotated with that cause), and
// releases the lease when fn returns or panics (the panic is re-raised). The
// lease is renewed until fn returns, even after ctx is cancelled. The
// returned Outcome says which of these happened. A nil fn is an error
// matching ErrInvalid, and nothing is acquired.
//
// When fn succeeds after ctx ended (the runtime gave up on the run and may
// deliver it again) and job.w.Label is set, the success is remembered for
// 24 hours (the engine's CompletedRetention): a later delivery with the same Origin returns a
// *DuplicateError with ReasonCompleted instead of running.
func (g *Guard) Run(ctx context.Context, job Job, fn func(context.Context) error) Outcome {
	if job.Key == "" {
		return Outcome{Err: g.emptyKey(ctx, job)}
	}
	if fn == nil {
		err := fmt.Errorf("%w: middleware: %s: Run: fn is nil", ErrInvalid, job.what())
		g.emit(ctx, Event{Kind: EventError, Job: job, Err: err})
		return Outcome{Err: err}
	}
	if job.w.Limit != 0 || g.limitOf != nil {
		n, err := LimitOf(g, ctx, job)
		if err != nil {
			err = fmt.Errorf("%w: middleware: %w", ErrInvalid, err)
			g.emit(ctx, Event{Kind: EventError, Job: job, Err: err})
			return Outcome{Err: err}
		}
		job.w.Limit = n
	}
	var keys []extraKey
	if job.w.Extra != nil || g.extraOf != nil {
		var err error
		if keys, err = g.extraKeysOf(ctx, job); err != nil {
			err = fmt.Errorf("%w: middleware: %w", ErrInvalid, err)
			g.emit(ctx, Event{Kind: EventError, Job: job, Err: err})
			return Outcome{Err: err}
		}
	}
	if g.shadow {
		return g.shadowRun(ctx, job, keys, fn)
	}
	a := &attempt{}
	if g.throttle != nil {
		if err := g.reserveStart(ctx, job, a); err != nil {
			var dup *DuplicateError
			errors.As(err, &dup)
			return Outcome{Duplicate: dup, Err: err}
		}
	}
	var (
		lease  *lockcore.Lease
		extra  []*lockcore.Lease
		waited time.Duration
		err    error
	)
	if len(keys) > 0 && g.policy.wait > 0 {
		lease, extra, waited, err = g.takeInOrder(ctx, job, a, keys)
	} else {
		lease, extra, waited, err = g.acquireAll(ctx, job, a, keys)
	}
	if err == nil {
		g.unparkUnderAnotherLimit(ctx, job)
	}
	if err == nil && a.start != "" {
		if err = g.beginStart(ctx, job, lease, a, waited); err != nil {
			g.releaseExtra(ctx, extra)
		}
	}
	g.unreserve(ctx, job, a) // only a run spends a start
	if err != nil {
		var dup *DuplicateError
		errors.As(err, &dup)
		return Outcome{Duplicate: dup, Err: err}
	}
	return Outcome{Ran: true, Err: g.run(ctx, job, lease, extra, waited, fn)}
}

// errPanicked ends a lease whose work panicked: never a success.
var errPanicked = errors.New("middleware: the work panicked")

// run runs fn under lease and the extra keys' leases (the engine's
// Lease.Run derives fn's context and ends the lease; the extra leases end
// first) and reports it.
func (g *Guard) run(ctx context.Context, job Job, lease *lockcore.Lease, extra []*lockcore.Lease, waited time.Duration, fn func(context.Context) error) error {
	g.emitLease(ctx, EventAcquired, job, lease, waited, 0, nil)
	start := time.Now()
	var (
		p                    any
		err, lost, cancelled error
		started              bool
	)
	end := lease.Run(ctx, func(wctx context.Context) (ferr error) {
		if err := extraLost(extra); err != nil {
			return err // an extra lease ran out before the job could start
		}
		started = true
		wctx, stopExtra := withExtra(wctx, extra)
		reported := make(chan struct{})
		stopLost := context.AfterFunc(wctx, func() {
			defer close(reported)
			g.reportLost(ctx, wctx, job, lease)
		})
		defer func() {
			if !stopLost() {
				<-reported // EventLost comes before EventReleased
			}
			stopExtra()
			lost = lease.Err()
			if lost == nil {
				lost = extraLost(extra)
			}
			if rerr := g.releaseExtra(ctx, extra); rerr != nil && lost == nil {
				g.emitLease(ctx, EventError, job, lease, 0, 0, fmt.Errorf("middleware: %s: releasing its extra keys: %w", job.what(), rerr))
			}
			if c := context.Cause(wctx); lost == nil && errors.Is(c, lockcore.ErrCancelled) {
				cancelled = c // an operator asked the run to stop (lockkit's Locker.CancelRun)
			}
			if p = recover(); p != nil {
				ferr = errPanicked
			}
		}()
		err = fn(wctx)
		return err
	})
	if !started {
		// The lease ran out before the job could start (its process was
		// paused after the acquire): Run did not start it. The job did not
		// run: its error, so that the runtime runs it again. Its extra keys
		// are given back (fn, which would have, was not called).
		_ = g.releaseExtra(ctx, extra)
		err, lost = end, end
	}
	var rerr error
	if p == nil && err == nil {
		rerr = end
	}
	if err != nil && cancelled != nil && !errors.Is(err, lockcore.ErrCancelled) {
		err = fmt.Errorf("%w (%w)", err, cancelled)
	}
	return g.finish(ctx, job, lease, start, p, err, lost, rerr)
}

// LimitOf returns job's holder limit: its Work.Limit, else what
// WithLimitFunc's function gives it (called with ctx), else WithLimit's. A
// limit outside 1 to lockcore.MaxLimit is an error naming job's key and
// the value. An adapter that refuses such a job its own way calls it before
// Run and gives Run the limit in Work.Limit.
func LimitOf(g *Guard, ctx context.Context, job Job) (int, error) {
	n := job.w.Limit
	switch {
	case n != 0:
	case g.limitOf != nil:
		n = g.limitOf(ctx, job)
	default:
		return g.limit, nil
	}
	if n < 1 || n > lockcore.MaxLimit {
		return 0, fmt.Errorf("%s: key %q: WithLimitFunc gave %d: a limit must be between 1 and %d", job.what(), job.Key, n, lockcore.MaxLimit)
	}
	return n, nil
}

// limitFor is job's holder limit: its own (Work.Limit) or the guard's.
func (g *Guard) limitFor(job Job) int {
	if job.w.Limit > 0 {
		return job.w.Limit
	}
	return g.limit
}

func (g *Guard) emptyKey(ctx context.Context, job Job) error {
	err := fmt.Errorf("middleware: %s: empty key", job.what())
	g.emit(ctx, Event{Kind: EventError, Job: job, Err: err})
	return err
}

func (g *Guard) emitLease(ctx context.Context, kind EventKind, job Job, lease *lockcore.Lease, wait, took time.Duration, err error) {
	g.emit(ctx, Event{Kind: kind, Job: job, Token: lease.Token(), Wait: wait, Duration: took, Err: err})
}

func (g *Guard) reportLost(ctx, wctx context.Context, job Job, lease *lockcore.Lease) {
	switch cause := context.Cause(wctx); {
	case errors.Is(cause, lockcore.ErrPreempted):
		g.emitLease(ctx, EventPreempted, job, lease, 0, 0, cause)
	case errors.Is(cause, lockcore.ErrLost):
		g.emitLease(ctx, EventLost, job, lease, 0, 0, cause)
	}
}

// finish reports a run whose work returned err or panicked with p (re-raised
// here), with the lease lost (lost) or not and ended with rerr, and returns
// the work's error, annotated with the loss cause if the lease was lost.
func (g *Guard) finish(ctx context.Context, job Job, lease *lockcore.Lease, start time.Time, p any, err, lost, rerr error) error {
	if p != nil {
		perr := fmt.Errorf("middleware: %s panicked: %v", job.what(), p)
		g.emitLease(ctx, EventError, job, lease, 0, time.Since(start), perr)
		g.emitLease(ctx, EventReleased, job, lease, 0, time.Since(start), perr) // the run ended
		panic(p)
	}
	if err != nil && lost != nil && !errors.Is(err, lockcore.ErrLost) {
		err = fmt.Errorf("%w (%w)", err, lost)
	}
	if rerr != nil && lost == nil {
		g.emitLease(ctx, EventError, job, lease, 0, 0, rerr)
	}
	g.emitLease(ctx, EventReleased, job, lease, 0, time.Since(start), err)
	return err
}

// attempt is one Run's state while it takes its key.
type attempt struct {
	// own is set when the lease was taken after waiting for an earlier
	// delivery of the same work.
	own bool
	// start names the run's throttle start ("" without WithThrottle);
	// reserved says that it is reserved and not taken yet; turn is the
	// turn it reserved in ("" for none).
	start    string
	reserved bool
	turn     string
	// until, when set, bounds the job's waits for its keys in all
	// (WithExtraKeys under Wait): the policy's bound from its first attempt.
	until time.Time
}

// acquire takes job's key under the policy. A job about to wait for the
// key gives back its reserved throttle start first.
func (g *Guard) acquire(ctx context.Context, job Job, a *attempt) (*lockcore.Lease, time.Duration, error) {
	if g.admit != nil {
		if err := g.admitJob(ctx, job); err != nil {
			return nil, 0, err
		}
	}
	opt := g.leaseOptions(ctx, job, true)
	opt.Fair = g.policy.fair
	switch g.policy.mode {
	case ModeCoalesce:
		opt.FollowUp = lockcore.Coalesce{Since: job.w.EnqueuedAt, Final: job.w.Final}
	case ModeKeepNewest:
		opt.FollowUp = lockcore.KeepNewest{Order: job.w.Order}
	case ModePreempt:
		opt.FollowUp = lockcore.Preempt{Order: job.w.Order, Grace: g.policy.grace}
	}
	if opt.FollowUp != nil {
		if parked(opt) {
			return g.parkFollowUp(ctx, job, opt)
		}
		return g.followUp(ctx, job, opt)
	}
	lease, err := g.core.TryAcquire(ctx, job.Key, opt)
	if err == nil {
		return lease, 0, nil
	}
	if !errors.Is(err, lockcore.ErrNotAcquired) {
		return nil, 0, g.notAcquired(ctx, job, err, 0)
	}
	if ownRun(job, err) {
		a.own = true
		g.unreserve(ctx, job, a)
		return g.awaitOwnRun(ctx, job, opt)
	}
	if g.policy.wait > 0 {
		lease, waited, err := g.acquireWaiting(ctx, job, opt, a)
		return lease, waited, markParked(err, opt)
	}
	return nil, 0, markParked(g.notAcquired(ctx, job, err, 0), opt)
}

// unparkUnderAnotherLimit gives up, once job took its key, the place a
// server that gave job a limit of 1 may have kept for it in the key's parked
// queue (WithLimitFunc, a policy that parks): only jobs of limit 1 park, so
// the acquire of a job of another limit carries no entry to take out, and
// the place would stay for the parked queue's retention. One write, made
// only for such jobs.
func (g *Guard) unparkUnderAnotherLimit(ctx context.Context, job Job) {
	if g.limitOf == nil || g.parking == nil || !g.parks() || job.w.Label == "" || job.w.Limit <= 1 {
		return
	}
	one := job
	one.w.Limit = 1
	g.unpark(ctx, job, g.leaseOptions(ctx, one, true))
}

// leaseOptions are the options of job's acquire: a job that may be
// reserved for (Job.Reserved, or any job of a policy that parks) takes its
// reservation over, and under WithParking (and a limit of 1 for the job,
// or any under WithLimitFunc, whose jobs of limit 1 park) the run's end
// resumes the key's oldest parked job; with park, a job of a policy that
// parks, whose limit is 1, is parked when the key is held. Under
// WithLimitFunc a job of any limit takes over a reservation made for it:
// a server that gave it a limit of 1 may have parked it.
func (g *Guard) leaseOptions(ctx context.Context, job Job, park bool) *lockcore.AcquireOptions {
	limit := g.limitFor(job)
	opt := &lockcore.AcquireOptions{TTL: g.ttl, Limit: limit, Epoch: job.w.Epoch, EpochTTL: job.w.EpochTTL, EpochTag: job.w.EpochTag, Label: job.w.Label, HoldAtLeast: g.hold,
		AsyncRelease: g.async, TakeReservation: job.w.Reserved && job.w.Label != ""}
	if p := g.parking; p != nil && (limit <= 1 || g.limitOf != nil) {
		// Every run resumes the key's oldest parked job when it ends.
		opt.Park = &lockcore.Parking{OnParked: p.Resume} // the Locker calls the adapter: the guard is not on that path
		if g.parks() && job.w.Label != "" {
			opt.TakeReservation = true
			if park && limit <= 1 {
				opt.Park.ID, opt.Park.Hold = p.ID(ctx, job), p.Hold
			}
		}
	}
	return opt
}

// acquireWaiting waits up to the policy's bound.
func (g *Guard) acquireWaiting(ctx context.Context, job Job, opt *lockcore.AcquireOptions, a *attempt) (*lockcore.Lease, time.Duration, error) {
	start := time.Now()
	until := start.Add(g.policy.wait)
	if !a.until.IsZero() {
		until = a.until
	}
	wctx, cancel := context.WithDeadline(ctx, until)
	lease, err := g.core.Acquire(wctx, job.Key, opt)
	cancel()
	waited := time.Since(start)
	switch {
	case err == nil:
		g.emit(ctx, Event{Kind: EventWaited, Job: job, Wait: waited})
		return lease, waited, nil
	case ctx.Err() != nil:
		// The caller gave up, not the policy: report that, not a duplicate.
		err = fmt.Errorf("middleware: %s: waiting for %q: %w", job.what(), job.Key, err)
		g.emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
		return nil, waited, err
	case ownRun(job, err):
		a.own = true
		return g.awaitOwnRun(ctx, job, opt)
	}
	return nil, waited, g.notAcquired(ctx, job, err, waited)
}

// notAcquired turns a failed acquire into a *DuplicateError (the key is held
// or the epoch claimed) or a wrapped lockkit error, and reports it.
func (g *Guard) notAcquired(ctx context.Context, job Job, err error, waited time.Duration) error {
	switch {
	case errors.Is(err, lockcore.ErrEpochUsed):
		g.emit(ctx, Event{Kind: EventClaimed, Job: job, Action: ActionSkip, Wait: waited, Err: err})
		return &DuplicateError{Job: job, Reason: ReasonClaimed, Action: ActionSkip, Waited: waited, Cause: err}
	case errors.Is(err, lockcore.ErrCompleted):
		g.emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: ActionSkip, Wait: waited, Err: err})
		return &DuplicateError{Job: job, Reason: ReasonCompleted, Action: ActionSkip, Waited: waited, Cause: err}
	case errors.Is(err, lockcore.ErrSuperseded):
		g.emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: ActionSkip, Wait: waited, Err: err})
		return &DuplicateError{Job: job, Reason: ReasonSuperseded, Action: ActionSkip, Waited: waited, Cause: err}
	case errors.Is(err, lockcore.ErrCovered):
		ev := Event{Kind: EventDuplicate, Job: job, Action: ActionSkip, Wait: waited, Err: err}
		var ce *lockcore.CoveredError
		if errors.As(err, &ce) {
			ev.Holder = ce.Owner
		}
		g.emit(ctx, ev)
		return &DuplicateError{Job: job, Reason: ReasonCovered, Action: ActionSkip, Waited: waited, Cause: err}
	case errors.Is(err, lockcore.ErrNotAcquired):
		dup := &DuplicateError{Job: job, Reason: ReasonHeld, Action: g.policy.action, Waited: waited, Cause: err}
		var ce *lockcore.ConflictError
		if errors.As(err, &ce) {
			dup.Cause = ce
		}
		ev := Event{Kind: EventDuplicate, Job: job, Action: dup.Action, Wait: waited, Err: dup.Cause}
		if ce != nil {
			ev.Holder = ce.Owner
		}
		g.emit(ctx, ev)
		return dup
	default:
		err = fmt.Errorf("middleware: %s: acquire %q: %w", job.what(), job.Key, err)
		g.emit(ctx, Event{Kind: EventError, Job: job, Err: err})
		return err
	}
}
