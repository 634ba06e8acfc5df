package guard

// WithThrottle: a run's start is reserved or checked before the key is
// taken, dated when the run begins, and given back when the job does not run.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/throttle"
)

// errNotBegun ends the lease of a run that did not begin after all.
var errNotBegun = errors.New("middleware: the run did not begin")

// reserveStart reserves the run's throttle start before the job takes its
// key, or returns why the job does not run. A job that is put back when
// throttled (ActionRequeue) and has an Origin reserves in the turn of its
// Origin (throttle.Throttle.ReserveInTurn). A job that may wait for its key
// (Wait, Coalesce, KeepNewest, Preempt) reserves none: it is throttled now
// only if n runs began, and otherwise meets the throttle when its run
// begins.
func (g *Guard) reserveStart(ctx context.Context, job Job, a *attempt) error {
	a.start = throttle.ID(job.w.Label)
	var wait time.Duration
	var err error
	if g.policy.wait > 0 || g.policy.mode != ModeAction {
		wait, err = g.starts.Next(ctx, job.Key)
	} else {
		if g.throttle.then == ActionRequeue && job.w.Label != "" {
			a.turn = job.w.Label
			wait, err = g.reserveInTurn(ctx, job, a.start)
		} else {
			wait, err = g.starts.Reserve(ctx, job.Key, a.start)
		}
		a.reserved = err == nil && wait == 0
		if err != nil {
			g.returnStart(ctx, job, a.start) // in case it was reserved
		}
	}
	if err != nil {
		err = fmt.Errorf("middleware: %s: throttle %q: %w", job.what(), job.Key, err)
		g.emit(ctx, Event{Kind: EventError, Job: job, Err: err})
		return err
	}
	if wait > 0 && !g.ownRunHolds(ctx, job) {
		return g.throttled(ctx, job, wait, 0)
	}
	return nil
}

// ownRunHolds reports whether a run of an earlier delivery of job's work
// (its Origin) holds its key: the budget it finds spent may be that run's
// own start, and job is that run's retry, which waits for it (awaitOwnRun)
// and takes that start over (beginStart). A reservation with job's label
// (lockkit Holder.Reserved: one a release made for a parked job, or one
// the job holds from its enqueue) is no run: a job throttled with it keeps
// it (it is put back in its place). Read only when job would be throttled;
// a key that cannot be read counts as not held.
func (g *Guard) ownRunHolds(ctx context.Context, job Job) bool {
	if job.w.Label == "" {
		return false
	}
	info, err := g.core.Inspect(ctx, job.Key)
	if err != nil {
		return false
	}
	for _, h := range info.Holders {
		if h.Label == job.w.Label && !h.Reserved {
			return true
		}
	}
	return false
}

// turnWait bounds how long a job reserving in its turn waits for the start
// instead of being put back: a runtime that schedules in whole seconds and
// polls for due work (asynq) brings it back a second or more later, after
// the turns behind it. Refusals that short come from deliveries of one
// moment racing by milliseconds.
const turnWait = 250 * time.Millisecond

// reserveInTurn reserves the start of a job that is put back when
// throttled in the turn of its Origin: the deliveries of a burst refused
// together are told distinct turns, each when its own start opens. A start
// opening within turnWait is waited for.
func (g *Guard) reserveInTurn(ctx context.Context, job Job, id string) (time.Duration, error) {
	for tries := 0; ; tries++ {
		wait, err := g.starts.ReserveInTurn(ctx, job.Key, id, job.w.Label)
		if err != nil || wait == 0 || wait > turnWait || tries == 3 {
			return wait, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return wait, nil
		}
	}
}

// beginStart takes the run's throttle start as its run begins, dated now:
// the start it reserved, or a new one if the budget allows. A job that
// waited for its own earlier run (a.own) is that run's retry: it takes over
// the start of the earlier delivery, if that one is still spent or
// reserved (it ran, runs, or is yet to give it back), and otherwise takes
// a new one, in its turn if it booked one. Otherwise it ends lease, taken
// after waiting for waited, as a run that did nothing (no HoldAtLeast, no
// success) and returns why the job does not run.
func (g *Guard) beginStart(ctx context.Context, job Job, lease *lockcore.Lease, a *attempt, waited time.Duration) error {
	t := g.throttle
	var wait time.Duration
	var err error
	if a.own {
		// A new id: a late give-back of the start it reserved before it
		// waited must not find the one it takes now.
		a.start = throttle.ID(job.w.Label)
		wait, err = g.starts.TakeOver(ctx, job.Key, a.start, a.turn)
	} else {
		wait, err = g.starts.Start(ctx, job.Key, a.start)
	}
	if err == nil && wait == 0 {
		a.reserved = false
		return nil
	}
	_ = lease.Run(ctx, func(context.Context) error { return errNotBegun })
	if err != nil {
		// In case it was taken: give it back; but not a start that may be
		// the earlier run's, taken over: it counts until it leaves the
		// window.
		a.reserved = !a.own
		err = fmt.Errorf("middleware: %s: throttle %q: %w", job.what(), job.Key, err)
		g.emit(ctx, Event{Kind: EventError, Job: job, Wait: waited, Err: err})
		return err
	}
	action := t.then
	if g.policy.mode != ModeAction {
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
	g.emit(ctx, Event{Kind: EventDuplicate, Job: job, Action: action, Delay: wait, Wait: waited, Err: dup.Cause})
	return dup
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
	if err := g.starts.Return(rctx, job.Key, id); err != nil {
		g.emit(ctx, Event{Kind: EventError, Job: job, Err: fmt.Errorf("middleware: %s: return throttle start %q: %w", job.what(), job.Key, err)})
	}
}
