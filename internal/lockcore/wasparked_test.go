package lockcore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
)

// parkingLocker is a Locker on the real Redis, closed when t ends.
func parkingLocker(t *testing.T) *lockcore.RedisLocker {
	c := testredis.Client(t)
	l, err := lockcore.NewRedis(c, lockcore.WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// A lease whose acquire had been parked says so, whether it adopted the
// reservation a release made for it or came back on its own and found its
// parked entry; a lease whose acquire never parked does not.
func TestWasParked(t *testing.T) {
	ctx := context.Background()
	l := parkingLocker(t)
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

// An acquire with Park whose Label was completed gives its parked entry
// up: a delivery of the work that parked behind the work's own run, and
// comes back once that run completed the label, leaves no place in the
// parked queue for work that is done (no release is to reserve the key for
// it, nor keep the entry ten minutes). A repeat of the call (its reply
// lost) finds the same.
func TestCompletedLabelLeavesTheParkedQueue(t *testing.T) {
	ctx := context.Background()
	l := parkingLocker(t)

	run, err := l.TryAcquire(ctx, "k", &lockcore.AcquireOptions{Label: "job-1"})
	require.NoError(t, err)
	again := &lockcore.AcquireOptions{Label: "job-1", TakeReservation: true, Park: &lockcore.Parking{ID: "queue/job-1"}}
	_, err = l.TryAcquire(ctx, "k", again)
	require.ErrorIs(t, err, lockcore.ErrNotAcquired)
	info, err := l.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []string{"queue/job-1"}, info.ParkedIDs, "the delivery parked behind its own run")

	require.NoError(t, run.Complete(ctx, time.Minute))
	for range 2 {
		_, err = l.TryAcquire(ctx, "k", again)
		require.ErrorIs(t, err, lockcore.ErrCompleted)
		info, err = l.Inspect(ctx, "k")
		require.NoError(t, err)
		require.Zero(t, info.Parked, "the completed work's entry left the parked queue")
	}
}

// Unpark takes the entry that an acquire with the same options parked out
// of the key's parked queue, leaving the others; a second call, and a call
// whose options park nothing, do nothing; options TryAcquire refuses are
// refused too.
func TestUnparkGivesUpTheJobsPlace(t *testing.T) {
	ctx := context.Background()
	l := parkingLocker(t)
	opt := func(label string) *lockcore.AcquireOptions {
		return &lockcore.AcquireOptions{Label: label, TakeReservation: true, Park: &lockcore.Parking{ID: "queue/" + label}}
	}
	holder, err := l.TryAcquire(ctx, "k", opt("job-1"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Release(ctx) })
	for _, job := range []string{"job-2", "job-3"} {
		_, err := l.TryAcquire(ctx, "k", opt(job))
		require.ErrorIs(t, err, lockcore.ErrNotAcquired)
	}
	for range 2 {
		require.NoError(t, l.Unpark(ctx, "k", opt("job-2")))
		info, err := l.Inspect(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, []string{"queue/job-3"}, info.ParkedIDs)
	}
	require.NoError(t, l.Unpark(ctx, "k", &lockcore.AcquireOptions{Label: "job-3"}), "options that park nothing")
	require.ErrorIs(t, l.Unpark(ctx, "k", &lockcore.AcquireOptions{Park: &lockcore.Parking{ID: "queue/x"}}), lockcore.ErrInvalid, "Park.ID without a Label")
	info, err := l.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []string{"queue/job-3"}, info.ParkedIDs)
}
