package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// go-redis v9.17's process-wide clock goroutine is go-redis's, not a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// TestEachTickEnqueuesOneTask runs the demo (on REDIS_ADDR when set, else on
// the embedded miniredis) and checks its summary: every tick ran on one
// replica, was skipped by the others and enqueued exactly one task.
func TestEachTickEnqueuesOneTask(t *testing.T) {
	var out bytes.Buffer
	cfg := config{Addr: os.Getenv("REDIS_ADDR"), Replicas: 3, Ticks: 3, Spec: "* * * * * *", Jitter: 300 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, &out, cfg)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	rows := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d\s+replica-[abc]\s+2\s+1$`).FindAllString(out.String(), -1)
	require.Len(t, rows, 3)
	require.Contains(t, out.String(), "3 ticks, 3 runs, 3 tasks (unguarded, 3 replicas would have enqueued 9)")
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, cfg := range []config{
		{Replicas: 0, Ticks: 1, Spec: "* * * * * *"},
		{Replicas: 27, Ticks: 1, Spec: "* * * * * *"},
		{Replicas: 3, Ticks: 0, Spec: "* * * * * *"},
		{Replicas: 3, Ticks: 1, Spec: "* * * * *"},
		{Replicas: 3, Ticks: 1, Spec: "* * * * * *", Jitter: -time.Second},
	} {
		require.Error(t, run(context.Background(), &bytes.Buffer{}, cfg), "%+v", cfg)
	}
}

// TestPeriodicEnqueuesEachTickOnce runs the -periodic demo: three
// periodic.Scheduler replicas, one with its clock 300ms behind, enqueue one
// task per tick.
func TestPeriodicEnqueuesEachTickOnce(t *testing.T) {
	var out bytes.Buffer
	cfg := config{Addr: os.Getenv("REDIS_ADDR"), Replicas: 3, Ticks: 3, Jitter: 300 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := runPeriodic(ctx, &out, cfg)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	require.Regexp(t, `\d+ ticks, \d+ tasks \(asynq.Scheduler on 3 replicas would have enqueued \d+\)`, out.String())
}
