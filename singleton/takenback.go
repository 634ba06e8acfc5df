package singleton

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
)

// takenBackMargin is how long past the time asynq will deliver a taken-back
// task again its success is kept (takenBack).
const takenBackMargin = time.Minute

// succeededField is the field of asynq's hash of a task (asynqkey.Task) in which a
// delivery that may have been taken back records its success while the
// task is active (takenBack). It goes with the task: a later task that
// reuses the ID has a new hash, without it.
const succeededField = "jobguard-succeeded"

// takenBackCmd reads the state of a task whose run just succeeded and, when
// it is active, records the success in the task's hash (succeededField):
// the active delivery may be another, which asynq made after taking the
// task back, and which waits for this run (ranBefore). Sent again after a
// lost reply, it writes the same. KEYS[1] the task's hash, KEYS[2] the
// queue's retry set; ARGV[1] the task ID, ARGV[2] the value recorded.
// Returns {state, due}: the task's state ("" when it is gone) and the
// retry's due time in Unix seconds ("" when it is not in the retry set).
var takenBackCmd = redis.NewScript(`
local state = redis.call("HGET", KEYS[1], "state")
if not state then
	return {"", ""}
end
if state == "active" then
	redis.call("HSET", KEYS[1], "` + succeededField + `", ARGV[2])
end
return {state, redis.call("ZSCORE", KEYS[2], ARGV[1]) or ""}
`)

// takenBack reports, as how long to keep its success recorded (0: not
// taken back), whether asynq no longer counts the task of this delivery,
// whose run just succeeded, as running. asynq's retry write is not
// idempotent: when an earlier delivery of the task was put back (a parked
// duplicate, a failure asynq retries) and the reply of that write was lost,
// go-redis or asynq's syncer sends it again, up to the earlier delivery's
// asynq lease (30s) later; landing while this delivery runs, it moves the
// task back to retry, asynq's completion of this run then fails, and asynq
// delivers the task once more, when that retry is due. Only a delivery that
// follows such a write is looked at (its lease was parked before, or asynq
// retried it): one script call (takenBackCmd). The success is then kept
// until the retry is due plus takenBackMargin, so that a later task reusing
// the ID is not taken for it. A task that is active again (the retry came
// due while this run went on, and asynq's next delivery waits for it) has
// the success recorded in its hash instead, which that delivery reads
// (ranBefore). A state that cannot be read counts as running (an
// EventError says so): a second run is better than a lost one.
func (m *guarded) takenBack(ctx context.Context, job guard.Job, retried int) time.Duration {
	if m.rdb == nil {
		return 0
	}
	lease, ok := lockcore.LeaseFromContext(ctx)
	if retried == 0 && !(ok && lease.WasParked()) {
		return 0
	}
	id, queue := taskIdentity(ctx)
	// The lease's ctx may be ending (the lease lost): the read does not.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	var token int64
	if ok {
		token = lease.Token()
	}
	vals, err := takenBackCmd.Run(rctx, m.rdb, []string{asynqkey.Task(queue, id), asynqkey.Retry(queue)}, id, token).StringSlice()
	if err != nil {
		// Not recorded: a delivery asynq made of the task meanwhile runs
		// the work again (a second run is better than a lost one).
		guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventError, Job: job,
			Err: fmt.Errorf("singleton: task %s: recording its run's success: %w", id, err)})
		return 0
	}
	if len(vals) != 2 || vals[0] == "" || vals[0] == "active" {
		return 0
	}
	keep := parkBackstop + takenBackMargin
	if due, perr := strconv.ParseFloat(vals[1], 64); perr == nil {
		keep = max(time.Until(time.Unix(int64(due), 0)), 0) + takenBackMargin
	}
	m.skips.l.LogAttrs(ctx, slog.LevelWarn, "singleton: asynq put the task back while it ran, after a late write of an earlier delivery; "+
		"its success is recorded, so its next delivery completes without running",
		slog.String("id", id), slog.String("queue", queue), slog.String("state", vals[0]), slog.Duration("kept", keep))
	return keep
}

// ranBefore is the guard's record (guard.WithDone) for a delivery that
// took its key after waiting for an earlier run of its task: whether that
// run did the work while asynq had this delivery active. asynq's
// completion of that run, meeting this delivery's entry, completes the task
// (its hash is gone, or with Retention completed); before it, a run that
// followed a late write has recorded its success in the hash (takenBack).
// One HMGET; false when the task waits for a retry or was archived (that
// run failed); an error when it cannot be read (a Redis error: the delivery
// fails without running, and asynq retries it unless that run's completion
// removed the task meanwhile).
func (m *guarded) ranBefore(ctx context.Context, job guard.Job) (bool, error) {
	id, queue := taskIdentity(ctx)
	if id == "" || id != job.ID {
		return false, nil
	}
	vals, err := m.rdb.HMGet(ctx, asynqkey.Task(queue, id), asynqkey.StateField, succeededField).Result()
	if err != nil {
		return false, fmt.Errorf("singleton: task %s: reading its state: %w", id, err)
	}
	if len(vals) != 2 {
		return false, nil
	}
	state, _ := vals[0].(string)
	ran, _ := vals[1].(string)
	if vals[0] != nil && state != "completed" && ran == "" {
		return false, nil
	}
	m.skips.l.LogAttrs(ctx, slog.LevelWarn, "singleton: asynq delivered the task again while an earlier delivery ran, and that run succeeded: "+
		"this delivery completes without running",
		slog.String("id", id), slog.String("queue", queue), slog.String("state", state), slog.String("run_token", ran))
	return true, nil
}
