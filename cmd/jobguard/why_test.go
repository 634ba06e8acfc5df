package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

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
	require.Contains(t, out, "task t-2 (sync, queue default) was preempted while it ran (a newer task of its key cancelled it; not retried), key asynq:sync, by task t-3, run by worker-9 (token 1795650000000001): lockkit: lease lost: preempted")
	out, _, code = jobguard(t, "p", "", "--decisions", stream, "why", "t-4")
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "task t-4 (sync, queue default) lost its lease while it ran, and failed (asynq retries it while it has retries left), key asynq:sync: ")
	require.Contains(t, out, `released by an operator (ForceRelease)\n`, "escaped")

	out, _, code = jobguard(t, "p", "", "--decisions", stream, "why", "t-1")
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "task t-1~a (report, queue default) completed without running: covered, key asynq:report\\x1b[2J, run by worker-8 (token 1795650000000000)")
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
