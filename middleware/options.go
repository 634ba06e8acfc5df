package middleware

// The options of a Guard.

import (
	"context"
	"log/slog"
	"time"
)

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
// 100 years. Defaults to zero.
func WithHoldAtLeast(d time.Duration) Option { return func(g *Guard) { g.hold = d } }

// WithThrottle allows at most n runs of a key to begin in any window of one
// period across every process (a throttle.Throttle on the Redis and prefix
// of the Locker), each start dated
// when its run begins. A job over the budget does not run: Run returns a
// *DuplicateError with ReasonThrottled, then as its Action (ActionSkip, or
// ActionRequeue to run it again when the next start opens, RetryAfter), and
// reports EventDuplicate, whatever holds its key. Before it takes its key a
// job whose policy does not wait for it (Skip, Requeue, Fail) reserves a
// start (throttle.Throttle.Reserve), so that jobs arriving together past
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
// 100 years. The budget is kept in the Redis of the *lockkit.RedisLocker.
// Defaults to no throttle.
func WithThrottle(n int, period time.Duration, then Action) Option {
	return func(g *Guard) { g.throttle = &throttleSpec{n: n, period: period, then: then} }
}

type throttleSpec struct {
	n      int
	period time.Duration
	then   Action
}

// Admit is a runtime's own check of whether a job may run, made by Run
// before the job takes its key (singleton uses it for a debounced task: only
// the newest request of a key runs). It returns nil to let the job go on, a
// *DuplicateError (found with errors.As; Run returns it unwrapped) to
// complete the job without running (reported as an
// EventDuplicate with the error's Action and Cause; Run fills in its Job),
// or another error to fail the job (reported as an EventError), so that the
// runtime tries it again.
type Admit func(ctx context.Context, job Job) error

// WithAdmit sets the check Run makes before a job takes its key (see
// Admit). It is not made under WithShadow. Must not be nil. Defaults to
// none: every job goes on to take its key.
func WithAdmit(a Admit) Option { return func(g *Guard) { g.admit, g.admitSet = a, true } }

// Done is a runtime's own record of whether a job's work is done, read by
// Run when the job took its key after waiting for an earlier run of the
// same work (Job.Origin) to end: the runtime may have delivered the work
// again while that run went on, unaware of it (singleton: asynq took the
// task back), and that run may have done it. true completes the job without
// running (ReasonCompleted, ActionSkip); false, also when the record cannot be read, runs
// it: a second run is better than a lost one.
type Done func(ctx context.Context, job Job) bool

// WithDone sets the record Run reads for a job that waited for its own
// earlier run (see Done), also when that wait failed (a Redis error, ctx
// ended): the job then completes without running if the record says the
// work is done. It is not read under WithShadow, nor for a
// follow-up of Coalesce, KeepNewest or Preempt. Must not be nil. Defaults to
// none: such a job runs, unless that run succeeded after its ctx ended
// (Job.Origin).
func WithDone(d Done) Option { return func(g *Guard) { g.done, g.doneSet = d, true } }

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
	// and take it over. Zero means the engine's default, 5 seconds.
	Hold time.Duration
}

// WithParking makes ActionRequeue park its duplicates, and Coalesce and
// KeepNewest their follow-ups instead of waiting for the key: a job with an
// Origin whose key is held is queued for the key (the engine's parking)
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
// (lockkit.WithTTL, 30s unless set); the lease is renewed every
// TTL/3 while the work runs. Zero means the Locker's. Must be zero or between
// 100ms and 100 years. Defaults to zero.
func WithTTL(ttl time.Duration) Option { return func(g *Guard) { g.ttl = ttl } }

// WithLogger sets the guard's logger: lost leases, errors and jobs that
// failed at Warn, everything else at Debug. Must not be nil. Defaults to the
// logger of the Locker (lockkit.WithLogger).
func WithLogger(l *slog.Logger) Option {
	return func(g *Guard) { g.logger, g.loggerSet = l, true }
}

// WithObserver adds an observer of the guard's events, called synchronously
// after the event is logged. It may be given more than once; observers are
// called in order. Must not be nil. Defaults to none.
func WithObserver(o Observer) Option {
	return func(g *Guard) { g.observers = append(g.observers, o) }
}
