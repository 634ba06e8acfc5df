package lockcore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// A Locker that missed an operator's CancelRun notice cancels the run at
// the lease's next renewal (TTL/3), and keeps renewing it.
func TestCancelRunWithoutItsNoticeArrivesAtTheNextRenewal(t *testing.T) {
	c := testredis.Client(t)
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)), WithTTL(900*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := ctxT(t)
	lease, err := l.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	work, cancel := lease.Context(ctx)
	defer cancel()
	k := l.r.keys("k")
	// The request as CancelRun records it, told on a channel nobody hears.
	a := cancelArgs{Token: lease.Token(), Operators: "nobody", Lock: "k", Keep: cancelKeep}
	n, err := cancelScript.Run(ctx, c, []string{k.holders, k.fence}, a.list()...).Int()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	select {
	case <-work.Done():
		require.ErrorIs(t, context.Cause(work), ErrCancelled)
	case <-time.After(2 * time.Second):
		t.Fatal("the renewal did not cancel the run")
	}
	late, stop := lease.Context(ctx)
	defer stop()
	require.ErrorIs(t, context.Cause(late), ErrCancelled, "a context made after the request is cancelled too")
	require.NoError(t, lease.Extend(ctx, 0))
	require.NoError(t, lease.Err())
	require.NoError(t, lease.Release(ctx))
}
