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

// Event kinds reported to observers, documented in package middleware.
const (
	EventAcquired EventKind = iota + 1
	EventWaited
	EventDuplicate
	EventRequeued
	EventClaimed
	EventLost
	EventReleased
	EventError
	EventPreempted
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
