package lockcore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// rawAcquire runs the acquire script with every mode for a limit-1 call with
// a chosen parked-queue keep (ms).
func rawAcquire(t *testing.T, c redis.UniversalClient, k lockKeys, owner string, ttl int64, aid, label, entry string, mode followUpMode, keep int64) []any {
	t.Helper()
	a := acquireArgs{Owner: owner, TTL: time.Duration(ttl) * time.Millisecond, Limit: 1, WaiterTTL: time.Second, EpochKeep: time.Duration(ttl) * time.Millisecond,
		AcquireID: aid, Label: label, TakeReserved: true, Mode: mode, Channel: k.channel, First: true, ParkEntry: entry, ParkKeep: time.Duration(keep) * time.Millisecond}
	vals, err := acquireScripts[partsAll].Run(context.Background(), c, k.acquireKeys(), a.list()...).Slice()
	require.NoError(t, err)
	return vals
}

// The record that makes a superseded parking call's repeat give up again
// ("S:<acquire id>") lives as long as it says, whatever kept the holders
// key until then: a repeat after the key would otherwise have expired must
// not take the key.
func TestSupersededRecordKeepsTheHoldersKey(t *testing.T) {
	testredis.Addr(t)
	c := testredis.Client(t)
	b := &redisBackend{c: c, prefix: testredis.Prefix(t, c)}
	k := b.keys("k")
	const short, keep = 1000, 60000
	require.EqualValues(t, 1, toInt(rawAcquire(t, c, k, "h", 200, "h1", "h", "", modeNone, short)[0]))
	require.EqualValues(t, 0, toInt(rawAcquire(t, c, k, "b", 1000, "ax", "lx", "60000:lx:idx", modeKeepNewest, short)[0]), "x parks")
	r := rawAcquire(t, c, k, "b", 1000, "ay", "ly", "60000:ly:idy", modeKeepNewest, short)
	require.Equal(t, "60000:lx:idx", r[7], "y replaced x")
	require.LessOrEqual(t, c.PTTL(context.Background(), k.holders).Val(), short*time.Millisecond)
	first := rawAcquire(t, c, k, "b", 1000, "ax2", "lx", "60000:lx:idx", modeKeepNewest, keep)
	require.EqualValues(t, -5, toInt(first[0]), "x gives up")
	require.Greater(t, c.PTTL(context.Background(), k.holders).Val(), keep/2*time.Millisecond,
		"the holders key lives as long as the S: record")
	require.Equal(t, first, rawAcquire(t, c, k, "b", 1000, "ax2", "lx", "60000:lx:idx", modeKeepNewest, keep), "a repeat gives up too")
}

// A run's order (KeepNewest.Order) is kept while its lease is renewed,
// however long past the ten minutes it is kept for anyway: a renewal keeps
// the hash it lives in for a TTL more, so an older call still gives up.
func TestRunOrderOutlivesItsKeepWhileRenewed(t *testing.T) {
	testredis.Addr(t)
	c := testredis.Client(t)
	ctx := context.Background()
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	defer l.Close(ctx)
	run, err := l.Acquire(ctx, "k", &AcquireOptions{FollowUp: KeepNewest{Order: 20}, TTL: 5 * time.Second})
	require.NoError(t, err)
	meta := l.r.keys("k").meta
	require.Greater(t, c.PTTL(ctx, meta).Val(), 9*time.Minute, "kept ten minutes after the run took the key")
	require.NoError(t, c.PExpire(ctx, meta, 50*time.Millisecond).Err()) // the ten minutes are over
	require.NoError(t, run.Extend(ctx, 5*time.Second))
	require.Greater(t, c.PTTL(ctx, meta).Val(), 4*time.Second, "kept while the run is renewed")
	_, err = l.Acquire(ctx, "k", &AcquireOptions{FollowUp: KeepNewest{Order: 10}})
	require.ErrorIs(t, err, ErrSuperseded)
	require.NoError(t, run.Release(ctx))
}

// acquireSources are the sources of the acquire scripts, one per set of
// parts.
func acquireSources() []string { return scriptSources(partsAll, acquireSource) }

// scriptSources are the sources source(m) of every set m of modes up to all.
func scriptSources[M ~uint8](all M, source func(M) string) []string {
	srcs := make([]string, all+1)
	for m := range srcs {
		srcs[m] = source(M(m))
	}
	return srcs
}

// scriptServer is a miniredis and a backend on it.
type scriptServer struct {
	mr *miniredis.Miniredis
	c  *redis.Client
	b  *redisBackend
}

// twinServers are two miniredis whose clocks start at start; setTime moves
// both to start plus a later at (their TTLs go down by as much).
func twinServers(t *testing.T, start time.Time, grace time.Duration) (own, every scriptServer, setTime func(at time.Duration)) {
	newServer := func() scriptServer {
		mr, c := testredis.Mini(t)
		mr.SetTime(start)
		return scriptServer{mr, c, &redisBackend{c: c, prefix: "p:", grace: grace}}
	}
	own, every = newServer(), newServer()
	last := time.Duration(0)
	return own, every, func(at time.Duration) {
		for _, s := range []scriptServer{own, every} {
			s.mr.SetTime(start.Add(at))
			s.mr.FastForward(at - last)
		}
		last = at
	}
}

// A call runs the acquire script of its own modes. A mode's code acts only
// when the call's arguments ask for it, so the script with every mode must
// answer each call the same and leave the same keys: a sequence of calls of
// every mode and their later attempts, each sent twice (as go-redis does
// when a reply is late), on two servers at the same clock.
func TestAcquireScriptOfTheModesAnswersAsTheOneWithEvery(t *testing.T) {
	ctx := context.Background()
	own, every, setTime := twinServers(t, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), 0)
	cfg, err := newConfig(nil)
	require.NoError(t, err)
	const ttl = 2 * time.Second
	steps := []struct {
		at   time.Duration // since start
		opt  AcquireOptions
		wait bool
		// again, when not zero, is 1 + the index of an earlier step whose
		// call tries again (opt and wait are then unused).
		again int
	}{
		{0, AcquireOptions{Label: "a", TTL: ttl}, true, 0},
		{0, AcquireOptions{Label: "a", FollowUp: KeepNewest{Order: 4}}, true, 0},
		{0, AcquireOptions{Label: "b"}, true, 0},
		{0, AcquireOptions{Label: "b2", Fair: true}, true, 0},
		{0, AcquireOptions{Label: "e", Epoch: 3}, true, 0},
		{0, AcquireOptions{Label: "c", FollowUp: Coalesce{}}, true, 0},
		{0, AcquireOptions{Label: "d", FollowUp: Coalesce{}}, true, 0},
		{0, AcquireOptions{Label: "d2", FollowUp: Coalesce{Final: true}}, true, 0},
		{0, AcquireOptions{Label: "s1", FollowUp: KeepNewest{Order: 5}}, true, 0},
		{0, AcquireOptions{Label: "s0", FollowUp: KeepNewest{Order: 3}}, true, 0},
		{0, AcquireOptions{Label: "s2", FollowUp: KeepNewest{Order: 6}, Park: &Parking{ID: "p2"}}, false, 0},
		{0, AcquireOptions{Label: "s3", FollowUp: KeepNewest{Order: 7}, Park: &Parking{ID: "p3"}}, false, 0},
		{0, AcquireOptions{Label: "s2", FollowUp: KeepNewest{Order: 6}, Park: &Parking{ID: "p2b"}}, false, 0},
		{0, AcquireOptions{Label: "g", FollowUp: Preempt{Grace: 500 * time.Millisecond}}, true, 0},
		{0, AcquireOptions{Label: "h", FollowUp: Coalesce{}, Park: &Parking{ID: "ph"}}, false, 0},
		{0, AcquireOptions{Label: "a", FollowUp: Preempt{Order: 8}}, true, 0},
		{0, AcquireOptions{}, false, 2}, // step 1 again, older than the follow-up now
		{3 * time.Second, AcquireOptions{Label: "i", FollowUp: Coalesce{}, Park: &Parking{ID: "pi"}, TTL: ttl}, false, 0},
		{3 * time.Second, AcquireOptions{Label: "a2", Fair: true, TTL: ttl}, true, 0},
		{3 * time.Second, AcquireOptions{Label: "i", FollowUp: Coalesce{}, Park: &Parking{ID: "pi2"}}, false, 0},
		{3 * time.Second, AcquireOptions{Label: "c", FollowUp: Coalesce{}}, true, 0},
		{3 * time.Second, AcquireOptions{Label: "j", Reserve: true, TTL: ttl}, false, 0},
		{6 * time.Second, AcquireOptions{Label: "j", Reserve: true, TTL: ttl}, false, 0},
		{6 * time.Second, AcquireOptions{Label: "j", TakeReservation: true, Park: &Parking{ID: "pj"}}, true, 0},
		{6 * time.Second, AcquireOptions{Label: "s3", FollowUp: KeepNewest{Order: 7}, Park: &Parking{ID: "p3"}}, false, 0},
		{6 * time.Second, AcquireOptions{Label: "e", Epoch: 3}, true, 0},
		{9 * time.Second, AcquireOptions{Label: "s3", FollowUp: KeepNewest{Order: 7}, Park: &Parking{ID: "p3"}}, false, 0},
		{9 * time.Second, AcquireOptions{Label: "k", FollowUp: KeepNewest{Order: 9}}, true, 0},
		{9 * time.Second, AcquireOptions{Label: "e", Epoch: 2}, true, 0},
	}
	reqs := make([]*request, len(steps))
	for i, st := range steps {
		// A millisecond a step: a call begins after the runs before it.
		setTime(st.at + time.Duration(i)*time.Millisecond)
		if st.again > 0 {
			reqs[i] = reqs[st.again-1]
		} else {
			r, err := cfg.request("k", &st.opt)
			require.NoError(t, err)
			if st.wait {
				r.waiter = fmt.Sprintf("%02d", i)
				if hold := handOverTTL(&r); hold > 0 {
					r.waiter = handOverID(r.waiter, hold, &r)
				}
			}
			reqs[i] = &r
		}
		r := reqs[i]
		for attempt := range 2 {
			var got []any
			for range 2 {
				script, keys, args := own.b.acquireCall(r)
				var err error
				got, err = script.Run(ctx, own.c, keys, args...).Slice()
				require.NoError(t, err)
				_, keys, args = every.b.acquireCall(r)
				want, err := acquireScripts[partsAll].Run(ctx, every.c, keys, args...).Slice()
				require.NoError(t, err)
				require.Equal(t, want, got, "step %d %+v, attempt %d", i, st.opt, attempt)
				require.Equal(t, every.mr.Dump(), own.mr.Dump(), "step %d %+v, attempt %d", i, st.opt, attempt)
			}
			// The later attempts of a waiting call (engine_wait.go).
			if len(got) > 5 && r.mode == modeCoalesce {
				r.since = toInt(got[5])
			}
			if !r.later && r.mode.keepsNewest() {
				if len(got) > 1 && toInt(got[0]) == 0 && r.label != "" && strings.HasSuffix(fmt.Sprint(got[1]), ":"+r.label) {
					r.behindOwnRun = true // its own earlier delivery holds the key
				}
			}
			r.later = true
		}
	}
}
