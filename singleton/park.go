package singleton

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

const (
	// resumeTimeout bounds how long resuming a parked task may take,
	// including the wait for asynq to put the task back to retry after its
	// duplicate delivery returned.
	resumeTimeout = time.Second
	// resumeMissing bounds the wait for a requeued copy to be enqueued.
	resumeMissing = 100 * time.Millisecond
	// ParkBackstop bounds the requeue delay of a parked duplicate. The run
	// that frees its key starts it (unless that run's process dies, or the
	// holder's lease expires without a release), so the delay is only a
	// backstop: for the next in line, the policy's delay after the holder's
	// lease would run out unrenewed (at most ParkBackstop), for the others
	// ParkBackstop (and at least the policy's delay); under WithHoldAtLeast,
	// whose runs shorter than the hold free the key without resuming anyone,
	// the policy's delay times one more than its place. The key stays
	// reserved for a resumed task for up to ParkBackstop, however many tasks
	// are ahead of it in its asynq queue.
	ParkBackstop = 30 * time.Second
)

// parking is the middleware.Parking of a requeueing middleware: a parked
// duplicate is named by its queue, task ID and origin, and resumed by moving
// it from asynq's retry set (or, parked at enqueue, its scheduled set) to the
// head of pending (runFirst).
func (m *guarded) parking() middleware.Parking {
	return middleware.Parking{ID: parkID, Resume: m.resume, Hold: ParkBackstop}
}

// parkID is "<queue>\n<task ID>\n<origin>": the task's own ID, or, when
// it has no retries left (so that Requeue puts a copy back in its place),
// the ID its copy will get.
func parkID(ctx context.Context, job middleware.Job) string {
	id, queue := taskIdentity(ctx)
	if c, ok := ctx.Value(copyIDKey{}).(string); ok {
		id = c
	}
	return parkEntry(queue, id, job.Origin)
}

// copyIDKey is the context key of the ID a requeued copy of the task gets.
type copyIDKey struct{}

// withCopyID gives a task that has no retries left the ID its requeued
// copy would get (copyIDOf), so that the copy can be parked before it
// exists.
func withCopyID(ctx context.Context, origin string) context.Context {
	retried, ok := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	if !ok || !ok2 || retried < maxRetry {
		return ctx
	}
	id, _ := asynq.GetTaskID(ctx)
	return context.WithValue(ctx, copyIDKey{}, copyIDOf(id, origin))
}

// copyIDOf is the ID of the requeued copy of task id, a delivery of the
// work first enqueued as origin: "<origin>~a", or "<origin>~b" for a copy of
// "<origin>~a". A task is revoked once its copy is enqueued, so at most one
// of origin and its two copy IDs is in the queue at a time, and an enqueue
// that finds origin gone can find its copy (Unique's reservations, which
// are named by origin).
func copyIDOf(id, origin string) string {
	if id == origin+"~a" {
		return origin + "~b"
	}
	return origin + "~a"
}

// runFirstCmd is asynq's RunTask script (v0.26) with two changes. The task
// goes to the head of the pending list (RPUSH; asynq dequeues with
// RPOPLPUSH), as asynq itself puts back a task that a shutdown
// interrupted, instead of behind every task already pending: a resumed task
// was delivered once already, and its key is reserved for it. And only a
// task waiting to run (scheduled, or waiting to retry) is moved: one that
// completed (kept by asynq.Retention) or was archived is done, and a
// resume must not run it again.
// KEYS[1] the task's hash, KEYS[2] the pending list; ARGV[1] the task ID,
// ARGV[2] the queue's key prefix. Returns 1 when moved, 0 when the task
// does not exist, -1 when it is active, -2 when it is pending already, -3
// when it is in another state.
var runFirstCmd = redis.NewScript(`
if redis.call("EXISTS", KEYS[1]) == 0 then
	return 0
end
local state = redis.call("HGET", KEYS[1], "state")
if state == "active" then
	return -1
elseif state == "pending" then
	return -2
elseif state ~= "scheduled" and state ~= "retry" then
	return -3
end
if redis.call("ZREM", ARGV[2] .. state, ARGV[1]) == 0 then
	return redis.error_reply("task " .. ARGV[1] .. " not found in " .. ARGV[2] .. state)
end
redis.call("RPUSH", KEYS[2], ARGV[1])
redis.call("HSET", KEYS[1], "state", "pending")
return 1
`)

// errNotWaiting is runFirst's error for a task that is done: completed or
// archived.
var errNotWaiting = errors.New("task is not waiting to run")

// asynqKeys is the prefix of asynq's keys of queue (v0.26's layout,
// "asynq:{<queue>}:"), which runFirst, Unique and ParkAtEnqueue read.
func asynqKeys(queue string) string { return "asynq:{" + queue + "}:" }

// runFirst moves task id of queue to the head of its pending list
// (runFirstCmd), with the errors of asynq's Inspector.RunTask (one matching
// asynq.ErrTaskNotFound, or one saying the task is already running or
// already in pending state), and errNotWaiting.
func (m *guarded) runFirst(ctx context.Context, queue, id string) error {
	prefix := asynqKeys(queue)
	n, err := runFirstCmd.Run(ctx, m.rdb, []string{prefix + "t:" + id, prefix + "pending"}, id, prefix).Int64()
	switch {
	case err != nil:
		return err
	case n == 0:
		return fmt.Errorf("%w: %s in queue %q", asynq.ErrTaskNotFound, id, queue)
	case n == -1:
		return errors.New("task is already running")
	case n == -2:
		return errors.New("task is already in pending state")
	case n == -3:
		return fmt.Errorf("%w: %s in queue %q", errNotWaiting, id, queue)
	}
	return nil
}

// passOn passes the key on from a delivery of origin that did not run and
// is not parked (dup: superseded, covered, a duplicate): a resumed task,
// for which the key was reserved, hands the reservation to the next parked
// task at once instead of leaving it for its hold. Only a reservation
// carrying origin is taken over, so a key that is free or held by others
// is left alone; a key that dup says is held by another run (one holder,
// under WithLimit(1)) holds no reservation for origin, and costs nothing.
//
// A resumed task that was throttled and put back keeps its reservation: it
// comes back when the key's next start opens, and taking the reservation
// then runs it. Passing the key on would resume the next parked task only
// to be throttled too, and the next, each an extra delivery, all put back
// together. (One that the throttle skips passes the key on.)
func (m *guarded) passOn(ctx context.Context, dup *middleware.DuplicateError, key, origin string) {
	if m.inspector == nil || origin == "" || m.limit > 1 ||
		(dup.Reason == middleware.ReasonThrottled && dup.Action == middleware.ActionRequeue) {
		return
	}
	var ce *lockkit.ConflictError
	var cov *lockkit.CoveredError
	if (errors.As(dup.Cause, &ce) && ce.Holders > 0 && ce.Label != origin) || (errors.As(dup.Cause, &cov) && cov.Owner != "") {
		return
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resumeTimeout)
	defer cancel()
	info, err := m.guard.Locker().Inspect(pctx, key)
	if err != nil || !slices.ContainsFunc(info.Holders, func(h lockkit.Holder) bool { return h.Label == origin }) {
		return
	}
	m.guard.PassOn(pctx, key, origin)
}

// resume runs the parked task id now; it is called on a goroutine of its
// own (lockkit's OnParked), which the Locker's Close waits for. asynq puts a
// duplicate back (to its retry set) only after the middleware returned, and
// a copy that replaces a task with no retries left is enqueued after it, so
// a task still active is tried again, with a growing pause, for up to
// resumeTimeout, and a task not found for up to resumeMissing. A task that
// cannot be run (gone, done: completed or archived, or its queue deleted)
// passes the key on: the
// reservation is adopted and released, which resumes the next parked task.
// So does a task still active after resumeTimeout: its duplicate delivery
// has not ended (asynq calls Config.ErrorHandler before it puts the task
// back, and a slow one delays that), and the task comes back at its
// backstop; a task that is running its own run holds the key, which
// passing on leaves alone.
func (m *guarded) resume(key, id string) {
	parts := strings.SplitN(id, "\n", 3)
	if len(parts) != 3 {
		return
	}
	queue, taskID, origin := parts[0], parts[1], parts[2]
	ctx, cancel := context.WithTimeout(context.Background(), resumeTimeout)
	defer cancel()
	start, pause, active := time.Now(), 200*time.Microsecond, false
	for {
		err := m.runFirst(ctx, queue, taskID)
		switch {
		case err == nil, strings.Contains(err.Error(), "already in pending state"), strings.Contains(err.Error(), redis.ErrClosed.Error()):
			return
		case strings.Contains(err.Error(), "already running") && ctx.Err() == nil,
			errors.Is(err, asynq.ErrTaskNotFound) && time.Since(start) < resumeMissing:
			active = strings.Contains(err.Error(), "already running")
			select {
			case <-time.After(pause):
			case <-ctx.Done():
			}
			pause = min(2*pause, 50*time.Millisecond)
			continue
		case strings.Contains(err.Error(), "already running"):
			active = true
		}
		if !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound) && !errors.Is(err, errNotWaiting) &&
			!(active && ctx.Err() != nil) {
			m.guard.Emit(ctx, middleware.Event{Kind: middleware.EventError, Job: middleware.Job{Key: key, ID: taskID, Origin: origin},
				Err: fmt.Errorf("singleton: resume parked task %s in queue %q: %w", taskID, queue, err)})
		}
		// ctx may have run out during runFirst: passing on gets its own.
		pctx, pcancel := context.WithTimeout(context.Background(), resumeTimeout)
		m.guard.PassOn(pctx, key, origin)
		pcancel()
		return
	}
}
