package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/throttle"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// on returns a function that makes Throttles of n starts per period on
// client, under a prefix of the test's own: as many processes sharing one
// Redis.
func on(t *testing.T, client redis.UniversalClient) func(n int, period time.Duration) *throttle.Throttle {
	prefix := testredis.Prefix(t, client)
	return func(n int, period time.Duration) *throttle.Throttle {
		t.Helper()
		th, err := throttle.New(client, n, period, throttle.WithPrefix(prefix))
		require.NoError(t, err)
		return th
	}
}

// At most n starts in any window of one period, across Throttles.
func TestThrottleSpreadsStarts(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		newThrottle := on(t, client)
		const n, period = 3, 600 * time.Millisecond
		a, b := newThrottle(n, period), newThrottle(n, period)
		a1, b1 := newThrottle(1, time.Minute), newThrottle(1, time.Minute)
		for i := range n {
			l := a
			if i%2 == 1 {
				l = b
			}
			wait, err := l.Take(ctx, "api")
			require.NoError(t, err)
			require.Zero(t, wait, "start %d of the burst", i+1)
		}
		wait, err := b.Take(ctx, "api")
		require.NoError(t, err)
		require.Positive(t, wait, "the budget is spent")

		// A named start: taken once however often it is asked for, and given
		// back for work that did not start.
		for range 2 {
			wait, err = a1.Start(ctx, "named", "s1")
			require.NoError(t, err)
			require.Zero(t, wait, "a repeat of the start takes no second one")
		}
		wait, err = b1.Start(ctx, "named", "s2")
		require.NoError(t, err)
		require.Positive(t, wait, "the budget is spent")
		require.NoError(t, b1.Return(ctx, "named", "s1"))
		require.NoError(t, b1.Return(ctx, "named", "s1"), "returning again does nothing")
		wait, err = b1.Start(ctx, "named", "s2")
		require.NoError(t, err)
		require.Zero(t, wait, "the returned start is free again")
		_, err = a1.Start(ctx, "named", "")
		require.ErrorIs(t, err, lockkit.ErrInvalid)
		require.ErrorIs(t, a1.Return(ctx, "named", ""), lockkit.ErrInvalid)
		require.LessOrEqual(t, wait, period+time.Millisecond, "when the oldest start leaves the window")
		again, err := a.Take(ctx, "api")
		require.NoError(t, err)
		require.Positive(t, again, "a refused start takes nothing: still refused")
		time.Sleep(again + 5*time.Millisecond) // the next slot opens
		wait, err = a.Take(ctx, "api")
		require.NoError(t, err)
		require.Zero(t, wait)
		wait, err = a.Take(ctx, "other")
		require.NoError(t, err)
		require.Zero(t, wait, "keys have their own budgets")

		_, err = a1.Take(ctx, "")
		require.ErrorIs(t, err, lockkit.ErrInvalid)
	})
}

// A start id seen again after its start left the window is a new start,
// counted against the budget.
func TestThrottleCountsAStaleIDAgain(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		const period = time.Second
		l := on(t, client)(2, period)
		take := func(id string) time.Duration {
			t.Helper()
			w, err := l.Start(ctx, "k", id)
			require.NoError(t, err)
			return w
		}
		require.Zero(t, take("X"))
		time.Sleep(period / 2)
		require.Zero(t, take("Y"))
		time.Sleep(period/2 + 100*time.Millisecond) // X left the window, Y is in it
		require.Zero(t, take("X"), "X again: a new start")
		require.Positive(t, take("Z"), "Y and the new X spent the budget")
	})
}

// A reserved start counts against the budget until it is taken, dated when
// taken, given back, or one period has passed.
func TestThrottleReservesStartsAndDatesThemWhenTaken(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		newThrottle := on(t, client)
		const period = 600 * time.Millisecond
		a, b := newThrottle(2, time.Minute), newThrottle(2, time.Minute)
		ap, bp := newThrottle(1, period), newThrottle(1, period)
		wait := func(d time.Duration, err error) time.Duration {
			t.Helper()
			require.NoError(t, err)
			return d
		}
		require.Zero(t, wait(a.Reserve(ctx, "k", "r1")))
		require.Zero(t, wait(a.Reserve(ctx, "k", "r1")), "a repeat")
		require.Zero(t, wait(b.Reserve(ctx, "k", "r2")), "the repeat reserved nothing more")
		require.Positive(t, wait(b.Take(ctx, "k")), "reservations count against the budget")
		require.Positive(t, wait(b.Reserve(ctx, "k", "r3")))
		require.Zero(t, wait(a.Next(ctx, "k")), "no start began: reservations may not")
		for range 2 {
			require.Zero(t, wait(a.Start(ctx, "k", "r1")), "a reserved start is taken, once")
		}
		require.Zero(t, wait(a.Reserve(ctx, "k", "r1")), "a repeat of the taken start's reservation")
		require.Zero(t, wait(a.Next(ctx, "k")), "one start began")
		require.NoError(t, b.Return(ctx, "k", "r2"))
		require.Zero(t, wait(b.Take(ctx, "k")), "a returned reservation is free again")
		require.Positive(t, wait(b.Next(ctx, "k")), "r1 and the last start began: the budget is spent")
		require.Positive(t, wait(b.Reserve(ctx, "k", "r4")))

		// A reserved start taken later is dated then.
		require.Zero(t, wait(ap.Reserve(ctx, "dated", "x")))
		time.Sleep(period / 2)
		require.Zero(t, wait(ap.Start(ctx, "dated", "x")))
		taken := time.Now()
		time.Sleep(period/2 + 50*time.Millisecond) // the reservation alone would have lapsed
		next := wait(bp.Next(ctx, "dated"))
		require.Positive(t, next, "x began less than a period ago")
		require.LessOrEqual(t, next, time.Until(taken.Add(period))+5*time.Millisecond)

		// A reservation nobody takes lapses after a period; taken after that,
		// its start is counted against the budget again.
		require.Zero(t, wait(ap.Reserve(ctx, "lapse", "y")))
		require.Positive(t, wait(bp.Take(ctx, "lapse")))
		time.Sleep(period + 50*time.Millisecond)
		require.Zero(t, wait(bp.Take(ctx, "lapse")), "the lapsed reservation holds nothing")
		require.Positive(t, wait(ap.Start(ctx, "lapse", "y")), "y is a new start, over the budget")

		_, err := a.Reserve(ctx, "k", "")
		require.ErrorIs(t, err, lockkit.ErrInvalid)
		_, err = a.Next(ctx, "")
		require.ErrorIs(t, err, lockkit.ErrInvalid)
	})
}

// New refuses what cannot work; a Throttle made from a Locker's Redis and
// prefix shares the budgets of the Throttles with that prefix, and its keys
// are where they were when the Locker made it, so that running processes
// of either kind share them.
func TestNew(t *testing.T) {
	_, c := testredis.Mini(t)
	var nilClient *redis.Client
	for name, make := range map[string]func() (*throttle.Throttle, error){
		"nil client":       func() (*throttle.Throttle, error) { return throttle.New(nil, 1, time.Second) },
		"typed nil client": func() (*throttle.Throttle, error) { return throttle.New(nilClient, 1, time.Second) },
		"n 0":              func() (*throttle.Throttle, error) { return throttle.New(c, 0, time.Second) },
		"period 0":         func() (*throttle.Throttle, error) { return throttle.New(c, 1, 0) },
		"period too long":  func() (*throttle.Throttle, error) { return throttle.New(c, 1, lockkit.MaxTTL+time.Millisecond) },
	} {
		_, err := make()
		require.ErrorIs(t, err, lockkit.ErrInvalid, name)
	}
	ctx := context.Background()
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix("p:{x}"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	client, prefix := l.Redis()
	require.Equal(t, "p:{x}", prefix)
	own, err := throttle.New(client, 1, time.Minute, throttle.WithPrefix(prefix))
	require.NoError(t, err)
	same, err := throttle.New(c, 1, time.Minute, throttle.WithPrefix("p:{x}"))
	require.NoError(t, err)
	other, err := throttle.New(c, 1, time.Minute)
	require.NoError(t, err)
	require.Zero(t, must(own.Take(ctx, "k{1}")))
	require.Positive(t, must(same.Take(ctx, "k{1}")), "the same Redis and prefix: the same budget")
	require.Zero(t, must(other.Take(ctx, "k{1}")), "another prefix: another budget")
	require.Equal(t, int64(1), c.Exists(ctx, "p:%7Bx%7D{k%7B1%7D}:t").Val(), "the key name of the budget")
	require.Equal(t, int64(1), c.Exists(ctx, lockkit.DefaultPrefix+"{k%7B1%7D}:t").Val(), "the default prefix")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
