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
	// ParkBackstop (and at least the policy's delay); under WithHoldAtLeast
	// a run shorter than the hold resumes the next in line at the hold's
	// end, when it frees the key. The key stays
	// reserved for a resumed task for up to ParkBackstop, however many tasks
	// are ahead of it in its asynq queue.
	ParkBackstop = 30 * time.Second
)

// parking is the middleware.Parking of a requeueing middleware: a parked
// duplicate is named by its queue and the work it delivers (its origin), and
// resumed by moving whichever delivery of that work is waiting from asynq's
// retry set (or, parked at enqueue, its scheduled set) to the head of
// pending (runFirst).
func (m *guarded) parking() middleware.Parking {
	return middleware.Parking{ID: parkID, Resume: m.resume, Hold: ParkBackstop}
}

// parkID is "<queue>\n<origin>\n<origin>" (parkEntry; ParkAtEnqueue parks
// a task under the same entry): every delivery of one work, the task and
// the copies that replace it when it has no retries left (copyIDOf), is
// parked under one entry, so a delivery parked again keeps the place of the
// first (lockkit parks an entry once). resume finds the delivery that is
// waiting.
func parkID(ctx context.Context, job middleware.Job) string {
	_, queue := taskIdentity(ctx)
	return parkEntry(queue, job.Origin, job.Origin)
}

// copyIDOf is the ID of the requeued copy of task id, a delivery of the
// work first enqueued as origin: "<origin>~a", or "<origin>~b" for a copy of
// "<origin>~a". A task is revoked once its copy is enqueued, so at most one
// of origin and its two copy IDs is waiting or running at a time (but for a
// creator still active until it returns; an archived one stays), and an enqueue that finds origin
// gone can find its copy (Unique's reservations, which are named by origin),
// as a resume finds the delivery of a parked work that is waiting.
func copyIDOf(id, origin string) string {
	if id == origin+"~a" {
		return origin + "~b"
	}
	return origin + "~a"
}

// deliveriesOf are the IDs a delivery of the work first enqueued as origin
// can have: origin and its copies' (copyIDOf).
func deliveriesOf(origin string) []string {
	return []string{origin, origin + "~a", origin + "~b"}
}

// runFirstCmd is asynq's RunTask script (v0.26) with three changes. The task
// goes to the head of the pending list (RPUSH; asynq dequeues with
// RPOPLPUSH), as asynq itself puts back a task that a shutdown
// interrupted, instead of behind every task already pending: a resumed task
// was delivered once already, and its key is reserved for it. Only a
// task waiting to run (scheduled, or waiting to retry) is moved: one that
// completed (kept by asynq.Retention) or was archived is done, and a
// resume must not run it again. And it is given the IDs of every delivery
// of one work (deliveriesOf) and moves the one waiting, reading them all at
// once: a copy enqueued and its creator revoked between two reads would
// otherwise be seen neither.
// KEYS[1..n] the tasks' hashes, KEYS[n+1] the pending list; ARGV[1] the
// queue's key prefix, ARGV[2..n+1] the task IDs. Returns {code, i}: 1 and
// the task moved (i, 1-based), else the first state found of, in this
// order, -2 pending already, -1 active, -3 another (done), with the first
// task in it, or 0 when none of the tasks exists.
var runFirstCmd = redis.NewScript(`
local n = #KEYS - 1
local code, at, rank = 0, 1, 0
local ranks = {[-2] = 3, [-1] = 2, [-3] = 1}
for i = 1, n do
	local c = 0
	if redis.call("EXISTS", KEYS[i]) == 1 then
		local state = redis.call("HGET", KEYS[i], "state")
		if state == "scheduled" or state == "retry" then
			local id = ARGV[i + 1]
			if redis.call("ZREM", ARGV[1] .. state, id) == 0 then
				return redis.error_reply("task " .. id .. " not found in " .. ARGV[1] .. state)
			end
			redis.call("RPUSH", KEYS[n + 1], id)
			redis.call("HSET", KEYS[i], "state", "pending")
			return {1, i}
		elseif state == "active" then
			c = -1
		elseif state == "pending" then
			c = -2
		else
			c = -3
		end
	end
	local r = ranks[c] or 0
	if r > rank then
		code, at, rank = c, i, r
	end
end
return {code, at}
`)

// errNotWaiting is runFirst's error for a task that is done: completed or
// archived (a *notWaitingError matches it).
var errNotWaiting = errors.New("task is not waiting to run")

// notWaitingError names the task runFirst found done.
type notWaitingError struct{ id, queue string }

func (e *notWaitingError) Error() string {
	return fmt.Sprintf("%s: %s in queue %q", errNotWaiting, e.id, e.queue)
}

func (e *notWaitingError) Is(target error) bool { return target == errNotWaiting }

// asynqKeys is the prefix of asynq's keys of queue (v0.26's layout,
// "asynq:{<queue>}:"), which runFirst, Unique and ParkAtEnqueue read.
func asynqKeys(queue string) string { return "asynq:{" + queue + "}:" }

// taskKey is the key of asynq's hash of task id in queue (base.TaskKey).
func taskKey(queue, id string) string { return asynqKeys(queue) + "t:" + id }

// runFirst moves the one of tasks ids of queue that is waiting to run to the
// head of its pending list (runFirstCmd), or reports, with the errors of
// asynq's Inspector.RunTask, the first it finds of: one already in pending
// state, one already running, one done (errNotWaiting), and
// asynq.ErrTaskNotFound when none exists. It is safe to send again (go-redis
// does after a lost reply): the moved task is pending then.
func (m *guarded) runFirst(ctx context.Context, queue string, ids ...string) error {
	prefix := asynqKeys(queue)
	keys := make([]string, 0, len(ids)+1)
	args := make([]any, 0, len(ids)+1)
	args = append(args, prefix)
	for _, id := range ids {
		keys, args = append(keys, taskKey(queue, id)), append(args, id)
	}
	vals, err := runFirstCmd.Run(ctx, m.rdb, append(keys, prefix+"pending"), args...).Int64Slice()
	if err == nil && (len(vals) != 2 || vals[1] < 1 || int(vals[1]) > len(ids)) {
		err = fmt.Errorf("unexpected reply %v", vals)
	}
	if err != nil {
		return err
	}
	id := ids[vals[1]-1]
	switch vals[0] {
	case 0:
		return fmt.Errorf("%w: %s in queue %q", asynq.ErrTaskNotFound, strings.Join(ids, ", "), queue)
	case -1:
		return fmt.Errorf("task %s is already running", id)
	case -2:
		return fmt.Errorf("task %s is already in pending state", id)
	case -3:
		return &notWaitingError{id: id, queue: queue}
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

// resume runs the parked work entry (parkEntry) now: whichever of its
// deliveries (deliveriesOf: the task, or the copy that replaced it) is
// waiting. It is called on a goroutine of its own (lockkit's OnParked),
// which the Locker's Close waits for. asynq puts a duplicate back (to its
// retry set) only after the middleware returned, and a copy that replaces a
// task with no retries left is enqueued while that task is active, so while
// a delivery is active and none is waiting the move is tried again, with a
// growing pause, for up to resumeTimeout; while none is found (a task parked
// at enqueue before its enqueue), or only a done copy ID (an earlier work's
// with the same task ID), for up to resumeMissing; not when the origin's own
// task is found done and none active: no copy is coming then (a copy is
// enqueued while its creator is active). When none can be run (gone, done:
// completed or archived, or its queue deleted) the key is passed on: the
// reservation is adopted and released, which resumes the next parked task.
// So is it when a delivery is still active after resumeTimeout: its
// duplicate delivery has not ended (asynq calls Config.ErrorHandler before
// it puts the task back, and a slow one delays that), and the task comes
// back at its backstop; a task that is running its own run holds the key,
// which passing on leaves alone.
func (m *guarded) resume(key, entry string) {
	queue, taskID, origin, ids, ok := parkedWork(entry)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), resumeTimeout)
	defer cancel()
	start, pause, active := time.Now(), 200*time.Microsecond, false
	for {
		err := m.runFirst(ctx, queue, ids...)
		var done *notWaitingError
		switch {
		case err == nil, strings.Contains(err.Error(), "already in pending state"), strings.Contains(err.Error(), redis.ErrClosed.Error()):
			return
		case strings.Contains(err.Error(), "already running") && ctx.Err() == nil,
			errors.Is(err, asynq.ErrTaskNotFound) && time.Since(start) < resumeMissing,
			// A done copy ID may be an earlier work's (kept by Retention,
			// or archived) while this work's task is not enqueued yet
			// (ParkAtEnqueue parks before it enqueues): only the origin's
			// own task found done says that the work is done.
			errors.As(err, &done) && done.id != origin && time.Since(start) < resumeMissing:
			active = strings.Contains(err.Error(), "already running")
			if m.onResumeWait != nil {
				m.onResumeWait()
			}
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
