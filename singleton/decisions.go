package singleton

import (
	"context"
	"fmt"
	"strconv"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/middleware"
)

// DecisionLog is the Redis stream to which a middleware with WithRedis adds
// one entry for every task that completes without running, so that
// `jobguard why <task-id>` can say why a task did not run long after asynq
// deleted it. An entry's fields: task (the task ID), origin (the first
// task's ID of a Requeue copy), type, queue, key, reason (held, claimed,
// superseded, throttled, covered, completed) and, where known, by_task,
// by_owner and by_token (the run or task that held, covered or completed
// the work), and call, which names the write (a go-redis resend after a lost
// reply adds an entry with the same call). Its ID is the Redis server's time
// of the decision.
const DecisionLog = "jobguard:decisions"

// DefaultDecisionLogLen is about how many entries DecisionLog keeps (Redis
// trims it approximately, XADD MAXLEN ~): about 2 MB of Redis memory.
const DefaultDecisionLogLen = 10000

// WithDecisionLog sets about how many entries of DecisionLog the
// middleware keeps when it adds one; 0 adds none. It needs WithRedis (New
// sets it). Defaults to DefaultDecisionLogLen.
func WithDecisionLog(n int) ServerOption {
	return serverOpt(func(c *config) { c.decisions, c.decisionsSet = n, true })
}

// logDecision adds the decision not to run t to DecisionLog: one XADD on the
// path of a task that does not run. A failed write is an error event; the
// task still completes.
func (m *guarded) logDecision(ctx context.Context, t *asynq.Task, dup *middleware.DuplicateError) {
	if m.rdb == nil || m.decisions <= 0 {
		return
	}
	why := whyOf(dup)
	_, queue := taskIdentity(ctx)
	// call names this write: go-redis sends an XADD again when its reply
	// was lost, and the reader (jobguard why) shows one entry per call.
	values := []any{"call", newTaskID(), "task", dup.Job.ID, "origin", dup.Job.Origin, "type", t.Type(), "queue", queue, "key", why.Key, "reason", why.Reason}
	if why.ByTask != "" {
		values = append(values, "by_task", why.ByTask)
	}
	if why.ByOwner != "" {
		values = append(values, "by_owner", why.ByOwner)
	}
	if why.ByToken != 0 {
		values = append(values, "by_token", strconv.FormatInt(why.ByToken, 10))
	}
	err := m.rdb.XAdd(ctx, &redis.XAddArgs{Stream: DecisionLog, MaxLen: int64(m.decisions), Approx: true, Values: values}).Err()
	if err != nil {
		m.guard.Emit(ctx, middleware.Event{Kind: middleware.EventError, Job: dup.Job,
			Err: fmt.Errorf("singleton: recording why task %s did not run in %s: %w", dup.Job.ID, DecisionLog, err)})
	}
}
