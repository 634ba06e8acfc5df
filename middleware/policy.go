package middleware

// What happens to a job whose key is held: the Policy values, the actions
// they take, and the DuplicateError a job that does not run reports.

import (
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/lockkit"
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

// String returns "skip", "requeue" or "fail".
func (a Action) String() string {
	if a > 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

var actionNames = [...]string{"", "skip", "requeue", "fail"}

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
