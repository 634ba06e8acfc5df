package singleton

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
)

// takenBackMargin is how long past the time asynq will deliver a taken-back
// task again its success is kept (takenBack).
const takenBackMargin = time.Minute

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
// retried it): one pipelined HGET and ZSCORE of the task. The success is
// then kept until the retry is due plus takenBackMargin, so that a later
// task reusing the ID is not taken for it. A state that cannot be read
// counts as running: a second run is better than a lost one.
func (m *guarded) takenBack(ctx context.Context, retried int) time.Duration {
	if m.rdb == nil {
		return 0
	}
	lease, ok := lockkit.LeaseFromContext(ctx)
	if retried == 0 && !(ok && lease.WasParked()) {
		return 0
	}
	id, queue := taskIdentity(ctx)
	// The lease's ctx may be ending (the lease lost): the read does not.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	var state *redis.StringCmd
	var due *redis.FloatCmd
	_, err := m.rdb.Pipelined(rctx, func(p redis.Pipeliner) error {
		state = p.HGet(rctx, taskKey(queue, id), "state")
		due = p.ZScore(rctx, asynqKeys(queue)+"retry", id)
		return nil
	})
	if state.Err() != nil || state.Val() == "active" {
		return 0
	}
	_ = err // a missing retry entry (redis.Nil) only leaves the default keep
	keep := ParkBackstop + takenBackMargin
	if due.Err() == nil {
		keep = max(time.Until(time.Unix(int64(due.Val()), 0)), 0) + takenBackMargin
	}
	m.skips.l.LogAttrs(ctx, slog.LevelWarn, "singleton: asynq put the task back while it ran, after a late write of an earlier delivery; "+
		"its success is recorded, so its next delivery completes without running",
		slog.String("id", id), slog.String("queue", queue), slog.String("state", state.Val()), slog.Duration("kept", keep))
	return keep
}
