package lockkit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
)

// An operator's release reaches the released lease's Locker on the
// operators' channel: its work's ctx is cancelled with a cause that says an
// operator released it in milliseconds, long before its next renewal (10s
// here), also for a lease that watches nothing (no Preempt). Another lease
// of the key is left running.
func TestForceReleaseCancelsTheWorkAtOnce(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { forceReleaseAtOnce(t, testredis.Client(t)) })
	t.Run("cluster", func(t *testing.T) { forceReleaseAtOnce(t, testredis.Cluster(t)) })
}

func forceReleaseAtOnce(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	prefix := testredis.Prefix(t, c)
	holder, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix), lockkit.WithTTL(30*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(ctx) })
	op, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = op.Close(ctx) })

	stuck, err := holder.TryAcquire(ctx, "k", &lockkit.AcquireOptions{Limit: 2})
	require.NoError(t, err)
	other, err := holder.TryAcquire(ctx, "k", &lockkit.AcquireOptions{Limit: 2})
	require.NoError(t, err)
	work, cancel := stuck.Context(ctx)
	defer cancel()
	otherWork, cancelOther := other.Context(ctx)
	defer cancelOther()
	require.Eventually(t, func() bool { // the Locker listens on the operators' channel (on one node of a Cluster)
		return subscribers(ctx, c, prefix+"!operators") == 1
	}, 5*time.Second, 5*time.Millisecond)

	start := time.Now()
	n, err := op.ForceRelease(ctx, "k", lockkit.Select{Token: stuck.Token()})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	select {
	case <-work.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the released work was not cancelled before its renewal")
	}
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, context.Cause(work), lockkit.ErrLost)
	require.ErrorContains(t, context.Cause(work), "released by an operator")
	require.NoError(t, otherWork.Err(), "the other holder of the key runs on")
	require.NoError(t, other.Release(ctx))

	// ForceRelease of every holder, by owner.
	again, err := holder.TryAcquire(ctx, "j", nil)
	require.NoError(t, err)
	work, cancel = again.Context(ctx)
	defer cancel()
	n, err = op.ForceRelease(ctx, "j", lockkit.Select{Owner: holder.Owner()})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	select {
	case <-work.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the released work was not cancelled before its renewal")
	}
	require.ErrorContains(t, context.Cause(work), "released by an operator")
}

// subscribers counts the subscribers of channel on every master.
func subscribers(ctx context.Context, c redis.UniversalClient, channel string) int64 {
	count := func(ctx context.Context, n *redis.Client) int64 {
		m, err := n.PubSubNumSub(ctx, channel).Result()
		if err != nil {
			return 0
		}
		return m[channel]
	}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return count(ctx, c.(*redis.Client))
	}
	var mu sync.Mutex
	var total int64
	_ = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		k := count(ctx, n)
		mu.Lock()
		total += k
		mu.Unlock()
		return nil
	})
	return total
}
