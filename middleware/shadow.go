package middleware

// WithShadow: every job runs, and what the policy would have done is
// reported.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// WithShadow runs every job: the guard decides as the policy would, and a
// job that the policy would not run now (its key is held by another run, its
// epoch claimed, or its Origin completed) runs anyway, without a lease, and
// is reported as an EventShadowed whose Action is what the policy would have
// done. A job whose key is free runs under its lease as usual, so that the
// jobs after it see the key held; so does a job the key is reserved for (a
// Job.Reserved job, or under WithParking a parked job resumed by a run
// with or without shadow), which takes the reservation over, and under
// WithParking a run's end hands the key to the next parked job, as without
// shadow; a Job.Reserved job that runs without a lease gives up, once it has
// run, the place kept for it in the key's parked queue and a reservation it
// could not take over (one more round trip). It is for rolling the guard out: watch what
// it would drop on real traffic, then remove the option. The decision is the
// key's (and the epoch's): a shadowed job does not wait, park, fold into a
// follow-up or spend a throttle start, so Wait, Coalesce, KeepNewest,
// Preempt and WithThrottle are reported as their first decision only, and
// WithThrottle is not applied. A job whose key is held by an earlier run of
// the same work (its Origin: asynq delivered the task again while that run
// went on) is no duplicate: it runs at once, without a lease, and is not
// reported. Under it a Redis error is an EventError and the job runs.
// Defaults to off.
func WithShadow() Option { return func(g *Guard) { g.shadow = true } }

// shadowRun runs job under WithShadow: under its lease when the key is
// free, and otherwise without one, reporting what the policy would have done.
func (g *Guard) shadowRun(ctx context.Context, job Job, fn func(context.Context) error) Outcome {
	// A job reserved for takes its reservation over, and the run's end
	// hands the key to the next parked job, as without shadow; nothing is
	// parked.
	lease, err := g.core.TryAcquire(ctx, job.Key, g.leaseOptions(ctx, job, false))
	if err == nil {
		return Outcome{Ran: true, Err: g.run(ctx, job, lease, 0, fn)}
	}
	e := Event{Kind: EventShadowed, Job: job, Action: g.policy.action, Err: err}
	var ce *lockcore.ConflictError
	switch {
	case errors.As(err, &ce) && job.Origin != "" && ce.Label == job.Origin:
		e = Event{} // its own earlier delivery: not a duplicate
	case errors.As(err, &ce):
		e.Holder = ce.Owner
	case errors.Is(err, lockcore.ErrEpochUsed):
		e.Action = ActionSkip
	case errors.Is(err, lockcore.ErrCompleted):
		e.Action = ActionSkip
	default:
		e.Kind, e.Action, e.Err = EventError, 0, fmt.Errorf("middleware: shadow: %q: %w; the job runs anyway", job.Key, err)
	}
	if e.Kind != 0 {
		g.Emit(ctx, e)
	}
	out := Outcome{Ran: true, Err: fn(ctx)}
	if e.Kind != 0 && job.Reserved && job.Origin != "" {
		// Its work ran: a place kept for it in the key's parked queue, or a
		// reservation it could not take over, would hold the key for work
		// that is done (lockkit: ForceRelease by Label gives up both).
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if _, ferr := g.core.ForceRelease(fctx, job.Key, lockcore.Select{Label: job.Origin}); ferr != nil {
			g.Emit(ctx, Event{Kind: EventError, Job: job, Err: fmt.Errorf("middleware: shadow: %q: giving up the place kept for %q: %w", job.Key, job.Origin, ferr)})
		}
		cancel()
	}
	return out
}
