// Package middleware is the runtime-agnostic guard that the asynq adapter
// (singleton) and the cron adapter (cronguard) share: key → lease → run →
// release, the conflict policies and the events. It knows neither asynq nor
// cron; a runtime of your own uses it directly.
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
// # Words
//
// A job is one run of work under a key (and its extra keys, other keys it
// holds besides its own: WithExtraKeys); a duplicate is a job whose key, or
// one of its extra keys, is held by other runs up to its limit; a policy says what happens to a duplicate (skip it,
// requeue it, fail it, wait, coalesce, keep the newest, preempt); an action
// is what a policy does with one duplicate (skip, requeue, fail); an event
// is what happened to a job, reported to observers. The lease, its label,
// its fencing token and a reservation are lockkit's words (see lockkit).
// singleton (asynq) and cronguard (cron) take the options of this package
// as their own: singleton.WithPolicy is WithPolicy.
//
// A Guard's events describe jobs; lockkit's observer (lockkit.WithObserver)
// describes leases. ErrInvalid here, in singleton and in cronguard also
// matches lockkit.ErrInvalid. The TTL and the logger are the Locker's unless
// WithTTL or WithLogger overrides them.
package middleware

import (
	"context"
	"log/slog"
	"time"

	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/lockkit"
)

// Errors of the guard. Compare with errors.Is.
var (
	// ErrDuplicate is matched (errors.Is) by every *DuplicateError: the work
	// did not run because another run holds its key or already claimed its
	// epoch.
	ErrDuplicate = guard.ErrDuplicate
	// ErrInvalid is matched by every error New returns for a nil locker or an
	// invalid option, and by the error of a Run whose WithLimitFunc gave a
	// limit out of range; it also matches lockkit.ErrInvalid. The message
	// names the option and the bad value.
	ErrInvalid = guard.ErrInvalid
	// ErrPreempted is the cause (context.Cause) of the cancellation of a
	// run's ctx when a newer job of its key took over (Preempt): the run's
	// lease is lost, so it also matches lockkit.ErrLost.
	ErrPreempted = guard.ErrPreempted
)

// Guard runs work under a lease on the work's key. It is safe for concurrent
// use and holds no goroutine of its own. Its one method, Run, acquires
// job.Key under the guard's policy, runs fn with a context that is
// cancelled (cause matching lockkit.ErrLost) if the lease is lost, or (cause
// matching lockkit.ErrCancelled) if an operator asked the run to stop
// (lockkit's Locker.CancelRun: the key stays held until fn returns), and
// releases the lease when fn returns or panics (the panic is re-raised). The
// returned Outcome says which of these happened; a nil fn is an error
// matching ErrInvalid.
type Guard = guard.Guard

// New returns a Guard that takes leases from locker. It returns an error
// matching ErrInvalid for a nil locker, an option of another package
// (singleton's key options, say), or an invalid option, naming the option
// and the value. The combinations that cannot work are refused here:
// WithLimit above 1, or WithLimitFunc, with Coalesce, KeepNewest or
// Preempt; WithHoldAtLeast with Preempt.
func New(locker *lockkit.Locker, opts ...Option) (*Guard, error) { return guard.New(locker, opts...) }

// Option configures a Guard; singleton.New, singleton.Middleware and
// cronguard take the same values. Build one with the With functions.
type Option = guard.Option

// Job is one run of work to guard: Key, the lock key (required); Name,
// which names the work in events and errors (a task type, a cron entry);
// ID, which identifies this run in events (a task ID, a tick), optional.
// An adapter may carry more of what it knows of the work (singleton: the
// task's place in its key's order, its enqueue time); a Job built here
// carries none of it.
type Job = guard.Job

// Outcome is what Run did with a job: exactly one of these. Ran: fn was
// called, and Err is what it returned (annotated with the loss cause if the
// lease was lost and fn failed; nil when fn succeeded, even if the lease
// was lost meanwhile, which an EventLost reports). Duplicate: the work did
// not run because the key was held, the epoch claimed or the work completed
// already; Duplicate.Action says what to do with it, and Err is Duplicate.
// Otherwise Err kept fn from running: an empty key, Redis unreachable, or an
// acquire whose outcome is unknown (never a *DuplicateError).
type Outcome = guard.Outcome

// Policy says what happens when a job's key is held by another run. It is
// built only by its constructors (Skip, Fail, Requeue, Wait, WaitInOrder,
// Coalesce, KeepNewest, Preempt), so a combination that cannot work cannot be
// written; its zero value is Skip(). String names it as written, such as
// "Wait(10s, Requeue(1s))".
type Policy = guard.Policy

// Action is what a policy does with one duplicate: ActionSkip,
// ActionRequeue or ActionFail. String returns "skip", "requeue" or "fail".
type Action = guard.Action

// Actions of a Policy.
const (
	// ActionSkip drops the duplicate: it completes without running.
	ActionSkip = guard.ActionSkip
	// ActionRequeue runs the duplicate again later (after the policy's delay
	// plus up to 50% jitter). Adapters that cannot requeue reject it.
	ActionRequeue = guard.ActionRequeue
	// ActionFail returns the *DuplicateError so the runtime's retry applies.
	ActionFail = guard.ActionFail
)

// DuplicateError is the error of a job that did not run (Outcome.Duplicate).
// It matches ErrDuplicate and, for ReasonHeld, lockkit.ErrNotAcquired. Its
// fields: Job; Reason, why it did not run; Action, what the caller should do
// (always ActionSkip for ReasonClaimed); Waited, how long it waited for the
// key; RetryAfter, for ReasonThrottled, how long until the key's next start
// is allowed; Parked, that an adapter queued it for its key (singleton's
// Requeue); Cause, the lease's error (a *lockkit.ConflictError naming the
// holder) or the refusal (ReasonClaimed, ReasonCompleted, ReasonCovered).
type DuplicateError = guard.DuplicateError

// Reason says why a job did not run (DuplicateError.Reason).
type Reason = guard.Reason

// Reasons of a DuplicateError.
const (
	// ReasonHeld: another run holds the key (or all its slots).
	ReasonHeld = guard.ReasonHeld
	// ReasonClaimed: the job's epoch was already claimed: the same unit of
	// work (such as a cron tick) ran elsewhere.
	ReasonClaimed = guard.ReasonClaimed
	// ReasonSuperseded: a newer job of the key took this one's place as its
	// follow-up (KeepNewest, Preempt), or the adapter found a newer request
	// of the key (singleton.Debounce).
	ReasonSuperseded = guard.ReasonSuperseded
	// ReasonThrottled: the key's starts per period (WithThrottle) were
	// spent; DuplicateError.RetryAfter says when the next one opens.
	ReasonThrottled = guard.ReasonThrottled
	// ReasonCovered: a run of the key that began after the job did
	// succeeded, is running, or is pending as the key's follow-up
	// (Coalesce): it does the job's work.
	ReasonCovered = guard.ReasonCovered
	// ReasonCompleted: an earlier delivery of the same work completed
	// successfully after the runtime had given up on it: running it again
	// would do the work twice.
	ReasonCompleted = guard.ReasonCompleted
)

// Event is one thing that happened to a guarded job, given to observers:
// Kind; Job; Action, what happens to a duplicate (EventDuplicate,
// EventClaimed, EventShadowed); Holder, the owner ID of the run holding the
// key (EventDuplicate); Token, the lease's fencing token (EventAcquired,
// EventLost, EventPreempted, EventReleased); Wait, how long the job waited
// for its key; Duration, how long it ran (EventReleased); Delay, when a
// requeued job runs again (EventRequeued); Err, the failure, the job's error
// or the conflict.
type Event = guard.Event

// Observer receives a guard's events synchronously, after the guard logged
// them; it must be fast.
type Observer = guard.Observer

// EventKind names what happened to a guarded job. String returns the kind
// in lower case, such as "duplicate".
type EventKind = guard.EventKind

// Event kinds reported to observers.
const (
	// EventAcquired: the job took its lease and is about to run (Event.Token).
	EventAcquired = guard.EventAcquired
	// EventWaited: the job waited for its key (Event.Wait) and then took it.
	EventWaited = guard.EventWaited
	// EventDuplicate: the key was held by another run; Event.Action says what
	// happens to the job and Event.Holder who holds the key.
	EventDuplicate = guard.EventDuplicate
	// EventRequeued: an adapter put a duplicate back to run later.
	EventRequeued = guard.EventRequeued
	// EventClaimed: the job's epoch was already claimed (it ran elsewhere);
	// the job is skipped.
	EventClaimed = guard.EventClaimed
	// EventLost: the lease was lost while the job ran; its ctx was cancelled
	// (Event.Err matches lockkit.ErrLost). A preemption is EventPreempted.
	EventLost = guard.EventLost
	// EventReleased: the job returned or panicked (Event.Err is its error,
	// Event.Duration its run time) and the lease was released.
	EventReleased = guard.EventReleased
	// EventError: the job could not be guarded (bad key, Redis error), or it
	// panicked, or its release failed.
	EventError = guard.EventError
	// EventPreempted: a newer job of the key preempted the running one
	// (Preempt), as asked; its ctx was cancelled with a cause matching
	// ErrPreempted. It is not an EventLost.
	EventPreempted = guard.EventPreempted
	// EventShadowed: under WithShadow, the job ran without a lease although
	// the policy would not have run it now; Event.Action is what the policy
	// would have done, Event.Holder who held the key, Event.Err the conflict.
	// An adapter reports with ActionFail a job it would have refused before
	// the policy had a say (singleton: a key that cannot be derived, say),
	// Event.Err the refusal.
	EventShadowed = guard.EventShadowed
)

// The options of a Guard and the policies.

// WithPolicy sets the conflict policy. Defaults to Skip().
func WithPolicy(p Policy) Option { return guard.WithPolicy(p) }

// WithLimit sets how many runs of one key may hold it at once (per-key
// concurrency across every process). Processes that give one key different
// limits (a rolling deploy that changes n) never let it have more runs than
// the smallest limit among its runs allows (see WithLimitFunc). Must be
// between 1 and 10,000. It replaces a WithLimitFunc given before it.
// Defaults to 1.
func WithLimit(n int) Option { return guard.WithLimit(n) }

// WithLimitFunc gives each job its own limit: fn(ctx, job) is how many runs
// of job.Key may hold it at once while this job runs (premium tenants 10,
// the others 1), called once per Run before the job takes its key, with
// Run's ctx. The key keeps the limit each of its runs took it with: a job
// is admitted only while the key's runs are fewer than its own limit and
// than the limit of every one of them, so the key never has more runs than
// the smallest limit among them allows, whichever process or task type
// gave which. Jobs that disagree (a rolling deploy that changes fn, or
// another process under another WithLimit) do not deadlock: a job with the
// larger limit counts against the smaller only while a run that took the
// key with it lives, and a job with the smaller one waits (or is a
// duplicate under its policy) until the runs are fewer than its limit. A
// waiter woken by a release is admitted by the same rule. fn returning
// less than 1 or more than 10,000 fails that job without running it: Run
// returns an error matching ErrInvalid that names the key and the value
// (reported as an EventError), not a duplicate. Only a job whose limit is
// 1 is parked for its key (singleton's Requeue); the end of any run of the
// key, whatever its limit, starts the oldest parked job. A job parked by a
// server that gave it a limit of 1 takes over the key's reservation for it
// on a server that gives it another limit; taking the key there, it gives
// up its place in the parked queue (one more write, for such jobs only).
// New refuses it
// with Coalesce, KeepNewest and Preempt, which run one job per key at a
// time whatever fn returns, and a nil fn (ErrInvalid). It replaces a
// WithLimit given before it. Defaults to none: every job has WithLimit's
// limit.
func WithLimitFunc(fn func(ctx context.Context, job Job) int) Option { return guard.WithLimitFunc(fn) }

// WithExtraKeys makes each job hold other keys besides its own while it
// runs, each under its own limit: fn(ctx, job) maps each key to how many
// runs may hold it at once (a tenant's key with limit 3 as the job's own,
// and {"api:github": 20} shared by every task that calls that API), called
// once per Run before the job takes its keys, with Run's ctx. A job runs
// only while it holds its own key and every extra key, all or none; a job
// that does not run holds none of them afterwards. Under Skip, Fail and
// Requeue it takes its own key under the policy first, then the extra keys
// in the order of their names, each tried once: when one is full it gives
// back every key it took (its own without a WithHoldAtLeast hold; the
// key's next parked job starts) and is a duplicate of that key's holder
// (ReasonHeld, the policy's action, DuplicateError.Cause naming the key;
// Requeue does not park it: it comes back after the policy's delay). Under
// Wait it takes all its keys, its own among them, in the order of their
// names, waiting for each within the policy's bound (counted from its
// first attempt) while it holds those before it; when a wait ends with the
// key still full it gives every key back and the wrapped policy applies.
// Every job takes keys in that one order, so no two jobs deadlock,
// whatever order their keys come in (a job its own key may be reserved
// for, resumed from parking, takes that key first: the reservation holds
// it already). The job's leases on its extra keys are labelled with its
// label and its own key, quoted (`<label>@"<key>"`: a label names the
// work among the jobs of one key only, and cron entries share their
// ticks); a key held by the job's own earlier delivery under that label is
// waited for, as its own key is, bounded by ctx only. The release of an
// extra key starts the oldest job parked for it (it may be another job's
// own key), as every run's end does. The run's ctx is
// cancelled (cause matching lockkit.ErrLost, naming the key) when any of
// its leases is lost, and (lockkit.ErrCancelled) when an operator cancels
// the run on any of its keys; the extra keys are renewed with its own and
// released together, before its own, when the work returns. Fencing
// tokens, epochs, holds and parking are of the job's own key. A map with
// an empty key, the job's own key, or a limit outside 1 to 10,000 fails
// that job without running it (ErrInvalid, reported as an EventError).
// Each extra key costs one round trip to take, and all of them one to
// give back (WithBatching shares round trips between concurrent jobs). New
// refuses a nil fn, and the policies that follow up on the own key alone
// (Coalesce, KeepNewest, Preempt) or serve it in arrival order
// (WaitInOrder), with ErrInvalid. Defaults to none: a job holds its own key
// only.
func WithExtraKeys(fn func(ctx context.Context, job Job) map[string]int) Option {
	return guard.WithExtraKeys(fn)
}

// WithThrottle allows at most n runs of a key to begin in any window of one
// period across every process (a budget kept on the Redis and under the prefix
// of the Locker), each start dated
// when its run begins. A job over the budget does not run: Run returns a
// *DuplicateError with ReasonThrottled, then as its Action (ActionSkip, or
// ActionRequeue to run it again when the next start opens, RetryAfter), and
// reports EventDuplicate, whatever holds its key. Before it takes its key a
// job whose policy does not wait for it (Skip, Requeue, Fail) reserves a
// start, so that jobs arriving together past
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
// it). A delivery that waited for its own earlier run is that run's retry:
// it takes that delivery's start over (dated when it begins) if the start
// is still spent or reserved, and otherwise needs a start of its own, as
// any run. n must be at least 1, period between a millisecond and
// 100 years. The budget is kept in the Redis of the *lockkit.Locker.
// Defaults to no throttle.
func WithThrottle(n int, period time.Duration, then Action) Option {
	return guard.WithThrottle(n, period, then)
}

// WithHoldAtLeast keeps a job's key held for at least d after its run began,
// even when the run ends sooner (lockkit.AcquireOptions.HoldAtLeast): with
// Skip, a key runs at most once per d. A run that fails holds nothing back:
// its retry runs as soon as it comes. Zero means none; at most
// 100 years. Defaults to zero.
func WithHoldAtLeast(d time.Duration) Option { return guard.WithHoldAtLeast(d) }

// WithAsyncRelease makes Run return as soon as the work has: the lease ends
// then, and its release is sent by the Locker's background releaser
// (lockkit.AcquireOptions.AsyncRelease), pipelined with other releases, so a
// job pays one Redis round trip (the acquire) on its own path instead of
// two. Another process may find the key held for up to about two round
// trips after the work returned, and apply its policy to it (Skip skips); a
// later job of this process waits for the release. A crash before the
// release is sent leaves the key held until its TTL. Defaults to off.
func WithAsyncRelease() Option { return guard.WithAsyncRelease() }

// WithTTL overrides, for this guard's leases, the TTL the Locker gives them
// (lockkit.WithTTL, 30s unless set); the lease is renewed every
// TTL/3 while the work runs. Zero means the Locker's. Must be zero or between
// 100ms and 100 years. Defaults to zero.
func WithTTL(ttl time.Duration) Option { return guard.WithTTL(ttl) }

// WithLogger sets the guard's logger: lost leases, errors and jobs that
// failed at Warn, everything else at Debug. Must not be nil. Defaults to the
// logger of the Locker (lockkit.WithLogger).
func WithLogger(l *slog.Logger) Option { return guard.WithLogger(l) }

// WithObserver adds an observer of the guard's events, called synchronously
// after the event is logged. It may be given more than once; observers are
// called in order. Must not be nil. Defaults to none.
func WithObserver(o Observer) Option { return guard.WithObserver(o) }

// WithShadow runs every job: the guard decides as the policy would, and a
// job that the policy would not run now (its key is held by another run, its
// epoch claimed, or its work completed) runs anyway, without a lease, and
// is reported as an EventShadowed whose Action is what the policy would have
// done. A job whose key is free runs under its lease as usual, so that the
// jobs after it see the key held; so does a job the key is reserved for (a
// task singleton parked, resumed by a run with or without shadow), which
// takes the reservation over, and a run's end hands the key to the next
// parked job, as without shadow; a reserved job that runs without a lease gives up, once it has
// run, the place kept for it in the key's parked queue and a reservation it
// could not take over (one more round trip). It is for rolling the guard out: watch what
// it would drop on real traffic, then remove the option. The decision is the
// key's (and the epoch's): a shadowed job does not wait, park, fold into a
// follow-up or spend a throttle start, so Wait, Coalesce, KeepNewest,
// Preempt and WithThrottle are reported as their first decision only, and
// WithThrottle is not applied. A job whose key is held by an earlier run of
// the same work (asynq delivered the task again while that run went on) is no duplicate: it runs at once, without a lease, and is not
// reported. Under it a Redis error is an EventError and the job runs.
// Defaults to off.
func WithShadow() Option { return guard.WithShadow() }

// Skip returns the policy that drops duplicates.
func Skip() Policy { return guard.Skip() }

// Fail returns the policy that fails duplicates with a *DuplicateError.
func Fail() Policy { return guard.Fail() }

// Requeue returns the policy that runs duplicates again after delay (plus up
// to 50% jitter). Zero means 5 seconds; it must not be negative
// nor longer than 100 years (New refuses it with ErrInvalid).
func Requeue(delay time.Duration) Policy { return guard.Requeue(delay) }

// Wait returns then (Skip, Requeue or Fail), made to first wait up to max for
// the key, woken when it is released. max must be positive, and then one of
// Skip, Requeue or Fail (New refuses another with ErrInvalid).
func Wait(max time.Duration, then Policy) Policy { return guard.Wait(max, then) }

// WaitInOrder is Wait, with the waiting duplicates taking the key in
// arrival order.
func WaitInOrder(max time.Duration, then Policy) Policy { return guard.WaitInOrder(max, then) }

// Coalesce returns the policy that folds duplicates into a run that began
// after them: a job completes without running (ReasonCovered, ActionSkip)
// when a run of its key that began after it (after Run was called: the
// delivery, which is after the enqueue; singleton.Client stamps the enqueue)
// succeeded, is running, or is pending as the key's follow-up. Any other job
// waits for the key, bounded by its ctx only, and runs as the key's one
// follow-up; a job whose wait ends with its ctx fails with an error that is
// not a duplicate, so the runtime retries it. WithLimit above 1 is refused.
func Coalesce() Policy { return guard.Coalesce() }

// KeepNewest returns the policy that keeps one follow-up per key, the newest:
// a job whose key is held waits, bounded by its ctx only, as the key's one
// follow-up; a later job takes its place, and the job it replaces completes
// without running (ReasonSuperseded, ActionSkip). "Later" is by the order
// of enqueue where the runtime knows it (singleton.Client), else by arrival
// at Redis. WithLimit above 1 is refused.
func KeepNewest() Policy { return guard.KeepNewest() }

// Preempt returns the policy under which a job cancels the run holding its
// key and runs after it: that run's ctx is cancelled with a cause matching
// ErrPreempted (and lockkit.ErrLost), its lease is no longer renewed and its
// fencing token is superseded by this job's; it is reported as
// EventPreempted, not EventLost. The job waits, bounded by its ctx only, as
// the key's one follow-up, the newest (as under KeepNewest), and runs once
// the preempted run has returned, or after grace if that comes first; zero
// grace means the preempted run's remaining TTL. grace must be between 0
// and 100 years. WithLimit above 1 and WithHoldAtLeast are refused.
func Preempt(grace time.Duration) Policy { return guard.Preempt(grace) }
