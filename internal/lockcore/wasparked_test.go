package lockcore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
)

// A lease whose acquire had been parked says so, whether it adopted the
// reservation a release made for it or came back on its own and found its
// parked entry; a lease whose acquire never parked does not.
func TestWasParked(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	l, err := lockcore.NewRedis(c, lockcore.WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	started := make(chan string, 1)
	opt := func(label string) *lockcore.AcquireOptions {
		return &lockcore.AcquireOptions{Label: label, TakeReservation: true, Park: &lockcore.Parking{ID: "queue/" + label, OnParked: func(_, id string) { started <- id }}}
	}

	first, err := l.TryAcquire(ctx, "k", opt("job-1"))
	require.NoError(t, err)
	require.False(t, first.WasParked())
	for _, job := range []string{"job-2", "job-3"} {
		_, err := l.TryAcquire(ctx, "k", opt(job))
		require.ErrorIs(t, err, lockcore.ErrNotAcquired)
	}
	info, err := l.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 2, info.Parked)
	require.Equal(t, []string{"queue/job-2", "queue/job-3"}, info.ParkedIDs, "Inspect names the parked jobs, oldest first")
	require.NoError(t, first.Release(ctx))
	require.Equal(t, "queue/job-2", <-started)
	second, err := l.TryAcquire(ctx, "k", opt("job-2"))
	require.NoError(t, err)
	require.True(t, second.WasParked(), "it adopted its reservation")
	require.NoError(t, second.Release(ctx))
	require.Equal(t, "queue/job-3", <-started)

	// job-3 does not take its reservation: it lapses (ForceRelease stands
	// for its hold ending), and job-3 comes back by itself.
	_, err = l.ForceRelease(ctx, "k", lockcore.Select{})
	require.NoError(t, err)
	third, err := l.TryAcquire(ctx, "k", opt("job-3"))
	require.NoError(t, err)
	require.False(t, third.WasParked(), "its entry left the parked queue when the key was reserved for it")
	require.NoError(t, third.Release(ctx))

	// A job parked and back before any release reserved the key for it
	// finds its entry.
	holder, err := l.TryAcquire(ctx, "k", opt("job-4"))
	require.NoError(t, err)
	_, err = l.TryAcquire(ctx, "k", opt("job-5"))
	require.ErrorIs(t, err, lockcore.ErrNotAcquired)
	_, err = l.ForceRelease(ctx, "k", lockcore.Select{})
	require.NoError(t, err)
	_ = holder.Release(ctx)
	fifth, err := l.TryAcquire(ctx, "k", opt("job-5"))
	require.NoError(t, err)
	require.True(t, fifth.WasParked(), "it found its parked entry")
	require.NoError(t, fifth.Release(ctx))
}
