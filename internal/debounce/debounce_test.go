package debounce_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/debounce"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// The newest request of a burst is the one Claim accepts, however the
// requests race across Debouncers; maxWait bounds the burst; a claim ends
// it.
func TestDebounceKeepsTheNewestRequest(t *testing.T) {
	testredis.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		prefix := testredis.Prefix(t, client)
		a, err := debounce.New(client, debounce.WithPrefix(prefix))
		require.NoError(t, err)
		b, err := debounce.New(client, debounce.WithPrefix(prefix))
		require.NoError(t, err)
		r1, err := a.Debounce(ctx, "k", "t1", 200*time.Millisecond, 0)
		require.NoError(t, err)
		require.InDelta(t, 200, r1.Wait.Milliseconds(), 20)
		r2, err := b.Debounce(ctx, "k", "t2", 200*time.Millisecond, 0)
		require.NoError(t, err)
		require.Greater(t, r2.Gen, r1.Gen)
		again, err := b.Debounce(ctx, "k", "t2", 200*time.Millisecond, 0)
		require.NoError(t, err)
		require.Equal(t, r2.Gen, again.Gen, "a repeated call is the same request")
		newest, ok, err := a.Claim(ctx, "k", r1.Gen, false)
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, r2.Gen, newest.Gen)
		require.Equal(t, "t2", newest.ID)
		require.False(t, newest.Claimed)
		_, ok, err = a.Claim(ctx, "k", r2.Gen, false)
		require.NoError(t, err)
		require.True(t, ok)
		_, ok, err = a.Claim(ctx, "k", r2.Gen, false)
		require.NoError(t, err)
		require.True(t, ok, "claiming twice is claiming once")
		newest, ok, err = a.Claim(ctx, "k", r1.Gen, false)
		require.NoError(t, err)
		require.False(t, ok)
		require.True(t, newest.Claimed, "the newest request was claimed")
		_, ok, err = a.Claim(ctx, "k", r1.Gen, true)
		require.NoError(t, err)
		require.False(t, ok, "no force claim once the newest request ran")

		// maxWait bounds a burst from its first request; a claim ends it.
		r3, err := a.Debounce(ctx, "k", "t3", 300*time.Millisecond, 300*time.Millisecond)
		require.NoError(t, err)
		require.LessOrEqual(t, r3.Wait, 300*time.Millisecond)
		r4, err := b.Debounce(ctx, "k", "t4", 300*time.Millisecond, 300*time.Millisecond)
		require.NoError(t, err)
		require.LessOrEqual(t, r4.Wait, r3.Wait, "due no later than maxWait after the burst's first request")
		_, ok, err = a.Claim(ctx, "k", r3.Gen, true)
		require.NoError(t, err)
		require.True(t, ok, "forced")
		time.Sleep(100 * time.Millisecond) // the old burst's bound would now be ≤ 200ms away
		r5, err := a.Debounce(ctx, "k", "t5", 300*time.Millisecond, 300*time.Millisecond)
		require.NoError(t, err)
		require.Greater(t, r5.Gen, r4.Gen)
		require.GreaterOrEqual(t, r5.Wait, 290*time.Millisecond, "a new burst")

		// Racing requests: exactly the newest is claimed.
		var wg sync.WaitGroup
		gens := make([]int64, 20)
		for i := range gens {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := a
				if i%2 == 1 {
					l = b
				}
				r, err := l.Debounce(ctx, "race", fmt.Sprint("t", i), time.Second, 0)
				assert.NoError(t, err)
				gens[i] = r.Gen
			}()
		}
		wg.Wait()
		claimed := 0
		for _, g := range gens {
			_, ok, err := a.Claim(ctx, "race", g, false)
			require.NoError(t, err)
			if ok {
				claimed++
				require.Equal(t, slices.Max(gens), g)
			}
		}
		require.Equal(t, 1, claimed)

		for _, bad := range []func() error{
			func() error { _, err := a.Debounce(ctx, "k", "", time.Second, 0); return err },
			func() error { _, err := a.Debounce(ctx, "k", "t", 0, 0); return err },
			func() error { _, err := a.Debounce(ctx, "k", "t", time.Second, time.Millisecond); return err },
			func() error { _, _, err := a.Claim(ctx, "k", 0, false); return err },
		} {
			require.ErrorIs(t, bad(), lockkit.ErrInvalid)
		}
	})
}

// New refuses a nil client; a Debouncer made from a Locker's Redis and
// prefix sees the requests of the Debouncers with that prefix, under the
// key names running processes use.
func TestNew(t *testing.T) {
	_, c := testredis.Mini(t)
	var nilClient *redis.Client
	_, err := debounce.New(nil)
	require.ErrorIs(t, err, lockkit.ErrInvalid)
	_, err = debounce.New(nilClient)
	require.ErrorIs(t, err, lockkit.ErrInvalid)

	ctx := context.Background()
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix("p:{x}"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	rl, err := lockcore.Of("test", l)
	require.NoError(t, err)
	client, prefix := rl.Redis()
	own, err := debounce.New(client, debounce.WithPrefix(prefix))
	require.NoError(t, err)
	same, err := debounce.New(c, debounce.WithPrefix("p:{x}"))
	require.NoError(t, err)
	other, err := debounce.New(c)
	require.NoError(t, err)
	r1, err := own.Debounce(ctx, "k{1}", "t1", time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), c.Exists(ctx, "p:%7Bx%7D{k%7B1%7D}:b").Val(), "the key name of the requests")
	// miniredis' TTLs stand still: the request is remembered for 24 hours
	// after it is due, a minute from now.
	require.Equal(t, 24*time.Hour+time.Minute, c.PTTL(ctx, "p:%7Bx%7D{k%7B1%7D}:b").Val(), "remembered 24 hours after it is due")
	r2, err := same.Debounce(ctx, "k{1}", "t2", time.Minute, 0)
	require.NoError(t, err)
	_, ok, err := own.Claim(ctx, "k{1}", r1.Gen, false)
	require.NoError(t, err)
	require.False(t, ok, "the same Redis and prefix: t2 is newer")
	_, ok, err = other.Claim(ctx, "k{1}", r1.Gen, false)
	require.NoError(t, err)
	require.True(t, ok, "another prefix knows no request of the key")
	_, ok, err = same.Claim(ctx, "k{1}", r2.Gen, false)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = other.Debounce(ctx, "k{1}", "t3", time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), c.Exists(ctx, lockcore.DefaultPrefix+"{k%7B1%7D}:b").Val(), "the default prefix")
}
