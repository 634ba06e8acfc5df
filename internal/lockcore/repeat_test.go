package lockcore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// repeatSetup returns a Locker on c, and its store's acquire and release
// with no engine around them, so that a release can be sent again.
func repeatSetup(t *testing.T, c redis.UniversalClient) (*RedisLocker, func(string, *AcquireOptions) (*Lease, error), func(*Lease) bool) {
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	take := func(key string, opt *AcquireOptions) (*Lease, error) {
		t.Helper()
		return storeAcquire(t, l, key, opt)
	}
	release := func(le *Lease) bool {
		t.Helper()
		held, err := l.r.release(ctxT(t), []*Lease{le}, nil)
		require.NoError(t, err)
		return held[0]
	}
	return l, take, release
}

// expired waits until key has n live holders.
func expired(t *testing.T, l *RedisLocker, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := l.Inspect(ctxT(t), key)
		require.NoError(t, err)
		return len(info.Holders) == n
	}, 5*time.Second, 5*time.Millisecond)
}

// A repeat of the release of an expired lease reports what its first run
// did (not released), also after a later holder's release left the last
// token, the expired lease's, in the holders key.
func TestRepeatedReleaseOfAnExpiredLease(t *testing.T) {
	for _, name := range []string{"redis", "cluster"} {
		t.Run(name, func(t *testing.T) {
			var c redis.UniversalClient
			if name == "redis" {
				c = testredis.Client(t)
			} else {
				c = testredis.Cluster(t)
			}
			l, take, release := repeatSetup(t, c)
			x, err := take("k", &AcquireOptions{Limit: 2, TTL: time.Minute})
			require.NoError(t, err)
			a, err := take("k", &AcquireOptions{Limit: 2, TTL: MinTTL})
			require.NoError(t, err)
			require.Greater(t, a.token, x.token)
			expired(t, l, "k", 1)
			first := release(a)
			require.False(t, first, "a's lease expired")
			require.True(t, release(x))
			again := release(a)
			require.Equal(t, first, again, "a repeat of a's release reports what the first run did")
		})
	}
}

// A late release of an expired lease is not reported released, also after
// a refused acquire dropped its member and a later holder's release left its
// token in the holders key.
func TestLateReleaseOfAnExpiredLease(t *testing.T) {
	c := testredis.Client(t)
	l, take, release := repeatSetup(t, c)
	x, err := take("k", &AcquireOptions{Limit: 2, TTL: time.Minute})
	require.NoError(t, err)
	a, err := take("k", &AcquireOptions{Limit: 2, TTL: MinTTL})
	require.NoError(t, err)
	expired(t, l, "k", 1)
	_, err = take("k", &AcquireOptions{Epoch: 7}) // acquire.lua, limit 1: refused, drops a's expired member
	require.ErrorIs(t, err, ErrNotAcquired)
	require.True(t, release(x))
	require.False(t, release(a), "a's lease expired before its release")
}

// Tokens keep increasing across a small backward step of the server's
// clock after a release, also when a Free turned the key's record over in
// between (miniredis, its clock set by hand).
func TestTokensIncreaseAcrossAClockStepBack(t *testing.T) {
	for _, del := range []string{"free", "none"} {
		t.Run(del, func(t *testing.T) {
			mr, c := testredis.Mini(t)
			now := time.Now()
			mr.SetTime(now)
			l, take, release := repeatSetup(t, c)
			x, err := take("k", &AcquireOptions{Limit: 2})
			require.NoError(t, err)
			require.True(t, release(x))
			if del == "free" {
				_, err = l.r.free(ctxT(t), "k", "nolabel")
				require.NoError(t, err)
			}
			mr.SetTime(now.Add(-300 * time.Millisecond))
			y, err := take("k", &AcquireOptions{Limit: 2})
			require.NoError(t, err)
			require.Greater(t, y.token, x.token, "tokens increase across a small backward step")
		})
	}
}

// Repeats of a plain and of a sorted release after each other operation on
// the key, and the next tokens.
func TestRepeatedReleaseAfterEachOperation(t *testing.T) {
	ops := []string{"none", "plain", "limit2", "evict", "free", "detachOther", "leave", "inspect", "extend", "renew", "expire"}
	for _, form := range []string{"plain", "sorted"} {
		for _, op := range ops {
			t.Run(form+"/"+op, func(t *testing.T) {
				ctx := ctxT(t)
				c := testredis.Client(t)
				l, take, release := repeatSetup(t, c)
				var opt *AcquireOptions
				if form == "sorted" {
					opt = &AcquireOptions{Limit: 2}
				}
				a, err := take("k", opt)
				require.NoError(t, err)
				require.True(t, release(a))
				var others []*Lease
				switch op {
				case "plain":
					b, err := take("k", nil)
					require.NoError(t, err)
					others = append(others, b)
				case "limit2":
					b, err := take("k", &AcquireOptions{Limit: 2})
					require.NoError(t, err)
					others = append(others, b)
				case "evict":
					_, err := l.r.evict(ctx, "k", "", 0, "call1")
					require.NoError(t, err)
				case "free":
					_, err := l.r.free(ctx, "k", "x")
					require.NoError(t, err)
				case "detachOther":
					b, err := take("k", &AcquireOptions{Limit: 2})
					require.NoError(t, err)
					ok, err := l.r.reserve(ctx, b, b.member+"r", time.Minute)
					require.NoError(t, err)
					require.True(t, ok)
				case "leave":
					require.NoError(t, l.r.leave(ctx, "k", "w1", "aid1"))
				case "inspect":
					_, err := l.Inspect(ctx, "k")
					require.NoError(t, err)
				case "extend":
					errs := l.r.extend(ctx, []*Lease{a}, []time.Duration{time.Minute}, true)
					require.Error(t, errs[0])
				case "renew":
					errs := l.r.renewMany(ctx, []*Lease{a}, []time.Duration{time.Minute})
					require.Error(t, errs[0])
				case "expire":
				}
				require.True(t, release(a), "repeat after %s", op)
				for _, o := range others {
					require.True(t, release(o), "the other holder was not released by the repeat")
				}
				n, err := take("k", &AcquireOptions{Limit: 3})
				require.NoError(t, err)
				require.Greater(t, n.token, a.token)
				require.True(t, release(n))
			})
		}
	}
}
