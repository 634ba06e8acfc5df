package lockcore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// Every key lockkit writes expires on its own, and a released lock without
// an epoch leaves nothing behind for longer than the client's retry window
// (the holders key, so that a repeated release reports the same) or a second
// (the fence): unique keys (one per task) must not pile up in Redis.
func TestReleasedLocksLeaveNoLongLivedKeys(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), MaxRetries: 1, ReadTimeout: time.Second, MaxRetryBackoff: 100 * time.Millisecond})
	defer c.Close()
	window := 2 * (time.Second + 100*time.Millisecond)
	require.Equal(t, window, retryWindow(c))
	prefix := testredis.Prefix(t, c)
	l, err := NewRedis(c, WithPrefix(prefix))
	require.NoError(t, err)
	defer l.Close(context.Background())
	ctx := context.Background()
	for i := range 50 {
		lease, err := l.TryAcquire(ctx, fmt.Sprint("task-", i), nil) // 30s TTL
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
	}
	lease, err := l.TryAcquire(ctx, "tick", &AcquireOptions{Epoch: 7, EpochTTL: time.Hour})
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))

	keys, err := c.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 52, "one key per lock, its holders key; and tick's epoch")
	// (A released lock's holders key keeps "~<token>.", its last token and
	// the record of its release; tick, with an epoch, also keeps the epoch.)
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, "%s has no expiry", k)
		if k == prefix+"{tick}:m" {
			require.Greater(t, ttl, 59*time.Minute, "the epoch is kept for EpochTTL")
			continue
		}
		if strings.HasSuffix(k, ":h") {
			v, err := c.Get(ctx, k).Result()
			require.NoError(t, err, "%s: a holders key without holders", k)
			require.True(t, strings.HasPrefix(v, "~"), "%s: a holders key without holders: %q", k, v)
			if strings.HasSuffix(v, ".") {
				require.LessOrEqual(t, ttl, window, "%s outlives the retry window", k)
				continue
			}
		}
		if strings.Contains(k, ":d") {
			require.LessOrEqual(t, ttl, window, "%s outlives the retry window", k)
			continue
		}
		require.LessOrEqual(t, ttl, time.Second, "%s outlives its lock", k)
	}
}

// The retry window spans every attempt go-redis makes of one command: a
// Client's and a Ring's 1 + MaxRetries; a ClusterClient's 1 + MaxRedirects,
// each on a node client that makes 1 + MaxRetries (none by default).
func TestRetryWindowSpansEveryAttempt(t *testing.T) {
	client := redis.NewClient(&redis.Options{})
	defer client.Close()
	o := client.Options() // go-redis' defaults, which differ between its versions
	require.Equal(t, 3, o.MaxRetries)
	require.Equal(t, min(4*(o.ReadTimeout+o.MaxRetryBackoff), time.Minute), retryWindow(client), "MaxRetries 3 by default")
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	co := cluster.Options()
	require.Equal(t, min(4*(co.ReadTimeout+co.MaxRetryBackoff), time.Minute), retryWindow(cluster),
		"MaxRedirects 3 by default, no node retries")
	retrying := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, MaxRedirects: 1, MaxRetries: 2,
		ReadTimeout: time.Second, MaxRetryBackoff: 100 * time.Millisecond})
	defer retrying.Close()
	require.Equal(t, 6*(time.Second+100*time.Millisecond), retryWindow(retrying), "2 redirect attempts × 3 node attempts")
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ReadTimeout: time.Second,
		MaxRetryBackoff: 100 * time.Millisecond})
	defer ring.Close()
	require.Equal(t, 4*(time.Second+100*time.Millisecond), retryWindow(ring), "MaxRetries 3 by default")
	none := redis.NewClient(&redis.Options{MaxRetries: -1, ReadTimeout: 200 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
	defer none.Close()
	require.Equal(t, time.Second, retryWindow(none), "at least a second")
}
