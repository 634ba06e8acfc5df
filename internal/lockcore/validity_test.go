package lockcore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
)

// Err tells a lease past its validity from a held one at once, also for a
// reservation (Reserve), which nothing renews or marks lost: once its TTL
// ran out in Redis (the key is free again), Err matches ErrLost.
func TestErrReportsARunOutValidity(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	l, err := lockcore.NewRedis(c, lockcore.WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	res, err := l.TryAcquire(ctx, "k", &lockcore.AcquireOptions{Label: "job", Reserve: true, TTL: lockcore.MinTTL})
	require.NoError(t, err)
	require.NoError(t, res.Err(), "held")
	require.Eventually(t, func() bool {
		info, err := l.Inspect(ctx, "k")
		return err == nil && len(info.Holders) == 0
	}, 5*time.Second, 5*time.Millisecond, "the reservation expires in Redis")
	require.ErrorIs(t, res.Err(), lockcore.ErrLost)
	require.ErrorContains(t, res.Err(), "validity ran out")

	held, err := l.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	require.NoError(t, held.Err(), "held")
	require.NoError(t, held.Release(ctx))
	require.NoError(t, held.Err(), "nil after a normal release")
}
