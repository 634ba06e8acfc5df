package lockcore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// acquireSignal counts acquire scripts and reports each reply on a channel.
type acquireSignal struct{ replies chan struct{} }

func (h *acquireSignal) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *acquireSignal) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	isAcquire := anyScript(append(acquireSources(), plainAcquireSrc)...)
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		// An EVALSHA that found the script cache empty is followed by EVAL.
		if isAcquire(cmd) && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			h.replies <- struct{}{}
		}
		return err
	}
}

func (h *acquireSignal) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// handoverClients runs fn against standalone Redis and a Redis Cluster, with
// a function returning new clients of the same store.
func handoverClients(t *testing.T, fn func(t *testing.T, newClient func() redis.UniversalClient)) {
	t.Run("redis", func(t *testing.T) {
		base := testredis.Client(t)
		fn(t, func() redis.UniversalClient {
			c := redis.NewClient(base.Options())
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
	t.Run("cluster", func(t *testing.T) {
		testredis.Cluster(t)
		fn(t, func() redis.UniversalClient {
			c := redis.NewClusterClient(testredis.ClusterOptions(t))
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
}

// A release hands the key to a plain waiter: the waiter holds it without an
// acquire of its own, for a short TTL that its Locker then renews.
func TestReleaseHandsTheKeyToTheWaiter(t *testing.T) {
	handoverClients(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		ctx := ctxT(t)
		hc := newClient()
		prefix := testredis.Prefix(t, hc)
		holder, err := NewRedis(hc, WithPrefix(prefix))
		require.NoError(t, err)
		t.Cleanup(func() { _ = holder.Close(context.Background()) })
		wc := newClient()
		sig := &acquireSignal{replies: make(chan struct{}, 10)}
		wc.AddHook(sig)
		renewed := make(chan struct{}, 10)
		// The poll interval is far beyond the test: only the release can
		// hand the key over in time. Its waiter TTL (4 minutes) is the TTL
		// the key is handed over with.
		waiter, err := NewRedis(wc, WithPrefix(prefix), WithPollInterval(time.Minute), WithObserver(func(e Event) {
			if e.Kind == LeaseRenewed {
				renewed <- struct{}{}
			}
		}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = waiter.Close(context.Background()) })

		first, err := holder.TryAcquire(ctx, "k", nil)
		require.NoError(t, err)
		got := make(chan *Lease, 1)
		go func() {
			l, err := waiter.Acquire(ctx, "k", &AcquireOptions{TTL: time.Hour, RenewInterval: 200 * time.Millisecond})
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		// Two attempts: the first registers the waiter, the second follows
		// the subscription. A hand-over after that waits in the channel.
		<-sig.replies
		<-sig.replies
		require.NoError(t, first.Release(ctx))
		var l *Lease
		select {
		case l = <-got:
		case <-ctx.Done():
			t.Fatal("the waiter was not handed the key")
		}
		require.NotNil(t, l)
		require.Len(t, sig.replies, 0, "the waiter sent no acquire after the release")
		require.Greater(t, l.Token(), first.Token())
		info, err := holder.Inspect(ctx, "k")
		require.NoError(t, err)
		require.Len(t, info.Holders, 1)
		require.Equal(t, waiter.Owner(), info.Holders[0].Owner)
		require.Equal(t, l.Token(), info.Holders[0].Token)
		require.LessOrEqual(t, info.Holders[0].TTL, 4*time.Minute, "handed over for the waiter TTL")
		<-renewed
		info, err = holder.Inspect(ctx, "k")
		require.NoError(t, err)
		require.Greater(t, info.Holders[0].TTL, 50*time.Minute, "renewed to its own TTL")
		require.NoError(t, l.Release(ctx))
		require.Len(t, sig.replies, 0)
	})
}

// The hand-over, step by step on the store: only a live plain waiter is
// handed the key, with its label unless that was completed; a late attempt of its call finds the lease it was handed;
// a waiter that gives up gives the key back; a waiter that died holds it only
// for the short TTL it was handed.
func TestHandOverSteps(t *testing.T) {
	handoverClients(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		ctx := ctxT(t)
		c := newClient()
		l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		b := l.r
		take := func(key string) *Lease {
			t.Helper()
			le, err := storeAcquire(t, l, key, nil)
			require.NoError(t, err)
			return le
		}
		wait := func(key string, opt *AcquireOptions, handTTL time.Duration) request {
			t.Helper()
			r, err := l.e.cfg.request(key, opt)
			require.NoError(t, err)
			r.waiter = randomID(8)
			if handTTL > 0 {
				r.waiter = handOverID(r.waiter, handTTL, &r)
			}
			res, err := b.acquire(ctx, &r)
			require.NoError(t, err)
			require.NotNil(t, res.conflict)
			return r
		}
		release := func(le *Lease) {
			t.Helper()
			held, err := b.release(ctx, []*Lease{le}, nil)
			require.NoError(t, err)
			require.Equal(t, []bool{true}, held)
		}
		holders := func(key string) []Holder {
			t.Helper()
			info, err := l.Inspect(ctx, key)
			require.NoError(t, err)
			return info.Holders
		}

		// Handed over, then found by a late attempt of the same call.
		first := take("a")
		w := wait("a", nil, 5*time.Second)
		release(first)
		hs := holders("a")
		require.Len(t, hs, 1)
		require.Greater(t, hs[0].Token, first.token)
		require.LessOrEqual(t, hs[0].TTL, 5*time.Second)
		res, err := b.acquire(ctx, &w)
		require.NoError(t, err)
		require.True(t, res.ok)
		require.Equal(t, hs[0].Token, res.token)
		require.Positive(t, res.left)
		require.LessOrEqual(t, res.left, 5*time.Second)

		// Given back by a waiter that gave up.
		require.NoError(t, b.leave(ctx, "a", w.waiter, w.aid))
		require.Empty(t, holders("a"))
		require.NoError(t, b.leave(ctx, "a", w.waiter, w.aid), "safe to run twice")

		// A waiter with an epoch is woken to try, not handed the key.
		second := take("b")
		wait("b", &AcquireOptions{Epoch: 7}, 0)
		release(second)
		require.Empty(t, holders("b"))

		// A waiter's label comes with the key it is handed, unless the
		// label was completed meanwhile.
		labelled := take("e")
		wait("e", &AcquireOptions{Label: "task:1"}, 5*time.Second)
		release(labelled)
		hs = holders("e")
		require.Len(t, hs, 1)
		require.Equal(t, "task:1", hs[0].Label)
		run, err := l.TryAcquire(ctx, "f", &AcquireOptions{Label: "task:2"})
		require.NoError(t, err)
		wait("f", &AcquireOptions{Label: "task:2"}, 5*time.Second)
		require.NoError(t, run.Complete(ctx, time.Minute))
		require.Empty(t, holders("f"), "a completed label is not handed the key")

		// A dead waiter holds the key only for the TTL it was handed.
		third := take("c")
		wait("c", nil, 300*time.Millisecond)
		release(third)
		hs = holders("c")
		require.Len(t, hs, 1)
		require.LessOrEqual(t, hs[0].TTL, 300*time.Millisecond)

		// A repeated release (go-redis sending it again after a lost
		// reply) reports the parked job it reserved the key for again.
		parker := take("g")
		parker.onParked = func(string, string) {}
		pr, err := l.e.cfg.request("g", &AcquireOptions{Label: "job-7", Park: &Parking{ID: "queue/7"}})
		require.NoError(t, err)
		res, err = b.acquire(ctx, &pr)
		require.NoError(t, err)
		require.NotNil(t, res.conflict)
		require.Equal(t, 0, res.conflict.Parked)
		for range 2 {
			parker.parked.Store(nil)
			release(parker)
			require.NotNil(t, parker.parked.Load())
			require.Equal(t, "queue/7", *parker.parked.Load())
		}
		hs = holders("g")
		require.Len(t, hs, 1)
		require.Equal(t, "parked:queue/7", hs[0].Owner)
		require.Equal(t, "job-7", hs[0].Label)

		// A repeated release hands nothing over twice.
		fourth := take("d")
		wait("d", nil, 5*time.Second)
		release(fourth)
		release(fourth)
		require.Len(t, holders("d"), 1)
	})
}
