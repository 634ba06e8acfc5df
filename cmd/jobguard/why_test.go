package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/testredis"
)

// why finds, in the decision log the asynq middleware writes, the
// decisions about a task (by its ID, or its first task's for a Requeue
// copy), newest first, with control bytes escaped; a task with no record
// exits 3.
func TestWhy(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	stream := testredis.Prefix(t, c) + "decisions"
	add := func(values ...any) {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err())
	}
	add("task", "t-1", "origin", "t-1", "type", "report", "queue", "default", "key", "asynq:report", "reason", "held", "by_task", "t-0", "by_owner", "worker-7")
	add("task", "other", "origin", "other", "type", "report", "queue", "default", "key", "asynq:report", "reason", "held")
	add("call", "c1", "task", "t-1~a", "origin", "t-1", "type", "report", "queue", "default", "key", "asynq:report\x1b[2J", "reason", "covered", "by_owner", "worker-8", "by_token", "1795650000000000")
	add("call", "c1", "task", "t-1~a", "origin", "t-1", "type", "report", "queue", "default", "key", "asynq:report\x1b[2J", "reason", "covered", "by_owner", "worker-8", "by_token", "1795650000000000")

	add("call", "c2", "task", "t-2", "origin", "t-2", "type", "sync", "queue", "default", "key", "asynq:sync", "reason", "preempted",
		"by_task", "t-3", "by_owner", "worker-9", "by_token", "1795650000000001", "cause", "lockkit: lease lost: preempted")
	add("call", "c3", "task", "t-4", "origin", "t-4", "type", "sync", "queue", "default", "key", "asynq:sync", "reason", "lost",
		"cause", "lockkit: lease lost: \"asynq:sync\": token 1 was released by an operator (ForceRelease)\n")

	add("call", "c4", "task", "t-5", "origin", "t-5", "type", "sync", "queue", "default", "key", "", "reason", "would_archive",
		"cause", "singleton: cannot derive key: task \"sync\": payload has no field \"tenant_id\" (skip retry for the task)")

	out, _, code := jobguard(t, "p", "", "--decisions", stream, "why", "t-5")
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "task t-5 (sync, queue default) ran under WithShadow; without it, it would have been refused and archived: singleton: cannot derive key")
	out, _, code = jobguard(t, "p", "", "--decisions", stream, "why", "t-2")
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "task t-2 (sync, queue default) was preempted while it ran (a newer task of its key cancelled it; not retried), key asynq:sync, by task t-3, run by worker-9 (token 1795650000000001, since 2026-11-25T23:40:00.000001Z): lockkit: lease lost: preempted")
	out, _, code = jobguard(t, "p", "", "--decisions", stream, "why", "t-4")
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "task t-4 (sync, queue default) lost its lease while it ran, and failed (asynq retries it while it has retries left), key asynq:sync: ")
	require.Contains(t, out, `released by an operator (ForceRelease)\n`, "escaped")

	out, _, code = jobguard(t, "p", "", "--decisions", stream, "why", "t-1")
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "task t-1~a (report, queue default) completed without running: covered, key asynq:report\\x1b[2J, run by worker-8 (token 1795650000000000, since 2026-11-25T23:40:00Z)")
	require.Contains(t, out, "task t-1 (report, queue default) completed without running: held, key asynq:report, by task t-0, run by worker-7")
	require.Less(t, strings.Index(out, "t-1~a"), strings.Index(out, "task t-1 "), "newest first")
	require.NotContains(t, out, "other")
	require.Equal(t, 1, strings.Count(out, "t-1~a"), "a write go-redis sent twice is shown once")

	out, _, code = jobguard(t, "p", "", "--decisions", stream, "--json", "why", "t-1")
	require.Equal(t, exitOK, code)
	var got []decisionView
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Len(t, got, 2)
	require.Equal(t, "covered", got[0].Fields["reason"])
	require.NotEmpty(t, got[0].At)

	out, _, code = jobguard(t, "p", "", "--decisions", stream, "why", "missing")
	require.Equal(t, exitNotHeld, code)
	require.Contains(t, out, "no decision recorded for task missing")
	_, errOut, code := jobguard(t, "p", "", "why")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "one TASK-ID")
}

// xrevranges counts the XREVRANGE calls and the entries they asked for.
type xrevranges struct{ calls, asked int64 }

func (h *xrevranges) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *xrevranges) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "xrevrange" {
			h.calls++
			args := cmd.Args()
			n, _ := strconv.ParseInt(fmt.Sprint(args[len(args)-1]), 10, 64)
			h.asked += n
		}
		return next(ctx, cmd)
	}
}

func (h *xrevranges) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// why reads the log 1,000 entries at a time, newest first, stops at the
// read in which it finds the task, and never reads more than --max-entries
// entries: a task older than that is reported as not found, saying so.
func TestWhyReadsTheLogInBoundedChunks(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	stream := testredis.Prefix(t, c) + "decisions"
	add := func(p redis.Pipeliner, task string) {
		p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"task", task, "origin", task, "type", "report", "queue", "default", "key", "k", "reason", "held"}})
	}
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		add(p, "oldest")
		for i := range 2500 {
			add(p, fmt.Sprint("t-", i))
			if i == 1200 {
				add(p, "middle")
			}
		}
		return nil
	})
	require.NoError(t, err)
	why := func(id string, maxEntries int) (int, string, *xrevranges) {
		h := &xrevranges{}
		client := redis.NewClient(c.Options())
		defer client.Close()
		client.AddHook(h)
		var out strings.Builder
		cl := &cli{o: options{decisions: stream, maxEntries: maxEntries}, out: &out, errOut: &out}
		return cl.why(ctx, client, id), out.String(), h
	}
	code, out, h := why("t-2400", defaultWhyMax)
	require.Equal(t, exitOK, code, out)
	require.EqualValues(t, 1, h.calls, "found in the first read")
	require.EqualValues(t, decisionChunk, h.asked)

	code, out, h = why("middle", defaultWhyMax)
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "task middle")
	require.EqualValues(t, 2, h.calls, "1,300 entries from the newest: the second read")

	code, out, h = why("oldest", 2500)
	require.Equal(t, exitNotHeld, code, out)
	require.Contains(t, out, "newest 2500 entries looked through (--max-entries)")
	require.EqualValues(t, 3, h.calls)
	require.EqualValues(t, 2500, h.asked, "never more than --max-entries")

	code, out, h = why("oldest", defaultWhyMax)
	require.Equal(t, exitOK, code, out)
	require.EqualValues(t, 3, h.calls)
	code, out, _ = why("missing", defaultWhyMax)
	require.Equal(t, exitNotHeld, code)
	require.NotContains(t, out, "--max-entries", "the whole log was read")

	_, errOut, code := jobguard(t, "p", "", "--max-entries", "0", "why", "x")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--max-entries")
}

// why prints every outcome of docs/rules.md that the decision log records
// (the table "What the decision log records" in docs/operations.md), and
// says of a task that ran that it recorded nothing: a parked task names the
// key, the task and owner that hold it, since when, and when it comes back;
// an archived task says it did not run and why; an enqueue Unique refused is
// found by the refused task's ID and by the fields of the caller's error;
// a key that the cause quotes is escaped once.
func TestWhyPrintsEveryOutcome(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	stream := testredis.Prefix(t, c) + "decisions"
	const key = `asynq:report:build:tenant_id="acme"`
	base := decisionlog.Entry{Type: "report", Queue: "default", Key: key}
	entry := func(task string, f func(e *decisionlog.Entry)) decisionlog.Entry {
		e := base
		e.Call, e.Task, e.Origin = "c-"+task, task, task
		f(&e)
		return e
	}
	for _, c := range []struct {
		outcome string
		e       decisionlog.Entry
		want    []string
	}{
		{"skipped", entry("skipped", func(e *decisionlog.Entry) {
			e.Reason, e.ByTask, e.ByOwner, e.ByToken = "held", "t-0", "worker-7", 1795649990000000
		}),
			[]string{`task skipped (report, queue default) completed without running: held, key asynq:report:build:tenant_id="acme", by task t-0, run by worker-7 (token 1795649990000000, since 2026-11-25T23:39:50Z)`}},
		{"parked", entry("parked", func(e *decisionlog.Entry) {
			e.Reason, e.ByTask, e.ByOwner, e.ByToken = "held", "t-0", "worker-7", 1795649990000000
			e.Action, e.BackIn = decisionlog.ActionParked, 30*time.Second
		}), []string{"2026-11-25T23:40:00.123Z task parked (report, queue default) was parked behind its key's holder, not run then (held): the run that frees the key resumes it, " +
			`key asynq:report:build:tenant_id="acme", by task t-0, run by worker-7 (token 1795649990000000, since 2026-11-25T23:39:50Z); ` +
			"it comes back by itself in 30s (at 2026-11-25T23:40:30.123Z) should the holder's release never come (its process died)"}},
		{"requeued", entry("requeued", func(e *decisionlog.Entry) {
			e.Reason, e.ByTask, e.Action, e.BackIn = "held", "t-0", decisionlog.ActionRequeued, 1500*time.Millisecond
		}), []string{"task requeued (report, queue default) was put back, not run then (held), key", "by task t-0; it comes back by itself in 1.5s (at 2026-11-25T23:40:01.623Z)"}},
		{"covered", entry("covered", func(e *decisionlog.Entry) { e.Reason, e.ByOwner, e.ByToken = "covered", "worker-8", 1795649995000000 }),
			[]string{"completed without running: covered", "run by worker-8 (token 1795649995000000, since 2026-11-25T23:39:55Z)"}},
		{"superseded", entry("superseded", func(e *decisionlog.Entry) { e.Reason = "superseded" }),
			[]string{"task superseded (report, queue default) completed without running: superseded, key"}},
		{"preempted", entry("preempted", func(e *decisionlog.Entry) {
			e.Reason, e.ByTask, e.Cause = decisionlog.ReasonPreempted, "t-9", "lockkit: lease lost: preempted"
		}), []string{"was preempted while it ran (a newer task of its key cancelled it; not retried)", "by task t-9: lockkit: lease lost: preempted"}},
		{"lost", entry("lost", func(e *decisionlog.Entry) {
			e.Reason, e.Cause = decisionlog.ReasonLost, `lockkit: lease lost: "`+strings.ReplaceAll(key, `"`, `\"`)+`": token 1 was released by an operator (ForceRelease)`
		}), []string{`lost its lease while it ran, and failed (asynq retries it while it has retries left), key asynq:report:build:tenant_id="acme": ` +
			`lockkit: lease lost: "asynq:report:build:tenant_id=\"acme\"": token 1 was released`}},
		{"throttled", entry("throttled", func(e *decisionlog.Entry) { e.Reason = "throttled" }),
			[]string{"completed without running: throttled"}},
		{"throttled-requeued", entry("throttled-requeued", func(e *decisionlog.Entry) {
			e.Reason, e.Action, e.BackIn = "throttled", decisionlog.ActionRequeued, 2*time.Second
		}), []string{"was put back, not run then (throttled)", "it comes back by itself in 2s"}},
		{"refused", entry("refused", func(e *decisionlog.Entry) {
			e.Reason, e.ByTask, e.ByState = decisionlog.ReasonRefused, "holder-1", "pending"
		}),
			[]string{"task refused (report, queue default) was refused at enqueue (Unique): its key was reserved, key", "by task holder-1 (pending)"}},
		{"archived", entry("archived", func(e *decisionlog.Entry) {
			e.Key, e.Reason, e.Cause = "", decisionlog.ReasonArchived, `singleton: cannot derive key: task "report": payload has no field "tenant_id" (skip retry for the task)`
		}), []string{`task archived (report, queue default) did not run: the middleware refused it, and asynq archives it: singleton: cannot derive key: task "report": payload has no field "tenant_id"`}},
		{"shadowed", entry("shadowed", func(e *decisionlog.Entry) {
			e.Reason, e.Cause = decisionlog.ReasonWouldArchive, "singleton: cannot derive key"
		}),
			[]string{"task shadowed (report, queue default) ran under WithShadow; without it, it would have been refused and archived"}},
	} {
		args := decisionlog.AddArgs(0, c.e)
		args.Stream, args.ID = stream, "1795650000123-*"
		require.NoError(t, testredis.Client(t).XAdd(ctx, args).Err(), c.outcome)
		out, _, code := jobguard(t, "p", "", "--decisions", stream, "why", c.outcome)
		require.Equal(t, exitOK, code, "%s: %s", c.outcome, out)
		for _, w := range c.want {
			require.Contains(t, out, w, c.outcome)
		}
		require.NotContains(t, out, `\\`, "%s: escaped once", c.outcome)
	}
	out, _, code := jobguard(t, "p", "", "--decisions", stream, "why", "ran")
	require.Equal(t, exitNotHeld, code, out)
	require.Contains(t, out, "no decision recorded for task ran", "a task that ran has no entry")

	// The caller of a refused enqueue has the refused task's ID only if it
	// gave one; it always has the error's ID (the holder) and Key.
	for _, id := range []string{"holder-1", key} {
		out, _, code := jobguard(t, "p", "", "--decisions", stream, "why", id)
		require.Equal(t, exitOK, code, out)
		require.Contains(t, out, "task refused (report, queue default) was refused at enqueue", id)
		require.NotContains(t, out, "task skipped", "the key finds refused enqueues only")
	}
}
