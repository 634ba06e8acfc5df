package lockkit_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// The observer sees each transition of a lease with its key, owner and
// token; the kinds print in snake case.
func TestObserverSeesLeaseEvents(t *testing.T) {
	var mu sync.Mutex
	var got []lockkit.Event
	l := lockkittest.New(t, lockkit.WithOwner("me"), lockkit.WithObserver(func(e lockkit.Event) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, e)
	}))
	ctx := context.Background()
	lease, err := l.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	_, err = l.TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, lockkit.ErrNotAcquired)
	require.NoError(t, lease.Release(ctx))
	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for _, e := range got {
		kinds = append(kinds, e.Kind.String())
		require.Equal(t, "k", e.Key)
	}
	require.Equal(t, []string{"acquired", "contended", "released"}, kinds)
	require.Equal(t, lockkit.LeaseAcquired, got[0].Kind)
	require.Equal(t, "me", got[0].Owner)
	require.Equal(t, lease.Token(), got[0].Token)
	require.Equal(t, "renew_failed", lockkit.LeaseRenewFailed.String())
	require.Equal(t, "lost", lockkit.LeaseLost.String())
}

// Do refuses a nil Locker, never running fn.
func TestDoNeedsALocker(t *testing.T) {
	ran := false
	err := lockkit.Do(context.Background(), nil, "k", nil, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, lockkit.ErrInvalid)
	require.ErrorContains(t, err, "locker is nil")
	require.False(t, ran)
}
