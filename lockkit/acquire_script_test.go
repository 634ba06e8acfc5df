package lockkit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// rawAcquire runs the acquire script with every mode for a limit-1 call with
// a chosen parked-queue keep (ms).
func rawAcquire(t *testing.T, c redis.UniversalClient, k lockKeys, owner string, ttl int64, aid, label, entry, sup string, keep int64) []any {
	t.Helper()
	vals, err := acquireScripts[modeAll].Run(context.Background(), c, []string{k.holders, k.meta, k.queue, k.waiters, k.fence, k.cover, k.parked, k.follow},
		owner, ttl, 1, "", "0", 1000, 0, ttl, aid, label, 0, "1", sup, k.channel, "0", 0, entry, keep).Slice()
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
	require.EqualValues(t, 1, toInt(rawAcquire(t, c, k, "h", 200, "h1", "h", "", "0", short)[0]))
	require.EqualValues(t, 0, toInt(rawAcquire(t, c, k, "b", 1000, "ax", "lx", "60000:lx:idx", "1", short)[0]), "x parks")
	r := rawAcquire(t, c, k, "b", 1000, "ay", "ly", "60000:ly:idy", "1", short)
	require.Equal(t, "60000:lx:idx", r[7], "y replaced x")
	require.LessOrEqual(t, c.PTTL(context.Background(), k.holders).Val(), short*time.Millisecond)
	first := rawAcquire(t, c, k, "b", 1000, "ax2", "lx", "60000:lx:idx", "1", keep)
	require.EqualValues(t, -5, toInt(first[0]), "x gives up")
	require.Greater(t, c.PTTL(context.Background(), k.holders).Val(), keep/2*time.Millisecond,
		"the holders key lives as long as the S: record")
	require.Equal(t, first, rawAcquire(t, c, k, "b", 1000, "ax2", "lx", "60000:lx:idx", "1", keep), "a repeat gives up too")
}

// A run's order (AcquireOptions.Order) is kept while its lease is renewed,
// however long past the ten minutes it is kept for anyway: a renewal keeps
// the hash it lives in for a TTL more, so an older call still gives up.
func TestRunOrderOutlivesItsKeepWhileRenewed(t *testing.T) {
	testredis.Addr(t)
	c := testredis.Client(t)
	ctx := context.Background()
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	defer l.Close(ctx)
	run, err := l.Acquire(ctx, "k", &AcquireOptions{Supersede: true, Order: 20, TTL: 5 * time.Second})
	require.NoError(t, err)
	meta := l.r.keys("k").meta
	require.Greater(t, c.PTTL(ctx, meta).Val(), 9*time.Minute, "kept ten minutes after the run took the key")
	require.NoError(t, c.PExpire(ctx, meta, 50*time.Millisecond).Err()) // the ten minutes are over
	require.NoError(t, run.Extend(ctx, 5*time.Second))
	require.Greater(t, c.PTTL(ctx, meta).Val(), 4*time.Second, "kept while the run is renewed")
	_, err = l.Acquire(ctx, "k", &AcquireOptions{Supersede: true, Order: 10})
	require.ErrorIs(t, err, ErrSuperseded)
	require.NoError(t, run.Release(ctx))
}

// acquireSources are the sources of the acquire scripts, one per set of
// modes.
func acquireSources() []string {
	srcs := make([]string, len(acquireScripts))
	for m := range srcs {
		srcs[m] = acquireSource(acquireMode(m))
	}
	return srcs
}
