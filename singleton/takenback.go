package singleton

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jobguard/jobguard/lockkit"
)

// errTakenBack ends the context of a delivery whose task asynq took back
// while it ran (see takenBack).
var errTakenBack = errors.New("singleton: asynq put the task back while it ran")

// takenBack reports whether asynq no longer counts the task of this
// delivery, whose run just succeeded, as running. asynq's retry write is
// not idempotent: when an earlier delivery of the task was put back (a
// parked duplicate, a failure asynq retries) and the reply of that write
// was lost, go-redis or asynq's syncer sends it again, up to the earlier
// delivery's asynq lease (30s) later; landing while this delivery runs, it
// moves the task back to retry, asynq's completion of this run then fails,
// and asynq delivers the task once more. Only a delivery that follows such
// a write is looked at (its lease was parked before, or asynq retried it):
// one HGET of the task's state. A state that cannot be read counts as
// running: a second run is better than a lost one.
func (m *guarded) takenBack(ctx context.Context, retried int) bool {
	if m.rdb == nil {
		return false
	}
	lease, ok := lockkit.LeaseFromContext(ctx)
	if retried == 0 && !(ok && lease.WasParked()) {
		return false
	}
	id, queue := taskIdentity(ctx)
	state, err := m.rdb.HGet(ctx, asynqKeys(queue)+"t:"+id, "state").Result()
	if err != nil || state == "active" {
		return false
	}
	m.skips.l.LogAttrs(ctx, slog.LevelWarn, "singleton: asynq put the task back while it ran, after a late write of an earlier delivery; "+
		"its success is recorded, so its next delivery completes without running",
		slog.String("id", id), slog.String("queue", queue), slog.String("state", state))
	return true
}
