// Package middleware is the runtime-agnostic guard that the asynq adapter
// (singleton) and the cron adapter (cronguard) share: key → lease → run →
// release, the conflict policies and the events. It knows neither asynq nor
// cron.
//
//	g, err := middleware.New(locker, middleware.WithPolicy(middleware.Wait(10*time.Second, middleware.Skip())))
//	if err != nil { ... }
//	out := g.Run(ctx, middleware.Job{Key: "tenant:42", Name: "report"}, func(ctx context.Context) error {
//		return work(ctx) // ctx is cancelled (cause lockkit.ErrLost) if the lease is lost
//	})
//	switch {
//	case out.Ran: // out.Err is work's error
//	case out.Duplicate != nil: // another run holds the key; out.Duplicate.Action says what to do
//	default: // out.Err kept the work from running (Redis unreachable, ...)
//	}
//
// The lease is renewed until fn returns, even after ctx is cancelled, and is
// released when fn returns or panics.
//
// # How it relates to the other packages
//
// A Guard runs jobs on lockkit leases: lockkit.Event reports what happens to
// a lease (acquired, renewed, lost) to the Locker's observer, while Event
// here reports what happens to a job (ran, duplicate, waited, lost) to the
// Guard's observers; the two share kind names where a job's step is a
// lease's (EventAcquired, EventReleased, EventLost). cronguard.Guard is the
// cron adapter built on a Guard of this package. ErrInvalid here, in
// singleton and in cronguard also matches lockkit.ErrInvalid. The TTL and
// the logger are the Locker's unless WithTTL or WithLogger overrides them.
package middleware

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobguard/jobguard/internal/invalid"
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
)

// Action is what happens to a job whose key is held.
type Action int

// Actions of a Policy.
const (
	// ActionSkip drops the duplicate: it completes without running.
	ActionSkip Action = iota + 1
	// ActionRequeue runs the duplicate again later (after the policy's delay
	// plus up to 50% jitter). Adapters that cannot requeue reject it.
	ActionRequeue
	// ActionFail returns the *DuplicateError so the runtime's retry applies.
	ActionFail
)

var actionNames = [...]string{"", "skip", "requeue", "fail"}

// String returns "skip", "requeue" or "fail".
func (a Action) String() string {
	if a > 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Policy says what happens when a job's key is held by another run.
type Policy struct {
	// OnConflict is the action for a duplicate (after waiting, if Wait > 0).
	// The zero value means ActionSkip.
	OnConflict Action
	// RequeueDelay is the base delay of ActionRequeue; up to 50% jitter is
	// added. Zero means DefaultRequeueDelay.
	RequeueDelay time.Duration
	// Wait, when positive, makes a duplicate wait up to Wait for the key
	// (woken when it is released) before OnConflict applies.
	Wait time.Duration
	// Fair makes waiting duplicates acquire in arrival order.
	Fair bool
	// Coalesce makes a job give way to a run of its key that began after
	// the job did (after Run was called: the delivery, which is after the
	// enqueue): it completes without running (ReasonCovered, ActionSkip)
	// when such a run succeeded, is running, or is pending as the key's
	// follow-up. Any other job waits for the key, bounded by its ctx only,
	// and runs as the key's one follow-up. OnConflict, Wait and Fair do not
	// apply; a job whose wait ends with its ctx fails with an error that is
	// not a duplicate, so the runtime retries it. Under WithParking a job
	// with an Origin parks as that follow-up instead of waiting.
	Coalesce bool
	// KeepNewest makes a job whose key is held wait, bounded by its ctx only,
	// as the key's one follow-up, the newest: a later job takes its place,
	// and the job it replaces completes without running (ReasonSuperseded,
	// ActionSkip). "Later" is by Job.Order when both jobs have one, else by
	// arrival at Redis. OnConflict, Wait, Fair and Coalesce do not apply. Under
	// WithParking a job with an Origin parks as that follow-up instead of
	// waiting.
	KeepNewest bool
	// Preempt makes a job cancel the run that holds its key: that run's ctx
	// is cancelled with a cause matching lockkit.ErrPreempted (and
	// lockkit.ErrLost), its lease is no longer renewed and its fencing token
	// is superseded by this job's; the run is reported as EventPreempted,
	// not EventLost. The job waits, bounded by its ctx only, as
	// the key's one follow-up, the newest (a later job takes its place as
	// KeepNewest does), and runs once the preempted run has returned, or
	// after Grace if that comes first. OnConflict, Wait, Fair, Coalesce and
	// KeepNewest do not apply.
	Preempt bool
	// Grace, with Preempt, bounds how long a preempted run may keep the key
	// after it was told to stop. Zero means until its lease runs out, which
	// is at most the lease TTL since it is no longer renewed.
	Grace time.Duration
}

// Preempt returns the policy under which a job cancels the run holding its
// key and runs after it (see Policy.Preempt); grace bounds how long the
// cancelled run may keep the key, zero meaning its remaining TTL.
func Preempt(grace time.Duration) Policy {
	return Policy{OnConflict: ActionSkip, Preempt: true, Grace: grace}
}

// KeepNewest returns the policy that keeps one follow-up per key, the newest
// (see Policy.KeepNewest).
func KeepNewest() Policy { return Policy{OnConflict: ActionSkip, KeepNewest: true} }

// String writes the policy the way it is built: "Skip()", "Requeue(1s)",
// "Wait(10s, Fail())", "Coalesce()"; a Fair wait reads "Wait(10s, fair, Skip())".
func (p Policy) String() string {
	if p.Coalesce {
		return "Coalesce()"
	}
	if p.KeepNewest {
		return "KeepNewest()"
	}
	if p.Preempt {
		return fmt.Sprintf("Preempt(%s)", p.Grace)
	}
	var s string
	switch p.OnConflict {
	case 0, ActionSkip:
		s = "Skip()"
	case ActionRequeue:
		s = fmt.Sprintf("Requeue(%s)", p.RequeueDelay)
	case ActionFail:
		s = "Fail()"
	default:
		s = fmt.Sprintf("Policy{OnConflict: %s}", p.OnConflict)
	}
	if p.Wait > 0 || p.Fair {
		fair := ""
		if p.Fair {
			fair = "fair, "
		}
		s = fmt.Sprintf("Wait(%s, %s%s)", p.Wait, fair, s)
	}
	return s
}

// Coalesce returns the policy that folds duplicates into a run that began
// after them (see Policy.Coalesce).
func Coalesce() Policy { return Policy{OnConflict: ActionSkip, Coalesce: true} }

// Skip returns the policy that drops duplicates.
func Skip() Policy { return Policy{OnConflict: ActionSkip} }

// Fail returns the policy that fails duplicates with a *DuplicateError.
func Fail() Policy { return Policy{OnConflict: ActionFail} }

// Requeue returns the policy that runs duplicates again after delay (plus up
// to 50% jitter). Zero means DefaultRequeueDelay.
func Requeue(delay time.Duration) Policy {
	return Policy{OnConflict: ActionRequeue, RequeueDelay: delay}
}

// Wait returns then, made to first wait up to max for the key.
func Wait(max time.Duration, then Policy) Policy {
	then.Wait = max
	return then
}

func (p Policy) validate() error {
	switch {
	case p.OnConflict < 0 || int(p.OnConflict) >= len(actionNames):
		return fmt.Errorf("%w: WithPolicy: unknown OnConflict action %d", ErrInvalid, int(p.OnConflict))
	case p.RequeueDelay < 0:
		return fmt.Errorf("%w: WithPolicy: RequeueDelay %s is negative", ErrInvalid, p.RequeueDelay)
	case p.Wait < 0:
		return fmt.Errorf("%w: WithPolicy: Wait %s is negative", ErrInvalid, p.Wait)
	case p.Fair && p.Wait == 0:
		return fmt.Errorf("%w: WithPolicy: Fair needs a positive Wait", ErrInvalid)
	case p.Grace < 0 || p.Grace > lockkit.MaxTTL:
		return fmt.Errorf("%w: WithPolicy: Grace %s must not be negative nor longer than %s", ErrInvalid, p.Grace, lockkit.MaxTTL)
	case p.Grace > 0 && !p.Preempt:
		return fmt.Errorf("%w: WithPolicy: Grace applies to Preempt only", ErrInvalid)
	case p.Preempt && (p.KeepNewest || p.Coalesce || p.Wait > 0 || p.OnConflict != ActionSkip):
		return fmt.Errorf("%w: WithPolicy: Preempt waits for its turn itself; it takes no Wait, Fair, Coalesce, KeepNewest or OnConflict", ErrInvalid)
	case p.KeepNewest && (p.Coalesce || p.Wait > 0 || p.OnConflict != ActionSkip):
		return fmt.Errorf("%w: WithPolicy: KeepNewest waits for its turn itself; it takes no Wait, Fair, Coalesce or OnConflict", ErrInvalid)
	case p.Coalesce && (p.Wait > 0 || p.OnConflict != ActionSkip):
		return fmt.Errorf("%w: WithPolicy: Coalesce waits for its follow-up run itself; it takes no Wait, Fair or OnConflict", ErrInvalid)
	}
	return nil
}

// Reason tells why a job did not run.
type Reason int

// Reasons of a DuplicateError.
const (
	// ReasonHeld means another run holds the key (or all its slots).
	ReasonHeld Reason = iota + 1
	// ReasonClaimed means the job's epoch was already claimed: the same unit
	// of work (such as a cron tick) ran elsewhere.
	ReasonClaimed
	// ReasonSuperseded means a newer job of the key took this one's place
	// as its follow-up (Policy.KeepNewest, Policy.Preempt), or that a newer
	// request of the key is pending (Job.Gen).
	ReasonSuperseded
	// ReasonThrottled means the key's starts per period (WithThrottle) were
	// spent; DuplicateError.RetryAfter says when the next one opens.
	ReasonThrottled
	// ReasonCovered means a run of the key that began after the job did
	// succeeded, is running, or is pending as the key's follow-up
	// (Policy.Coalesce): it does the job's work.
	ReasonCovered
	// ReasonCompleted means an earlier delivery of the same work (same
	// Job.Origin) completed successfully after the runtime had given up on
	// it: running it again would do the work twice.
	ReasonCompleted
)

// DuplicateError is returned by Guard.Run when the work did not run. It
// matches ErrDuplicate and, for ReasonHeld, lockkit.ErrNotAcquired; for
// ReasonCompleted, lockkit.ErrCompleted; for ReasonCovered, lockkit.ErrCovered.
type DuplicateError struct {
	Job    Job
	Reason Reason
	// Action is what the caller should do: always ActionSkip for ReasonClaimed.
	Action Action
	// Waited is how long the job waited for the key.
	Waited time.Duration
	// RetryAfter, for ReasonThrottled, is how long until the key's next
	// start would be allowed.
	RetryAfter time.Duration
	// Parked, for ActionRequeue under WithParking, says that the job is
	// queued for its key: it is started again when the key is free (the
	// runtime's requeue after the policy's delay is the backstop).
	Parked bool
	// Cause is the lockkit error: a *lockkit.ConflictError (naming the holder)
	// or one matching lockkit.ErrEpochUsed.
	Cause error
}

// Error implements error.
func (e *DuplicateError) Error() string {
	switch e.Reason {
	case ReasonClaimed:
		return fmt.Sprintf("middleware: duplicate %s (key %q): already claimed: %v", e.Job.label(), e.Job.Key, e.Cause)
	case ReasonCompleted:
		return fmt.Sprintf("middleware: duplicate %s (key %q): delivery of %q that completed already: %v", e.Job.label(), e.Job.Key, e.Job.Origin, e.Cause)
	case ReasonCovered:
		return fmt.Sprintf("middleware: duplicate %s (key %q): covered: %v", e.Job.label(), e.Job.Key, e.Cause)
	case ReasonSuperseded:
		if e.Cause != nil && !errors.Is(e.Cause, lockkit.ErrSuperseded) {
			return fmt.Sprintf("middleware: duplicate %s (key %q): superseded: %v", e.Job.label(), e.Job.Key, e.Cause)
		}
		return fmt.Sprintf("middleware: duplicate %s (key %q): a newer follow-up took its place", e.Job.label(), e.Job.Key)
	case ReasonThrottled:
		return fmt.Sprintf("middleware: %s (key %q) throttled, %s: next start in %s", e.Job.label(), e.Job.Key, e.Action, e.RetryAfter)
	}
	return fmt.Sprintf("middleware: duplicate %s (key %q), %s: %v", e.Job.label(), e.Job.Key, e.Action, e.Cause)
}

// Is reports whether target is ErrDuplicate.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// Unwrap returns the lockkit error.
func (e *DuplicateError) Unwrap() error { return e.Cause }

// Job is one run of work to guard.
type Job struct {
	// Key is the lock key; required.
	Key string
	// Name names the work in events and errors (a task type, a cron entry).
	Name string
	// ID identifies this run in events (a task id, a tick). Optional.
	ID string
	// Origin identifies the work across the deliveries a runtime may make of
	// it (an asynq task's ID, kept by its requeued copies). Optional. A job
	// whose key is held by a run with the same Origin is never a duplicate of
	// it: it waits for that run to end, bounded only by ctx, and then runs;
	// unless that run succeeded after its ctx had ended, in which case the job
	// does not run (ReasonCompleted, ActionSkip). Two runs with one Origin
	// never hold a key at once, whatever WithLimit says.
	Origin string
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
	// Gen, when positive, is the job's request generation from
	// lockkit.Locker.Debounce on Key (latest wins): the job runs only if it
	// is its key's newest request, which ends the key's burst (Locker.Claim).
	// Otherwise it does not run (ReasonSuperseded, ActionSkip), unless the
	// guard's WithPending check says the newest request's work does not
	// exist (its enqueue failed): then it runs in its place.
	Gen int64
	// Epoch, when positive, claims the unit of work once: a later run with an
	// epoch not greater than the last claimed one fails with ReasonClaimed.
	Epoch int64
	// EpochTTL is how long the claim is remembered. Zero means the lease TTL.
	EpochTTL time.Duration
	// Reserved says that the key may be reserved for the job (a Detached
	// lease carrying its Origin, such as singleton.ParkAtEnqueue makes, or
	// the reservation a run's end makes for a parked job): its acquire
	// takes such a reservation over (lockkit.AcquireOptions.Adopt), whatever
	// the policy. It needs Origin. Defaults to false.
	Reserved bool
	// Final says that the runtime does not run the job again if this run
	// fails (an asynq task with no retries left). Under Coalesce such a job
	// covers no other (lockkit.AcquireOptions.Final): a failure of its run
	// loses no other job's work. Defaults to false.
	Final bool
}

func (j Job) label() string {
	if j.Name == "" {
		return "job"
	}
	return j.Name
}

// Option configures a Guard.
type Option func(*Guard)

// WithPolicy sets the conflict policy. Defaults to Skip().
func WithPolicy(p Policy) Option { return func(g *Guard) { g.policy = p } }

// WithLimit sets how many runs of one key may hold it at once (per-key
// concurrency across every process). Must be at least 1. Defaults to 1.
func WithLimit(n int) Option { return func(g *Guard) { g.limit = n } }

// WithHoldAtLeast keeps a job's key held for at least d after its run began,
// even when the run ends sooner (lockkit.AcquireOptions.HoldAtLeast): with
// Skip, a key runs at most once per d. A run that fails holds nothing back:
// its retry runs as soon as it comes. Zero means none; at most
// lockkit.MaxTTL. Defaults to zero.
func WithHoldAtLeast(d time.Duration) Option { return func(g *Guard) { g.hold = d } }

// WithThrottle allows at most n runs of a key to begin in any window of one
// period across every process (lockkit's Locker.Throttle), each start dated
// when its run begins. A job over the budget does not run: Run returns a
// *DuplicateError with ReasonThrottled, then as its Action (ActionSkip, or
// ActionRequeue to run it again when the next start opens, RetryAfter), and
// reports EventDuplicate, whatever holds its key. Before it takes its key a
// job whose policy does not wait for it (Skip, Requeue, Fail) reserves a
// start (lockkit's Locker.ReserveStart), so that jobs arriving together past
// the budget meet the throttle rather than the policy; the reservation
// counts against the budget until the run begins, when it is taken and
// dated. Only a run spends a start: a job that does not run after all (a
// duplicate, a requeued or parked job, one that gives way, or an acquire
// that failed) gives back its reservation. A job that may wait for its key
// (Wait, Coalesce, KeepNewest, Preempt, or a redelivery waiting for its own
// earlier run) holds no start while it waits: it is throttled at once only
// if n runs began within the period, and otherwise takes its start when it
// gets the key; if the budget is spent then, it gives the key back without
// running and is throttled (with ActionRequeue under Coalesce, KeepNewest
// and Preempt, whatever then is: other jobs folded into it or gave way to
// it). A delivery that waited for its own earlier run
// is that run's retry and spends no start. n must be at least 1, period between a millisecond and
// lockkit.MaxTTL. Defaults to no throttle.
func WithThrottle(n int, period time.Duration, then Action) Option {
	return func(g *Guard) { g.throttle = &throttle{n: n, period: period, then: then} }
}

type throttle struct {
	n      int
	period time.Duration
	then   Action
}

// Pending tells whether the work of newest, a newer request of job's key
// (Job.Gen), exists and will run: a queued task, for example.
type Pending func(ctx context.Context, job Job, newest lockkit.Request) (bool, error)

// WithPending sets how the guard checks that the newest request of a job's
// key exists before the job gives way to it (Job.Gen). An error fails the
// job (not a duplicate), so the runtime retries it. Must not be nil.
// Defaults to trusting that it exists.
func WithPending(p Pending) Option { return func(g *Guard) { g.pending, g.pendingSet = p, true } }

// WithAsyncRelease makes Run return as soon as the work has: the lease ends
// then, and its release is sent by the Locker's background releaser
// (lockkit.AcquireOptions.AsyncRelease), pipelined with other releases, so a
// job pays one Redis round trip (the acquire) on its own path instead of
// two. Another process may find the key held for up to about two round
// trips after the work returned, and apply its policy to it (Skip skips); a
// later job of this process waits for the release. A crash before the
// release is sent leaves the key held until its TTL. Defaults to off.
func WithAsyncRelease() Option { return func(g *Guard) { g.async = true } }

// Parking is how an adapter parks duplicates under ActionRequeue (see
// WithParking).
type Parking struct {
	// ID names a job to start again later (for asynq: its queue and task
	// ID); ctx is the job's. Must not be nil.
	ID func(ctx context.Context, job Job) string
	// Resume starts the parked job id now, for which the key was just
	// reserved. It runs on a goroutine of its own (lockkit's OnParked),
	// which the Locker's Close waits for: it should return once the job is
	// started, or soon after the Locker closes. If the job cannot be
	// started it should call Guard.PassOn, so that the next parked job gets
	// the key. It is also called, on the newer job's goroutine, with a
	// KeepNewest follow-up that a newer job replaced while it was parked:
	// nothing is reserved for it, and started, it completes without running
	// (ReasonSuperseded). Must not be nil.
	Resume func(key, id string)
	// Hold is how long the key stays reserved for a parked job to start
	// and take it over. Zero means lockkit.DefaultParkHold.
	Hold time.Duration
}

// WithParking makes ActionRequeue park its duplicates, and Coalesce and
// KeepNewest their follow-ups instead of waiting for the key: a job with an
// Origin whose key is held is queued for the key (lockkit.AcquireOptions.Park)
// and reported with ActionRequeue and DuplicateError.Parked (a Coalesce job
// that a run covers, or that the key's parked follow-up will cover, still
// completes without running, as does a KeepNewest follow-up that a newer
// one replaced once it is started again); when a run of the key ends, the key
// is reserved for the oldest parked job and p.Resume starts it, so the job
// starts as soon as its key is free instead of after the policy's delay,
// and jobs that keep arriving meanwhile queue behind it instead of taking
// the key from it. The job's own requeue after the policy's delay stays:
// it is the backstop when the process that ran the key dies before it
// resumes anyone. Jobs are parked only under WithLimit(1) (the default).
func WithParking(p Parking) Option { return func(g *Guard) { g.parking, g.parkingSet = &p, true } }

// WithTTL overrides, for this guard's leases, the TTL the Locker gives them
// (lockkit.WithTTL, lockkit.DefaultTTL unless set); the lease is renewed every
// TTL/3 while the work runs. Zero means the Locker's. Must be zero or between
// lockkit.MinTTL and lockkit.MaxTTL. Defaults to zero.
func WithTTL(ttl time.Duration) Option { return func(g *Guard) { g.ttl = ttl } }

// WithLogger overrides, for this guard, the logger the Locker logs through
// (lockkit.WithLogger): lost leases, errors and jobs that failed at Warn,
// everything else at Debug. Must not be nil. Defaults to the Locker's.
func WithLogger(l *slog.Logger) Option {
	return func(g *Guard) { g.logger, g.loggerSet = l, true }
}

// WithObserver adds an observer of the guard's events, called synchronously
// after the event is logged. It may be given more than once; observers are
// called in order. Must not be nil. Defaults to none.
func WithObserver(o Observer) Option {
	return func(g *Guard) { g.observers = append(g.observers, o) }
}

// WithShadow runs every job: the guard decides as the policy would, and a
// job that the policy would not run now (its key is held by another run, its
// epoch claimed, or its Origin completed) runs anyway, without a lease, and
// is reported as an EventShadowed whose Action is what the policy would have
// done. A job whose key is free runs under its lease as usual, so that the
// jobs after it see the key held. It is for rolling the guard out: watch what
// it would drop on real traffic, then remove the option. The decision is the
// key's (and the epoch's): a shadowed job does not wait, park, fold into a
// follow-up or spend a throttle start, so Wait, Coalesce, KeepNewest,
// Preempt and WithThrottle are reported as their first decision only, and
// WithThrottle is not applied. Under it a Redis error is an EventError and
// the job runs. Defaults to off.
func WithShadow() Option { return func(g *Guard) { g.shadow = true } }

// Guard runs work under a lease on the work's key. It is safe for concurrent
// use and holds no goroutine of its own.
type Guard struct {
	locker     lockkit.Locker
	policy     Policy
	limit      int
	hold       time.Duration
	throttle   *throttle
	ttl        time.Duration
	logger     *slog.Logger
	loggerSet  bool
	log        Observer
	observers  []Observer
	pending    Pending
	pendingSet bool
	parking    *Parking
	parkingSet bool
	async      bool
	shadow     bool
}

// New returns a Guard that takes leases from locker. It returns an error
// matching ErrInvalid for a nil locker or an invalid option, naming the option
// and the value.
func New(locker lockkit.Locker, opts ...Option) (*Guard, error) {
	if locker == nil {
		return nil, fmt.Errorf("%w: New: locker is nil", ErrInvalid)
	}
	g := &Guard{locker: locker, policy: Skip(), limit: 1}
	for _, o := range opts {
		if o != nil {
			o(g)
		}
	}
	if g.policy.OnConflict == 0 {
		g.policy.OnConflict = ActionSkip
	}
	if g.policy.RequeueDelay == 0 {
		g.policy.RequeueDelay = DefaultRequeueDelay
	}
	if err := g.policy.validate(); err != nil {
		return nil, err
	}
	switch {
	case g.limit < 1:
		return nil, fmt.Errorf("%w: WithLimit(%d): must be at least 1", ErrInvalid, g.limit)
	case g.throttle != nil && (g.throttle.n < 1 || g.throttle.period < time.Millisecond || g.throttle.period > lockkit.MaxTTL):
		return nil, fmt.Errorf("%w: WithThrottle(%d, %s): n must be at least 1 and period between 1ms and %s", ErrInvalid, g.throttle.n, g.throttle.period, lockkit.MaxTTL)
	case g.throttle != nil && g.throttle.then != ActionSkip && g.throttle.then != ActionRequeue:
		return nil, fmt.Errorf("%w: WithThrottle: then must be ActionSkip or ActionRequeue, not %s", ErrInvalid, g.throttle.then)
	case g.hold < 0 || g.hold > lockkit.MaxTTL:
		return nil, fmt.Errorf("%w: WithHoldAtLeast(%s): must not be negative nor longer than %s", ErrInvalid, g.hold, lockkit.MaxTTL)
	case g.limit > 1 && g.policy.KeepNewest:
		return nil, fmt.Errorf("%w: WithLimit(%d): KeepNewest runs one job per key at a time", ErrInvalid, g.limit)
	case g.limit > 1 && g.policy.Preempt:
		return nil, fmt.Errorf("%w: WithLimit(%d): Preempt runs one job per key at a time", ErrInvalid, g.limit)
	case g.hold > 0 && g.policy.Preempt:
		return nil, fmt.Errorf("%w: WithHoldAtLeast(%s): Preempt ends runs early, so it cannot keep a key held", ErrInvalid, g.hold)
	case g.limit > 1 && g.policy.Coalesce:
		return nil, fmt.Errorf("%w: WithLimit(%d): Coalesce runs one job per key at a time", ErrInvalid, g.limit)
	case g.ttl != 0 && (g.ttl < lockkit.MinTTL || g.ttl > lockkit.MaxTTL):
		return nil, fmt.Errorf("%w: WithTTL(%s): must be zero (the Locker's) or between %s and %s", ErrInvalid, g.ttl, lockkit.MinTTL, lockkit.MaxTTL)
	case g.loggerSet && g.logger == nil:
		return nil, fmt.Errorf("%w: WithLogger(nil)", ErrInvalid)
	case g.pendingSet && g.pending == nil:
		return nil, fmt.Errorf("%w: WithPending(nil)", ErrInvalid)
	case g.parkingSet && (g.parking.ID == nil || g.parking.Resume == nil):
		return nil, fmt.Errorf("%w: WithParking: ID and Resume must not be nil", ErrInvalid)
	case g.parkingSet && (g.parking.Hold < 0 || g.parking.Hold > lockkit.MaxTTL):
		return nil, fmt.Errorf("%w: WithParking: Hold %s must not be negative nor longer than %s", ErrInvalid, g.parking.Hold, lockkit.MaxTTL)

	}
	for i, o := range g.observers {
		if o == nil {
			return nil, fmt.Errorf("%w: WithObserver #%d is nil", ErrInvalid, i+1)
		}
	}
	if g.logger == nil {
		g.logger = locker.Logger()
	}
	g.log = logObserver(g.logger)
	return g, nil
}

// Policy returns the guard's conflict policy with defaults filled in.
func (g *Guard) Policy() Policy { return g.policy }

// Locker returns the Locker the guard takes its leases from.
func (g *Guard) Locker() lockkit.Locker { return g.locker }

// Emit reports an event to the guard's observers. Adapters use it for what
// happens outside Run, such as a requeue.
func (g *Guard) Emit(ctx context.Context, e Event) {
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
// is cancelled (cause matching lockkit.ErrLost) if the lease is lost, and
// releases the lease when fn returns or panics (the panic is re-raised). The
// lease is renewed until fn returns, even after ctx is cancelled. The
// returned Outcome says which of these happened.
//
// When fn succeeds after ctx ended (the runtime gave up on the run and may
// deliver it again) and job.Origin is set, the success is remembered for
// lockkit.CompletedRetention: a later delivery with the same Origin returns a
// *DuplicateError with ReasonCompleted instead of running.
func (g *Guard) Run(ctx context.Context, job Job, fn func(context.Context) error) Outcome {
	if job.Key == "" {
		return Outcome{Err: g.emptyKey(ctx, job)}
	}
	if g.shadow {
		return g.shadowRun(ctx, job, fn)
	}
	a := &attempt{}
	if g.throttle != nil {
		if err := g.reserveStart(ctx, job, a); err != nil {
			var dup *DuplicateError
			errors.As(err, &dup)
			return Outcome{Duplicate: dup, Err: err}
		}
	}
	lease, waited, err := g.acquire(ctx, job, a)
	if err == nil && a.start != "" && !a.own {
		// A delivery that waited for its own earlier run is that run's
		// retry: it spends no start.
		err = g.beginStart(ctx, job, lease, a, waited)
	}
	g.unreserve(ctx, job, a) // only a run spends a start
	if err != nil {
		var dup *DuplicateError
		errors.As(err, &dup)
		return Outcome{Duplicate: dup, Err: err}
	}
	return Outcome{Ran: true, Err: g.run(ctx, job, lease, waited, fn)}
}

// errPanicked ends a lease whose work panicked: never a success.
var errPanicked = errors.New("middleware: the work panicked")

// run runs fn under lease (lockkit.Lease.Run derives fn's context and ends
// the lease) and reports it.
func (g *Guard) run(ctx context.Context, job Job, lease *lockkit.Lease, waited time.Duration, fn func(context.Context) error) error {
	g.emitLease(ctx, EventAcquired, job, lease, waited, 0, nil)
	start := time.Now()
	var (
		p         any
		err, lost error
	)
	end := lease.Run(ctx, func(wctx context.Context) (ferr error) {
		reported := make(chan struct{})
		stopLost := context.AfterFunc(wctx, func() {
			defer close(reported)
			g.reportLost(ctx, wctx, job, lease)
		})
		defer func() {
			if !stopLost() {
				<-reported // EventLost comes before EventReleased
			}
			lost = lease.Err()
			if p = recover(); p != nil {
				ferr = errPanicked
			}
		}()
		err = fn(wctx)
		return err
	})
	var rerr error
	if p == nil && err == nil {
		rerr = end
	}
	return g.finish(ctx, job, lease, start, p, err, lost, rerr)
}

func (g *Guard) emptyKey(ctx context.Context, job Job) error {
	err := fmt.Errorf("middleware: %s: empty key", job.label())
	g.Emit(ctx, Event{Kind: EventError, Job: job, Err: err})
	return err
}

func (g *Guard) emitLease(ctx context.Context, kind EventKind, job Job, lease *lockkit.Lease, wait, took time.Duration, err error) {
	g.Emit(ctx, Event{Kind: kind, Job: job, Token: lease.Token(), Wait: wait, Duration: took, Err: err})
}

func (g *Guard) reportLost(ctx, wctx context.Context, job Job, lease *lockkit.Lease) {
	switch cause := context.Cause(wctx); {
	case errors.Is(cause, lockkit.ErrPreempted):
		g.emitLease(ctx, EventPreempted, job, lease, 0, 0, cause)
	case errors.Is(cause, lockkit.ErrLost):
		g.emitLease(ctx, EventLost, job, lease, 0, 0, cause)
	}
}

// finish reports a run whose work returned err or panicked with p (re-raised
// here), with the lease lost (lost) or not and ended with rerr, and returns
// the work's error, annotated with the loss cause if the lease was lost.
func (g *Guard) finish(ctx context.Context, job Job, lease *lockkit.Lease, start time.Time, p any, err, lost, rerr error) error {
	if p != nil {
		perr := fmt.Errorf("middleware: %s panicked: %v", job.label(), p)
		g.emitLease(ctx, EventError, job, lease, 0, time.Since(start), perr)
		g.emitLease(ctx, EventReleased, job, lease, 0, time.Since(start), perr) // the run ended
		panic(p)
	}
	if err != nil && lost != nil && !errors.Is(err, lockkit.ErrLost) {
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
	// reserved says that it is reserved and not taken yet.
	start    string
	reserved bool
}

// acquire takes job's key under the policy. A job about to wait for the
// key gives back its reserved throttle start first.
func (g *Guard) acquire(ctx context.Context, job Job, a *attempt) (*lockkit.Lease, time.Duration, error) {
	if job.Gen > 0 {
		if err := g.claim(ctx, job); err != nil {
			return nil, 0, err
		}
	}
	opt := &lockkit.AcquireOptions{TTL: g.ttl, Limit: g.limit, Epoch: job.Epoch, EpochTTL: job.EpochTTL, Fair: g.policy.Fair, Label: job.Origin, HoldAtLeast: g.hold,
		AsyncRelease: g.async, Adopt: job.Reserved && job.Origin != ""}
	if p := g.parking; p != nil && g.limit <= 1 {
		// Every run resumes the key's oldest parked job when it ends.
		opt.OnParked = func(id string) { p.Resume(job.Key, id) }
		if g.parks() && job.Origin != "" {
			opt.Park, opt.ParkHold, opt.Adopt = p.ID(ctx, job), p.Hold, true
		}
	}
	if g.policy.Coalesce {
		opt.Since = job.EnqueuedAt
		opt.Coalesce, opt.Final = true, job.Final
		if opt.Park != "" {
			return g.parkFollowUp(ctx, job, opt)
		}
		return g.followUp(ctx, job, opt)
	}
	if g.policy.KeepNewest || g.policy.Preempt {
		opt.Supersede, opt.Order = true, job.Order
		opt.Preempt, opt.PreemptGrace = g.policy.Preempt, g.policy.Grace
		if opt.Park != "" {
			return g.parkFollowUp(ctx, job, opt)
		}
		return g.followUp(ctx, job, opt)
	}
	lease, err := g.locker.TryAcquire(ctx, job.Key, opt)
	if err == nil {
		return lease, 0, nil
	}
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		return nil, 0, g.notAcquired(ctx, job, err, 0)
	}
	if ownRun(job, err) {
		a.own = true
		g.unreserve(ctx, job, a)
		return g.awaitOwnRun(ctx, job, opt)
	}
	if g.policy.Wait > 0 {
		lease, waited, err := g.acquireWaiting(ctx, job, opt, a)
		return lease, waited, markParked(err, opt)
	}
	return nil, 0, markParked(g.notAcquired(ctx, job, err, 0), opt)
}

// PassOn hands the key on from a parked job that cannot be started (see
// WithParking): it takes over the key's reservation carrying origin, the
// job's Origin, and releases it, which reserves the key for the next parked
// job and resumes that one. It does nothing when the key is held otherwise
// (a run of that job or of another: that run's end passes the key on),
// without WithParking, and once the Locker is closed (the reservation ends
// with its hold). Errors are reported as EventError.
func (g *Guard) PassOn(ctx context.Context, key, origin string) {
	p := g.parking
	if p == nil || key == "" || origin == "" {
		return
	}
	l, err := g.locker.TryAcquire(ctx, key, &lockkit.AcquireOptions{TTL: g.ttl, Label: origin, Adopt: true,
		OnParked: func(id string) { p.Resume(key, id) }})
	if err != nil {
		if !errors.Is(err, lockkit.ErrNotAcquired) && !errors.Is(err, lockkit.ErrClosed) {
			g.Emit(ctx, Event{Kind: EventError, Job: Job{Key: key, Origin: origin}, Err: fmt.Errorf("middleware: pass on %q: %w", key, err)})
		}
		return
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, lockkit.ErrClosed) {
		g.Emit(ctx, Event{Kind: EventError, Job: Job{Key: key, Origin: origin}, Err: fmt.Errorf("middleware: pass on %q: %w", key, err)})
	}
}

// parks reports whether the policy parks a job whose key is held (with
// WithParking): Requeue's duplicates, and the follow-ups of Coalesce and
// KeepNewest. A Preempt follow-up waits: it must run as soon as the run it
// cancelled returns.
func (g *Guard) parks() bool {
	switch {
	case g.policy.Preempt:
		return false
	case g.policy.Coalesce, g.policy.KeepNewest:
		return true
	}
	return g.policy.OnConflict == ActionRequeue
}

// parkFollowUp takes the key for a Coalesce or KeepNewest job under
// WithParking, or parks the job as the key's follow-up instead of waiting
// for it: the job is reported with ActionRequeue and DuplicateError.Parked,
// and the run that frees the key resumes it. A KeepNewest job that takes the
// place of a parked follow-up resumes that one, which then completes
// without running (ReasonSuperseded).
func (g *Guard) parkFollowUp(ctx context.Context, job Job, opt *lockkit.AcquireOptions) (*lockkit.Lease, time.Duration, error) {
	lease, err := g.locker.TryAcquire(ctx, job.Key, opt)
	if err == nil {
		return lease, 0, nil
	}
	var ce *lockkit.ConflictError
	if !errors.As(err, &ce) || ce.Parked < 0 {
		return nil, 0, g.notAcquired(ctx, job, err, 0)
	}
	if ce.Superseded != "" {
		g.parking.Resume(job.Key, ce.Superseded)
	}
	g.Emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: ActionRequeue, Holder: ce.Owner, Err: ce})
	return nil, 0, &DuplicateError{Job: job, Reason: ReasonHeld, Action: ActionRequeue, Parked: true, Cause: ce}
}

// markParked sets Parked in err's DuplicateError when the acquire with opt
// parked the job.
func markParked(err error, opt *lockkit.AcquireOptions) error {
	var dup *DuplicateError
	if opt.Park != "" && errors.As(err, &dup) && dup.Reason == ReasonHeld && dup.Action == ActionRequeue {
		dup.Parked = true
	}
	return err
}

// followUp takes the key for a Coalesce, KeepNewest or Preempt job in one waiting
// call, bounded by ctx: the job either gives way (to a run that began after
// it, or to a newer follow-up) or waits for the key as its follow-up.
func (g *Guard) followUp(ctx context.Context, job Job, opt *lockkit.AcquireOptions) (*lockkit.Lease, time.Duration, error) {
	start := time.Now()
	lease, err := g.locker.Acquire(ctx, job.Key, opt)
	waited := time.Since(start)
	switch {
	case err == nil:
		return lease, waited, nil // EventAcquired reports the wait
	case errors.Is(err, lockkit.ErrCovered), errors.Is(err, lockkit.ErrSuperseded), errors.Is(err, lockkit.ErrCompleted), errors.Is(err, lockkit.ErrEpochUsed):
		return nil, waited, g.notAcquired(ctx, job, err, waited)
	}
	err = fmt.Errorf("middleware: %s: waiting for %q: %w", job.label(), job.Key, err)
	g.Emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
	return nil, waited, err
}

// claim lets a job with a request generation run only if it is its key's
// newest request, or if the newest one's work does not exist.
func (g *Guard) claim(ctx context.Context, job Job) error {
	fail := func(err error) error {
		err = fmt.Errorf("middleware: %s: claim %q: %w", job.label(), job.Key, err)
		g.Emit(ctx, Event{Kind: EventError, Job: job, Err: err})
		return err
	}
	newest, ok, err := g.locker.Claim(ctx, job.Key, job.Gen, false)
	if err != nil {
		return fail(err)
	}
	if ok {
		return nil
	}
	pending := true
	if g.pending != nil && !newest.Claimed {
		if pending, err = g.pending(ctx, job, newest); err != nil {
			return fail(err)
		}
	}
	if !pending {
		// The newest request's work does not exist: this job runs instead,
		// unless that request was claimed meanwhile (it ran and is gone).
		again, ok, err := g.locker.Claim(ctx, job.Key, job.Gen, true)
		if err != nil {
			return fail(err)
		}
		if ok {
			return nil
		}
		newest = again
	}
	state := "is pending"
	if newest.Claimed {
		state = "ran or runs"
	}
	cause := fmt.Errorf("a newer request of the key, %q (generation %d), %s", newest.ID, newest.Gen, state)
	g.Emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: ActionSkip, Err: cause})
	return &DuplicateError{Job: job, Reason: ReasonSuperseded, Action: ActionSkip, Cause: cause}
}

// reserveStart reserves the run's throttle start before the job takes its
// key, or returns why the job does not run. A job that may wait for its key
// (Wait, Coalesce, KeepNewest, Preempt) reserves none: it is throttled now
// only if n runs began, and otherwise meets the throttle when its run
// begins.
func (g *Guard) reserveStart(ctx context.Context, job Job, a *attempt) error {
	t := g.throttle
	a.start = randomID()
	var wait time.Duration
	var err error
	if g.policy.Wait > 0 || g.policy.Coalesce || g.policy.KeepNewest || g.policy.Preempt {
		wait, err = g.locker.NextStart(ctx, job.Key, t.n, t.period)
	} else {
		wait, err = g.locker.ReserveStart(ctx, job.Key, t.n, t.period, a.start)
		a.reserved = err == nil && wait == 0
		if err != nil {
			g.returnStart(ctx, job, a.start) // in case it was reserved
		}
	}
	if err != nil {
		err = fmt.Errorf("middleware: %s: throttle %q: %w", job.label(), job.Key, err)
		g.Emit(ctx, Event{Kind: EventError, Job: job, Err: err})
		return err
	}
	if wait > 0 {
		return g.throttled(ctx, job, wait, 0)
	}
	return nil
}

// errNotBegun ends the lease of a run that did not begin after all.
var errNotBegun = errors.New("middleware: the run did not begin")

// beginStart takes the run's throttle start as its run begins, dated now:
// the start it reserved, or a new one if the budget allows. Otherwise it
// ends lease, taken after waiting for waited, as a run that did nothing
// (no HoldAtLeast, no success) and returns why the job does not run.
func (g *Guard) beginStart(ctx context.Context, job Job, lease *lockkit.Lease, a *attempt, waited time.Duration) error {
	t := g.throttle
	wait, err := g.locker.ThrottleStart(ctx, job.Key, t.n, t.period, a.start)
	if err == nil && wait == 0 {
		a.reserved = false
		return nil
	}
	_ = lease.Run(ctx, func(context.Context) error { return errNotBegun })
	if err != nil {
		a.reserved = true // in case it was taken: give it back
		err = fmt.Errorf("middleware: %s: throttle %q: %w", job.label(), job.Key, err)
		g.Emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
		return err
	}
	action := t.then
	if g.policy.Coalesce || g.policy.KeepNewest || g.policy.Preempt {
		// It got the key as the key's follow-up: other jobs may have folded
		// into it or given way to it, and their work rests on its run. It is
		// put back, never skipped.
		action = ActionRequeue
	}
	return g.throttledAs(ctx, job, wait, waited, action)
}

// throttled reports a job that does not run because its key's budget is
// spent for wait.
func (g *Guard) throttled(ctx context.Context, job Job, wait, waited time.Duration) error {
	return g.throttledAs(ctx, job, wait, waited, g.throttle.then)
}

// throttledAs is throttled with the action given.
func (g *Guard) throttledAs(ctx context.Context, job Job, wait, waited time.Duration, action Action) error {
	t := g.throttle
	dup := &DuplicateError{Job: job, Reason: ReasonThrottled, Action: action, RetryAfter: wait, Waited: waited,
		Cause: fmt.Errorf("%d starts per %s spent; the next in %s", t.n, t.period, wait)}
	g.Emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: action, Delay: wait, Wait: waited, Err: dup.Cause})
	return dup
}

// randomID names a throttle start.
func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// unreserve gives back a's reserved throttle start, if any.
func (g *Guard) unreserve(ctx context.Context, job Job, a *attempt) {
	if a.reserved {
		a.reserved = false
		g.returnStart(ctx, job, a.start)
	}
}

// returnStart gives back the throttle start id of a job that did not run.
// An error is reported as EventError: the start then counts until it
// leaves the window.
func (g *Guard) returnStart(ctx context.Context, job Job, id string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := g.locker.ReturnStart(rctx, job.Key, id); err != nil {
		g.Emit(ctx, Event{Kind: EventError, Job: job, Err: fmt.Errorf("middleware: %s: return throttle start %q: %w", job.label(), job.Key, err)})
	}
}

// ownRun reports whether err is a conflict with a run of the same work.
func ownRun(job Job, err error) bool {
	var ce *lockkit.ConflictError
	return job.Origin != "" && errors.As(err, &ce) && ce.Label == job.Origin
}

// awaitOwnRun waits, bounded by ctx only, for the earlier delivery of the same
// work to end: a delivery is never skipped as a duplicate of itself.
func (g *Guard) awaitOwnRun(ctx context.Context, job Job, opt *lockkit.AcquireOptions) (*lockkit.Lease, time.Duration, error) {
	start := time.Now()
	lease, err := g.locker.Acquire(ctx, job.Key, opt)
	waited := time.Since(start)
	switch {
	case err == nil:
		g.Emit(ctx, Event{Kind: EventWaited, Job: job, Wait: waited})
		return lease, waited, nil
	case errors.Is(err, lockkit.ErrCompleted):
		return nil, waited, g.notAcquired(ctx, job, err, waited)
	}
	err = fmt.Errorf("middleware: %s: waiting for the earlier delivery of %q: %w", job.label(), job.Origin, err)
	g.Emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
	return nil, waited, err
}

// acquireWaiting waits up to the policy's bound.
func (g *Guard) acquireWaiting(ctx context.Context, job Job, opt *lockkit.AcquireOptions, a *attempt) (*lockkit.Lease, time.Duration, error) {
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, g.policy.Wait)
	lease, err := g.locker.Acquire(wctx, job.Key, opt)
	cancel()
	waited := time.Since(start)
	switch {
	case err == nil:
		g.Emit(ctx, Event{Kind: EventWaited, Job: job, Wait: waited})
		return lease, waited, nil
	case ctx.Err() != nil:
		// The caller gave up, not the policy: report that, not a duplicate.
		err = fmt.Errorf("middleware: %s: waiting for %q: %w", job.label(), job.Key, err)
		g.Emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
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
	case errors.Is(err, lockkit.ErrEpochUsed):
		g.Emit(ctx, Event{Kind: EventClaimed, Job: job, Action: ActionSkip, Wait: waited, Err: err})
		return &DuplicateError{Job: job, Reason: ReasonClaimed, Action: ActionSkip, Waited: waited, Cause: err}
	case errors.Is(err, lockkit.ErrCompleted):
		g.Emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: ActionSkip, Wait: waited, Err: err})
		return &DuplicateError{Job: job, Reason: ReasonCompleted, Action: ActionSkip, Waited: waited, Cause: err}
	case errors.Is(err, lockkit.ErrSuperseded):
		g.Emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: ActionSkip, Wait: waited, Err: err})
		return &DuplicateError{Job: job, Reason: ReasonSuperseded, Action: ActionSkip, Waited: waited, Cause: err}
	case errors.Is(err, lockkit.ErrCovered):
		ev := Event{Kind: EventDuplicate, Job: job, Action: ActionSkip, Wait: waited, Err: err}
		var ce *lockkit.CoveredError
		if errors.As(err, &ce) {
			ev.Holder = ce.Owner
		}
		g.Emit(ctx, ev)
		return &DuplicateError{Job: job, Reason: ReasonCovered, Action: ActionSkip, Waited: waited, Cause: err}
	case errors.Is(err, lockkit.ErrNotAcquired):
		dup := &DuplicateError{Job: job, Reason: ReasonHeld, Action: g.policy.OnConflict, Waited: waited, Cause: err}
		var ce *lockkit.ConflictError
		if errors.As(err, &ce) {
			dup.Cause = ce
		}
		ev := Event{Kind: EventDuplicate, Job: job, Action: dup.Action, Wait: waited, Err: dup.Cause}
		if ce != nil {
			ev.Holder = ce.Owner
		}
		g.Emit(ctx, ev)
		return dup
	default:
		err = fmt.Errorf("middleware: %s: acquire %q: %w", job.label(), job.Key, err)
		g.Emit(ctx, Event{Kind: EventError, Job: job, Err: err})
		return err
	}
}

// shadowRun runs job under WithShadow: under its lease when the key is
// free, and otherwise without one, reporting what the policy would have done.
func (g *Guard) shadowRun(ctx context.Context, job Job, fn func(context.Context) error) Outcome {
	opt := &lockkit.AcquireOptions{TTL: g.ttl, Limit: g.limit, Epoch: job.Epoch, EpochTTL: job.EpochTTL, Label: job.Origin,
		HoldAtLeast: g.hold, AsyncRelease: g.async}
	lease, err := g.locker.TryAcquire(ctx, job.Key, opt)
	if err == nil {
		return Outcome{Ran: true, Err: g.run(ctx, job, lease, 0, fn)}
	}
	e := Event{Kind: EventShadowed, Job: job, Action: g.policy.OnConflict, Err: err}
	var ce *lockkit.ConflictError
	switch {
	case errors.As(err, &ce) && job.Origin != "" && ce.Label == job.Origin:
		e = Event{} // its own earlier delivery: not a duplicate
	case errors.As(err, &ce):
		e.Holder = ce.Owner
	case errors.Is(err, lockkit.ErrEpochUsed):
		e.Action = ActionSkip
	case errors.Is(err, lockkit.ErrCompleted):
		e.Action = ActionSkip
	default:
		e.Kind, e.Action, e.Err = EventError, 0, fmt.Errorf("middleware: shadow: %q: %w; the job runs anyway", job.Key, err)
	}
	if e.Kind != 0 {
		g.Emit(ctx, e)
	}
	return Outcome{Ran: true, Err: fn(ctx)}
}
