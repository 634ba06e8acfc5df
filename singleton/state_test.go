package singleton_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// shortRetries returns a new client of the Redis that c is a client of,
// whose commands go-redis sends again for at most window after their first
// run, closed when the test ends.
func shortRetries(t *testing.T, c redis.UniversalClient) (_ redis.UniversalClient, window time.Duration) {
	t.Helper()
	const retries, read, backoff = 1, time.Second, 100 * time.Millisecond
	window = (retries + 1) * (read + backoff)
	switch c := c.(type) {
	case *redis.Client:
		o := *c.Options()
		o.MaxRetries, o.ReadTimeout, o.MaxRetryBackoff = retries, read, backoff
		n := redis.NewClient(&o)
		t.Cleanup(func() { _ = n.Close() })
		return n, window
	case *redis.ClusterClient:
		// A cluster client makes 1 + MaxRedirects attempts of a command,
		// each on a node client that makes 1 + MaxRetries.
		o := *c.Options()
		o.MaxRetries, o.MaxRedirects, o.ReadTimeout, o.MaxRetryBackoff = retries, 1, read, backoff
		n := redis.NewClusterClient(&o)
		t.Cleanup(func() { _ = n.Close() })
		return n, 2 * window
	}
	t.Fatalf("unexpected client %T", c)
	return nil, 0
}

// prefixKeys returns the keys under prefix and their PTTLs, on every master.
func prefixKeys(t *testing.T, c redis.UniversalClient, prefix string) map[string]time.Duration {
	t.Helper()
	ctx := context.Background()
	out := map[string]time.Duration{}
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			left, err := c.PTTL(ctx, iter.Val()).Result()
			if err != nil {
				return err
			}
			out[iter.Val()] = left
		}
		return iter.Err()
	}
	switch c := c.(type) {
	case *redis.Client:
		require.NoError(t, scan(ctx, c))
	case *redis.ClusterClient:
		// ForEachMaster calls its function on every master at once: collect
		// them, then scan one at a time.
		var mu sync.Mutex
		var masters []*redis.Client
		require.NoError(t, c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			mu.Lock()
			masters = append(masters, m)
			mu.Unlock()
			return nil
		}))
		for _, m := range masters {
			require.NoError(t, scan(ctx, m))
		}
	}
	return out
}

// A guarded task that ran leaves one key behind in Redis, for the Locker's
// client's retry window: its holders key with the last fencing token and
// the record that answers a release go-redis sends again. A burst of tasks
// on distinct keys does not pile keys up in Redis.
func TestGuardedTaskLeavesOneKeyForTheRetryWindow(t *testing.T) {
	policies := map[string]middleware.Policy{
		"skip":    middleware.Skip(),
		"requeue": middleware.Requeue(50 * time.Millisecond),
	}
	for name, policy := range policies {
		t.Run(name, func(t *testing.T) {
			onEachRedis(t, func(t *testing.T, r connect) {
				e := newEnvOn(t, r)
				rdb, window := shortRetries(t, e.RDB)
				g, err := singleton.New(rdb, singleton.KeyByPayload(), singleton.WithPolicy(policy),
					singleton.WithLockerOptions(lockkit.WithPrefix(e.Prefix)))
				require.NoError(t, err)
				t.Cleanup(func() { _ = g.Close(context.Background()) })
				const tasks = 20
				var runs atomic.Int32
				cfg := e.config(4)
				g.Configure(&cfg)
				e.start(cfg, g.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
					runs.Add(1)
					return nil
				})))
				for i := range tasks {
					e.Enqueue(asynq.NewTask("state", fmt.Appendf(nil, "%d", i)))
				}
				e.Drained(10 * time.Second)
				require.EqualValues(t, tasks, runs.Load())
				left := prefixKeys(t, e.RDB, e.Prefix)
				require.LessOrEqual(t, len(left), tasks, "keys left: %v", left)
				for k, ttl := range left {
					require.Greater(t, ttl, time.Duration(0), "%s does not expire (of %d keys)", k, len(left))
					require.LessOrEqual(t, ttl, window, "%s outlives the retry window", k)
				}
			})
		})
	}
}
