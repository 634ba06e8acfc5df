package singleton

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/middleware"
)

// IsFailure returns an asynq.Config.IsFailure that reports a duplicate put back
// by Requeue as no failure, so that asynq neither increments its Retried count
// nor counts it in the queue's failure stats, and asks next about every other
// error. A nil next means asynq's default (every non-nil error is a failure).
//
// Without it a requeued duplicate that still has retries left is retried as a
// failure and uses one retry; once none is left Requeue enqueues a copy, so it
// is still never archived for being a duplicate.
func IsFailure(next func(error) bool) func(error) bool {
	return func(err error) bool {
		if isRequeue(err) {
			return false
		}
		if next == nil {
			return err != nil
		}
		return next(err)
	}
}

// RetryDelay returns an asynq.Config.RetryDelayFunc that retries a duplicate
// put back by Requeue after the policy's delay plus jitter
// (middleware.DuplicateError.RequeueIn), and asks next about every other
// error. A nil next means asynq.DefaultRetryDelayFunc.
//
// asynq moves due retries back to their queue every
// asynq.Config.DelayedTaskCheckInterval (5s by default) and schedules them in
// whole seconds, so a shorter requeue delay waits that long.
func RetryDelay(next asynq.RetryDelayFunc) asynq.RetryDelayFunc {
	return func(n int, err error, t *asynq.Task) time.Duration {
		var dup *middleware.DuplicateError
		if errors.As(err, &dup) && dup.Action == middleware.ActionRequeue {
			return dup.RequeueIn
		}
		if next == nil {
			return asynq.DefaultRetryDelayFunc(n, err, t)
		}
		return next(n, err, t)
	}
}

func isRequeue(err error) bool {
	var dup *middleware.DuplicateError
	return errors.As(err, &dup) && dup.Action == middleware.ActionRequeue
}

// requeue puts a duplicate back to run after dup.RequeueIn. While the task has
// retries left it returns dup, which asynq retries (IsFailure and RetryDelay
// make that retry free and timed by the policy). With none left a retry would
// archive the task, so it enqueues a copy and revokes the original.
func (m *guarded) requeue(ctx context.Context, t *asynq.Task, dup *middleware.DuplicateError) error {
	retried, ok := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	id, ok3 := asynq.GetTaskID(ctx)
	queue, ok4 := asynq.GetQueueName(ctx)
	if !ok || !ok2 || !ok3 || !ok4 || ctx.Err() != nil {
		// Not called by a server, or the server is already handling the task
		// itself (shutdown or deadline): there is nothing to put back.
		return dup
	}
	if retried < maxRetry {
		m.guard.Emit(ctx, middleware.Event{Kind: middleware.EventRequeued, Job: dup.Job, Delay: dup.RequeueIn})
		return dup
	}
	copyID, err := m.enqueueCopy(ctx, t, id, queue, dup.RequeueIn)
	if err != nil {
		err = fmt.Errorf("singleton: task %q (id %s): re-enqueue duplicate: %w (%w)", t.Type(), id, err, dup)
		m.guard.Emit(ctx, middleware.Event{Kind: middleware.EventError, Job: dup.Job, Err: err})
		return err
	}
	m.guard.Emit(ctx, middleware.Event{Kind: middleware.EventRequeued, Job: dup.Job, Delay: dup.RequeueIn})
	return fmt.Errorf("%w; re-enqueued as task %s (%w)", dup, copyID, asynq.RevokeTask)
}

// enqueueCopy enqueues a copy of the active task id to run after delay, with
// the options that shape its processing. The copy gets a new ID (the original
// still exists until it is revoked) and no Unique lock (the original's is
// released when it is revoked); its headers carry OriginHeader.
func (m *guarded) enqueueCopy(ctx context.Context, t *asynq.Task, id, queue string, delay time.Duration) (string, error) {
	info, err := m.inspector.GetTaskInfo(queue, id)
	if err != nil {
		return "", fmt.Errorf("read task options: %w", err)
	}
	opts := []asynq.Option{
		asynq.Queue(queue),
		asynq.MaxRetry(max(info.MaxRetry-info.Retried, 0)),
		asynq.ProcessIn(delay),
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
	if headers[OriginHeader] == "" {
		headers[OriginHeader] = id
	}
	copied, err := m.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers), opts...)
	if err != nil {
		return "", err
	}
	return copied.ID, nil
}
