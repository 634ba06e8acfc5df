package singleton

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
)

// skipLogEvery is how often a key's tasks that complete without running
// are logged at most; the lines left out are counted in the next one.
const skipLogEvery = time.Second

// skipLogKeys bounds the keys a skipLog remembers.
const skipLogKeys = 4096

// skipLog logs, at Info, the tasks that complete without running: at most
// one line per key per skipLogEvery.
type skipLog struct {
	l    *slog.Logger
	now  func() time.Time
	mu   sync.Mutex
	last map[string]skipped // key → its last line
}

type skipped struct {
	at      time.Time
	dropped int // lines left out since at
}

func newSkipLog(l *slog.Logger) *skipLog {
	return &skipLog{l: l, now: time.Now, last: make(map[string]skipped)}
}

var reasonNames = map[guard.Reason]string{
	guard.ReasonHeld: "held", guard.ReasonClaimed: "claimed", guard.ReasonSuperseded: "superseded",
	guard.ReasonThrottled: "throttled", guard.ReasonCovered: "covered", guard.ReasonCompleted: "completed",
}

// log logs that dup's task completes without running, unless a line for its
// key was logged less than skipLogEvery ago.
func (s *skipLog) log(ctx context.Context, dup *guard.DuplicateError) {
	if !s.l.Enabled(ctx, slog.LevelInfo) {
		return
	}
	key, now := dup.Job.Key, s.now()
	s.mu.Lock()
	prev, ok := s.last[key]
	if ok && now.Sub(prev.at) < skipLogEvery {
		prev.dropped++
		s.last[key] = prev
		s.mu.Unlock()
		return
	}
	if !ok && len(s.last) >= skipLogKeys {
		for k, e := range s.last {
			if now.Sub(e.at) >= skipLogEvery {
				delete(s.last, k)
			}
		}
		if len(s.last) >= skipLogKeys {
			clear(s.last)
		}
	}
	s.last[key] = skipped{at: now}
	s.mu.Unlock()

	why := whyOf(dup)
	attrs := []slog.Attr{slog.String("key", why.Key), slog.String("task", dup.Job.Name), slog.String("id", dup.Job.ID),
		slog.String("reason", why.Reason)}
	if why.ByTask != "" {
		attrs = append(attrs, slog.String("by_task", why.ByTask))
	}
	if why.ByOwner != "" {
		attrs = append(attrs, slog.String("by_owner", why.ByOwner))
	}
	if why.ByToken != 0 {
		attrs = append(attrs, slog.Int64("by_token", why.ByToken))
	}
	if prev.dropped > 0 {
		attrs = append(attrs, slog.Int("not_logged", prev.dropped))
	}
	s.l.LogAttrs(ctx, slog.LevelInfo, "singleton: task completed without running", attrs...)
}

// notRun says why a task completed without running: the log line's fields,
// and the asynq result (ResultWriter) of the task, as JSON.
type notRun struct {
	Outcome string `json:"outcome"` // always "completed without running"
	Key     string `json:"key"`
	Reason  string `json:"reason"`             // held, claimed, superseded, throttled, covered, completed
	ByTask  string `json:"by_task,omitempty"`  // the task (its origin) that holds, covers or completed the work
	ByOwner string `json:"by_owner,omitempty"` // the lease owner of the run that holds or covers the key
	ByToken int64  `json:"by_token,omitempty"` // the fencing token of the covering run
}

// whyOf is what dup says of a task that completes without running.
func whyOf(dup *guard.DuplicateError) notRun {
	why := notRun{Outcome: "completed without running", Key: dup.Job.Key, Reason: reasonNames[dup.Reason]}
	var ce *lockcore.ConflictError
	var cov *lockcore.CoveredError
	switch {
	case errors.As(dup.Cause, &ce):
		why.ByTask, why.ByOwner = ce.Label, ce.Owner
	case errors.As(dup.Cause, &cov):
		why.ByOwner, why.ByToken = cov.Owner, cov.Token
	}
	if dup.Reason == guard.ReasonCompleted {
		why.ByTask = guard.WorkOf(dup.Job).Label
	}
	return why
}

// writeResult writes why t completed without running as its asynq result
// (JSON, see notRun), which the Inspector and asynqmon show while the task
// is kept (asynq.Retention). A task that is not a server's delivery has no
// result writer; a failed write is an error event, and the task still
// completes.
func (m *guarded) writeResult(ctx context.Context, t *asynq.Task, dup *guard.DuplicateError) {
	w := t.ResultWriter()
	if w == nil {
		return
	}
	b, err := json.Marshal(whyOf(dup))
	if err == nil {
		_, err = w.Write(b)
	}
	m.resultWritten(ctx, dup.Job, err)
}

// resultWritten reports a failed write of why job did not run, as its
// result, as an error event.
func (m *guarded) resultWritten(ctx context.Context, job guard.Job, err error) {
	if err != nil {
		guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventError, Job: job,
			Err: fmt.Errorf("singleton: writing why task %s did not run as its result: %w", job.ID, err)})
	}
}

// recordSkip writes why t completed without running as its result
// (writeResult) and adds the decision to the decision log (logDecision): with
// WithRedis, which is the servers' Redis, both in one pipeline (the result
// is the HSET asynq's ResultWriter makes, written only while the task
// exists: resultIfTaskCmd; on a Cluster, one pipeline per node that holds
// one of the keys, sent at once), each a round trip of its own otherwise. Both writes are safe to send twice. A
// failed write is an error event, and the task still completes.
func (m *guarded) recordSkip(ctx context.Context, t *asynq.Task, dup *guard.DuplicateError) {
	w := t.ResultWriter()
	queue, _ := asynq.GetQueueName(ctx)
	if w == nil || queue == "" || m.rdb == nil {
		m.writeResult(ctx, t, dup)
		m.logDecision(ctx, t, dup)
		return
	}
	result, err := json.Marshal(whyOf(dup))
	if err != nil {
		m.resultWritten(ctx, dup.Job, err)
		m.logDecision(ctx, t, dup)
		return
	}
	var hset *redis.Cmd
	var xadd *redis.StringCmd
	_, _ = m.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		hset = p.Eval(ctx, resultIfTaskCmd, []string{asynqkey.Task(queue, w.TaskID())}, result)
		if m.logsDecisions() {
			xadd = p.XAdd(ctx, decisionlog.AddArgs(m.decisions, decisionOf(ctx, t, dup)))
		}
		return nil
	})
	m.resultWritten(ctx, dup.Job, hset.Err())
	if xadd != nil {
		m.decisionWritten(ctx, dup.Job, xadd.Err())
	}
}

// resultIfTaskCmd writes a task's result (the field asynq's ResultWriter
// sets) only while the task exists: the task of a delivery that completes
// without running may be gone already (completed by an earlier delivery of
// it that asynq had given up on), and a hash holding only a result would be
// a task asynq cannot read. It is short enough to be sent as EVAL in the
// pipeline. KEYS[1] the task's hash; ARGV[1] the result. Returns 1 when
// written, else 0.
const resultIfTaskCmd = `if redis.call("EXISTS", KEYS[1]) == 0 then return 0 end
redis.call("HSET", KEYS[1], "result", ARGV[1])
return 1`
