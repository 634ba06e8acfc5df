package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// clients runs fn on a standalone Redis and on a Redis Cluster.
func clients(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	t.Run("Redis", func(t *testing.T) { fn(t, testredis.Client(t)) })
	t.Run("RedisCluster", func(t *testing.T) { fn(t, testredis.Cluster(t)) })
}

// setup returns a Locker and a Writer on c under a prefix of the test's, and
// a key (with a hash tag when tagged) under it.
func setup(t *testing.T, c redis.UniversalClient) (*lockkit.Locker, *Writer, string) {
	t.Helper()
	prefix := testredis.Prefix(t, c)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix), lockkit.WithPollInterval(10*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	w, err := New(c, WithPrefix(prefix))
	require.NoError(t, err)
	return l, w, prefix + "report"
}

// op is one kind of fenced write, as the tests of every kind make it: write
// is a holder's write of v, stale the stale holder's last write, and read
// shows the key's data.
type op struct {
	name  string
	write func(ctx context.Context, w *Writer, t Token, key, v string) error
	stale func(ctx context.Context, w *Writer, t Token, key string) error
	read  func(ctx context.Context, c redis.UniversalClient, key string) string
}

func ops() []op {
	set := func(ctx context.Context, w *Writer, t Token, key, v string) error { return w.Set(ctx, t, key, v, 0) }
	get := func(ctx context.Context, c redis.UniversalClient, key string) string { return c.Get(ctx, key).Val() }
	// incr adds 1 for "first", 10 for "second", 100 for "stale".
	incr := func(ctx context.Context, w *Writer, t Token, key, v string) error {
		n := map[string]int64{"first": 1, "second": 10, "stale": 100}[v]
		_, err := w.IncrBy(ctx, t, key, n)
		return err
	}
	xadd := func(ctx context.Context, w *Writer, t Token, key, v string) error {
		_, err := w.XAdd(ctx, t, key, "by", v)
		return err
	}
	return []op{
		{name: "Set", write: set, stale: func(ctx context.Context, w *Writer, t Token, key string) error {
			return set(ctx, w, t, key, "stale")
		}, read: get},
		{name: "HSet", write: func(ctx context.Context, w *Writer, t Token, key, v string) error {
			return w.HSet(ctx, t, key, "by", v)
		}, stale: func(ctx context.Context, w *Writer, t Token, key string) error {
			return w.HSet(ctx, t, key, "by", "stale")
		}, read: func(ctx context.Context, c redis.UniversalClient, key string) string {
			return c.HGet(ctx, key, "by").Val()
		}},
		{name: "Del", write: set, stale: func(ctx context.Context, w *Writer, t Token, key string) error {
			return w.Del(ctx, t, key)
		}, read: get},
		{name: "IncrBy", write: incr, stale: func(ctx context.Context, w *Writer, t Token, key string) error {
			return incr(ctx, w, t, key, "stale")
		}, read: get},
		{name: "XAdd", write: xadd, stale: func(ctx context.Context, w *Writer, t Token, key string) error {
			return xadd(ctx, w, t, key, "stale")
		}, read: func(ctx context.Context, c redis.UniversalClient, key string) string {
			var by []string
			for _, m := range c.XRange(ctx, key, "-", "+").Val() {
				by = append(by, fmt.Sprint(m.Values["by"]))
			}
			return strings.Join(by, ",")
		}},
	}
}

// A holder whose lease expired writes after a second holder took the key
// and wrote: its write is refused with a *StaleError carrying the second's
// token, and the data holds the second's write. The first lease is not
// renewed (NoRenew); the second holder's Acquire waits for its expiry.
func TestStaleHolderIsRefused(t *testing.T) {
	want := map[string]string{"Set": "second", "HSet": "second", "Del": "second", "IncrBy": "11", "XAdd": "first,second"}
	eachOp(t, func(t *testing.T, c redis.UniversalClient, o op) {
		ctx := context.Background()
		l, w, key := setup(t, c)
		first, err := l.TryAcquire(ctx, "report", &lockkit.AcquireOptions{TTL: 100 * time.Millisecond, NoRenew: true})
		require.NoError(t, err)
		t1 := Token{Key: "report", Value: first.Token()}
		require.NoError(t, o.write(ctx, w, t1, key, "first"))

		wait, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		second, err := l.Acquire(wait, "report", nil) // once the first lease expired
		require.NoError(t, err)
		defer second.Release(ctx)
		t2 := Token{Key: "report", Value: second.Token()}
		require.Greater(t, t2.Value, t1.Value)
		require.NoError(t, o.write(ctx, w, t2, key, "second"))

		err = o.stale(ctx, w, t1, key)
		require.ErrorIs(t, err, ErrStale)
		var stale *StaleError
		require.ErrorAs(t, err, &stale)
		require.Equal(t, StaleError{Key: key, Lease: "report", Token: t1.Value, Newest: t2.Value}, *stale)
		require.Equal(t, want[o.name], o.read(ctx, c, key), "the data holds the second holder's write")
		require.NoError(t, o.stale(ctx, w, t2, key), "the newest token writes again")
	})
}

// eachOp runs fn for every kind of write, on a standalone Redis and on a
// Redis Cluster.
func eachOp(t *testing.T, fn func(t *testing.T, c redis.UniversalClient, o op)) {
	clients(t, func(t *testing.T, c redis.UniversalClient) {
		for _, o := range ops() {
			t.Run(o.name, func(t *testing.T) { fn(t, c, o) })
		}
	})
}

// isScript matches the commands that run a script.
func isScript(cmd redis.Cmder) bool {
	name := strings.ToLower(cmd.Name())
	return name == "evalsha" || name == "eval"
}

// Every write sent twice (as go-redis does after a lost reply) reports what
// its first run did and writes once: an IncrBy adds once, an XAdd appends
// one entry.
func TestWriteSentTwice(t *testing.T) {
	want := map[string]string{"Set": "first", "HSet": "first", "Del": "", "IncrBy": "1", "XAdd": "first"}
	eachOp(t, func(t *testing.T, c redis.UniversalClient, o op) {
		ctx := context.Background()
		_, w, key := setup(t, c)
		tok := Token{Value: 1000}
		if o.name == "Del" {
			require.NoError(t, w.Set(ctx, tok, key, "x", 0))
		}
		faults := &testredis.Faults{Match: isScript}
		c.AddHook(faults)
		faults.Arm(testredis.Repeat, 1)
		write := o.write
		if o.name == "Del" {
			write = func(ctx context.Context, w *Writer, t Token, key, _ string) error { return w.Del(ctx, t, key) }
		}
		require.NoError(t, write(ctx, w, tok, key, "first"))
		require.EqualValues(t, 1, faults.Hits(), "the write was sent twice")
		require.Equal(t, want[o.name], o.read(ctx, c, key))
	})
}

// The value an IncrBy sent twice returns, and the ID an XAdd sent twice
// returns, are its first run's.
func TestRepliesOfWritesSentTwice(t *testing.T) {
	clients(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		_, w, key := setup(t, c)
		tok := Token{Value: 1000}
		faults := &testredis.Faults{Match: isScript}
		c.AddHook(faults)
		faults.Arm(testredis.Repeat, 2)
		n, err := w.IncrBy(ctx, tok, key+":n", 5)
		require.NoError(t, err)
		require.EqualValues(t, 5, n)
		id, err := w.XAdd(ctx, tok, key+":s", "a", "1")
		require.NoError(t, err)
		require.EqualValues(t, 2, faults.Hits())
		entries := c.XRange(ctx, key+":s", "-", "+").Val()
		require.Len(t, entries, 1)
		require.Equal(t, entries[0].ID, id)
		// Two calls are two writes.
		n, err = w.Incr(ctx, tok, key+":n")
		require.NoError(t, err)
		require.EqualValues(t, 6, n)
	})
}

// between is a go-redis hook that sends the first script call it sees
// twice and calls fn between the two runs: a newer token's write that lands
// between a write and its repeat.
type between struct {
	fn   func()
	done bool
}

func (h *between) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *between) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.done || !isScript(cmd) {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return err // it did not run; go-redis sends the script itself next
		}
		h.done = true
		h.fn()
		return next(ctx, cmd)
	}
}

func (h *between) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A write that went through, whose repeat arrives after a newer token's
// write, reports success (its first run's reply), and the repeat changes
// nothing: the data holds the newer write.
func TestRepeatAfterANewerWrite(t *testing.T) {
	clients(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		prefix := testredis.Prefix(t, c)
		key := prefix + "n"
		newer, err := New(c, WithPrefix(prefix))
		require.NoError(t, err)
		hooked := c
		switch cc := c.(type) {
		case *redis.Client:
			hooked = redis.NewClient(cc.Options())
		case *redis.ClusterClient:
			hooked = redis.NewClusterClient(cc.Options())
		}
		defer hooked.Close()
		hooked.AddHook(&between{fn: func() {
			_, err := newer.IncrBy(ctx, Token{Value: 2000}, key, 10)
			require.NoError(t, err)
		}})
		older, err := New(hooked, WithPrefix(prefix))
		require.NoError(t, err)
		n, err := older.IncrBy(ctx, Token{Value: 1000}, key, 1)
		require.NoError(t, err, "the write went through before the newer one")
		require.EqualValues(t, 1, n, "its first run's reply")
		require.Equal(t, "11", c.Get(ctx, key).Val())
		_, err = older.IncrBy(ctx, Token{Value: 1000}, key, 1)
		require.ErrorIs(t, err, ErrStale, "a new call of the older token is refused")
	})
}

// Equal tokens write: a run writes as often as it needs.
func TestEqualTokenWrites(t *testing.T) {
	c := testredis.Client(t)
	ctx := context.Background()
	_, w, key := setup(t, c)
	tok := Token{Value: 1000}
	for i := range 3 {
		require.NoError(t, w.Set(ctx, tok, key, i, 0))
	}
	require.Equal(t, "2", c.Get(ctx, key).Val())
}

// pairs returns n field, value pairs: "f0", 0, "f1", 1, ...
func pairs(n int) []any {
	vs := make([]any, 0, 2*n)
	for i := range n {
		vs = append(vs, fmt.Sprint("f", i), i)
	}
	return vs
}

// HSet takes as many fields as HSET does, more than a Lua script passes to
// one command (fewer than 8000 values on Redis, than 5120 on miniredis, as
// lockkit/inprocess runs it), and still checks the fence; XAdd takes its
// most pairs on both.
func TestManyFields(t *testing.T) {
	_, mini := testredis.Mini(t)
	for name, c := range map[string]redis.UniversalClient{"Redis": testredis.Client(t), "miniredis": mini} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			prefix := testredis.Prefix(t, c)
			w, err := New(c, WithPrefix(prefix))
			require.NoError(t, err)
			key := prefix + "report"
			tok := Token{Value: 1000}
			require.NoError(t, w.HSet(ctx, tok, key, pairs(10000)...))
			require.EqualValues(t, 10000, c.HLen(ctx, key).Val())
			require.Equal(t, "9999", c.HGet(ctx, key, "f9999").Val())
			err = w.HSet(ctx, Token{Value: 999}, key, append(pairs(10000), "stale", 1)...)
			require.ErrorIs(t, err, ErrStale)
			require.EqualValues(t, 10000, c.HLen(ctx, key).Val(), "the stale write changed nothing")

			id, err := w.XAdd(ctx, tok, key+":s", pairs(maxEntryPairs)...)
			require.NoError(t, err)
			entries := c.XRange(ctx, key+":s", id, id).Val()
			require.Len(t, entries, 1)
			require.Len(t, entries[0].Values, maxEntryPairs)
		})
	}
}

// A key's fence and the records of its writes are in the key's Cluster
// slot, with a hash tag or without; a key without one that contains '}'
// is refused before anything is sent.
func TestFenceSharesTheSlot(t *testing.T) {
	c := testredis.Cluster(t)
	ctx := context.Background()
	w, err := New(c, WithPrefix("p{x}:"))
	require.NoError(t, err)
	require.Equal(t, "p%7Bx%7D:", w.prefix, "the prefix is escaped")
	for _, key := range []string{"report", "{acme}:report", "a{b", "{", "a{b}c{d}", "é"} {
		fenceKey, writeKey, err := w.keys("Set", key)
		require.NoError(t, err, key)
		slot := c.ClusterKeySlot(ctx, key).Val()
		require.Equal(t, slot, c.ClusterKeySlot(ctx, fenceKey).Val(), "fence %q of %q", fenceKey, key)
		require.Equal(t, slot, c.ClusterKeySlot(ctx, writeKey).Val(), "write record %q of %q", writeKey, key)
	}
	tok := Token{Value: 1}
	for _, key := range []string{"a}b", "}", "{}x", "x{}y{z}", ""} {
		err := w.Set(ctx, tok, key, "v", 0)
		require.ErrorIs(t, err, ErrInvalid, "%q", key)
		if key != "" {
			require.ErrorContains(t, err, "no hash tag and contains '}'")
		}
	}
	// One key's fence is not another's.
	a, _, _ := w.keys("Set", "{abc}")
	b, _, _ := w.keys("Set", "abc")
	require.NotEqual(t, a, b)
}

// Bad input is refused with ErrInvalid naming it, before anything is sent.
func TestInvalid(t *testing.T) {
	_, c := testredis.Mini(t)
	ctx := context.Background()
	_, err := New(nil)
	require.ErrorIs(t, err, ErrInvalid)
	var nilClient *redis.Client
	_, err = New(nilClient)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = New(c, WithLinger(0))
	require.ErrorContains(t, err, "WithLinger 0s")
	w, err := New(c)
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, w.linger, "the default linger")
	tok := Token{Value: 1}
	for name, err := range map[string]error{
		"token 0":   w.Set(ctx, Token{}, "k", "v", 0),
		"token -1":  w.Del(ctx, Token{Value: -1}, "k"),
		"ttl -1s":   w.Set(ctx, tok, "k", "v", -time.Second),
		"ttl 1.5ms": w.Set(ctx, tok, "k", "v", 1500*time.Microsecond),
		"1 values":  w.HSet(ctx, tok, "k", "f"),
		"0 values":  func() error { _, err := w.XAdd(ctx, tok, "k"); return err }(),
		"2001 field, value pairs": func() error {
			_, err := w.XAdd(ctx, tok, "k", pairs(maxEntryPairs+1)...)
			return err
		}(),
		"key is empty": w.Del(ctx, tok, ""),
	} {
		require.ErrorIs(t, err, ErrInvalid, name)
		require.ErrorContains(t, err, name)
	}
	require.Empty(t, c.Keys(ctx, "*").Val(), "nothing was written")
}

// The fence lives as long as its key and the linger after it: none while
// the key has no TTL, the key's TTL plus the linger while it has one (not
// shortened by a shorter one later), the linger once the key is deleted.
func TestFenceLifetime(t *testing.T) {
	c := testredis.Client(t)
	ctx := context.Background()
	prefix := testredis.Prefix(t, c)
	w, err := New(c, WithPrefix(prefix), WithLinger(time.Hour))
	require.NoError(t, err)
	key := prefix + "k"
	fenceKey, _, err := w.keys("Set", key)
	require.NoError(t, err)
	tok := Token{Value: 1}
	ttl := func() time.Duration { return c.PTTL(ctx, fenceKey).Val() }

	require.NoError(t, w.Set(ctx, tok, key, "v", 0))
	require.Equal(t, time.Duration(-1), ttl(), "no TTL while the key has none")
	require.NoError(t, w.Set(ctx, tok, key, "v", time.Minute))
	require.InDelta(t, time.Hour+time.Minute, ttl(), float64(time.Second))
	require.NoError(t, w.Set(ctx, tok, key, "v", time.Second))
	require.InDelta(t, time.Hour+time.Minute, ttl(), float64(time.Second), "not shortened")
	_, err = w.Incr(ctx, tok, key+":n")
	require.NoError(t, err)
	require.NoError(t, w.Del(ctx, tok, key+":n"))
	n, _, _ := w.keys("Del", key+":n")
	require.InDelta(t, time.Hour, c.PTTL(ctx, n).Val(), float64(time.Second), "the linger once the key is deleted")
	require.Equal(t, "1", c.Get(ctx, fenceKey).Val(), "the fence holds the token")
}

// A write's record lives for the client's retry window, and a refused
// write leaves none.
func TestWriteRecordLifetime(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), ReadTimeout: time.Second, MaxRetries: 1, MaxRetryBackoff: time.Millisecond})
	defer c.Close()
	ctx := context.Background()
	prefix := testredis.Prefix(t, c)
	w, err := New(c, WithPrefix(prefix))
	require.NoError(t, err)
	require.Equal(t, 2*(time.Second+time.Millisecond), w.window)
	require.NoError(t, w.Set(ctx, Token{Value: 2}, prefix+"k", "v", 0))
	require.ErrorIs(t, w.Set(ctx, Token{Value: 1}, prefix+"k", "v", 0), ErrStale)
	records := c.Keys(ctx, prefix+"fence-write:*").Val()
	require.Len(t, records, 1)
	require.InDelta(t, w.window, c.PTTL(ctx, records[0]).Val(), float64(100*time.Millisecond))
}

// A fenced write is one round trip once the script is loaded.
func TestOneRoundTrip(t *testing.T) {
	c := testredis.Client(t)
	ctx := context.Background()
	_, w, key := setup(t, c)
	tok := Token{Value: 1}
	writes := map[string]func() error{
		"Set":    func() error { return w.Set(ctx, tok, key+":s", "v", 0) },
		"HSet":   func() error { return w.HSet(ctx, tok, key+":h", "f", "v") },
		"Del":    func() error { return w.Del(ctx, tok, key+":s") },
		"IncrBy": func() error { _, err := w.IncrBy(ctx, tok, key+":n", 2); return err },
		"XAdd":   func() error { _, err := w.XAdd(ctx, tok, key+":x", "f", "v"); return err },
	}
	var counter testredis.Counter
	c.AddHook(&counter)
	for name, write := range writes {
		require.NoError(t, write(), name) // loads the script
		counter.Reset()
		require.NoError(t, write(), name)
		require.EqualValues(t, 1, counter.Count(), name)
	}
}

// FromContext returns the token of the lease the work runs under, from
// lockkit.Do, from the guard that the asynq and cron adapters share, and
// from a cron job under cronguard; a
// ctx without a lease is an error that says what is missing.
func TestFromContext(t *testing.T) {
	c := testredis.Client(t)
	ctx := context.Background()
	l, _, _ := setup(t, c)
	_, err := FromContext(ctx)
	require.ErrorIs(t, err, ErrNoLease)
	require.ErrorContains(t, err, "lockkit.Do")

	require.NoError(t, lockkit.Do(ctx, l, "report", nil, func(ctx context.Context) error {
		tok, err := FromContext(ctx)
		require.NoError(t, err)
		lease, _ := lockkit.LeaseFromContext(ctx)
		require.Equal(t, Token{Key: "report", Value: lease.Token()}, tok)
		return nil
	}))
	g, err := middleware.New(l)
	require.NoError(t, err)
	var got Token
	out := g.Run(ctx, middleware.Job{Key: "tenant:42", Name: "report"}, func(ctx context.Context) error {
		got, err = FromContext(ctx)
		return err
	})
	require.True(t, out.Ran)
	require.NoError(t, out.Err)
	require.Equal(t, "tenant:42", got.Key)
	require.Positive(t, got.Value)

	wrap, err := cronguard.Wrap(l, "digest", "@hourly")
	require.NoError(t, err)
	got = Token{}
	wrap(cronguard.Func(func(ctx context.Context) error {
		got, err = FromContext(ctx)
		return err
	})).Run()
	require.NoError(t, err)
	require.Equal(t, "cron:digest", got.Key, "a cron tick's lease")
	require.Positive(t, got.Value)
}

func TestStaleErrorMessage(t *testing.T) {
	err := error(&StaleError{Key: "k", Lease: "report", Token: 1, Newest: 2})
	require.True(t, errors.Is(err, ErrStale))
	require.Equal(t, `fence: stale token: "k" was written with token 2, newer than this write's 1 (lease "report"): nothing changed`, err.Error())
}
