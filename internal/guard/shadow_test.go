package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/lockkit"
)

// Under WithShadow a job the policy would not run now runs anyway, without
// a lease, and is reported with what the policy would have done; a job whose
// key is free runs under its lease, so the next one sees the key held.
func TestShadowRunsEveryJobAndReportsTheDecision(t *testing.T) {
	newLocker := backends(t)["redis"]
	rec := &recorder{}
	one, two := newLocker(t), newLocker(t)
	a, err := guard.New(one, guard.WithShadow(), guard.WithPolicy(guard.Requeue(0)), guard.WithObserver(rec.observe))
	require.NoError(t, err)
	b, err := guard.New(two, guard.WithShadow(), guard.WithPolicy(guard.Requeue(0)), guard.WithObserver(rec.observe))
	require.NoError(t, err)

	started, release, done := make(chan struct{}), make(chan struct{}), make(chan guard.Outcome)
	go func() {
		done <- a.Run(context.Background(), guard.With(guard.Job{Key: "report", ID: "first"}, guard.Work{Label: "first"}), func(ctx context.Context) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	ranSecond := false
	out := b.Run(context.Background(), guard.With(guard.Job{Key: "report", ID: "second"}, guard.Work{Label: "second"}), func(ctx context.Context) error {
		ranSecond = true
		return errors.New("the job's own error")
	})
	require.True(t, out.Ran && ranSecond, "the duplicate ran anyway")
	require.Nil(t, out.Duplicate)
	require.EqualError(t, out.Err, "the job's own error")
	close(release)
	first := <-done
	require.True(t, first.Ran)
	require.NoError(t, first.Err)

	var shadowed []guard.Event
	for _, e := range rec.events {
		if e.Kind == guard.EventShadowed {
			shadowed = append(shadowed, e)
		}
	}
	require.Len(t, shadowed, 1)
	require.Equal(t, "second", shadowed[0].Job.ID)
	require.Equal(t, guard.ActionRequeue, shadowed[0].Action, "what the policy would have done")
	require.Equal(t, coretest.Of(t, one).Owner(), shadowed[0].Holder)
	require.ErrorIs(t, shadowed[0].Err, lockkit.ErrNotAcquired)
	require.Equal(t, "shadowed", guard.EventShadowed.String())

	// Its own earlier delivery holding the key is no duplicate: nothing is
	// reported. And Redis unreachable: the job runs, with an error event.
	started, release = make(chan struct{}), make(chan struct{})
	go func() {
		done <- a.Run(context.Background(), guard.With(guard.Job{Key: "report", ID: "third"}, guard.Work{Label: "third"}), func(context.Context) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	out = b.Run(context.Background(), guard.With(guard.Job{Key: "report", ID: "third"}, guard.Work{Label: "third"}), func(context.Context) error { return nil })
	require.True(t, out.Ran)
	close(release)
	<-done
	require.Len(t, kindsOf(rec, guard.EventShadowed), 1, "a re-delivery of the running job is not shadowed")

	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	dl, err := lockkit.NewRedis(down)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dl.Close(context.Background()) })
	g, err := guard.New(dl, guard.WithShadow(), guard.WithObserver(rec.observe))
	require.NoError(t, err)
	ran := false
	out = g.Run(context.Background(), guard.Job{Key: "report"}, func(context.Context) error { ran = true; return nil })
	require.True(t, out.Ran && ran, "a Redis error does not keep a shadowed job from running")
	require.Len(t, kindsOf(rec, guard.EventError), 1)
}

// kindsOf returns the events of kind k that r recorded.
func kindsOf(r *recorder, k guard.EventKind) []guard.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []guard.Event
	for _, e := range r.events {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// Under WithShadow a job reserved for (Job.Reserved) takes its reservation
// over and runs under its lease, and its end frees the key, as without
// shadow: the reservation does not stay until it lapses.
func TestShadowReservedJobTakesItsReservationOver(t *testing.T) {
	newLocker := backends(t)["redis"]
	ctx := context.Background()
	l := newLocker(t)
	_, err := coretest.Of(t, l).TryAcquire(ctx, "report", &lockcore.AcquireOptions{Label: "task-1", Reserve: true, TTL: lockcore.MaxTTL})
	require.NoError(t, err)
	rec := &recorder{}
	g, err := guard.New(newLocker(t), guard.WithShadow(), guard.WithObserver(rec.observe))
	require.NoError(t, err)
	out := g.Run(ctx, guard.With(guard.Job{Key: "report", ID: "task-1"}, guard.Work{Label: "task-1", Reserved: true}), func(ctx context.Context) error {
		_, ok := lockkit.LeaseFromContext(ctx)
		require.True(t, ok, "it runs under its lease")
		return nil
	})
	require.True(t, out.Ran)
	require.NoError(t, out.Err)
	info, err := l.Inspect(ctx, "report")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "its run's end gave the key back")
	require.Empty(t, kindsOf(rec, guard.EventShadowed))
}

// Under WithShadow a job the key is reserved for that runs beside another
// holder (a duplicate) gives up its place in the key's parked queue when it
// has run: no later release reserves the key for work that is done.
func TestShadowDuplicateGivesUpItsParkedPlace(t *testing.T) {
	newLocker := backends(t)["redis"]
	ctx := context.Background()
	l := coretest.Of(t, newLocker(t))
	holder, err := l.TryAcquire(ctx, "report", &lockcore.AcquireOptions{Label: "task-1"})
	require.NoError(t, err)
	defer holder.Release(ctx)
	_, err = l.TryAcquire(ctx, "report", &lockcore.AcquireOptions{Label: "task-2", Park: &lockcore.Parking{ID: "q\ntask-2\ntask-2", Hold: time.Minute}})
	require.ErrorIs(t, err, lockkit.ErrNotAcquired)
	info, err := l.Inspect(ctx, "report")
	require.NoError(t, err)
	require.Equal(t, 1, info.Parked, "task-2 is parked")
	g, err := guard.New(newLocker(t), guard.WithShadow())
	require.NoError(t, err)
	out := g.Run(ctx, guard.With(guard.Job{Key: "report", ID: "task-2"}, guard.Work{Label: "task-2", Reserved: true}), func(context.Context) error { return nil })
	require.True(t, out.Ran)
	info, err = l.Inspect(ctx, "report")
	require.NoError(t, err)
	require.Zero(t, info.Parked, "its place is given up")
	require.Len(t, info.Holders, 1, "the holder keeps the key")
}
