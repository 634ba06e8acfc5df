package singleton

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// DecisionLog stays near its length however many tasks do not run, and at
// the default length it takes about 3 MB of Redis memory with realistic
// entries (Kubernetes-style owners, UUID task IDs, a tenant key).
func TestDecisionLogIsTrimmedToItsLength(t *testing.T) {
	ctx := context.Background()
	// A database of its own: DecisionLog is one key per Redis database, and
	// other tests read theirs.
	rdb := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), DB: 15})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Del(ctx, DecisionLog).Err())
	t.Cleanup(func() { _ = rdb.Del(context.Background(), DecisionLog).Err() })
	l, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(testredis.Prefix(t, rdb)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	for _, n := range []int{500, DefaultDecisionLogLen} {
		require.NoError(t, rdb.Del(ctx, DecisionLog).Err())
		cfg := serverConfig([]ServerOption{WithRedis(rdb), WithDecisionLog(n)})
		m, err := cfg.build(l)
		require.NoError(t, err)
		for i := range 2 * n {
			id := fmt.Sprintf("9f1c2d3e-4b5a-4c6d-8e7f-%012d", i)
			job := guard.With(middleware.Job{Key: `asynq:report:tenant_id="acme-corp-1234"`, ID: id}, guard.Work{Label: id})
			m.addDecision(ctx, job, decisionlog.Entry{Call: newTaskID(), Task: id, Origin: id, Type: "report", Queue: "default",
				Key: job.Key, Reason: "held", ByTask: "0b7e6f5d-4c3b-4a29-8f17-6e5d4c3b2a19", ByOwner: "report-worker-7c9d8f6b5-x2kqz:1:3f9a2c7d"})
		}
		length, err := rdb.XLen(ctx, DecisionLog).Result()
		require.NoError(t, err)
		require.GreaterOrEqual(t, length, int64(n))
		require.LessOrEqual(t, length, int64(n)+100, "trimmed to about %d (whole nodes of 100 entries)", n)
		if n == DefaultDecisionLogLen {
			mem, err := rdb.MemoryUsage(ctx, DecisionLog).Result()
			require.NoError(t, err)
			t.Logf("%d entries: %d bytes", length, mem)
			require.LessOrEqual(t, mem, int64(4<<20), "about 3 MB at the default length")
		}
	}
}
