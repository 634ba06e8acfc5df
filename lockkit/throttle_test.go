package lockkit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// throttleOn returns the Throttle of n starts per period on l's Redis and
// prefix.
func throttleOn(t *testing.T, l Locker, n int, period time.Duration) *Throttle {
	t.Helper()
	th, err := l.(*RedisLocker).Throttle(n, period)
	require.NoError(t, err)
	return th
}

// Throttle: at most n starts in any window of one period, across Lockers.
func testThrottle(t *testing.T, h *harness) {
	ctx := ctxT(t)
	la, lb := h.locker(t), h.locker(t)
	const n, period = 3, 600 * time.Millisecond
	a, b := throttleOn(t, la, n, period), throttleOn(t, lb, n, period)
	a1, b1 := throttleOn(t, la, 1, time.Minute), throttleOn(t, lb, 1, time.Minute)
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
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorIs(t, a1.Return(ctx, "named", ""), ErrInvalid)
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
	require.ErrorIs(t, err, ErrInvalid)
}

// testThrottleStaleID: a start id seen again after its start left the
// window is a new start, counted against the budget.
func testThrottleStaleID(t *testing.T, h *harness) {
	ctx := ctxT(t)
	const period = time.Second
	l := throttleOn(t, h.locker(t), 2, period)
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
}

// testThrottleReserve: a reserved start counts against the budget until it
// is taken, dated when taken, given back, or one period has passed.
func testThrottleReserve(t *testing.T, h *harness) {
	ctx := ctxT(t)
	la, lb := h.locker(t), h.locker(t)
	const period = 600 * time.Millisecond
	a, b := throttleOn(t, la, 2, time.Minute), throttleOn(t, lb, 2, time.Minute)
	ap, bp := throttleOn(t, la, 1, period), throttleOn(t, lb, 1, period)
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
	require.ErrorIs(t, err, ErrInvalid)
	_, err = a.Next(ctx, "")
	require.ErrorIs(t, err, ErrInvalid)
}

// NewThrottle and RedisLocker.Throttle refuse what cannot work; a Throttle
// made from the client and prefix shares the Locker's budgets.
func TestNewThrottle(t *testing.T) {
	c := mini(t)
	var nilClient *redis.Client
	for name, make := range map[string]func() (*Throttle, error){
		"nil client":       func() (*Throttle, error) { return NewThrottle(nil, 1, time.Second) },
		"typed nil client": func() (*Throttle, error) { return NewThrottle(nilClient, 1, time.Second) },
		"n 0":              func() (*Throttle, error) { return NewThrottle(c, 0, time.Second) },
		"period 0":         func() (*Throttle, error) { return NewThrottle(c, 1, 0) },
		"period too long":  func() (*Throttle, error) { return NewThrottle(c, 1, MaxTTL+time.Millisecond) },
		"bad option":       func() (*Throttle, error) { return NewThrottle(c, 1, time.Second, WithTTL(time.Millisecond)) },
		"Locker's, n 0":    func() (*Throttle, error) { return miniLocker(t).Throttle(0, time.Second) },
	} {
		_, err := make()
		require.ErrorIs(t, err, ErrInvalid, name)
	}
	ctx := context.Background()
	l, err := NewRedis(c, WithPrefix("p:"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	own, err := l.Throttle(1, time.Minute)
	require.NoError(t, err)
	same, err := NewThrottle(c, 1, time.Minute, WithPrefix("p:"), WithOwner("ignored"))
	require.NoError(t, err)
	other, err := NewThrottle(c, 1, time.Minute)
	require.NoError(t, err)
	require.Zero(t, must(own.Take(ctx, "k")))
	require.Positive(t, must(same.Take(ctx, "k")), "the same Redis and prefix: the same budget")
	require.Zero(t, must(other.Take(ctx, "k")), "another prefix: another budget")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
