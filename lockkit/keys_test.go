package lockkit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// Every key lockkit writes expires on its own, and a released lock without
// an epoch leaves nothing behind for more than a second: unique keys (one per
// task) must not pile up in Redis.
func TestReleasedLocksLeaveNoLongLivedKeys(t *testing.T) {
	c := testredis.Client(t)
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
	lease, err := l.TryAcquire(ctx, "tick", &Options{Epoch: 7, EpochTTL: time.Hour})
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))

	keys, err := c.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 52, "a fence key per lock and the epoch of tick; holders keys are gone")
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, "%s has no expiry", k)
		if k == prefix+"{tick}:m" {
			require.Greater(t, ttl, 59*time.Minute, "the epoch is kept for EpochTTL")
			continue
		}
		require.LessOrEqual(t, ttl, time.Second, "%s outlives its lock", k)
	}
}
