package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// Under WithShadow a job the policy would not run now runs anyway, without
// a lease, and is reported with what the policy would have done; a job whose
// key is free runs under its lease, so the next one sees the key held.
func TestShadowRunsEveryJobAndReportsTheDecision(t *testing.T) {
	newLocker := backends(t)["redis"]
	rec := &recorder{}
	one, two := newLocker(t).(*lockkit.RedisLocker), newLocker(t)
	a, err := middleware.New(one, middleware.WithShadow(), middleware.WithPolicy(middleware.Requeue(0)), middleware.WithObserver(rec.observe))
	require.NoError(t, err)
	b, err := middleware.New(two, middleware.WithShadow(), middleware.WithPolicy(middleware.Requeue(0)), middleware.WithObserver(rec.observe))
	require.NoError(t, err)

	started, release, done := make(chan struct{}), make(chan struct{}), make(chan middleware.Outcome)
	go func() {
		done <- a.Run(context.Background(), middleware.Job{Key: "report", ID: "first", Origin: "first"}, func(ctx context.Context) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	ranSecond := false
	out := b.Run(context.Background(), middleware.Job{Key: "report", ID: "second", Origin: "second"}, func(ctx context.Context) error {
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

	var shadowed []middleware.Event
	for _, e := range rec.events {
		if e.Kind == middleware.EventShadowed {
			shadowed = append(shadowed, e)
		}
	}
	require.Len(t, shadowed, 1)
	require.Equal(t, "second", shadowed[0].Job.ID)
	require.Equal(t, middleware.ActionRequeue, shadowed[0].Action, "what the policy would have done")
	require.Equal(t, coretest.Of(t, one).Owner(), shadowed[0].Holder)
	require.ErrorIs(t, shadowed[0].Err, lockkit.ErrNotAcquired)
	require.Equal(t, "shadowed", middleware.EventShadowed.String())

	// Its own earlier delivery holding the key is no duplicate: nothing is
	// reported. And Redis unreachable: the job runs, with an error event.
	started, release = make(chan struct{}), make(chan struct{})
	go func() {
		done <- a.Run(context.Background(), middleware.Job{Key: "report", ID: "third", Origin: "third"}, func(context.Context) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	out = b.Run(context.Background(), middleware.Job{Key: "report", ID: "third", Origin: "third"}, func(context.Context) error { return nil })
	require.True(t, out.Ran)
	close(release)
	<-done
	require.Len(t, kindsOf(rec, middleware.EventShadowed), 1, "a re-delivery of the running job is not shadowed")

	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	dl, err := lockkit.NewRedis(down)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dl.Close(context.Background()) })
	g, err := middleware.New(dl, middleware.WithShadow(), middleware.WithObserver(rec.observe))
	require.NoError(t, err)
	ran := false
	out = g.Run(context.Background(), middleware.Job{Key: "report"}, func(context.Context) error { ran = true; return nil })
	require.True(t, out.Ran && ran, "a Redis error does not keep a shadowed job from running")
	require.Len(t, kindsOf(rec, middleware.EventError), 1)
}

// kindsOf returns the events of kind k that r recorded.
func kindsOf(r *recorder, k middleware.EventKind) []middleware.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []middleware.Event
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
	_, err := coretest.Of(t, l).TryAcquire(ctx, "report", &lockcore.AcquireOptions{Label: "task-1", Detached: true, TTL: lockcore.MaxTTL})
	require.NoError(t, err)
	rec := &recorder{}
	g, err := middleware.New(newLocker(t), middleware.WithShadow(), middleware.WithObserver(rec.observe))
	require.NoError(t, err)
	out := g.Run(ctx, middleware.Job{Key: "report", ID: "task-1", Origin: "task-1", Reserved: true}, func(ctx context.Context) error {
		_, ok := lockkit.LeaseFromContext(ctx)
		require.True(t, ok, "it runs under its lease")
		return nil
	})
	require.True(t, out.Ran)
	require.NoError(t, out.Err)
	info, err := l.Inspect(ctx, "report")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "its run's end gave the key back")
	require.Empty(t, kindsOf(rec, middleware.EventShadowed))
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
	g, err := middleware.New(newLocker(t), middleware.WithShadow())
	require.NoError(t, err)
	out := g.Run(ctx, middleware.Job{Key: "report", ID: "task-2", Origin: "task-2", Reserved: true}, func(context.Context) error { return nil })
	require.True(t, out.Ran)
	info, err = l.Inspect(ctx, "report")
	require.NoError(t, err)
	require.Zero(t, info.Parked, "its place is given up")
	require.Len(t, info.Holders, 1, "the holder keeps the key")
}
