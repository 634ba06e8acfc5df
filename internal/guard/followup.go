package guard

// Follow-ups (Coalesce, KeepNewest, Preempt), parking, the pass-on of a
// reserved key, the runtime's own check (WithAdmit), and a delivery that
// waits for its own earlier run.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// PassOn hands the key on from a parked job that cannot be started (see
// WithParking): it takes over the key's reservation carrying origin, the
// job's Label, and releases it, which reserves the key for the next parked
// job and resumes that one. It does nothing when the key is held otherwise
// (a run of that job or of another: that run's end passes the key on),
// without WithParking, and once the Locker is closed (the reservation ends
// with its hold). Errors are reported as EventError.
func PassOn(g *Guard, ctx context.Context, key, origin string) { g.passOn(ctx, key, origin) }

func (g *Guard) passOn(ctx context.Context, key, origin string) {
	p := g.parking
	if p == nil || key == "" || origin == "" {
		return
	}
	l, err := g.core.TryAcquire(ctx, key, &lockcore.AcquireOptions{TTL: g.ttl, Label: origin, TakeReservation: true,
		Park: &lockcore.Parking{OnParked: p.Resume}})
	if err != nil {
		if !errors.Is(err, lockcore.ErrNotAcquired) && !errors.Is(err, lockcore.ErrClosed) {
			g.emit(ctx, Event{Kind: EventError, Job: Job{Key: key, w: Work{Label: origin}}, Err: fmt.Errorf("middleware: pass on %q: %w", key, err)})
		}
		return
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, lockcore.ErrClosed) {
		g.emit(ctx, Event{Kind: EventError, Job: Job{Key: key, w: Work{Label: origin}}, Err: fmt.Errorf("middleware: pass on %q: %w", key, err)})
	}
}

// parks reports whether the policy parks a job whose key is held (with
// WithParking): Requeue's duplicates, and the follow-ups of Coalesce and
// KeepNewest. A Preempt follow-up waits: it must run as soon as the run it
// cancelled returns.
func (g *Guard) parks() bool {
	switch {
	case g.policy.mode == ModePreempt:
		return false
	case g.policy.mode == ModeCoalesce, g.policy.mode == ModeKeepNewest:
		return true
	}
	return ActionOf(g.policy) == ActionRequeue
}

// parkFollowUp takes the key for a Coalesce or KeepNewest job under
// WithParking, or parks the job as the key's follow-up instead of waiting
// for it: the job is reported with ActionRequeue and DuplicateError.Parked,
// and the run that frees the key resumes it. A KeepNewest job that takes the
// place of a parked follow-up names that one in its DuplicateError's Cause
// (lockcore.ConflictError.Superseded), for the adapter to start it: it then
// completes without running (ReasonSuperseded).
func (g *Guard) parkFollowUp(ctx context.Context, job Job, opt *lockcore.AcquireOptions) (*lockcore.Lease, time.Duration, error) {
	lease, err := g.core.TryAcquire(ctx, job.Key, opt)
	if err == nil {
		return lease, 0, nil
	}
	var ce *lockcore.ConflictError
	if !errors.As(err, &ce) || ce.Parked < 0 {
		return nil, 0, g.notAcquired(ctx, job, err, 0)
	}
	g.emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: ActionRequeue, Holder: ce.Owner, Err: ce})
	return nil, 0, &DuplicateError{Job: job, Reason: ReasonHeld, Action: ActionRequeue, Parked: true, Cause: ce}
}

// parked reports whether opt parks the job when its key is held.
func parked(opt *lockcore.AcquireOptions) bool { return opt.Park != nil && opt.Park.ID != "" }

// markParked sets Parked in err's DuplicateError when the acquire with opt
// parked the job.
func markParked(err error, opt *lockcore.AcquireOptions) error {
	var dup *DuplicateError
	if parked(opt) && errors.As(err, &dup) && dup.Reason == ReasonHeld && dup.Action == ActionRequeue {
		dup.Parked = true
	}
	return err
}

// followUp takes the key for a Coalesce, KeepNewest or Preempt job in one waiting
// call, bounded by ctx: the job either gives way (to a run that began after
// it, or to a newer follow-up) or waits for the key as its follow-up.
func (g *Guard) followUp(ctx context.Context, job Job, opt *lockcore.AcquireOptions) (*lockcore.Lease, time.Duration, error) {
	start := time.Now()
	lease, err := g.core.Acquire(ctx, job.Key, opt)
	waited := time.Since(start)
	switch {
	case err == nil:
		return lease, waited, nil // EventAcquired reports the wait
	case errors.Is(err, lockcore.ErrCovered), errors.Is(err, lockcore.ErrSuperseded), errors.Is(err, lockcore.ErrCompleted), errors.Is(err, lockcore.ErrEpochUsed):
		return nil, waited, g.notAcquired(ctx, job, err, waited)
	}
	err = fmt.Errorf("middleware: %s: waiting for %q: %w", job.what(), job.Key, err)
	g.emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
	return nil, waited, err
}

// admitJob makes the runtime's check of job (WithAdmit).
func (g *Guard) admitJob(ctx context.Context, job Job) error {
	err := g.admit(ctx, job)
	if err == nil {
		return nil
	}
	var dup *DuplicateError
	if errors.As(err, &dup) {
		dup.Job = job
		g.emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: dup.Action, Err: dup.Cause})
		return dup
	}
	err = fmt.Errorf("middleware: %s: %w", job.what(), err)
	g.emit(ctx, Event{Kind: EventError, Job: job, Err: err})
	return err
}

// ownRun reports whether err is a conflict with a run of the same work.
func ownRun(job Job, err error) bool {
	var ce *lockcore.ConflictError
	return job.w.Label != "" && errors.As(err, &ce) && ce.Label == job.w.Label
}

// errDoneBefore ends, as a run that did nothing (no HoldAtLeast hold), the
// lease of a job whose earlier run did its work (WithDone).
var errDoneBefore = errors.New("middleware: the work was done by an earlier run")

// errDoneUnknown ends, as a run that did nothing, the lease of a job whose
// runtime's record (WithDone) could not be read.
var errDoneUnknown = errors.New("middleware: whether an earlier run did the work is unknown")

// doneAfterFailedWait reads the runtime's record (WithDone) for job, whose
// wait for its own earlier run failed, bounded by a second of its own: ctx
// may be what ended the wait.
func (g *Guard) doneAfterFailedWait(ctx context.Context, job Job) bool {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	done, err := g.done(dctx, job)
	return err == nil && done
}

// unpark takes job's entry, made by an acquire with opt, out of its key's
// parked queue, bounded by a second of its own (ctx may have ended): the
// job's work is done. An error is reported as EventError; the entry then
// stays for the parked queue's retention.
func (g *Guard) unpark(ctx context.Context, job Job, opt *lockcore.AcquireOptions) {
	if !parked(opt) {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := g.core.Unpark(uctx, job.Key, opt); err != nil {
		g.emit(ctx, Event{Kind: EventError, Job: job, Err: fmt.Errorf("middleware: %s: giving up the place kept for %q: %w", job.what(), job.w.Label, err)})
	}
}

// awaitOwnRun waits, bounded by ctx only, for the earlier delivery of the same
// work to end: a delivery is never skipped as a duplicate of itself. When
// that run succeeded after the runtime delivered the work again, the
// runtime's record says so (WithDone) and the job completes without running;
// when that record cannot be read, the job fails without running.
func (g *Guard) awaitOwnRun(ctx context.Context, job Job, opt *lockcore.AcquireOptions) (*lockcore.Lease, time.Duration, error) {
	start := time.Now()
	lease, err := g.core.Acquire(ctx, job.Key, opt)
	waited := time.Since(start)
	if err == nil && g.done != nil {
		done, derr := g.done(ctx, job)
		switch {
		case derr != nil:
			_ = lease.Run(ctx, func(context.Context) error { return errDoneUnknown })
			err = fmt.Errorf("middleware: %s: reading whether the earlier run of %q did the work: %w", job.what(), job.w.Label, derr)
			g.emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
			return nil, waited, err
		case done:
			_ = lease.Run(ctx, func(context.Context) error { return errDoneBefore })
			err = fmt.Errorf("%w: %s: the earlier run of %q did the work", lockcore.ErrCompleted, job.what(), job.w.Label)
			return nil, waited, g.notAcquired(ctx, job, err, waited)
		}
	}
	switch {
	case err == nil:
		g.emit(ctx, Event{Kind: EventWaited, Job: job, Wait: waited})
		return lease, waited, nil
	case errors.Is(err, lockcore.ErrCompleted):
		return nil, waited, g.notAcquired(ctx, job, err, waited)
	case g.done != nil && g.doneAfterFailedWait(ctx, job):
		// The wait failed (a Redis error, ctx ended), but the earlier run
		// did the work meanwhile: the job is not to run at its next
		// delivery either, which need not wait for that run, and gives up
		// the place it took in the key's parked queue (an acquire that
		// takes the key or finds its Label completed gives it up itself).
		err = fmt.Errorf("%w: %s: the earlier run of %q did the work (%w)", lockcore.ErrCompleted, job.what(), job.w.Label, err)
		g.unpark(ctx, job, opt)
		return nil, waited, g.notAcquired(ctx, job, err, waited)
	}
	err = fmt.Errorf("middleware: %s: waiting for the earlier delivery of %q: %w", job.what(), job.w.Label, err)
	g.emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
	return nil, waited, err
}
