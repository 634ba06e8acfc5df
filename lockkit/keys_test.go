package lockkit

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
