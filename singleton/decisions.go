package singleton

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
)

// defaultDecisionLogLen is about how many entries the decision log keeps
// by default (WithDecisionLog): about 3 MB of Redis memory with realistic
// entries (TestDecisionLogIsTrimmedToItsLength measured 3.0 MB).
const defaultDecisionLogLen = 10000

// WithDecisionLog sets about how many entries of the decision log the
// middleware, or a Client (NewClient takes it too; Guard.Client uses the
// Guard's), keeps when it adds one (Redis trims it approximately, XADD
// MAXLEN ~); 0 adds none. The middleware's log needs WithRedis (New sets
// it). Defaults to 10,000 entries, about 3 MB of Redis memory with
// realistic entries. A negative n is refused with an error matching
// ErrInvalid.
//
// The decision log is the Redis stream "jobguard:decisions", to which the
// middleware adds one entry for every task that completes without running,
// is put back or is refused, and for every run that ends before its work
// did (never on the path of a task that runs), so that
// `jobguard why <task-id>` can say why a task did not run long after asynq
// deleted it. An entry's fields: task (the task ID), origin (the label of a
// Requeue copy: its first task's ID), type, queue, key, reason and, where
// known, by_task, by_owner and by_token (the run or task that held,
// covered, completed or took over the work), cause (the error that ended a
// run), and call, which names the write (a go-redis resend after a lost
// reply adds an entry with the same call). Its ID is the Redis server's
// time of the decision. The reasons of a task that completed without
// running: held, claimed, superseded, throttled, covered, completed. A task
// put back to run later (Requeue, a throttle's ActionRequeue, a follow-up
// parked behind its key's holder) has the same reasons, and action
// "requeued" or "parked" (the run that frees the key resumes it) and
// back_in_ms, when it comes back by itself (the backstop of a parked
// task); by_token, a fencing token, is at least the Redis server's time in
// microseconds when that run took the key. A task the middleware refused
// (ErrKey, ErrKeyMismatch, ParkAtEnqueue under WithLimit(n > 1)), which
// asynq archives: reason archived, cause the refusal. Of a
// run that ended early: preempted (a newer task of the key cancelled it
// under middleware.Preempt, and the task is done, neither retried nor archived;
// by_task is the newer task, found holding the key once the run returned)
// and lost (its lease was lost while it ran, as when an operator released
// the key or Redis stayed unreachable past its TTL, and the run failed;
// cause says which, and asynq retries the task while it has retries left).
// A Client adds one for an enqueue that Unique refused: reason refused,
// by_task the task that holds the key and by_state its asynq state; task
// is the ID the refused task would have had (its asynq.TaskID, if given).
// Under WithShadow the middleware adds one for a task that ran although
// without WithShadow it would have been refused and archived (ErrKey,
// ErrKeyMismatch, ParkAtEnqueue under WithLimit(n > 1)): reason
// would_archive, cause the refusal.
func WithDecisionLog(n int) Option {
	return keyOpt(func(c *config) { c.decisions, c.decisionsSet = n, true })
}

// logDecision adds the decision not to run t to the decision log: one XADD on the
// path of a task that does not run (pipelined with its result by
// recordSkip). A failed write is an error event; the task still completes.
func (m *guarded) logDecision(ctx context.Context, t *asynq.Task, dup *guard.DuplicateError) {
	if !m.logsDecisions() {
		return
	}
	m.addDecision(ctx, dup.Job, decisionOf(ctx, t, dup))
}

// logsDecisions tells whether the middleware adds entries to the decision log.
func (m *guarded) logsDecisions() bool { return m.rdb != nil && m.decisions > 0 }

// decisionOf is the decision log entry of the decision not to run t.
// A held key's entry carries its holder's fencing token too (by_token:
// since when the holder has held the key), which the task's result leaves
// out.
func decisionOf(ctx context.Context, t *asynq.Task, dup *guard.DuplicateError) decisionlog.Entry {
	why := whyOf(dup)
	e := entryOf(ctx, t, dup.Job, why.Reason)
	e.Key, e.ByTask, e.ByOwner, e.ByToken = why.Key, why.ByTask, why.ByOwner, why.ByToken
	var ce *lockcore.ConflictError
	if e.ByToken == 0 && errors.As(dup.Cause, &ce) {
		e.ByToken = ce.Token
	}
	return e
}

// logPutBack adds to the decision log that t was put back (re): parked
// behind its key's holder, or requeued, and when it comes back by itself.
// One XADD on the path of a task that does not run; a failed write is an
// error event, and the task is put back all the same.
func (m *guarded) logPutBack(ctx context.Context, t *asynq.Task, re *RequeueError) {
	if !m.logsDecisions() {
		return
	}
	e := decisionOf(ctx, t, re.Duplicate)
	e.Action, e.BackIn = decisionlog.ActionRequeued, re.Delay
	if re.Duplicate.Parked {
		e.Action = decisionlog.ActionParked
	}
	m.addDecision(ctx, re.Duplicate.Job, e)
}

// entryOf is the decision log entry of job (t's), for reason.
func entryOf(ctx context.Context, t *asynq.Task, job guard.Job, reason string) decisionlog.Entry {
	_, queue := taskIdentity(ctx)
	// Call names this write: go-redis sends an XADD again when its reply
	// was lost, and the readers show one entry per call.
	return decisionlog.Entry{Call: newTaskID(), Task: job.ID, Origin: guard.WorkOf(job).Label, Type: t.Type(), Queue: queue, Key: job.Key, Reason: reason}
}

// addDecision adds e to the decision log. A failed write is an error event.
func (m *guarded) addDecision(ctx context.Context, job guard.Job, e decisionlog.Entry) {
	m.decisionWritten(ctx, job, decisionlog.Add(ctx, m.rdb, m.decisions, e))
}

// decisionWritten reports a failed write of job's decision log entry as an
// error event.
func (m *guarded) decisionWritten(ctx context.Context, job guard.Job, err error) {
	if err != nil {
		guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventError, Job: job,
			Err: fmt.Errorf("singleton: recording why task %s did not run in %s: %w", job.ID, decisionlog.Stream, err)})
	}
}

// Bounds of the look for the task that preempted a run: it takes the key
// as soon as the preempted run has released it.
const (
	preemptLooks     = 10
	preemptLookEvery = 20 * time.Millisecond
)

// logCutShort adds to the decision log a run of t that ended before its work
// did (out.Err): preempted by a newer task of the key, or failed after its
// lease was lost. One XADD, and for a preemption up to preemptLooks
// Inspects of the key, on the path of a run that was cut short only.
func (m *guarded) logCutShort(ctx context.Context, t *asynq.Task, job guard.Job, out guard.Outcome) {
	if m.rdb == nil || m.decisions <= 0 || !out.Ran || !errors.Is(out.Err, lockcore.ErrLost) {
		return
	}
	if !errors.Is(out.Err, lockcore.ErrPreempted) {
		e := entryOf(ctx, t, job, decisionlog.ReasonLost)
		e.Cause = out.Err.Error()
		m.addDecision(ctx, job, e)
		return
	}
	e := entryOf(ctx, t, job, decisionlog.ReasonPreempted)
	e.Cause = out.Err.Error()
	if h, ok := m.newerHolder(ctx, job); ok {
		e.ByTask, e.ByOwner, e.ByToken = h.Label, h.Owner, h.Token
	}
	m.addDecision(ctx, job, e)
}

// newerHolder looks for the holder of job's key that is not job's work:
// the task that preempted it, once it has the key.
func (m *guarded) newerHolder(ctx context.Context, job guard.Job) (lockcore.Holder, bool) {
	if m.onPreempted != nil {
		m.onPreempted()
	}
	for i := range preemptLooks {
		info, err := m.core.Inspect(ctx, job.Key)
		if err == nil {
			for _, h := range info.Holders {
				if h.Label != "" && h.Label != guard.WorkOf(job).Label {
					return h, true
				}
			}
		}
		if i == preemptLooks-1 {
			break
		}
		select {
		case <-ctx.Done():
			return lockcore.Holder{}, false
		case <-time.After(preemptLookEvery):
		}
	}
	return lockcore.Holder{}, false
}

// logRefusal adds to the decision log an enqueue of t (ID id, in queue) that
// Unique refused: reason "refused", with the task that holds the key and
// its asynq state. One XADD on the path of a refused enqueue only; a failed
// write is not the caller's error (the refusal is), and is dropped.
func (c *Client) logRefusal(ctx context.Context, t *asynq.Task, id, queue string, dup *DuplicateTaskError) {
	if c.decisions <= 0 {
		return
	}
	_ = decisionlog.Add(ctx, c.rdb, c.decisions, decisionlog.Entry{Call: newTaskID(), Task: id, Origin: id, Type: t.Type(), Queue: queue,
		Key: dup.Key, Reason: decisionlog.ReasonRefused, ByTask: dup.ID, ByState: dup.State})
}
