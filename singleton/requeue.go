package singleton

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/middleware"
)

// isFailure returns an asynq.Config.IsFailure that reports a duplicate put back
// by Requeue as no failure, so that asynq neither increments its Retried count
// nor counts it in the queue's failure stats, and asks next about every other
// error. A nil next means asynq's default (every non-nil error is a failure).
// ServerConfig sets it and retryDelay in one call.
//
// Without it a requeued duplicate that still has retries left is retried as a
// failure and uses one retry; once none is left Requeue enqueues a copy, so it
// is still never archived for being a duplicate.
func isFailure(next func(error) bool) func(error) bool {
	return func(err error) bool {
		if re, ok := requeueOf(err); ok {
			re.saw(func(h *hookCheck) *atomic.Bool { return &h.isFailure }, func(s *putBackSeen) *atomic.Bool { return &s.isFailure })
			return false
		}
		if next == nil {
			return err != nil
		}
		return next(err)
	}
}

// RequeueError is what the middleware returns for a duplicate that Requeue
// puts back: it wraps the *middleware.DuplicateError (so it matches
// middleware.ErrDuplicate) and carries the delay after which the duplicate
// runs again.
type RequeueError struct {
	Duplicate *middleware.DuplicateError
	// Delay is the policy's RequeueDelay plus up to 50% jitter, so that
	// duplicates put back together do not all come back at once. For a
	// throttled task it is the wait for its turn's start, rounded up to a
	// whole second of the clock.
	Delay time.Duration

	hooks *hookCheck   // of the middleware that returned it, told when a hook sees it
	seen  *putBackSeen // when this put back is checked, told when a hook sees it
}

// Error implements error.
func (e *RequeueError) Error() string {
	return fmt.Sprintf("%v; runs again in %s", e.Duplicate, e.Delay.Round(time.Millisecond))
}

// Unwrap returns the duplicate.
func (e *RequeueError) Unwrap() error { return e.Duplicate }

// requeueOf returns the *RequeueError in err, if any.
func requeueOf(err error) (*RequeueError, bool) {
	var re *RequeueError
	return re, errors.As(err, &re)
}

// retryDelay returns an asynq.Config.RetryDelayFunc that retries a duplicate
// put back by Requeue after its RequeueError.Delay, and asks next about every
// other error. A nil next means asynq.DefaultRetryDelayFunc.
//
// asynq moves due retries back to their queue every
// asynq.Config.DelayedTaskCheckInterval (5s by default) and schedules them in
// whole seconds, so a shorter requeue delay waits that long.
func retryDelay(next asynq.RetryDelayFunc) asynq.RetryDelayFunc {
	return func(n int, err error, t *asynq.Task) time.Duration {
		if re, ok := requeueOf(err); ok {
			re.saw(func(h *hookCheck) *atomic.Bool { return &h.retryDelay }, func(s *putBackSeen) *atomic.Bool { return &s.retryDelay })
			return re.Delay
		}
		if next == nil {
			return asynq.DefaultRetryDelayFunc(n, err, t)
		}
		return next(n, err, t)
	}
}

// requeue puts a duplicate back to run after the policy's delay plus jitter.
// While the task has retries left it returns a *RequeueError, which asynq
// retries (isFailure and retryDelay make that retry free and timed by the
// policy). With none left a retry would archive the task, so it enqueues a
// copy and revokes the original. Either way the put back is added to the
// decision log (logPutBack).
func (m *guarded) requeue(ctx context.Context, t *asynq.Task, dup *guard.DuplicateError) error {
	p := guard.PolicyOf(m.guard)
	d := guard.DelayOf(p)
	re := &RequeueError{Duplicate: dup, Delay: d + rand.N(d/2+1)}
	switch {
	case dup.Reason == guard.ReasonThrottled:
		re.Delay = wholeSeconds(dup.RetryAfter) // when the key's next start opens
	case dup.Parked && (guard.ModeOf(p) == guard.ModeCoalesce || guard.ModeOf(p) == guard.ModeKeepNewest):
		// A parked follow-up has no delay of its own: the run that frees
		// the key starts it, and it comes back by itself only as the
		// backstop.
		re.Delay = parkBackstop
	}
	var ce *lockcore.ConflictError
	if dup.Parked && errors.As(dup.Cause, &ce) {
		re.Delay = parkedDelay(re.Delay, ce)
		if ce.Superseded != "" && m.inspector != nil {
			// This follow-up took the place of a parked one (KeepNewest):
			// started now, that one completes without running.
			m.resume(dup.Job.Key, ce.Superseded)
		}
	}
	retried, ok := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	id, ok3 := asynq.GetTaskID(ctx)
	queue, ok4 := asynq.GetQueueName(ctx)
	if !ok || !ok2 || !ok3 || !ok4 || ctx.Err() != nil {
		// Not called by a server, or the server is already handling the task
		// itself (shutdown or deadline): there is nothing to put back.
		return re
	}
	if retried < maxRetry {
		guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventRequeued, Job: dup.Job, Delay: re.Delay})
		m.putBack(ctx, re, queue, id)
		m.logPutBack(ctx, t, re)
		return re
	}
	if m.inspector == nil {
		// Without WithRedis no copy can be made (a throttled follow-up is
		// put back whatever the throttle's action): asynq archives the task,
		// which stays visible.
		err := fmt.Errorf("singleton: task %q (id %s) has no retries left and cannot be put back without WithRedis: %w", t.Type(), id, dup)
		guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventError, Job: dup.Job, Err: err})
		return err
	}
	copyID, err := m.enqueueCopy(ctx, t, id, queue, re.Delay)
	if err != nil {
		err = fmt.Errorf("singleton: task %q (id %s): re-enqueue duplicate: %w (%w)", t.Type(), id, err, dup)
		guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventError, Job: dup.Job, Err: err})
		return err
	}
	guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventRequeued, Job: dup.Job, Delay: re.Delay})
	m.logPutBack(ctx, t, re)
	return fmt.Errorf("%w; re-enqueued as task %s (%w)", re, copyID, asynq.RevokeTask)
}

// wholeSeconds returns d, from now, rounded up to the next whole second of
// the clock (see wholeSecond): a throttled task put back for d would
// otherwise come back before the start it waits for opens, and be put back
// again.
func wholeSeconds(d time.Duration) time.Duration {
	now := time.Now()
	return wholeSecond(now.Add(d)).Sub(now)
}

// wholeSecond returns t rounded up to a whole second of the clock: asynq
// dates a retry or a scheduled task in whole seconds, rounded down, so a
// task due at t would otherwise run up to a second early.
func wholeSecond(t time.Time) time.Time {
	if s := t.Truncate(time.Second); s.Before(t) {
		return s.Add(time.Second)
	}
	return t
}

// nameCopy names copyID the latest copy of the work first enqueued as
// origin in queue, for ttl, keeping the copy it replaces (nameCopyCmd).
func nameCopy(ctx context.Context, rdb redis.UniversalClient, queue, origin, copyID string, ttl time.Duration) error {
	err := nameCopyCmd.Run(ctx, rdb, []string{asynqkey.Copy(queue, origin)}, copyID, ttl.Milliseconds()).Err()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// enqueueCopy enqueues a copy of the active task id to run after delay, with
// the options that shape its processing. The copy gets an ID of its own
// (newCopyID), named by asynqkey.Copy before it is enqueued, and no Unique lock
// (the original's is released when it is revoked); its headers carry
// asynqkey.LabelHeader and copyHeader.
func (m *guarded) enqueueCopy(ctx context.Context, t *asynq.Task, id, queue string, delay time.Duration) (string, error) {
	info, err := m.inspector.GetTaskInfo(queue, id)
	if err != nil {
		return "", fmt.Errorf("read task options: %w", err)
	}
	origin := t.Headers()[asynqkey.LabelHeader]
	if origin == "" {
		origin = id
	}
	// The copy's ID is chosen here, so that a conflict on it can only be
	// an earlier run of this enqueue that go-redis sent again after a lost
	// reply: the copy is there (it carries this enqueue's copyHeader).
	copyID := newCopyID(origin)
	opts := []asynq.Option{
		asynq.Queue(queue),
		asynq.MaxRetry(max(info.MaxRetry-info.Retried, 0)),
		asynq.ProcessIn(delay),
		asynq.TaskID(copyID),
	}
	if info.Timeout > 0 {
		opts = append(opts, asynq.Timeout(info.Timeout))
	}
	if !info.Deadline.IsZero() {
		opts = append(opts, asynq.Deadline(info.Deadline))
	}
	if info.Retention > 0 {
		opts = append(opts, asynq.Retention(info.Retention))
	}
	headers := maps.Clone(t.Headers())
	if headers == nil {
		headers = make(map[string]string, 1)
	}
	headers[asynqkey.LabelHeader] = origin
	headers[copyHeader] = newTaskID()
	if err := nameCopy(ctx, m.rdb, queue, origin, copyID, delay+copyKeep); err != nil {
		return "", fmt.Errorf("name the copy %s: %w", copyID, err)
	}
	_, err = m.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers), opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		other, ierr := m.inspector.GetTaskInfo(queue, copyID)
		switch {
		case ierr == nil && other.Headers[copyHeader] == headers[copyHeader]:
			err = nil
		case ierr == nil:
			err = fmt.Errorf("the copy's ID %s is taken by another task (%s): %w", copyID, other.State, err)
		}
	}
	if err != nil {
		return "", err
	}
	return copyID, nil
}

// parkedDelay is when a parked duplicate of a Requeue policy whose delay
// (with jitter) is d comes back by itself: the run that frees the key
// starts it, so coming back is only the backstop for a run that ended
// without its release (its process died). The next in line comes back d
// after the holder's lease runs out unless renewed, the first moment it
// could find the key free (at most parkBackstop); the others after
// parkBackstop: should the holder die, the next in line takes the key and
// its release resumes them. A task that came back every d instead would be
// delivered once more for each d it waits: with many tasks parked per key,
// those deliveries, each put back, take the workers from the runs.
// Under WithHoldAtLeast a run shorter than the hold ends in a held release,
// which frees the key at the hold's end: its Locker resumes the next in line
// then, and the holder's TTL the conflict reports is the hold left.
func parkedDelay(d time.Duration, ce *lockcore.ConflictError) time.Duration {
	if ce.Parked > 0 {
		return max(d, parkBackstop)
	}
	return max(d, min(ce.TTL+d, parkBackstop))
}
