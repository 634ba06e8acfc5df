package guard

// WithShadow: every job runs, and what the policy would have done is
// reported.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// WithShadow is middleware.WithShadow, which documents it.
func WithShadow() Option { return optionFunc(func(g *Guard) { g.shadow = true }) }

// shadowRun runs job under WithShadow: under its lease when the key is
// free, and otherwise without one, reporting what the policy would have done.
func (g *Guard) shadowRun(ctx context.Context, job Job, keys []extraKey, fn func(context.Context) error) Outcome {
	// A job reserved for takes its reservation over, and the run's end
	// hands the key to the next parked job, as without shadow; nothing is
	// parked.
	lease, err := g.core.TryAcquire(ctx, job.Key, g.leaseOptions(ctx, job, false))
	var extra []*lockcore.Lease
	if err == nil && len(keys) > 0 {
		// A full extra key gives every key back: the job runs without them.
		extra, _, err = g.takeExtra(ctx, job, keys, lease)
	}
	if err == nil {
		return Outcome{Ran: true, Err: g.run(ctx, job, lease, extra, 0, fn)}
	}
	e := Event{Kind: EventShadowed, Job: job, Action: g.policy.action, Err: err}
	var ce *lockcore.ConflictError
	switch {
	case errors.As(err, &ce) && job.w.Label != "" && ce.Label == job.w.Label:
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
		g.emit(ctx, e)
	}
	out := Outcome{Ran: true, Err: fn(ctx)}
	if e.Kind != 0 && job.w.Reserved && job.w.Label != "" {
		// Its work ran: a place kept for it in the key's parked queue, or a
		// reservation it could not take over, would hold the key for work
		// that is done (lockkit: ForceRelease by Label gives up both).
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if _, ferr := g.core.ForceRelease(fctx, job.Key, lockcore.Select{Label: job.w.Label}); ferr != nil {
			g.emit(ctx, Event{Kind: EventError, Job: job, Err: fmt.Errorf("middleware: shadow: %q: giving up the place kept for %q: %w", job.Key, job.w.Label, ferr)})
		}
		cancel()
	}
	return out
}
