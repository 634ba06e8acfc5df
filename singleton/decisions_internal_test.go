package singleton

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/middleware"
)

// The decision log stays near its length however many tasks do not run, and at
// the default length it takes about 3 MB of Redis memory with realistic
// entries (Kubernetes-style owners, UUID task IDs, a tenant key).
func TestDecisionLogIsTrimmedToItsLength(t *testing.T) {
	ctx := context.Background()
	// A database of its own: the decision log is one key per Redis database, and
	// other tests read theirs.
	rdb := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), DB: 15})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Del(ctx, decisionlog.Stream).Err())
	t.Cleanup(func() { _ = rdb.Del(context.Background(), decisionlog.Stream).Err() })
	l, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(testredis.Prefix(t, rdb)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	for _, n := range []int{500, defaultDecisionLogLen} {
		require.NoError(t, rdb.Del(ctx, decisionlog.Stream).Err())
		cfg := serverConfig([]ServerOption{WithRedis(rdb), WithDecisionLog(n)})
		m, err := cfg.build(l)
		require.NoError(t, err)
		for i := range 2 * n {
			id := fmt.Sprintf("9f1c2d3e-4b5a-4c6d-8e7f-%012d", i)
			job := guard.With(middleware.Job{Key: `asynq:report:tenant_id="acme-corp-1234"`, ID: id}, guard.Work{Label: id})
			m.addDecision(ctx, job, decisionlog.Entry{Call: newTaskID(), Task: id, Origin: id, Type: "report", Queue: "default",
				Key: job.Key, Reason: "held", ByTask: "0b7e6f5d-4c3b-4a29-8f17-6e5d4c3b2a19", ByOwner: "report-worker-7c9d8f6b5-x2kqz:1:3f9a2c7d"})
		}
		length, err := rdb.XLen(ctx, decisionlog.Stream).Result()
		require.NoError(t, err)
		require.GreaterOrEqual(t, length, int64(n))
		require.LessOrEqual(t, length, int64(n)+100, "trimmed to about %d (whole nodes of 100 entries)", n)
		if n == defaultDecisionLogLen {
			mem, err := rdb.MemoryUsage(ctx, decisionlog.Stream).Result()
			require.NoError(t, err)
			t.Logf("%d entries: %d bytes", length, mem)
			require.LessOrEqual(t, mem, int64(4<<20), "about 3 MB at the default length")
		}
	}
}

// The defaults WithDecisionLog and Unique state: about 10,000 entries of the
// decision log, kept by a middleware and a Client given no WithDecisionLog,
// and a reservation of 24 hours when Unique is given no TTL.
func TestStatedDefaults(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialed
	t.Cleanup(func() { _ = rdb.Close() })
	locker := lockkittest.New(t)
	m, err := serverConfig([]ServerOption{WithRedis(rdb)}).build(locker)
	require.NoError(t, err)
	require.Equal(t, 10000, m.decisions, "the middleware's decision log length")
	c, err := NewClient(asynq.NewClientFromRedisClient(rdb), rdb, Unique(locker, 0, 0))
	require.NoError(t, err)
	require.Equal(t, 10000, c.decisions, "the Client's decision log length")
	require.Equal(t, 24*time.Hour, c.unique.ttl, "Unique's reservation TTL")
}
