package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// EventKind names what happened to a guarded job.
type EventKind int

// Event kinds reported to observers.
const (
	// EventAcquired: the job took its lease and is about to run (Event.Token).
	EventAcquired EventKind = iota + 1
	// EventWaited: the job waited for its key (Event.Wait) and then took it.
	EventWaited
	// EventDuplicate: the key was held by another run; Event.Action says what
	// happens to the job and Event.Holder who holds the key.
	EventDuplicate
	// EventRequeued: an adapter put a duplicate back to run later.
	EventRequeued
	// EventClaimed: the job's epoch was already claimed (it ran elsewhere);
	// the job is skipped.
	EventClaimed
	// EventLost: the lease was lost while the job ran; its ctx was cancelled
	// (Event.Err matches lockkit.ErrLost). A preemption is EventPreempted.
	EventLost
	// EventReleased: the job returned or panicked (Event.Err is its error,
	// Event.Duration its run time) and the lease was released.
	EventReleased
	// EventError: the job could not be guarded (bad key, Redis error), or it
	// panicked, or its release failed.
	EventError
	// EventPreempted: a newer job of the key preempted the running one
	// (ModePreempt), as asked; its ctx was cancelled with a cause
	// matching ErrPreempted. It is not an EventLost.
	EventPreempted
	// EventShadowed: under WithShadow, the job ran without a lease although
	// the policy would not have run it now; Event.Action is what the policy
	// would have done, Event.Holder who held the key, Event.Err the conflict.
	// An adapter reports with ActionFail a job it would have refused before
	// the policy had a say (singleton: a key that cannot be derived, say),
	// Event.Err the refusal.
	EventShadowed
)

var kindNames = [...]string{"", "acquired", "waited", "duplicate", "requeued", "claimed", "lost", "released", "error", "preempted", "shadowed"}

// String returns the kind in lower case, such as "duplicate".
func (k EventKind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one thing that happened to a guarded job.
type Event struct {
	Kind EventKind
	Job  Job
	// Action is what happens to a duplicate (EventDuplicate, EventClaimed).
	Action Action
	// Holder is the owner id of the run holding the key (EventDuplicate).
	Holder string
	// Token is the lease's fencing token (EventAcquired, EventLost,
	// EventPreempted, EventReleased).
	Token int64
	// Wait is how long the job waited for its key.
	Wait time.Duration
	// Duration is how long the job ran (EventReleased).
	Duration time.Duration
	// Delay is when a requeued job runs again (EventRequeued).
	Delay time.Duration
	// Err is the failure, the job's error, or the conflict.
	Err error
}

// Observer receives a guard's events synchronously; it must be fast.
type Observer func(ctx context.Context, e Event)

// logObserver returns an Observer that logs to l: EventLost, EventError and
// an EventReleased whose job failed at Warn, except a preemption
// (EventPreempted, ErrPreempted, ModePreempt), which is asked for
// and logged at Info; everything else at Debug.
func logObserver(l *slog.Logger) Observer {
	return func(ctx context.Context, e Event) {
		lvl := slog.LevelDebug
		if e.Kind == EventShadowed {
			lvl = slog.LevelInfo
		}
		if e.Kind == EventLost || e.Kind == EventPreempted || e.Kind == EventError || (e.Kind == EventReleased && e.Err != nil) {
			lvl = slog.LevelWarn
			if errors.Is(e.Err, lockcore.ErrPreempted) {
				lvl = slog.LevelInfo
			}
		}
		if !l.Enabled(ctx, lvl) {
			return
		}
		attrs := []slog.Attr{slog.String("key", e.Job.Key)}
		if e.Job.Name != "" {
			attrs = append(attrs, slog.String("job", e.Job.Name))
		}
		if e.Job.ID != "" {
			attrs = append(attrs, slog.String("id", e.Job.ID))
		}
		if e.Action != 0 {
			attrs = append(attrs, slog.String("action", e.Action.String()))
		}
		if e.Holder != "" {
			attrs = append(attrs, slog.String("holder", e.Holder))
		}
		if e.Token != 0 {
			attrs = append(attrs, slog.Int64("token", e.Token))
		}
		if e.Wait != 0 {
			attrs = append(attrs, slog.Duration("wait", e.Wait))
		}
		if e.Duration != 0 {
			attrs = append(attrs, slog.Duration("duration", e.Duration))
		}
		if e.Delay != 0 {
			attrs = append(attrs, slog.Duration("delay", e.Delay))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.String("err", e.Err.Error()))
		}
		l.LogAttrs(ctx, lvl, "jobguard: "+e.Kind.String(), attrs...)
	}
}
