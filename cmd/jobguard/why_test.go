package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/singleton"
)

// why finds, in the decision log the asynq middleware writes, the
// decisions about a task (by its ID, or its first task's for a Requeue
// copy), newest first, with control bytes escaped; a task with no record
// exits 3.
func TestWhy(t *testing.T) {
	require.Equal(t, singleton.DecisionLog, decisionLog)
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

	out, _, code := jobguard(t, "p", "", "--decisions", stream, "why", "t-1")
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
