package lockcore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// releaseSources are the sources of the release scripts, one per set of
// options.
func releaseSources() []string { return scriptSources(releaseAll, releaseSource) }

// A release runs the release script of its own options. A section acts
// only when the call's arguments ask for it, so the script with every
// section must answer each release the same and leave the same keys: for
// every set of options, releases of a holder with waiters (plain and fair)
// and parked jobs behind it, of the holders handed the key, of a lease
// found by its acquire id, of an expired lease and of a lease held at least
// a while, each sent twice (as go-redis does when a reply is late), on two
// servers at the same clock.
func TestReleaseScriptOfTheOptionsAnswersAsTheOneWithEvery(t *testing.T) {
	ctx := context.Background()
	own, every, setTime := twinServers(t, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), time.Second)
	cfg, err := newConfig(nil)
	require.NoError(t, err)
	e := &engine{cfg: cfg}
	at := time.Duration(0)
	// advance moves both clocks d on, and a millisecond: a call begins
	// after the runs before it.
	advance := func(d time.Duration) {
		at += d + time.Millisecond
		setTime(at)
	}
	same := func(what string) {
		t.Helper()
		require.Equal(t, every.mr.Dump(), own.mr.Dump(), what)
	}
	n := 0
	// acquire runs the acquire script with every mode on both servers and
	// returns the lease of the call, with no member if it took none.
	acquire := func(key string, opt AcquireOptions, wait bool) *Lease {
		t.Helper()
		advance(0)
		r, err := cfg.request(key, &opt)
		require.NoError(t, err)
		n++
		if wait {
			r.waiter = fmt.Sprintf("%03d", n)
			if ttl := handOverTTL(&r); ttl > 0 {
				r.waiter = handOverID(r.waiter, ttl, &r)
			}
		}
		var vals []any
		for _, s := range []scriptServer{own, every} {
			_, keys, args := s.b.acquireCall(&r)
			vals, err = acquireScripts[partsAll].Run(ctx, s.c, keys, args...).Slice()
			require.NoError(t, err)
		}
		same(fmt.Sprintf("acquire %s %+v", key, opt))
		l := &Lease{e: e, key: key, owner: r.owner, label: r.label, aid: r.aid, ttl: r.ttl, hold: opt.HoldAtLeast}
		if toInt(vals[0]) == 1 {
			l.token = toInt(vals[1])
			l.member = memberOf(l.token, r.aid, r.owner, r.label)
		}
		return l
	}
	// release releases l under end on both servers, twice, with the
	// options m, and returns the replies of the two runs.
	release := func(l *Lease, m releaseMode, end ending) []any {
		t.Helper()
		advance(0)
		l.onParked = nil
		if m&releasePark != 0 {
			l.onParked = func(string, string) {}
		}
		var replies []any
		for try := range 2 {
			what := fmt.Sprintf("release %s %q with %04b %+v, run %d", l.key, l.member, m, end, try)
			script, keys, args := own.b.releaseCall(l, end)
			require.True(t, releaseScripts[m] == script, what)
			got, err := script.Run(ctx, own.c, keys, args...).Result()
			require.NoError(t, err, what)
			_, keys, args = every.b.releaseCall(l, end)
			want, err := releaseScripts[releaseAll].Run(ctx, every.c, keys, args...).Result()
			require.NoError(t, err, what)
			require.Equal(t, want, got, what)
			same(what)
			replies = append(replies, want)
		}
		return replies
	}
	// byAid is l as a release finds it when no Lease was handed out for it
	// (see engine.orphan): by its acquire id.
	byAid := func(l *Lease) *Lease {
		return &Lease{e: e, key: l.key, owner: l.owner, label: l.label, aid: l.aid, ttl: l.ttl}
	}
	const ttl = 2 * time.Second
	seen := make(map[string]bool) // the replies seen, over every set of options
	for m := range releaseAll + 1 {
		k := fmt.Sprintf("k%d", m)
		var end ending
		if m&releaseCoalesce != 0 {
			end.coalesce = 3 * time.Second
		}
		if m&releaseDone != 0 {
			end.done = 5 * time.Second
		}
		hold := time.Duration(0)
		if m&releaseHold != 0 {
			hold = 4 * time.Second
		}
		a := acquire(k, AcquireOptions{Label: "a", TTL: ttl, HoldAtLeast: hold}, false)
		require.NotEmpty(t, a.member)
		fair := acquire(k, AcquireOptions{Label: "f", Fair: true, TTL: ttl}, true)
		waiter := acquire(k, AcquireOptions{Label: "w", TTL: ttl}, true)
		doneWaiter := acquire(k, AcquireOptions{Label: "a", TTL: ttl}, true)
		require.Empty(t, fair.member+waiter.member+doneWaiter.member)
		for _, p := range []string{"p1", "a", "p2"} {
			require.Empty(t, acquire(k, AcquireOptions{Label: p, Park: &Parking{ID: "id-" + p}}, false).member)
		}
		note := func(what string, v any) {
			seen[fmt.Sprint(what, v)] = true
		}
		note("first", release(a, m, end))  // hands the key to the fair waiter, or holds it
		note("repeat", release(a, m, end)) // a repeat of the release
		if m&releaseHold != 0 {
			// The hold is over, the lease too: a held release sent again
			// (its reply lost, so no hand-over came) hands the key over,
			// to the oldest parked job.
			advance(4 * time.Second)
			note("expired", release(a, m, end))
		}
		// The holders a release handed the key, found by acquire id.
		for _, w := range []*Lease{{key: k, aid: "none", ttl: ttl}, a, waiter, fair, doneWaiter} {
			l := byAid(w)
			l.hold = hold
			note("by aid", release(l, m, end))
		}
		// A lease whose HoldAtLeast is over by its release, with the key
		// reserved for a parked job or handed over before.
		b := acquire(k, AcquireOptions{Label: "b", TTL: 5 * time.Second, HoldAtLeast: hold / 4}, true)
		if b.member != "" {
			advance(2 * time.Second)
			note("hold over", release(b, m, end))
		}
		// An expired lease.
		advance(10 * time.Second)
		c := acquire(k, AcquireOptions{Label: "c", TTL: ttl, HoldAtLeast: hold / 8}, false)
		require.NotEmpty(t, c.member)
		require.Empty(t, acquire(k, AcquireOptions{Label: "p3", Park: &Parking{ID: "id-p3"}}, false).member)
		advance(3 * time.Second)
		note("expired", release(c, m, end))
		advance(10 * time.Second)
	}
	// The paths the releases took: a hand-over, a repeat, a lease found by
	// acquire id, an expired one, a held one (and its repeat), and a
	// reservation for a parked job.
	for _, path := range []string{"first[1 1]", "repeat[1 1]", "by aid[1 0]", "by aid[0 0]", "expired[0 0]",
		"expired[[1 id-p1] [1 id-p1]]", "hold over[1 1]"} {
		require.True(t, seen[path], "%s in %v", path, seen)
	}
}
