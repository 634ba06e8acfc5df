package throttle_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/internal/throttle"
	"github.com/jobguard/jobguard/lockkit"
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
		// The server reads its clock after asked. It counts in whole ms
		// (its clock read rounded down) and opens the next start 1 ms past
		// the period (throttle.lua): 2 ms of slack.
		asked := time.Now()
		next := wait(bp.Next(ctx, "dated"))
		require.Positive(t, next, "x began less than a period ago")
		require.LessOrEqual(t, next, taken.Add(period).Sub(asked)+2*time.Millisecond, "dated when taken, not when reserved")

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

// TakeOver gives a try of work the start of its earlier try, taken or
// reserved, dated now: both spend one start, and the earlier try's
// give-back, late, finds none. Without one it takes a start of its own,
// within the budget; a repeat takes nothing more; an id that names no work
// takes over nothing.
func TestTakeOverMovesTheEarlierTrysStart(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		const period = 600 * time.Millisecond
		l := on(t, client)(1, time.Minute)
		wait := func(d time.Duration, err error) time.Duration {
			t.Helper()
			require.NoError(t, err)
			return d
		}
		for _, taken := range []bool{true, false} {
			key := fmt.Sprint("taken-", taken)
			first, again := throttle.ID("w"), throttle.ID("w")
			require.NotEqual(t, first, again)
			require.Zero(t, wait(l.Reserve(ctx, key, first)))
			if taken {
				require.Zero(t, wait(l.Start(ctx, key, first)))
			}
			for range 2 {
				require.Zero(t, wait(l.TakeOver(ctx, key, again, "")), "taken %v: the earlier try's start, once", taken)
			}
			require.NoError(t, l.Return(ctx, key, first), "a late give-back")
			require.Positive(t, wait(l.Take(ctx, key)), "taken %v: one start spent", taken)
		}

		// Given back first: a start of its own, if the budget allows.
		first, again := throttle.ID("w"), throttle.ID("w")
		require.Zero(t, wait(l.Reserve(ctx, "back", first)))
		require.NoError(t, l.Return(ctx, "back", first))
		require.Zero(t, wait(l.Take(ctx, "back")), "another run took the start")
		require.Positive(t, wait(l.TakeOver(ctx, "back", again, "")), "the budget is spent")
		require.Zero(t, wait(l.TakeOver(ctx, "none", throttle.ID("w"), "")))
		require.Positive(t, wait(l.TakeOver(ctx, "none", throttle.ID("v"), "")), "another work's start is not taken over")
		require.Zero(t, wait(l.Reserve(ctx, "plain", throttle.ID(""))))
		require.Positive(t, wait(l.TakeOver(ctx, "plain", throttle.ID(""), "")), "an id of no work takes none over")

		// A start that left the window is spent no more: a new one is dated now.
		lp := on(t, client)(1, period)
		require.Zero(t, wait(lp.Start(ctx, "old", throttle.ID("w"))))
		time.Sleep(period + 50*time.Millisecond)
		require.Zero(t, wait(lp.TakeOver(ctx, "old", throttle.ID("w"), "")))
		require.Positive(t, wait(lp.Take(ctx, "old")))

		_, err := l.TakeOver(ctx, "k", "", "")
		require.ErrorIs(t, err, lockkit.ErrInvalid)
	})
}

// TakeOver in a turn claims its booking: a try refused when it reserved,
// and booked, is not held back by its own booking, which it ends.
func TestTakeOverClaimsItsTurn(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		l := on(t, client)(1, time.Minute)
		wait := func(d time.Duration, err error) time.Duration {
			t.Helper()
			require.NoError(t, err)
			return d
		}
		require.Zero(t, wait(l.Reserve(ctx, "k", "r")))
		require.Positive(t, wait(l.ReserveInTurn(ctx, "k", throttle.ID("w"), "w")), "refused: w is booked")
		require.NoError(t, l.Return(ctx, "k", "r"))
		again := throttle.ID("w")
		require.Zero(t, wait(l.TakeOver(ctx, "k", again, "w")), "its own booking does not hold it back")
		require.Positive(t, wait(l.Take(ctx, "k")), "one start spent")
		require.NoError(t, l.Return(ctx, "k", again))
		require.Zero(t, wait(l.Take(ctx, "k")), "the booking ended when the start was taken")
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
		"period too long":  func() (*throttle.Throttle, error) { return throttle.New(c, 1, lockcore.MaxTTL+time.Millisecond) },
	} {
		_, err := make()
		require.ErrorIs(t, err, lockkit.ErrInvalid, name)
	}
	ctx := context.Background()
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix("p:{x}"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	rl, err := lockcore.Of("test", l)
	require.NoError(t, err)
	client, prefix := rl.Redis()
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
	require.Equal(t, int64(1), c.Exists(ctx, lockcore.DefaultPrefix+"{k%7B1%7D}:t").Val(), "the default prefix")

	// A booked turn is known until a period after its slot, and a minute
	// more (miniredis' TTLs stand still).
	w := must(own.ReserveInTurn(ctx, "k{1}", "r", "T"))
	require.Positive(t, w)
	require.Equal(t, w+time.Minute+time.Minute, c.PTTL(ctx, "p:%7Bx%7D{k%7B1%7D}:tq").Val(), "the slot, a period, a minute")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Work refused together books distinct turns: each is told to come back
// when a start opens for it, one period after the start it waits behind,
// not all at the first opening. A wait is told from the server's clock at
// the call, which lies between the client's times around it: the dates are
// checked within those bounds, so that a stall between calls (a loaded
// machine) is no failure.
func TestReserveInTurnBooksDistinctTurns(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		const period = 300 * time.Millisecond
		newThrottle := on(t, client)
		for _, n := range []int{1, 3} {
			th := newThrottle(n, period)
			key := fmt.Sprintf("burst%d", n)
			first, lastStart := time.Now(), time.Time{}
			for i := range n {
				require.Zero(t, must(th.ReserveInTurn(ctx, key, fmt.Sprint("s", i), fmt.Sprint("t", i))), "within the budget")
				lastStart = time.Now()
			}
			// The i-th refused turn is due between lo[i] and hi[i].
			var lo, hi []time.Time
			for i := n; i < 4*n; i++ {
				before := time.Now()
				w := must(th.ReserveInTurn(ctx, key, fmt.Sprint("s", i), fmt.Sprint("t", i)))
				after := time.Now()
				require.Positive(t, w)
				lo, hi = append(lo, before.Add(w)), append(hi, after.Add(w))
			}
			const slack = 50 * time.Millisecond
			for i := range lo {
				// The i-th refused turn waits behind the (i/n+1)-th period's
				// starts: distinct turns, n per period.
				k := time.Duration(i/n+1) * period
				require.False(t, lo[i].Sub(lastStart.Add(k)) > slack || first.Add(k).Sub(hi[i]) > slack,
					"n %d: turn %d due in [%s, %s] after the first start, want %s", n, i, lo[i].Sub(lastStart), hi[i].Sub(first), k)
				if i >= n {
					require.GreaterOrEqual(t, hi[i].Sub(lo[i-n]), period-20*time.Millisecond, "n %d: turn %d one period after turn %d", n, i, i-n)
				}
			}
		}
	})
}

// A booked turn is ahead of every newcomer: a newcomer is refused while the
// booking is live though no start is in the window, and the turn's claimant
// takes the start when it comes back, before the newcomer that came first.
func TestReserveInTurnClaimantGoesFirst(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		const period = 200 * time.Millisecond
		th := on(t, client)(1, period)
		require.Zero(t, must(th.Reserve(ctx, "k", "first")))
		w := must(th.ReserveInTurn(ctx, "k", "a1", "A"))
		require.Positive(t, w)
		require.Positive(t, must(th.Next(ctx, "k")), "the booking is ahead of a start now")
		time.Sleep(w + 10*time.Millisecond) // the first reservation lapsed; A's slot came
		require.Positive(t, must(th.Take(ctx, "k")), "A's booking is ahead of a newcomer")
		require.Positive(t, must(th.ReserveInTurn(ctx, "k", "b1", "B")), "and of a newcomer with a turn")
		require.Zero(t, must(th.ReserveInTurn(ctx, "k", "a2", "A")), "A's next try takes its start")
		require.Zero(t, must(th.Start(ctx, "k", "a2")))
		require.Positive(t, must(th.Take(ctx, "k")), "the budget is spent")

		// A claimant back before its slot, with no start in the window, is
		// not held back by the bookings: the others wait for their slots.
		require.Zero(t, must(th.Reserve(ctx, "early", "e0")))
		wc := must(th.ReserveInTurn(ctx, "early", "c1", "C"))
		wd := must(th.ReserveInTurn(ctx, "early", "d1", "D"))
		require.Greater(t, wd, wc)
		require.NoError(t, th.Return(ctx, "early", "e0"))
		require.Zero(t, must(th.ReserveInTurn(ctx, "early", "d2", "D")), "D back early: the window has room")
		wc2 := must(th.ReserveInTurn(ctx, "early", "c2", "C"))
		require.Positive(t, wc2, "C: D's start fills the window")
		require.LessOrEqual(t, wc2, period+5*time.Millisecond)

		_, err := th.ReserveInTurn(ctx, "k", "x", "")
		require.ErrorIs(t, err, lockkit.ErrInvalid)
		_, err = th.ReserveInTurn(ctx, "k", "", "X")
		require.ErrorIs(t, err, lockkit.ErrInvalid)
	})
}

// A call that books a turn, sent again (as go-redis does after a lost
// reply), is the turn's claimant: it reserves one start at most, and its
// reply is one the caller can act on.
func TestReserveInTurnRepeated(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		th := on(t, client)(2, time.Minute)
		require.Zero(t, must(th.Reserve(ctx, "k", "r1")))
		require.Zero(t, must(th.Reserve(ctx, "k", "r2")))
		w := must(th.ReserveInTurn(ctx, "k", "x", "X"))
		require.Positive(t, w)
		again := must(th.ReserveInTurn(ctx, "k", "x", "X"))
		require.InDelta(t, w, again, float64(20*time.Millisecond), "still booked: told its slot again")
		require.NoError(t, th.Return(ctx, "k", "r2"))
		require.Positive(t, must(th.Take(ctx, "k")), "X's booking fills the room r2 left")
		require.Zero(t, must(th.ReserveInTurn(ctx, "k", "x", "X")), "X's claimant takes the room")
		require.Zero(t, must(th.ReserveInTurn(ctx, "k", "x", "X")), "a repeat finds the reservation")
		require.Positive(t, must(th.Take(ctx, "k")), "one start was reserved for X")
		require.Zero(t, must(th.Start(ctx, "k", "x")))
		require.Zero(t, must(th.Start(ctx, "k", "r1")))
		require.Positive(t, must(th.Take(ctx, "k")))
	})
}

// A booking nobody claims lapses one period after its slot: newcomers stop
// counting it, and its turn is still known.
func TestReserveInTurnBookingLapses(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		const period = 200 * time.Millisecond
		th := on(t, client)(1, period)
		require.Zero(t, must(th.Reserve(ctx, "k", "r")))
		w := must(th.ReserveInTurn(ctx, "k", "x", "X"))
		booked := time.Now()
		require.Positive(t, w)
		time.Sleep(time.Until(booked.Add(w + period/2)))
		require.Positive(t, must(th.Next(ctx, "k")), "half a period after its slot, the booking holds the start")
		time.Sleep(time.Until(booked.Add(w + period + 20*time.Millisecond)))
		require.Zero(t, must(th.Take(ctx, "k")), "a period after its slot, it lapsed")

		// Its turn, back late, is still known (for a minute): not booked behind
		// the turns booked since, it waits only for the start in the window.
		wy := must(th.ReserveInTurn(ctx, "k", "y", "Y"))
		require.Greater(t, wy, period/2)
		wx := must(th.ReserveInTurn(ctx, "k", "x2", "X"))
		require.LessOrEqual(t, wx, wy)
		require.Greater(t, must(th.ReserveInTurn(ctx, "k", "z", "Z")), wy+period/2, "a newcomer is booked behind Y")
	})
}

// However claimants, newcomers and repeats interleave, no window of one
// period holds more than n starts, and every turn starts once in the end.
func TestReserveInTurnKeepsTheBudget(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := ctxT(t)
		const n, turns, period = 2, 8, 200 * time.Millisecond
		th := on(t, client)(n, period)
		// The server dates each start between the client's times around
		// its call: began[i] before it, ended[i] after it.
		var began, ended []time.Time
		start := func(id string) {
			t.Helper()
			before := time.Now()
			require.Zero(t, must(th.Start(ctx, "k", id)), "a reserved start is taken")
			began, ended = append(began, before), append(ended, time.Now())
		}
		due := make([]time.Time, turns) // when turn i comes back; zero: started
		// The earliest moment turn i's wait can end by the server: its wait
		// from the start of the call that was told it.
		earliest := make([]time.Time, turns)
		tries := make([]int, turns)
		for i := range due {
			due[i] = time.Now()
		}
		begin := time.Now()
		lateTries, lateBy := 0, time.Duration(0)
		for left := turns; left > 0; {
			i := 0
			for j := range due {
				if !due[j].IsZero() && (due[i].IsZero() || due[j].Before(due[i])) {
					i = j
				}
			}
			time.Sleep(min(time.Until(due[i]), period))
			if time.Now().Before(due[i]) {
				continue
			}
			// A comeback this late (the machine stalled the test) may let
			// another turn take the opening it was told of: each grants
			// every turn one try more, and the run its lateness.
			if late := time.Since(earliest[i]); !earliest[i].IsZero() && late > period/10 {
				lateTries, lateBy = lateTries+1, lateBy+late
			}
			if tries[i]%3 == 1 { // a newcomer takes a start between tries
				before := time.Now()
				if must(th.Take(ctx, "k")) == 0 {
					began, ended = append(began, before), append(ended, time.Now())
				}
			}
			id := fmt.Sprintf("%d.%d", i, tries[i])
			tries[i]++
			called := time.Now()
			w := must(th.ReserveInTurn(ctx, "k", id, fmt.Sprint("turn", i)))
			if i%2 == 0 { // sent again, as after a lost reply
				w = must(th.ReserveInTurn(ctx, "k", id, fmt.Sprint("turn", i)))
			}
			if w == 0 {
				start(id)
				due[i], left = time.Time{}, left-1
				continue
			}
			if i%3 == 0 && tries[i] == 2 {
				w /= 2 // back early
			}
			due[i], earliest[i] = time.Now().Add(w), called.Add(w)
		}
		require.Less(t, time.Since(begin), 10*period+lateBy, "every turn started")
		for i := n; i < len(began); i++ {
			// At least as far apart as the server dated starts i-n and i
			// (a ms of slack for its clock's rounding).
			require.GreaterOrEqual(t, ended[i].Sub(began[i-n]), period-time.Millisecond, "start %d and %d are in one window", i-n, i)
		}
		for i, k := range tries {
			// A turn that came back early (i%3 == 0) gave its booked
			// opening up: the turn it books then may meet a newcomer's
			// start first, one try more.
			most := 4 + lateTries
			if i%3 == 0 {
				most++
			}
			require.LessOrEqual(t, k, most, "turn %d tried %d times (%d comebacks late)", i, k, lateTries)
		}
	})
}
