package lockcore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
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
	holder, err := lockcore.NewRedis(c, lockcore.WithPrefix(prefix), lockcore.WithTTL(30*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(ctx) })
	op, err := lockcore.NewRedis(c, lockcore.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = op.Close(ctx) })

	stuck, err := holder.TryAcquire(ctx, "k", &lockcore.AcquireOptions{Limit: 2})
	require.NoError(t, err)
	other, err := holder.TryAcquire(ctx, "k", &lockcore.AcquireOptions{Limit: 2})
	require.NoError(t, err)
	work, cancel := stuck.Context(ctx)
	defer cancel()
	otherWork, cancelOther := other.Context(ctx)
	defer cancelOther()
	require.Eventually(t, func() bool { // the Locker listens on the operators' channel (on one node of a Cluster)
		return subscribers(ctx, c, prefix+"!operators") == 1
	}, 5*time.Second, 5*time.Millisecond)

	start := time.Now()
	n, err := op.ForceRelease(ctx, "k", lockcore.Select{Token: stuck.Token()})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	select {
	case <-work.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the released work was not cancelled before its renewal")
	}
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, context.Cause(work), lockcore.ErrLost)
	require.ErrorContains(t, context.Cause(work), "released by an operator")
	require.NoError(t, otherWork.Err(), "the other holder of the key runs on")
	require.NoError(t, other.Release(ctx))

	// ForceRelease of every holder, by owner.
	again, err := holder.TryAcquire(ctx, "j", nil)
	require.NoError(t, err)
	work, cancel = again.Context(ctx)
	defer cancel()
	n, err = op.ForceRelease(ctx, "j", lockcore.Select{Owner: holder.Owner()})
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

// An operator's CancelRun of a run that ignores its ctx never lets a second
// run of the key start beside it: the run's ctx is cancelled at once
// (ErrCancelled, not ErrLost), the key stays held and renewed past its TTL
// while the run goes on, Inspect says it is being cancelled, and when the
// run returns its release hands the key to the waiter at once.
func TestCancelRunKeepsTheKeyUntilTheRunReturns(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { cancelRunKeepsTheKey(t, testredis.Client(t)) })
	t.Run("cluster", func(t *testing.T) {
		cancelRunKeepsTheKey(t, testredis.Cluster(t))
	})
}

func cancelRunKeepsTheKey(t *testing.T, c redis.UniversalClient) {
	ctx, prefix := context.Background(), testredis.Prefix(t, c)
	locker := func(opts ...lockcore.Option) *lockcore.RedisLocker {
		l, err := lockcore.NewRedis(c, append([]lockcore.Option{lockcore.WithPrefix(prefix)}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(ctx) })
		return l
	}
	const ttl = 600 * time.Millisecond
	holder, other, op := locker(lockcore.WithTTL(ttl)), locker(lockcore.WithTTL(ttl)), locker()

	lease, err := holder.TryAcquire(ctx, "k", &lockcore.AcquireOptions{Label: "task-1"})
	require.NoError(t, err)
	cancelled, finish, ran := make(chan error, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		ran <- lease.Run(ctx, func(ctx context.Context) error {
			<-ctx.Done() // then goes on, as a handler stuck in a call that ignores ctx
			cancelled <- context.Cause(ctx)
			<-finish
			return nil
		})
	}()
	require.Eventually(t, func() bool { return subscribers(ctx, c, prefix+"!operators") >= 1 }, 5*time.Second, 5*time.Millisecond)
	second := make(chan *lockcore.Lease, 1)
	go func() {
		l, err := other.Acquire(ctx, "k", nil)
		if err == nil {
			second <- l
		}
	}()

	n, err := op.CancelRun(ctx, "k", lockcore.Select{Token: lease.Token()})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	select {
	case cause := <-cancelled:
		require.ErrorIs(t, cause, lockcore.ErrCancelled)
		require.NotErrorIs(t, cause, lockcore.ErrLost)
	case <-time.After(5 * time.Second):
		t.Fatal("the run's ctx was not cancelled")
	}
	n, err = op.CancelRun(ctx, "k", lockcore.Select{Token: lease.Token()})
	require.NoError(t, err)
	require.Equal(t, 1, n, "a repeat selects the same run")
	info, err := op.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.True(t, info.Holders[0].Cancelling)
	require.Equal(t, lease.Token(), info.Holders[0].Token)
	require.Less(t, info.Holders[0].CancelAge, 5*time.Second)

	// The run goes on for 3 TTLs: nobody else gets the key, the lease is renewed.
	require.Never(t, func() bool { return len(second) > 0 }, 3*ttl, 10*time.Millisecond, "a second run started beside the cancelled one")
	require.NoError(t, lease.Err())

	returned := time.Now()
	close(finish)
	require.NoError(t, <-ran)
	select {
	case l := <-second:
		wait := time.Since(returned)
		t.Logf("the waiter got the key %s after the cancelled run returned", wait)
		require.Less(t, wait, ttl, "handed on by the release, not by the lease's expiry")
		info, err := op.Inspect(ctx, "k")
		require.NoError(t, err)
		require.Len(t, info.Holders, 1)
		require.False(t, info.Holders[0].Cancelling, "the request ended with the run")
		require.NoError(t, l.Release(ctx))
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the key when the cancelled run returned")
	}

	_, err = op.CancelRun(ctx, "k", lockcore.Select{Token: lease.Token()})
	require.ErrorIs(t, err, lockcore.ErrNotHeld)
	_, err = op.CancelRun(ctx, "k", lockcore.Select{Label: "task-1"})
	require.ErrorIs(t, err, lockcore.ErrInvalid)
	_, err = op.CancelRun(ctx, "", lockcore.Select{})
	require.ErrorIs(t, err, lockcore.ErrInvalid)
}

// A cancelled run whose process stops renewing (it died, or is cut off)
// loses the key at its TTL as any lease does: the waiter gets it then.
func TestCancelRunOfADeadProcessLapses(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	const ttl = 600 * time.Millisecond
	holder, err := lockcore.NewRedis(c, lockcore.WithPrefix(prefix), lockcore.WithTTL(ttl))
	require.NoError(t, err)
	other, err := lockcore.NewRedis(c, lockcore.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close(ctx) })
	_, err = holder.TryAcquire(ctx, "k", &lockcore.AcquireOptions{NoRenew: true}) // a process that renews nothing: dead
	require.NoError(t, err)
	n, err := other.CancelRun(ctx, "k", lockcore.Select{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	start := time.Now()
	l, err := other.Acquire(ctx, "k", nil)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 2*ttl)
	require.NoError(t, l.Release(ctx))
	_ = holder.Close(ctx)
}
