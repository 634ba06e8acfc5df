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

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
)

const (
	// resumeTimeout bounds how long resuming a parked task may take,
	// including the wait for asynq to put the task back to retry after its
	// duplicate delivery returned.
	resumeTimeout = time.Second
	// resumeMissing bounds the wait for a requeued copy to be enqueued.
	resumeMissing = 100 * time.Millisecond
	// parkBackstop bounds the requeue delay of a parked duplicate. The run
	// that frees its key starts it (unless that run's process dies, or the
	// holder's lease expires without a release), so the delay is only a
	// backstop: for the next in line, the policy's delay after the holder's
	// lease would run out unrenewed (at most parkBackstop), for the others
	// parkBackstop (and at least the policy's delay); under WithHoldAtLeast
	// a run shorter than the hold resumes the next in line at the hold's
	// end, when it frees the key. The key stays
	// reserved for a resumed task for up to parkBackstop, however many tasks
	// are ahead of it in its asynq queue.
	parkBackstop = 30 * time.Second
)

// parking is the guard.Parking of a requeueing middleware: a parked
// duplicate is named by its queue and the work it delivers (its origin), and
// resumed by moving whichever delivery of that work is waiting from asynq's
// retry set (or, parked at enqueue, its scheduled set) to the head of
// pending (runFirst).
func (m *guarded) parking() guard.Parking {
	return guard.Parking{ID: parkID, Resume: m.resume, Hold: parkBackstop}
}

// parkID is "<queue>\n<origin>\n<origin>" (parkEntry; ParkAtEnqueue parks
// a task under the same entry): every delivery of one work, the task and
// the copies that replace it when it has no retries left (newCopyID), is
// parked under one entry, so a delivery parked again keeps the place of the
// first (lockkit parks an entry once). resume finds the delivery that is
// waiting.
func parkID(ctx context.Context, job guard.Job) string {
	_, queue := taskIdentity(ctx)
	return parkEntry(queue, guard.WorkOf(job).Label, guard.WorkOf(job).Label)
}

// newCopyID is the ID of a Requeue copy of the work first enqueued as
// origin: "<origin>~<random>", new for each copy, so that no copy takes the
// ID of another, even one of an earlier task with the same ID that is kept
// completed (asynq.Retention) or archived. The copy is named by asynqkey.Copy,
// which is how a resume and Unique find it.
func newCopyID(origin string) string { return origin + "~" + newTaskID()[:16] }

// copyKeep is how long the key that names the latest copy of a work
// (asynqkey.Copy, set before the copy is enqueued) outlives the time its
// copy is due.
const copyKeep = 24 * time.Hour

// nameCopyCmd names copy ARGV[1] in the work's copy key KEYS[1] for ARGV[2]
// ms, keeping the copy it replaces: "<previous> <latest>". The key is set
// before the copy is enqueued and the previous copy revoked after it, so
// between the two the previous copy, still active, is the delivery that
// needs the key, and a reader (Unique's, a resume's) must find it. Sent
// again (a lost reply), it finds its copy latest already and keeps the
// pair.
var nameCopyCmd = redis.NewScript(`
local v = redis.call("GET", KEYS[1])
local latest = v and string.match(v, "(%S+)$")
local pair = ARGV[1]
if latest == ARGV[1] then
	pair = v
elseif latest then
	pair = latest .. " " .. ARGV[1]
end
redis.call("SET", KEYS[1], pair, "PX", ARGV[2])
`)

// copiesLua is the Lua that adds to ids, a table, the copies named in the
// work's copy key k (nameCopyCmd): the latest, and the one it replaces.
const copiesLua = `
local function add_copies(ids, k)
	local v = redis.call("GET", k)
	if v then
		for id in string.gmatch(v, "%S+") do
			ids[#ids + 1] = id
		end
	end
end
`

// deliveriesOf are the IDs a delivery of the work first enqueued as origin
// can have besides the copy asynqkey.Copy names: origin, and the IDs an earlier
// version gave its copies ("<origin>~a", and "<origin>~b" for a copy of
// that one), which a rolling upgrade may leave in the queue. A task is
// revoked once its copy is enqueued, so at most one of them is waiting or
// running at a time (but for a creator still active until it returns; an
// archived one stays), and an enqueue that finds origin gone can find its
// copy (Unique's reservations, which are named by origin), as a resume finds
// the delivery of a parked work that is waiting.
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
// of one work (deliveriesOf, and the copy asynqkey.Copy names) and moves the one
// waiting, reading them all at once: a copy enqueued and its creator
// revoked between two reads would otherwise be seen neither.
// KEYS[1] the pending list, KEYS[2] the work's asynqkey.Copy; ARGV[1] the
// queue's key prefix, ARGV[2..] the task IDs. Returns {code, id}: 1 and
// the task moved, else the first state found of, in this order, -2 pending
// already, -1 active, -3 another (done), with the first task in it, or 0
// when none of the tasks exists.
var runFirstCmd = redis.NewScript(copiesLua + `
local ids = {}
for i = 2, #ARGV do
	ids[#ids + 1] = ARGV[i]
end
add_copies(ids, KEYS[2])
local code, at, rank = 0, ids[1], 0
local ranks = {[-2] = 3, [-1] = 2, [-3] = 1}
for _, id in ipairs(ids) do
	local key = ARGV[1] .. "t:" .. id
	local c = 0
	if redis.call("EXISTS", key) == 1 then
		local state = redis.call("HGET", key, "state")
		if state == "scheduled" or state == "retry" then
			if redis.call("ZREM", ARGV[1] .. state, id) == 0 then
				return redis.error_reply("task " .. id .. " not found in " .. ARGV[1] .. state)
			end
			redis.call("RPUSH", KEYS[1], id)
			redis.call("HSET", key, "state", "pending")
			return {1, id}
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
		code, at, rank = c, id, r
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

// runFirst moves the one of the deliveries of the work first enqueued as
// origin in queue (deliveriesOf, the copy asynqkey.Copy names, and ids) that is
// waiting to run to the head of its pending list (runFirstCmd), or
// reports, with the errors of asynq's Inspector.RunTask, the first it finds
// of: one already in pending state, one already running, one done
// (errNotWaiting), and asynq.ErrTaskNotFound when none exists. It is safe
// to send again (go-redis does after a lost reply): the moved task is
// pending then.
func (m *guarded) runFirst(ctx context.Context, queue, origin string, ids ...string) error {
	all := deliveriesOf(origin)
	for _, id := range ids {
		if !slices.Contains(all, id) {
			all = append(all, id)
		}
	}
	args := make([]any, 0, len(all)+1)
	args = append(args, asynqkey.Queue(queue))
	for _, id := range all {
		args = append(args, id)
	}
	vals, err := runFirstCmd.Run(ctx, m.rdb, []string{asynqkey.Pending(queue), asynqkey.Copy(queue, origin)}, args...).Slice()
	var code int64
	var id string
	if err == nil {
		var ok1, ok2 bool
		if len(vals) == 2 {
			code, ok1 = vals[0].(int64)
			id, ok2 = vals[1].(string)
		}
		if !ok1 || !ok2 {
			err = fmt.Errorf("unexpected reply %v", vals)
		}
	}
	if err != nil {
		return err
	}
	switch code {
	case 0:
		return fmt.Errorf("%w: %s (or a copy of %s) in queue %q", asynq.ErrTaskNotFound, strings.Join(all, ", "), origin, queue)
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
func (m *guarded) passOn(ctx context.Context, dup *guard.DuplicateError, key, origin string) {
	if m.inspector == nil || origin == "" || m.limitOf(dup.Job) > 1 ||
		(dup.Reason == guard.ReasonThrottled && dup.Action == guard.ActionRequeue) {
		return
	}
	var ce *lockcore.ConflictError
	var cov *lockcore.CoveredError
	if (errors.As(dup.Cause, &ce) && ce.Holders > 0 && ce.Label != origin) || (errors.As(dup.Cause, &cov) && cov.Owner != "") {
		return
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resumeTimeout)
	defer cancel()
	info, err := m.core.Inspect(pctx, key)
	if err != nil || !slices.ContainsFunc(info.Holders, func(h lockcore.Holder) bool { return h.Label == origin }) {
		return
	}
	guard.PassOn(m.guard, pctx, key, origin)
}

// resume runs the parked work entry (parkEntry) now: whichever of its
// deliveries (runFirst: the task, or the copy that replaced it) is
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
// reservation is taken over and released, which resumes the next parked task.
// So is it when a delivery is still active after resumeTimeout: its
// duplicate delivery has not ended (asynq calls Config.ErrorHandler before
// it puts the task back, and a slow one delays that), and the task comes
// back at its backstop; a task that is running its own run holds the key,
// which passing on leaves alone.
func (m *guarded) resume(key, entry string) {
	queue, taskID, origin, ok := parkedWork(entry)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), resumeTimeout)
	defer cancel()
	start, pause, active := time.Now(), 200*time.Microsecond, false
	for {
		err := m.runFirst(ctx, queue, origin, taskID)
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
			guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventError, Job: guard.With(guard.Job{Key: key, ID: taskID}, guard.Work{Label: origin}),
				Err: fmt.Errorf("singleton: resume parked task %s in queue %q: %w", taskID, queue, err)})
		}
		// ctx may have run out during runFirst: passing on gets its own.
		pctx, pcancel := context.WithTimeout(context.Background(), resumeTimeout)
		guard.PassOn(m.guard, pctx, key, origin)
		pcancel()
		return
	}
}
