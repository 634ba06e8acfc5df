package guard

// The options of a Guard.

import (
	"context"
	"log/slog"
	"time"
)

// Option configures a Guard, or an adapter built on one: an adapter's own
// options (singleton's key options, say) fill in its settings through
// Settings.Adapter, so that one list takes both.
type Option interface{ Apply(*Settings) }

// Settings collects the options given to New, or to an adapter that builds a
// Guard.
type Settings struct {
	// Adapter is the adapter's own settings, which its options fill in; nil
	// for New.
	Adapter any
	fns     []func(*Guard)
	err     error
}

// Apply implements Option: the guard options s collected apply after those
// collected before it.
func (s *Settings) Apply(dst *Settings) {
	dst.fns = append(dst.fns, s.fns...)
	if dst.err == nil {
		dst.err = s.err
	}
}

// Refuse records why an option given does not belong here: New fails with
// the first such error, wrapped in ErrInvalid.
func (s *Settings) Refuse(err error) {
	if s.err == nil {
		s.err = err
	}
}

// optionFunc is an option of the Guard itself.
type optionFunc func(*Guard)

func (o optionFunc) Apply(s *Settings) { s.fns = append(s.fns, o) }

// WithPolicy is middleware.WithPolicy, which documents it.
func WithPolicy(p Policy) Option { return optionFunc(func(g *Guard) { g.policy = p }) }

// WithLimit is middleware.WithLimit, which documents it. It replaces a
// WithLimitFunc given before it.
func WithLimit(n int) Option {
	return optionFunc(func(g *Guard) { g.limit, g.limitOf, g.limitSet = n, nil, false })
}

// WithLimitFunc is middleware.WithLimitFunc, which documents it. It
// replaces a WithLimit given before it. Run calls fn only for a job without
// Work.Limit: an adapter may call it first (LimitOf) with what fn reads
// from its ctx.
func WithLimitFunc(fn func(ctx context.Context, job Job) int) Option {
	return optionFunc(func(g *Guard) { g.limit, g.limitOf, g.limitSet = 1, fn, true })
}

// WithHoldAtLeast is middleware.WithHoldAtLeast, which documents it.
func WithHoldAtLeast(d time.Duration) Option { return optionFunc(func(g *Guard) { g.hold = d }) }

// WithThrottle is middleware.WithThrottle, which documents it.
func WithThrottle(n int, period time.Duration, then Action) Option {
	return optionFunc(func(g *Guard) { g.throttle = &throttleSpec{n: n, period: period, then: then} })
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
func WithAdmit(a Admit) Option { return optionFunc(func(g *Guard) { g.admit, g.admitSet = a, true }) }

// Done is a runtime's own record of whether a job's work is done, read by
// Run when the job took its key after waiting for an earlier run of the
// same work (Job.Origin) to end: the runtime may have delivered the work
// again while that run went on, unaware of it (singleton: asynq took the
// task back), and that run may have done it. true completes the job without
// running (ReasonCompleted, ActionSkip); false runs it. An error (the record
// cannot be read) fails the job without running: Run frees the key, reports
// an EventError and returns the error, for the runtime to deliver the job
// again; a job that waited for its own run is not run on a guess, since
// that run most often did the work.
type Done func(ctx context.Context, job Job) (bool, error)

// WithDone sets the record Run reads for a job that waited for its own
// earlier run (see Done), also when that wait failed (a Redis error, ctx
// ended): the job then completes without running if the record says the
// work is done. It is not read under WithShadow, nor for a
// follow-up of Coalesce, KeepNewest or Preempt. Must not be nil. Defaults to
// none: such a job runs, unless that run succeeded after its ctx ended
// (Job.Origin).
func WithDone(d Done) Option { return optionFunc(func(g *Guard) { g.done, g.doneSet = d, true }) }

// WithAsyncRelease is middleware.WithAsyncRelease, which documents it.
func WithAsyncRelease() Option { return optionFunc(func(g *Guard) { g.async = true }) }

// Parking is how an adapter parks duplicates under ActionRequeue (see
// WithParking).
type Parking struct {
	// ID names a job to start again later (for asynq: its queue and task
	// ID); ctx is the job's. Must not be nil.
	ID func(ctx context.Context, job Job) string
	// Resume starts the parked job id now, for which key was just
	// reserved. The Locker calls it directly (lockcore's Parking.OnParked;
	// the guard is not on that path), on a goroutine of its own, which the
	// Locker's Close waits for: it should return once the job is started,
	// or soon after the Locker closes. If the job cannot be started it
	// should call PassOn, so that the next parked job gets the key. A
	// KeepNewest follow-up that a newer job replaced while it was parked is
	// not passed here: the newer job's DuplicateError names it (its Cause,
	// a lockcore.ConflictError, Superseded), and the adapter starts it: it
	// then completes without running (ReasonSuperseded). Must not be nil.
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
// resumes anyone. Only jobs whose limit is 1 (WithLimit(1), the default, or
// WithLimitFunc's 1) are parked; their runs resume parked jobs, and so do
// the runs of every limit under WithLimitFunc.
func WithParking(p Parking) Option {
	return optionFunc(func(g *Guard) { g.parking, g.parkingSet = &p, true })
}

// WithTTL is middleware.WithTTL, which documents it.
func WithTTL(ttl time.Duration) Option { return optionFunc(func(g *Guard) { g.ttl = ttl }) }

// WithLogger is middleware.WithLogger, which documents it.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(g *Guard) { g.logger, g.loggerSet = l, true })
}

// WithObserver is middleware.WithObserver, which documents it.
func WithObserver(o Observer) Option {
	return optionFunc(func(g *Guard) { g.observers = append(g.observers, o) })
}

// Config is what an adapter reads of a built Guard's settings.
type Config struct {
	Policy       Policy
	Limit        int  // WithLimit; 1 under WithLimitFunc
	LimitFunc    bool // WithLimitFunc: each job's limit is its own
	ExtraKeys    bool // WithExtraKeys: each job holds keys of its own besides its key
	Shadow       bool
	Throttled    bool   // WithThrottle was given
	ThrottleThen Action // its then, when Throttled
	// Logger is the WithLogger value, or the Locker's logger.
	Logger *slog.Logger
}

// ConfigOf returns g's settings, defaults filled in.
func ConfigOf(g *Guard) Config {
	c := Config{Policy: g.policy, Limit: g.limit, LimitFunc: g.limitSet, ExtraKeys: g.extraSet, Shadow: g.shadow, Logger: g.logger}
	if g.throttle != nil {
		c.Throttled, c.ThrottleThen = true, g.throttle.then
	}
	return c
}
