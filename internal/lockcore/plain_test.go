package lockcore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// storeAcquire runs one acquire of key with opt on l's store, with no
// engine around it: the lease it took, or the conflict (or other refusal)
// as an error.
func storeAcquire(t *testing.T, l *RedisLocker, key string, opt *AcquireOptions) (*Lease, error) {
	t.Helper()
	r, err := l.e.cfg.request(key, opt)
	require.NoError(t, err)
	res, err := l.r.acquire(ctxT(t), &r)
	require.NoError(t, err)
	if !res.ok {
		require.NotNil(t, res.conflict, "refused otherwise: %+v", res)
		return nil, res.conflict
	}
	return &Lease{e: l.e, key: key, aid: r.aid, owner: r.owner, label: r.label, token: res.token, ttl: r.ttl, plain: res.plain,
		member: memberOf(res.token, r.aid, r.owner, r.label)}, nil
}

// hookedClient is a new client of the test Redis that runs commands through
// hook.
func hookedClient(t *testing.T, hook redis.Hook) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(hook)
	return c
}

// The plain form of a key, step by step on the store: a plain lease is one
// STRING; its release is remembered after the key was taken again, so a
// repeat still reports it; a later token is greater; an acquire with a
// queue turns the key into the sorted set, which the plain lease's renewal
// and release then use; and while the queue lives a plain acquire does not
// pass it by, even with the key free.
func TestPlainFormSteps(t *testing.T) {
	handoverClients(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		ctx := ctxT(t)
		c := newClient()
		l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		b := l.r
		take := func(key string, opt *AcquireOptions) (*Lease, error) {
			t.Helper()
			return storeAcquire(t, l, key, opt)
		}
		release := func(le *Lease) bool {
			t.Helper()
			held, err := b.release(ctx, []*Lease{le}, nil)
			require.NoError(t, err)
			return held[0]
		}
		keyType := func(key string) string {
			t.Helper()
			typ, err := c.Type(ctx, b.keys(key).holders).Result()
			require.NoError(t, err)
			return typ
		}

		// A plain lease is a STRING; a repeat of its release, after the key
		// was taken again, still reports the release.
		first, err := take("a", &AcquireOptions{Label: "q/1"})
		require.NoError(t, err)
		require.True(t, first.plain)
		require.Equal(t, "string", keyType("a"))
		info, err := l.Inspect(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, []Holder{{Owner: first.owner, Token: first.token, TTL: info.Holders[0].TTL, Label: "q/1"}}, info.Holders)
		require.True(t, release(first))
		second, err := take("a", nil)
		require.NoError(t, err)
		require.Greater(t, second.token, first.token)
		require.True(t, release(first), "a repeated release reports what the first did")
		_, err = take("a", nil)
		require.ErrorIs(t, err, ErrNotAcquired, "the repeat did not release the new holder")
		require.True(t, release(second))

		// A release in the sorted set that leaves the key empty leaves the
		// last token there as well, with the record of the release, for the
		// next plain acquire.
		lim, err := take("d", &AcquireOptions{Limit: 2})
		require.NoError(t, err)
		require.False(t, lim.plain)
		require.True(t, release(lim))
		v, err := c.Get(ctx, b.keys("d").holders).Result()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("~", lim.token, "."), v)
		next, err := take("d", nil)
		require.NoError(t, err)
		require.True(t, next.plain)
		require.Greater(t, next.token, lim.token)
		require.True(t, release(next))

		// A lease that expired is not reported released.
		short, err := take("b", &AcquireOptions{TTL: MinTTL})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return keyType("b") == "none" }, 5*time.Second, 5*time.Millisecond)
		require.False(t, release(short))

		// A waiting acquire queues in the sorted set; the plain holder is
		// moved there, renewed and released there.
		holder, err := take("c", nil)
		require.NoError(t, err)
		require.True(t, holder.plain)
		r, err := l.e.cfg.request("c", &AcquireOptions{Fair: true, Epoch: 1})
		require.NoError(t, err)
		r.waiter = randomID(8)
		res, err := b.acquire(ctx, &r)
		require.NoError(t, err)
		require.NotNil(t, res.conflict)
		require.Equal(t, holder.token, res.conflict.Token)
		require.Equal(t, "zset", keyType("c"))
		require.Equal(t, []error{nil}, b.extend(ctx, []*Lease{holder}, []time.Duration{time.Minute}, true))
		info, err = l.Inspect(ctx, "c")
		require.NoError(t, err)
		require.Greater(t, info.Holders[0].TTL, 30*time.Second, "renewed in the sorted set")
		require.True(t, release(holder))
		// The key is free, but the queue lives: a plain acquire waits its
		// turn, and the queued call takes the key.
		_, err = take("c", nil)
		var conflict *ConflictError
		require.ErrorAs(t, err, &conflict)
		require.Equal(t, 1, conflict.Ahead)
		require.True(t, b.isSorted("c"), "the Locker remembers the key is in the sorted set")
		require.False(t, b.isSorted("a"))
		res, err = b.acquire(ctx, &r)
		require.NoError(t, err)
		require.True(t, res.ok)
		require.Greater(t, res.token, holder.token)
	})
}

// Renewal of many leases in one call mixes leases in the plain form and in
// the sorted set.
func TestRenewMixesPlainAndSortedLeases(t *testing.T) {
	ctx := ctxT(t)
	c := testredis.Client(t)
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	opts := []*AcquireOptions{nil, {Limit: 2}, nil, {Limit: 3}}
	var leases []*Lease
	var ttls []time.Duration
	for i, o := range opts {
		le, err := l.TryAcquire(ctx, string(rune('a'+i)), o)
		require.NoError(t, err)
		require.Equal(t, o == nil, le.plain)
		leases = append(leases, le)
		ttls = append(ttls, time.Hour)
	}
	require.Equal(t, make([]error, len(leases)), l.r.renewMany(ctx, leases, ttls))
	for _, le := range leases {
		info, err := l.Inspect(ctx, le.Key())
		require.NoError(t, err)
		require.Greater(t, info.Holders[0].TTL, 50*time.Minute, le.Key())
		require.NoError(t, le.Release(ctx))
	}
	// Released (or gone) leases are not renewed.
	errs := l.r.renewMany(ctx, leases, ttls)
	for _, err := range errs {
		require.ErrorIs(t, err, errNotHeld)
	}
}

// The releaser gathers asynchronous releases: Runs that end close together
// have their releases sent in one pipeline, not one round trip each.
func TestAsyncReleasesShareAPipeline(t *testing.T) {
	ctx := ctxT(t)
	var rt testredis.Counter
	c := hookedClient(t, &rt)
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	const n = 20
	leases := make([]*Lease, n)
	for i := range leases {
		leases[i], err = l.TryAcquire(ctx, fmt.Sprint("k", i), &AcquireOptions{AsyncRelease: true})
		require.NoError(t, err)
	}
	rt.Reset()
	for _, le := range leases {
		require.NoError(t, le.Run(ctx, func(context.Context) error { return nil }))
	}
	for _, le := range leases {
		l.e.awaitOwnRelease(ctx, le.Key())
	}
	for _, le := range leases {
		info, err := l.Inspect(ctx, le.Key())
		require.NoError(t, err)
		require.Empty(t, info.Holders, le.Key())
	}
	sent := rt.Count() - n // the Inspects
	require.Less(t, sent, int64(n), "%d round trips for %d releases", sent, n)
	t.Logf("%d releases in %d round trips", n, sent)
}

// OnParked runs on a goroutine of its own, after the release returned, and
// Close waits for it: nothing it does outlives the Locker.
func TestCloseWaitsForOnParked(t *testing.T) {
	ctx := ctxT(t)
	l := miniLocker(t)
	called := make(chan string, 1)
	unblock := make(chan struct{})
	holder, err := l.TryAcquire(ctx, "k", &AcquireOptions{Label: "first", Park: &Parking{OnParked: func(_, id string) {
		called <- id
		<-unblock
	}}})
	require.NoError(t, err)
	_, err = l.TryAcquire(ctx, "k", &AcquireOptions{Label: "second", Park: &Parking{ID: "job-2"}})
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NoError(t, holder.Release(ctx), "the release does not wait for OnParked")
	require.Equal(t, "job-2", <-called)
	closed := make(chan error, 1)
	go func() { closed <- l.Close(context.Background()) }()
	select {
	case <-closed:
		t.Fatal("Close returned while OnParked ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(unblock)
	require.NoError(t, <-closed)
}

// A release leaves one key, the holders key's record "~<token>.", for the
// client's retry window: a plain lease's, and a lease's in the sorted set
// (a limit, a parking job's) that left the key empty; a Locker that takes
// the key again within the window moves the record into P{K}:d:<token> for
// the rest of the window, so a repeat of the release still reports it.
func TestReleaseLeavesOneKey(t *testing.T) {
	forms := []struct {
		name string
		opt  *AcquireOptions
	}{
		{"plain", nil},
		{"limit", &AcquireOptions{Limit: 2}},
		{"park", &AcquireOptions{Label: "job", Park: &Parking{ID: "id"}, TakeReservation: true}},
	}
	handoverClients(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		for _, f := range forms {
			t.Run(f.name, func(t *testing.T) {
				ctx := ctxT(t)
				c := newClient()
				l, take, release := repeatSetup(t, c)
				b := l.r
				k := b.keys("a")
				all := []string{k.holders, k.meta, k.queue, k.waiters, k.fence, k.channel, k.cover, k.released, k.parked, k.follow}
				// left returns the lock's keys that exist and their TTLs.
				left := func(extra ...string) map[string]time.Duration {
					t.Helper()
					out := map[string]time.Duration{}
					for _, key := range append(all, extra...) {
						d, err := c.PTTL(ctx, key).Result()
						require.NoError(t, err)
						if d != -2*time.Nanosecond && d != -2*time.Millisecond {
							out[key] = d
						}
					}
					return out
				}

				first, err := take("a", f.opt)
				require.NoError(t, err)
				require.Equal(t, f.opt == nil, first.plain)
				require.True(t, release(first))
				moved := b.plainKeys("a", first.member)[1]
				keys := left(moved)
				require.Len(t, keys, 1, "a release leaves one key: %v", keys)
				require.Greater(t, keys[k.holders], time.Second, "kept past a second")
				require.LessOrEqual(t, keys[k.holders], b.grace, "kept no longer than the retry window")
				v, err := c.Get(ctx, k.holders).Result()
				require.NoError(t, err)
				require.Equal(t, fmt.Sprint("~", first.token, "."), v)

				second, err := take("a", f.opt)
				require.NoError(t, err)
				require.Greater(t, second.token, first.token)
				keys = left(moved)
				if f.opt == nil {
					require.Len(t, keys, 2, "the holder and the moved record: %v", keys)
				}
				require.Greater(t, keys[moved], time.Second, "the record moved: %v", keys)
				require.LessOrEqual(t, keys[moved], b.grace)
				require.True(t, release(first), "a repeat of the release reports it after the key was taken again")
				_, err = take("a", nil)
				require.ErrorIs(t, err, ErrNotAcquired, "the repeat did not release the new holder")
			})
		}
	})
}
