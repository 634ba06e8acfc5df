package guard

// What happens to a job whose key is held: the Policy values, the actions
// they take, and the DuplicateError a job that does not run reports.

import (
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// Action is what happens to a job whose key is held.
type Action int

// Actions of a Policy, documented in package middleware.
const (
	ActionSkip Action = iota + 1
	ActionRequeue
	ActionFail
)

// String returns "skip", "requeue" or "fail".
func (a Action) String() string {
	if a > 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

var actionNames = [...]string{"", "skip", "requeue", "fail"}

// Mode is what a policy does with a job whose key is held: one of a closed
// set, chosen by the constructor that made the policy.
type Mode int

// Modes of a Policy.
const (
	// ModeAction: the policy's Action applies (skip, requeue or fail), after
	// the job waited for the key if the policy waits (Wait, WaitInOrder).
	ModeAction Mode = iota
	// ModeCoalesce: the job gives way to a run of its key that began after
	// it (after Run was called: the delivery, which is after the enqueue):
	// it completes without running (ReasonCovered, ActionSkip) when such a
	// run succeeded, is running, or is pending as the key's follow-up. Any
	// other job waits for the key, bounded by its ctx only, and runs as the
	// key's one follow-up; a job whose wait ends with its ctx fails with an
	// error that is not a duplicate, so the runtime retries it. Under
	// WithParking a job with an Origin parks as that follow-up instead of
	// waiting.
	ModeCoalesce
	// ModeKeepNewest: a job whose key is held waits, bounded by its ctx
	// only, as the key's one follow-up, the newest: a later job takes its
	// place, and the job it replaces completes without running
	// (ReasonSuperseded, ActionSkip). "Later" is by Job.Order when both jobs
	// have one, else by arrival at Redis. Under WithParking a job with an
	// Origin parks as that follow-up instead of waiting.
	ModeKeepNewest
	// ModePreempt: a job cancels the run that holds its key: that run's ctx
	// is cancelled with a cause matching ErrPreempted (and
	// lockkit.ErrLost), its lease is no longer renewed and its fencing token
	// is superseded by this job's; the run is reported as EventPreempted,
	// not EventLost. The job waits, bounded by its ctx only, as the key's
	// one follow-up, the newest (as under ModeKeepNewest), and runs once the
	// preempted run has returned, or after the policy's Grace if that comes
	// first.
	ModePreempt
)

// Policy says what happens when a job's key is held by another run. It is
// built only by its constructors (Skip, Fail, Requeue, Wait, WaitInOrder,
// Coalesce, KeepNewest, Preempt), so a combination that cannot work cannot be
// written; its zero value is Skip().
type Policy struct {
	mode   Mode
	action Action
	delay  time.Duration // ActionRequeue's base delay
	wait   time.Duration // how long a job waits for the key before action applies
	fair   bool          // waiting jobs take the key in arrival order
	grace  time.Duration // ModePreempt's grace
	bad    string        // why Wait or WaitInOrder made a policy New refuses
}

// ModeOf returns what p does with a job whose key is held.
func ModeOf(p Policy) Mode { return p.mode }

// ActionOf returns what happens to a duplicate under ModeAction (after its
// wait, if any): skip, requeue or fail. Under the other modes a job that does
// not run completes without running (ActionSkip).
func ActionOf(p Policy) Action {
	if p.action == 0 {
		return ActionSkip
	}
	return p.action
}

// DelayOf returns the base delay of p's ActionRequeue (up to 50% jitter is
// added): DefaultRequeueDelay unless Requeue was given another.
func DelayOf(p Policy) time.Duration {
	if p.delay == 0 {
		return DefaultRequeueDelay
	}
	return p.delay
}

// Preempt is middleware.Preempt, which documents it.
func Preempt(grace time.Duration) Policy {
	return Policy{mode: ModePreempt, action: ActionSkip, grace: grace}
}

// KeepNewest is middleware.KeepNewest, which documents it.
func KeepNewest() Policy { return Policy{mode: ModeKeepNewest, action: ActionSkip} }

// String writes the policy the way it is built: "Skip()", "Requeue(1s)",
// "Wait(10s, Fail())", "WaitInOrder(10s, Skip())", "Coalesce()".
func (p Policy) String() string {
	switch p.mode {
	case ModeCoalesce:
		return "Coalesce()"
	case ModeKeepNewest:
		return "KeepNewest()"
	case ModePreempt:
		return fmt.Sprintf("Preempt(%s)", p.grace)
	}
	var s string
	switch p.action {
	case 0, ActionSkip:
		s = "Skip()"
	case ActionRequeue:
		s = fmt.Sprintf("Requeue(%s)", p.delay)
	case ActionFail:
		s = "Fail()"
	default:
		s = fmt.Sprintf("Policy(%s)", p.action)
	}
	switch {
	case p.fair:
		s = fmt.Sprintf("WaitInOrder(%s, %s)", p.wait, s)
	case p.wait != 0 || p.bad != "":
		s = fmt.Sprintf("Wait(%s, %s)", p.wait, s)
	}
	return s
}

// Coalesce is middleware.Coalesce, which documents it.
func Coalesce() Policy { return Policy{mode: ModeCoalesce, action: ActionSkip} }

// Skip is middleware.Skip, which documents it.
func Skip() Policy { return Policy{action: ActionSkip} }

// Fail is middleware.Fail, which documents it.
func Fail() Policy { return Policy{action: ActionFail} }

// Requeue is middleware.Requeue, which documents it.
func Requeue(delay time.Duration) Policy {
	return Policy{action: ActionRequeue, delay: delay}
}

// Wait is middleware.Wait, which documents it.
func Wait(max time.Duration, then Policy) Policy {
	switch {
	case then.mode != ModeAction:
		then.bad = "only Skip, Requeue and Fail take a Wait: " + then.String() + " waits for its turn itself"
	case then.wait != 0:
		then.bad = "then waits already: " + then.String()
	case max <= 0:
		then.bad = fmt.Sprintf("the wait %s must be positive", max)
	}
	then.wait = max
	return then
}

// WaitInOrder is middleware.WaitInOrder, which documents it.
func WaitInOrder(max time.Duration, then Policy) Policy {
	p := Wait(max, then)
	p.fair = true
	return p
}

func (p Policy) validate() error {
	switch {
	case p.bad != "" && p.fair:
		return fmt.Errorf("%w: WithPolicy: WaitInOrder: %s", ErrInvalid, p.bad)
	case p.bad != "":
		return fmt.Errorf("%w: WithPolicy: Wait: %s", ErrInvalid, p.bad)
	case p.action < 0 || int(p.action) >= len(actionNames):
		return fmt.Errorf("%w: WithPolicy(%s): unknown action %d", ErrInvalid, p, int(p.action))
	case p.delay < 0 || p.delay > lockcore.MaxTTL:
		return fmt.Errorf("%w: WithPolicy(%s): the requeue delay must not be negative nor longer than %s", ErrInvalid, p, lockcore.MaxTTL)
	case p.grace < 0 || p.grace > lockcore.MaxTTL:
		return fmt.Errorf("%w: WithPolicy(%s): the grace must not be negative nor longer than %s", ErrInvalid, p, lockcore.MaxTTL)
	}
	return nil
}

// Reason tells why a job did not run.
type Reason int

// Reasons of a DuplicateError, documented in package middleware.
const (
	ReasonHeld Reason = iota + 1
	ReasonClaimed
	ReasonSuperseded
	ReasonThrottled
	ReasonCovered
	ReasonCompleted
)

// DuplicateError is returned by Guard.Run when the work did not run. It
// matches ErrDuplicate and, for ReasonHeld, lockkit.ErrNotAcquired; Reason
// tells why it did not run.
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
	// Cause is the lease's error: a *lockkit.ConflictError (naming the
	// holder), or the refusal of a claimed epoch (ReasonClaimed), a
	// completed or covered work (ReasonCompleted, ReasonCovered).
	Cause error
}

// Error implements error.
func (e *DuplicateError) Error() string {
	switch e.Reason {
	case ReasonClaimed:
		return fmt.Sprintf("middleware: duplicate %s (key %q): already claimed: %v", e.Job.what(), e.Job.Key, e.Cause)
	case ReasonCompleted:
		return fmt.Sprintf("middleware: duplicate %s (key %q): delivery of %q that completed already: %v", e.Job.what(), e.Job.Key, e.Job.w.Label, e.Cause)
	case ReasonCovered:
		return fmt.Sprintf("middleware: duplicate %s (key %q): covered: %v", e.Job.what(), e.Job.Key, e.Cause)
	case ReasonSuperseded:
		if e.Cause != nil && !errors.Is(e.Cause, lockcore.ErrSuperseded) {
			return fmt.Sprintf("middleware: duplicate %s (key %q): superseded: %v", e.Job.what(), e.Job.Key, e.Cause)
		}
		return fmt.Sprintf("middleware: duplicate %s (key %q): a newer follow-up took its place", e.Job.what(), e.Job.Key)
	case ReasonThrottled:
		return fmt.Sprintf("middleware: %s (key %q) throttled, %s: next start in %s", e.Job.what(), e.Job.Key, e.Action, e.RetryAfter)
	}
	return fmt.Sprintf("middleware: duplicate %s (key %q), %s: %v", e.Job.what(), e.Job.Key, e.Action, e.Cause)
}

// Is reports whether target is ErrDuplicate.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// Unwrap returns the lockkit error.
func (e *DuplicateError) Unwrap() error { return e.Cause }
