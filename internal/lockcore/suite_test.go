package lockcore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// go-redis v9.17's process-wide clock goroutine is go-redis's, not a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// harness builds Lockers that share one store, like processes sharing a Redis.
type harness struct {
	// locker returns a new Locker on the shared store, closed at test end.
	locker func(t *testing.T, opts ...Option) Locker
	// killable returns a Locker whose renewal can be stopped without releasing
	// anything, as if its process froze or died.
	killable func(t *testing.T, opts ...Option) (Locker, func())
	// steal removes key's holders behind the holders' backs.
	steal func(t *testing.T, key string)
	// wipe forgets everything (a Redis restart without persistence).
	wipe func(t *testing.T)
	// prefix is the key prefix the harness's Lockers use.
	prefix string
}

func redisHarness(t *testing.T, client *redis.Client) *harness {
	return universalHarness(t, client, func() redis.UniversalClient { return redis.NewClient(client.Options()) })
}

func clusterHarness(t *testing.T, client *redis.ClusterClient) *harness {
	return universalHarness(t, client, func() redis.UniversalClient {
		return redis.NewClusterClient(testredis.ClusterOptions(t))
	})
}

func universalHarness(t *testing.T, client redis.UniversalClient, newClient func() redis.UniversalClient) *harness {
	prefix := testredis.Prefix(t, client)
	newLocker := func(t *testing.T, c redis.UniversalClient, opts ...Option) *RedisLocker {
		l, err := NewRedis(c, append([]Option{WithPrefix(prefix)}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	return &harness{
		prefix: prefix,
		locker: func(t *testing.T, opts ...Option) Locker { return newLocker(t, client, opts...) },
		killable: func(t *testing.T, opts ...Option) (Locker, func()) {
			own := newClient()
			t.Cleanup(func() { _ = own.Close() })
			return newLocker(t, own, opts...), func() { _ = own.Close() }
		},
		steal: func(t *testing.T, key string) {
			require.NoError(t, client.Del(context.Background(), escapeKey(prefix)+"{"+escapeKey(key)+"}:h").Err())
		},
		wipe: func(t *testing.T) {
			wipe := func(ctx context.Context, c redis.Cmdable) error {
				iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
				for iter.Next(ctx) {
					c.Del(ctx, iter.Val())
				}
				return iter.Err()
			}
			if cc, ok := client.(*redis.ClusterClient); ok {
				require.NoError(t, cc.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error { return wipe(ctx, c) }))
				return
			}
			require.NoError(t, wipe(context.Background(), client))
		},
	}
}

// The same behaviour suite runs on miniredis (the scripts in-process), Redis
// and Redis Cluster.
func TestBehaviourMiniredis(t *testing.T) {
	runSuite(t, func(t *testing.T) *harness { return redisHarness(t, mini(t)) })
}

// mini returns a client of a miniredis of the test's own whose keys expire
// as real time passes, as on Redis.
func mini(t testing.TB) *redis.Client {
	mr, c := testredis.Mini(t)
	mr.ClockTTL(true)
	return c
}

// miniLocker returns a Locker built with opts on a miniredis of the test's
// own, closed when the test ends.
func miniLocker(t testing.TB, opts ...Option) *RedisLocker {
	t.Helper()
	l, err := NewRedis(mini(t), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func TestBehaviourRedis(t *testing.T) {
	testredis.Addr(t)
	runSuite(t, func(t *testing.T) *harness { return redisHarness(t, testredis.Client(t)) })
}

func TestBehaviourRedisCluster(t *testing.T) {
	testredis.ClusterAddrs(t)
	runSuite(t, func(t *testing.T) *harness { return clusterHarness(t, testredis.Cluster(t)) })
}

// The suite again with every Locker batching its calls (WithBatching), on
// Redis and Redis Cluster: the Lockers of a test share their calls' round
// trips, and each call behaves as it does alone.
func TestBehaviourBatched(t *testing.T) {
	t.Run("Redis", func(t *testing.T) {
		testredis.Addr(t)
		runSuite(t, func(t *testing.T) *harness { return batched(redisHarness(t, testredis.Client(t))) })
	})
	t.Run("RedisCluster", func(t *testing.T) {
		testredis.ClusterAddrs(t)
		runSuite(t, func(t *testing.T) *harness { return batched(clusterHarness(t, testredis.Cluster(t))) })
	})
}

// batched makes every Locker of h batch its calls (WithBatching).
func batched(h *harness) *harness {
	locker, killable := h.locker, h.killable
	h.locker = func(t *testing.T, opts ...Option) Locker { return locker(t, append(opts, WithBatching())...) }
	h.killable = func(t *testing.T, opts ...Option) (Locker, func()) {
		return killable(t, append(opts, WithBatching())...)
	}
	return h
}

func runSuite(t *testing.T, newHarness func(*testing.T) *harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, *harness)
	}{
		{"TryAcquireConflictNamesHolder", testConflict},
		{"ReleaseWakesWaiterWithoutPolling", testWake},
		{"ReleaseIsOwnerChecked", testReleaseOwnerChecked},
		{"ExtendIsOwnerChecked", testExtend},
		{"RenewalKeepsLeaseAlive", testRenewal},
		{"StolenKeyCancelsWork", testLost},
		{"DeadHolderExpiresAndTokenRises", testDeadHolder},
		{"FencingTokenMonotonicAcrossRestart", testFencing},
		{"HolderLimit", testLimit},
		{"DisagreeingLimitsKeepTheSmaller", testLimitsDisagree},
		{"FairQueueIsFIFO", testFair},
		{"DeadFairWaiterIsDropped", testDeadWaiter},
		{"EpochClaimsOnce", testEpoch},
		{"EpochOutlivesARunLongerThanTTL", testEpochLongRun},
		{"EpochTagOfAnotherClaimIsTold", testEpochTag},
		{"Inspect", testInspect},
		{"CloseReleasesEverything", testClose},
		{"AcquireEndsWithContext", testAcquireCtx},
		{"RunReleasesOnPanic", testRunPanic},
		{"RunDoesNotStartPastValidity", testRunPastValidity},
		{"Validation", testValidation},
		{"KeysListsHeldKeys", testKeys},
		{"KeysSkipsKeysWithNoLiveHolder", testKeysLive},
		{"AnyKeyAndPrefix", testBraces},
		{"EpochForgottenAfterEpochTTL", testEpochForgotten},
		{"LabelsAreUniqueAmongHolders", testLabels},
		{"CompletedLabelIsRefused", testComplete},
		{"RunCompletesWorkItsCallerGaveUpOn", testRunCompletes},
		{"CoalesceGivesWayToLaterRuns", testCoalesce},
		{"ReservationsAreUnrenewedAndFreedByLabel", testReservation},
		{"ForceReleaseByLabelGivesUpTheParkedJob", testForceReleaseLabelParked},
		{"HoldAtLeastKeepsAFastRunsKey", testHoldAtLeast},
		{"HeldReleaseHandsTheKeyToAParkedJobAtItsEnd", testHoldHandOver},
		{"SupersedeKeepsTheNewestFollowUp", testSupersede},
		{"PreemptCancelsTheRunningHolder", testPreempt},
		{"OrderedFollowUpsKeepTheNewestEnqueued", testOrder},
		{"ForceReleaseEvictsHolders", testForceRelease},
		{"ForceReleaseByTokenEvictsTheHolderSeen", testForceReleaseToken},
		{"AsyncReleaseLeavesRunsPath", testAsyncRelease},
		{"ManyLeasesRenewTogether", testRenewMany},
		{"HugeTTLsAreRejected", testHugeTTL},
		{"ParkedJobsGetTheKeyInOrder", testPark},
		{"ParkedFollowUpsSupersedeAndCover", testParkFollowUp},
		{"RenewalsKeepTheirInterval", testRenewalOnTime},
		{"RedeliveryIsNoFollowUp", testRedelivery},
		{"HandOverComesBeforeParkedJobs", testHandOverBeforeParked},
		{"CloseResumesTheParkedJob", testCloseResumesParked},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newHarness(t))
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func testConflict(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t, WithOwner("owner-a"))
	b := h.locker(t, WithOwner("owner-b"))
	la, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	require.Equal(t, "owner-a", la.Owner())
	require.Positive(t, la.Token())

	_, err = b.TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, ErrNotAcquired)
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "owner-a", ce.Owner)
	require.Equal(t, la.Token(), ce.Token)
	require.Equal(t, 1, ce.Holders)
	require.Greater(t, ce.TTL, DefaultTTL-5*time.Second)
	require.LessOrEqual(t, ce.TTL, DefaultTTL)

	// A Locker does not re-enter its own lock either: two workers of one
	// process must not run the same key.
	_, err = a.TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NoError(t, la.Release(ctx))
	lb, err := b.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	require.NoError(t, lb.Release(ctx))
}

func testWake(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	// A poll interval far beyond the test's deadline: only a release
	// notification can hand the lock over in time.
	b := h.locker(t, WithPollInterval(time.Hour))
	la, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)

	var events []EventKind
	var mu sync.Mutex
	waiting := make(chan struct{})
	c := h.locker(t, WithPollInterval(time.Hour), WithObserver(func(e Event) {
		mu.Lock()
		events = append(events, e.Kind)
		mu.Unlock()
		if e.Kind == LeaseContended {
			close(waiting)
		}
	}))
	got := make(chan *Lease, 1)
	go func() {
		l, err := c.Acquire(ctx, "k", nil)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	<-waiting
	_ = b
	require.NoError(t, la.Release(ctx))
	select {
	case l := <-got:
		require.NotNil(t, l)
		require.Greater(t, l.Token(), la.Token())
		require.NoError(t, l.Release(ctx))
	case <-time.After(10 * time.Second):
		t.Fatal("waiter was not woken by the release")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []EventKind{LeaseContended, LeaseAcquired, LeaseReleased}, events)
}

func testReleaseOwnerChecked(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	b := h.locker(t)
	la, err := a.TryAcquire(ctx, "k", &AcquireOptions{TTL: MinTTL, NoRenew: true})
	require.NoError(t, err)
	lb, err := b.Acquire(ctx, "k", nil) // after la expires
	require.NoError(t, err)

	err = la.Release(ctx)
	require.ErrorIs(t, err, ErrNotHeld)
	// b's lock is untouched.
	_, err = a.TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, ErrNotAcquired)

	require.NoError(t, lb.Release(ctx))
	require.ErrorIs(t, lb.Release(ctx), ErrNotHeld, "a second release")
}

func testExtend(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	la, err := a.TryAcquire(ctx, "k", &AcquireOptions{TTL: time.Second, NoRenew: true})
	require.NoError(t, err)
	require.NoError(t, la.Extend(ctx, time.Minute))
	info, err := a.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Greater(t, info.Holders[0].TTL, 50*time.Second)
	require.ErrorIs(t, la.Extend(ctx, time.Millisecond), ErrInvalid)

	h.steal(t, "k")
	err = la.Extend(ctx, time.Minute)
	require.ErrorIs(t, err, ErrNotHeld)
	require.ErrorIs(t, la.Err(), ErrLost)
	info, err = a.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "extend must not recreate a lost lease")
}

// A lease is renewed every RenewInterval (TTL/3 by default), not merely
// before it runs out: each renewal schedules the next.
func testRenewalOnTime(t *testing.T, h *harness) {
	ctx := ctxT(t)
	renewed := make(chan time.Time, 100)
	a := h.locker(t, WithObserver(func(e Event) {
		if e.Kind == LeaseRenewed {
			renewed <- time.Now()
		}
	}))
	ttl := 1500 * time.Millisecond
	l, err := a.TryAcquire(ctx, "k", &AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	last := time.Now()
	for i := range 4 {
		select {
		case at := <-renewed:
			require.Less(t, at.Sub(last), ttl/2, "renewal %d came %s after the one before (interval %s)", i, at.Sub(last), ttl/3)
			last = at
		case <-ctx.Done():
			t.Fatal("lease was not renewed")
		}
	}
	require.NoError(t, l.Release(ctx))
}

func testRenewal(t *testing.T, h *harness) {
	ctx := ctxT(t)
	renewed := make(chan struct{}, 100)
	a := h.locker(t, WithObserver(func(e Event) {
		if e.Kind == LeaseRenewed {
			renewed <- struct{}{}
		}
	}))
	b := h.locker(t)
	ttl := 300 * time.Millisecond
	la, err := a.TryAcquire(ctx, "k", &AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	// Five renewals span well over one TTL.
	start := time.Now()
	for range 5 {
		select {
		case <-renewed:
		case <-ctx.Done():
			t.Fatal("lease was not renewed")
		}
	}
	require.Greater(t, time.Since(start), ttl)
	_, err = b.TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NoError(t, la.Err())
	require.NoError(t, la.Release(ctx))
}

func testLost(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	la, err := a.TryAcquire(ctx, "k", &AcquireOptions{TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- la.Run(ctx, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	<-started
	h.steal(t, "k")
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrLost)
	case <-ctx.Done():
		t.Fatal("work was not cancelled after its key was stolen")
	}
	<-la.Lost()
	require.ErrorIs(t, la.Err(), ErrLost)
}

func testDeadHolder(t *testing.T, h *harness) {
	ctx := ctxT(t)
	ttl := 400 * time.Millisecond
	holder, kill := h.killable(t)
	waiter := h.locker(t, WithPollInterval(50*time.Millisecond))
	lh, err := holder.TryAcquire(ctx, "k", &AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	kill()
	killed := time.Now()
	lw, err := waiter.Acquire(ctx, "k", nil)
	require.NoError(t, err)
	took := time.Since(killed)
	require.Less(t, took, ttl+time.Second, "the next waiter gets the lock within TTL + a margin")
	require.Greater(t, lw.Token(), lh.Token())
	require.NoError(t, lw.Release(ctx))
}

func testFencing(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	b := h.locker(t)
	var last int64
	for i := range 6 {
		l := a
		if i%2 == 1 {
			l = b
		}
		if i == 3 {
			h.wipe(t) // the key and its counter are gone
		}
		lease, err := l.TryAcquire(ctx, "k", nil)
		require.NoError(t, err)
		require.Greater(t, lease.Token(), last, "acquire %d", i)
		last = lease.Token()
		require.NoError(t, lease.Release(ctx))
	}
}

func testLimit(t *testing.T, h *harness) {
	ctx := ctxT(t)
	opt := &AcquireOptions{Limit: 3}
	var held []*Lease
	for i := range 3 {
		l, err := h.locker(t).TryAcquire(ctx, "k", opt)
		require.NoError(t, err, "holder %d", i)
		held = append(held, l)
	}
	other := h.locker(t)
	_, err := other.TryAcquire(ctx, "k", opt)
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, 3, ce.Holders)

	got := make(chan *Lease, 1)
	go func() {
		l, err := other.Acquire(ctx, "k", opt)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	require.NoError(t, held[1].Release(ctx))
	l := <-got
	require.NotNil(t, l)
	info, err := other.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Len(t, info.Holders, 3)
	for _, x := range []*Lease{held[0], held[2], l} {
		require.NoError(t, x.Release(ctx))
	}
}

// Two servers that pass different limits for one key (a rolling deploy
// that changed it) never let it have more holders than the smaller limit
// while a holder that took it with that limit lives, and neither is
// blocked for good: the larger limit applies again once those holders are
// gone, and a waiter with the smaller one gets the key once the holders
// are fewer than its limit.
func testLimitsDisagree(t *testing.T, h *harness) {
	ctx := ctxT(t)
	three, one, two := &AcquireOptions{Limit: 3}, &AcquireOptions{Limit: 1}, &AcquireOptions{Limit: 2}
	a, b := h.locker(t), h.locker(t)
	holders := func() int {
		info, err := a.Inspect(ctx, "k")
		require.NoError(t, err)
		return len(info.Holders)
	}
	// refused checks the conflict, which names the limit it applied when a
	// holder's smaller one did (lowered).
	refused := func(l Locker, opt *AcquireOptions, n, lowered int) {
		t.Helper()
		_, err := l.TryAcquire(ctx, "k", opt)
		var ce *ConflictError
		require.ErrorAs(t, err, &ce, "limit %d with %d holders", opt.Limit, n)
		require.Equal(t, n, ce.Holders)
		require.Equal(t, lowered, ce.Limit)
		if lowered > 0 {
			require.ErrorContains(t, err, fmt.Sprintf("at a holder's limit of %d", lowered))
		} else {
			require.NotContains(t, err.Error(), "a holder's limit")
		}
	}

	// The 1-server holds: the 3-server is refused.
	lb, err := b.TryAcquire(ctx, "k", one)
	require.NoError(t, err)
	refused(a, three, 1, 1)
	// It waits, and gets the key when the 1-server's holder leaves; then
	// the 3-server fills its three slots and the 1-server waits.
	got := make(chan *Lease, 1)
	wait := func(l Locker, opt *AcquireOptions) {
		go func() {
			lease, err := l.Acquire(ctx, "k", opt)
			if err != nil {
				t.Error(err)
			}
			got <- lease
		}()
		waitWaiters(t, a, "k", 1)
	}
	wait(a, three)
	require.NoError(t, lb.Release(ctx))
	la := []*Lease{<-got}
	require.NotNil(t, la[0])
	for range 2 {
		l, err := a.TryAcquire(ctx, "k", three)
		require.NoError(t, err)
		la = append(la, l)
	}
	refused(b, one, 3, 0)
	wait(b, one)
	for _, l := range la {
		require.LessOrEqual(t, holders(), 3)
		require.NoError(t, l.Release(ctx))
	}
	lb = <-got
	require.NotNil(t, lb)
	require.Equal(t, 1, holders())
	refused(a, three, 1, 1)
	require.NoError(t, lb.Release(ctx))

	// 3 and 2: a 2-holder keeps the key at two holders, whoever comes.
	l3, err := a.TryAcquire(ctx, "k", three)
	require.NoError(t, err)
	l2, err := b.TryAcquire(ctx, "k", two)
	require.NoError(t, err)
	refused(a, three, 2, 2)
	refused(b, two, 2, 0)
	require.NoError(t, l3.Release(ctx))
	l3, err = a.TryAcquire(ctx, "k", three)
	require.NoError(t, err)
	refused(a, three, 2, 2)
	// Once the 2-holder leaves, the 3-server has its three slots again.
	require.NoError(t, l2.Release(ctx))
	more := []*Lease{l3}
	for range 2 {
		l, err := a.TryAcquire(ctx, "k", three)
		require.NoError(t, err)
		more = append(more, l)
	}
	refused(a, three, 3, 0)
	refused(b, two, 3, 0)
	for _, l := range more {
		require.NoError(t, l.Release(ctx))
	}
}

// waitWaiters blocks until key has n live waiters.
func waitWaiters(t *testing.T, l Locker, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := l.Inspect(context.Background(), key)
		return err == nil && info.Waiters == n
	}, 10*time.Second, 2*time.Millisecond)
}

func testFair(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	la, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	const n = 5
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		// A waiter that misses 4 polls counts as dead: keep the poll far above
		// scheduling delays on a loaded machine.
		w := h.locker(t, WithPollInterval(100*time.Millisecond))
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := w.Acquire(ctx, "k", &AcquireOptions{Fair: true})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			_ = l.Release(ctx)
		}()
		waitWaiters(t, a, "k", i+1) // i is queued before i+1 arrives
	}
	require.NoError(t, la.Release(ctx))
	wg.Wait()
	require.Equal(t, []int{0, 1, 2, 3, 4}, order)
}

func testDeadWaiter(t *testing.T, h *harness) {
	ctx := ctxT(t)
	poll := 50 * time.Millisecond
	a := h.locker(t)
	la, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	// A fair waiter that queued once and then died: it never polls or leaves.
	dead := engineOf(h.locker(t, WithPollInterval(poll)))
	r, err := dead.cfg.request("k", &AcquireOptions{Fair: true})
	require.NoError(t, err)
	r.waiter = "dead-waiter"
	res, err := dead.b.acquire(ctx, &r)
	require.NoError(t, err)
	require.False(t, res.ok)
	waitWaiters(t, a, "k", 1)

	live := h.locker(t, WithPollInterval(poll))
	got := make(chan error, 1)
	go func() {
		l, err := live.Acquire(ctx, "k", &AcquireOptions{Fair: true})
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	require.NoError(t, la.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a dead fair waiter blocked the queue")
	}
}

func engineOf(l Locker) *engine { return l.(*RedisLocker).e }

func testEpoch(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	b := h.locker(t)
	l, err := a.TryAcquire(ctx, "tick", &AcquireOptions{Epoch: 100, EpochTTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	// A replica that fires the same tick late finds it claimed.
	_, err = b.TryAcquire(ctx, "tick", &AcquireOptions{Epoch: 100})
	require.ErrorIs(t, err, ErrEpochUsed)
	_, err = b.Acquire(ctx, "tick", &AcquireOptions{Epoch: 99})
	require.ErrorIs(t, err, ErrEpochUsed)
	l, err = b.TryAcquire(ctx, "tick", &AcquireOptions{Epoch: 101})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
}

// An acquire whose EpochTag is not the last claim's is told that claim's
// tag: on its lease when it claims the next epoch, in the EpochUsedError
// when the epoch was used. An untagged claim or acquire tells nothing.
func testEpochTag(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a, b := h.locker(t), h.locker(t)
	claim := func(l Locker, epoch int64, tag string) (string, error) {
		lease, err := l.TryAcquire(ctx, "tick", &AcquireOptions{Epoch: epoch, EpochTag: tag, EpochTTL: time.Minute})
		if err != nil {
			return "", err
		}
		require.NoError(t, lease.Release(ctx))
		return lease.OtherEpochTag(), nil
	}
	other, err := claim(a, 100, "spec-a")
	require.NoError(t, err)
	require.Empty(t, other, "the first claim")
	other, err = claim(b, 200, "spec-b")
	require.NoError(t, err)
	require.Equal(t, "spec-a", other)
	other, err = claim(b, 300, "spec-b")
	require.NoError(t, err)
	require.Empty(t, other, "its own tag")
	_, err = claim(a, 300, "spec-a")
	var used *EpochUsedError
	require.ErrorAs(t, err, &used)
	require.ErrorIs(t, err, ErrEpochUsed)
	require.Equal(t, EpochUsedError{Key: "tick", Epoch: 300, Last: 300, OtherTag: "spec-b"}, *used)
	_, err = claim(a, 300, "spec-b")
	require.ErrorAs(t, err, &used)
	require.Empty(t, used.OtherTag, "the same tag")
	_, err = claim(a, 300, "")
	require.ErrorAs(t, err, &used)
	require.Empty(t, used.OtherTag, "an untagged acquire")
	other, err = claim(a, 400, "")
	require.NoError(t, err)
	require.Empty(t, other)
	other, err = claim(b, 500, "spec-b")
	require.NoError(t, err)
	require.Empty(t, other, "an untagged claim")

	_, err = a.TryAcquire(ctx, "tick", &AcquireOptions{EpochTag: "spec-a"})
	require.ErrorIs(t, err, ErrInvalid, "a tag needs an epoch")
	_, err = a.TryAcquire(ctx, "tick", &AcquireOptions{Epoch: 600, EpochTag: strings.Repeat("x", MaxEpochTag+1)})
	require.ErrorIs(t, err, ErrInvalid)
}

func testInspect(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t, WithOwner("ins-a"))
	b := h.locker(t, WithOwner("ins-b"))
	info, err := a.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders)
	la, err := a.TryAcquire(ctx, "k", &AcquireOptions{Limit: 2, TTL: time.Minute})
	require.NoError(t, err)
	lb, err := b.TryAcquire(ctx, "k", &AcquireOptions{Limit: 2, TTL: 2 * time.Minute})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = h.locker(t).Acquire(wctx, "k", &AcquireOptions{Limit: 2}) }()
	waitWaiters(t, a, "k", 1)
	info, err = b.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "k", info.Key)
	require.Len(t, info.Holders, 2)
	require.Equal(t, Holder{Owner: "ins-a", Token: la.Token(), TTL: info.Holders[0].TTL}, info.Holders[0])
	require.Equal(t, "ins-b", info.Holders[1].Owner)
	require.Equal(t, lb.Token(), info.Holders[1].Token)
	require.Greater(t, info.Holders[1].TTL, info.Holders[0].TTL)
	cancel()
	waitWaiters(t, a, "k", 0) // a waiter that gives up leaves at once

	// A reservation is told from a run: acquired Reserve, or turned into
	// one by Detach; in the plain form and the sorted one.
	res, err := a.TryAcquire(ctx, "r1", &AcquireOptions{Label: "job", Reserve: true, TTL: time.Minute})
	require.NoError(t, err)
	run, err := a.TryAcquire(ctx, "r2", &AcquireOptions{Label: "job", Limit: 2})
	require.NoError(t, err)
	for key, want := range map[string]bool{"r1": true, "r2": false, "k": false} {
		info, err := b.Inspect(ctx, key)
		require.NoError(t, err)
		require.NotEmpty(t, info.Holders)
		require.Equal(t, want, info.Holders[0].Reserved, key)
	}
	require.NoError(t, run.Reserve(ctx, time.Minute))
	info, err = b.Inspect(ctx, "r2")
	require.NoError(t, err)
	require.True(t, info.Holders[0].Reserved, "a detached run is a reservation")
	require.NoError(t, res.Release(ctx))
	_, err = a.Inspect(ctx, "")
	require.ErrorIs(t, err, ErrInvalid)
}

func testClose(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	var leases []*Lease
	for i := range 3 {
		l, err := a.TryAcquire(ctx, fmt.Sprint("k", i), nil)
		require.NoError(t, err)
		leases = append(leases, l)
	}
	wctx, wcancel := leases[0].Context(ctx)
	defer wcancel()
	require.NoError(t, a.Close(ctx))
	require.ErrorIs(t, context.Cause(wctx), ErrClosed)
	require.ErrorIs(t, context.Cause(wctx), ErrLost)
	b := h.locker(t)
	for i := range 3 {
		l, err := b.TryAcquire(ctx, fmt.Sprint("k", i), nil)
		require.NoError(t, err, "key %d is free after Close", i)
		require.NoError(t, l.Release(ctx))
	}
	_, err := a.TryAcquire(ctx, "k9", nil)
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, a.Close(ctx), "Close twice")
}

func testAcquireCtx(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	la, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = h.locker(t).Acquire(wctx, "k", nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, ErrNotAcquired)
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, la.Owner(), ce.Owner)
	require.NoError(t, la.Release(ctx))
}

func testRunPanic(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	require.PanicsWithValue(t, "boom", func() {
		_ = Do(ctx, a, "k", nil, func(context.Context) error { panic("boom") })
	})
	var ran atomic.Bool
	err := Do(ctx, h.locker(t), "k", nil, func(context.Context) error {
		ran.Store(true)
		return errors.New("work failed")
	})
	require.EqualError(t, err, "work failed")
	require.True(t, ran.Load(), "the lock was released after the panic")
	info, err := a.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Empty(t, info.Holders)
}

func testValidation(t *testing.T, h *harness) {
	ctx := ctxT(t)
	l := h.locker(t)
	cases := []struct {
		name string
		key  string
		opt  *AcquireOptions
		want string
	}{
		{"empty key", "", nil, "key is empty"},
		{"negative TTL", "k", &AcquireOptions{TTL: -time.Second}, "TTL -1s is shorter than MinTTL"},
		{"TTL too short to renew", "k", &AcquireOptions{TTL: 10 * time.Millisecond}, "TTL 10ms is shorter than MinTTL"},
		{"renew interval equals TTL", "k", &AcquireOptions{TTL: time.Second, RenewInterval: time.Second}, "RenewInterval 1s must be positive and shorter than TTL 1s"},
		{"negative renew interval", "k", &AcquireOptions{RenewInterval: -time.Second}, "RenewInterval -1s must be positive"},
		{"limit below one", "k", &AcquireOptions{Limit: -1}, "Limit -1 must be between 1 and MaxLimit (10000)"},
		{"limit above MaxLimit", "k", &AcquireOptions{Limit: MaxLimit + 1}, "Limit 10001 must be between 1 and MaxLimit"},
		{"negative epoch", "k", &AcquireOptions{Epoch: -1}, "Epoch -1 must not be negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := l.TryAcquire(ctx, c.key, c.opt)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, c.want)
			_, err = l.Acquire(ctx, c.key, c.opt)
			require.ErrorIs(t, err, ErrInvalid)
		})
	}
}

func testKeys(t *testing.T, h *harness) {
	ctx := ctxT(t)
	l := h.locker(t)
	var leases []*Lease
	for _, k := range []string{"tenant:1", "tenant:2", "report", "tenant:3", "a/b/c", "x[1]", "T*"} {
		lease, err := l.TryAcquire(ctx, k, nil)
		require.NoError(t, err)
		leases = append(leases, lease)
	}
	require.NoError(t, leases[3].Release(ctx))
	// One glob syntax (Redis') on every backend.
	for pattern, want := range map[string][]string{
		"tenant:*":     {"tenant:1", "tenant:2"},
		"*":            {"T*", "a/b/c", "report", "tenant:1", "tenant:2", "x[1]"},
		"tenant:[12]":  {"tenant:1", "tenant:2"},
		"tenant:[^1]":  {"tenant:2"},
		"tenant:[0-1]": {"tenant:1"},
		"a*c":          {"a/b/c"},
		"?eport":       {"report"},
		"x\\[1]":       {"x[1]"},
		"T\\*":         {"T*"},
		"nothing*":     nil,
	} {
		keys, err := l.Keys(ctx, pattern)
		require.NoError(t, err)
		require.Equal(t, want, keys, "pattern %q", pattern)
	}
}

// A run that outlasts its TTL (kept alive by renewal) must not let its epoch
// be forgotten: a late replica of the same tick would run it again.
func testEpochLongRun(t *testing.T, h *harness) {
	ctx := ctxT(t)
	renewed := make(chan struct{}, 100)
	a := h.locker(t, WithObserver(func(e Event) {
		if e.Kind == LeaseRenewed {
			renewed <- struct{}{}
		}
	}))
	// Four renewals, one every ttl/3: the run outlasts its TTL. A TTL of a
	// second leaves a loaded machine 2/3 s of slack per renewal; a lease
	// lost all the same fails the test instead of leaving it waiting.
	ttl := time.Second
	l, err := a.TryAcquire(ctx, "tick", &AcquireOptions{TTL: ttl, Epoch: 5})
	require.NoError(t, err)
	start := time.Now()
	for range 4 {
		select {
		case <-renewed:
		case <-l.Lost():
			t.Fatalf("the lease was lost: %v", l.Err())
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	require.Greater(t, time.Since(start), ttl, "the run outlasted its TTL")
	require.NoError(t, l.Release(ctx))
	_, err = h.locker(t).TryAcquire(ctx, "tick", &AcquireOptions{TTL: ttl, Epoch: 5})
	require.ErrorIs(t, err, ErrEpochUsed)
}

// A key whose only holder expired is not listed, even when a released
// holder with a longer TTL made its record outlive it.
func testKeysLive(t *testing.T, h *harness) {
	ctx := ctxT(t)
	short, kill := h.killable(t)
	long := h.locker(t)
	opt := &AcquireOptions{Limit: 2, TTL: 200 * time.Millisecond}
	_, err := short.TryAcquire(ctx, "k", opt)
	require.NoError(t, err)
	ll, err := long.TryAcquire(ctx, "k", &AcquireOptions{Limit: 2, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, ll.Release(ctx))
	kill() // the short holder's process dies: nobody releases it
	keys, err := long.Keys(ctx, "*")
	require.NoError(t, err)
	require.Equal(t, []string{"k"}, keys)
	require.Eventually(t, func() bool {
		keys, err := long.Keys(ctx, "*")
		require.NoError(t, err)
		return len(keys) == 0
	}, 5*time.Second, 10*time.Millisecond)
}

// Braces and percent signs in keys and prefixes are plain characters: every
// key is its own lock, on Redis Cluster too.
func testBraces(t *testing.T, h *harness) {
	ctx := ctxT(t)
	keys := []string{"}job", "{a}", "a{}b", "{", "}", "%7B", "{}", "x%y"}
	for _, prefix := range []string{"", "app{}:", "}{:"} {
		var opts []Option
		if prefix != "" {
			opts = append(opts, WithPrefix(h.prefix+prefix))
		}
		a := h.locker(t, opts...)
		b := h.locker(t, opts...)
		var leases []*Lease
		for _, k := range keys {
			l, err := a.TryAcquire(ctx, k, &AcquireOptions{TTL: 5 * time.Second})
			require.NoError(t, err, "prefix %q key %q", prefix, k)
			leases = append(leases, l)
			_, err = b.TryAcquire(ctx, k, nil)
			require.ErrorIs(t, err, ErrNotAcquired, "prefix %q key %q", prefix, k)
			info, err := b.Inspect(ctx, k)
			require.NoError(t, err)
			require.Len(t, info.Holders, 1)
			require.Equal(t, l.Token(), info.Holders[0].Token)
		}
		got, err := a.Keys(ctx, "*")
		require.NoError(t, err)
		require.ElementsMatch(t, keys, got, "prefix %q", prefix)
		got, err = a.Keys(ctx, "?a?")
		require.NoError(t, err)
		require.Equal(t, []string{"{a}"}, got, "'?' matches one byte of the key, whatever it is stored as (prefix %q)", prefix)
		for _, l := range leases {
			require.NoError(t, l.Release(ctx))
			lb, err := b.TryAcquire(ctx, l.Key(), nil)
			require.NoError(t, err)
			require.NoError(t, lb.Release(ctx))
		}
	}
}

// An epoch is forgotten EpochTTL after its claim once no lease that claimed
// it lives, whatever other leases of the key do.
func testEpochForgotten(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	ttl := 200 * time.Millisecond
	var other *Lease
	key := ""
	// On a busy machine the steps before the check can outlast EpochTTL,
	// which forgets the epoch as it should: such a try is made again, on a
	// key of its own.
	for try := 0; key == ""; try++ {
		k := fmt.Sprint("tick-", try)
		claimed := time.Now()
		l, err := a.TryAcquire(ctx, k, &AcquireOptions{Limit: 2, TTL: ttl, Epoch: 5, EpochTTL: ttl})
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		// A lease without an epoch, renewed and extended meanwhile.
		other, err = h.locker(t).TryAcquire(ctx, k, &AcquireOptions{Limit: 2, TTL: 2 * time.Second})
		require.NoError(t, err)
		require.NoError(t, other.Extend(ctx, 3*time.Second))
		again, err := a.TryAcquire(ctx, k, &AcquireOptions{Limit: 2, Epoch: 5})
		if err == nil && time.Since(claimed) >= ttl && try < 5 {
			require.NoError(t, again.Release(ctx))
			require.NoError(t, other.Release(ctx))
			continue
		}
		require.ErrorIs(t, err, ErrEpochUsed)
		key = k
	}
	require.Eventually(t, func() bool {
		l, err := a.TryAcquire(ctx, key, &AcquireOptions{Limit: 2, TTL: ttl, Epoch: 5})
		if errors.Is(err, ErrEpochUsed) {
			return false
		}
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		return true
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, other.Release(ctx))
}

// Two live holders of a key never share a label, whatever the limit.
func testLabels(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t, WithOwner("lab-a"))
	b := h.locker(t, WithOwner("lab-b"))
	opt := &AcquireOptions{Limit: 3, Label: "task:1 {x}%"}
	la, err := a.TryAcquire(ctx, "k", opt)
	require.NoError(t, err)
	lo, err := b.TryAcquire(ctx, "k", &AcquireOptions{Limit: 3, Label: "task:2"})
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "k", opt)
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "lab-a", ce.Owner)
	require.Equal(t, opt.Label, ce.Label)
	require.Equal(t, la.Token(), ce.Token)
	info, err := b.Inspect(ctx, "k")
	require.NoError(t, err)
	labels := []string{info.Holders[0].Label, info.Holders[1].Label}
	require.ElementsMatch(t, []string{"task:1 {x}%", "task:2"}, labels)
	require.NoError(t, la.Release(ctx))
	lb, err := b.TryAcquire(ctx, "k", opt)
	require.NoError(t, err)
	require.NoError(t, lb.Release(ctx))
	require.NoError(t, lo.Release(ctx))
}

// A label recorded by Complete refuses later acquires of it, for keep.
func testComplete(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	l, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	require.ErrorIs(t, l.Complete(ctx, time.Second), ErrInvalid, "no label")
	require.NoError(t, l.Release(ctx))
	l, err = a.TryAcquire(ctx, "k", &AcquireOptions{Label: "t1"})
	require.NoError(t, err)
	require.ErrorIs(t, l.Complete(ctx, 0), ErrInvalid)
	require.NoError(t, l.Complete(ctx, 300*time.Millisecond))
	_, err = h.locker(t).TryAcquire(ctx, "k", &AcquireOptions{Label: "t1"})
	require.ErrorIs(t, err, ErrCompleted)
	_, err = h.locker(t).Acquire(ctx, "k", &AcquireOptions{Label: "t1"})
	require.ErrorIs(t, err, ErrCompleted)
	other, err := a.TryAcquire(ctx, "k", &AcquireOptions{Label: "t2"})
	require.NoError(t, err, "other labels are not affected")
	require.NoError(t, other.Release(ctx))
	require.Eventually(t, func() bool {
		l, err := a.TryAcquire(ctx, "k", &AcquireOptions{Label: "t1"})
		if errors.Is(err, ErrCompleted) {
			return false
		}
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
		return true
	}, 5*time.Second, 10*time.Millisecond)
}

// Lease.Run ends a labeled lease whose work succeeded after its caller's ctx
// ended with Complete, and every other lease with Release.
func testRunCompletes(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t)
	run := func(key, label string, work func(ctx context.Context, cancel context.CancelFunc) error) {
		l, err := a.TryAcquire(ctx, key, &AcquireOptions{Label: label})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		func() {
			defer func() { _ = recover() }()
			_ = l.Run(rctx, func(context.Context) error { return work(rctx, cancel) })
		}()
	}
	givenUp := func(_ context.Context, cancel context.CancelFunc) error { cancel(); return nil }
	failed := func(_ context.Context, cancel context.CancelFunc) error { cancel(); return errors.New("boom") }
	panicked := func(_ context.Context, cancel context.CancelFunc) error { cancel(); panic("boom") }
	inTime := func(context.Context, context.CancelFunc) error { return nil }

	run("done", "t1", givenUp)
	_, err := h.locker(t).TryAcquire(ctx, "done", &AcquireOptions{Label: "t1"})
	require.ErrorIs(t, err, ErrCompleted, "succeeded after the caller gave up: recorded")

	for name, work := range map[string]func(context.Context, context.CancelFunc) error{"failed": failed, "panicked": panicked, "in time": inTime} {
		run(name, "t1", work)
		l, err := h.locker(t).TryAcquire(ctx, name, &AcquireOptions{Label: "t1"})
		require.NoError(t, err, "%s: released, not recorded", name)
		require.NoError(t, l.Release(ctx))
	}
	run("unlabeled", "", givenUp)
	l, err := h.locker(t).TryAcquire(ctx, "unlabeled", nil)
	require.NoError(t, err, "a lease without a label is released")
	require.NoError(t, l.Release(ctx))
}

// A Coalesce acquire gives way to a run that began after it: one that
// succeeded, one that holds the key, or a follow-up that waits for it.
func testCoalesce(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a, b := h.locker(t), h.locker(t)
	co := &AcquireOptions{FollowUp: Coalesce{}}

	first, err := a.TryAcquire(ctx, "k", co)
	require.NoError(t, err, "a free key is taken")

	// The key is held by a run that began before: no coverage, a conflict.
	_, err = b.TryAcquire(ctx, "k", co)
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NotErrorIs(t, err, ErrCovered)

	// A waiting Coalesce acquire is the follow-up; later ones fold into it.
	type res struct {
		l   *Lease
		err error
	}
	follow := make(chan res, 1)
	go func() {
		l, err := b.Acquire(ctx, "k", co)
		follow <- res{l, err}
	}()
	require.Eventually(t, func() bool {
		info, err := a.Inspect(ctx, "k")
		require.NoError(t, err)
		return info.Waiters == 1
	}, 5*time.Second, time.Millisecond)
	_, err = a.TryAcquire(ctx, "k", co)
	var ce *CoveredError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, CoveredByFollowUp, ce.By)
	_, err = a.Acquire(ctx, "k", co)
	require.ErrorAs(t, err, &ce, "a waiting acquire folds too")
	require.Equal(t, CoveredByFollowUp, ce.By)
	_, err = a.TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, ErrNotAcquired, "an acquire without Coalesce is not covered")
	require.NotErrorIs(t, err, ErrCovered)

	// The first run succeeds: the follow-up runs anyway (it began later).
	require.NoError(t, first.Succeed(ctx))
	r := <-follow
	require.NoError(t, r.err)
	second := r.l
	require.Greater(t, second.Token(), first.Token())

	// A call that began before the follow-up took the key is covered by it
	// while it runs, and by its success after.
	e := engineOf(a)
	early, err := e.cfg.request("k", co)
	require.NoError(t, err)
	early.since = second.Token() - 1
	got, err := e.b.acquire(ctx, &early)
	require.NoError(t, err)
	require.NotNil(t, got.covered)
	require.Equal(t, CoveredByRun, got.covered.By)
	require.Equal(t, second.Token(), got.covered.Token)
	require.NotEmpty(t, got.covered.Owner)
	require.NoError(t, second.Run(ctx, func(context.Context) error { return nil }), "Run records the success")
	early.aid = randomID(8)
	got, err = e.b.acquire(ctx, &early)
	require.NoError(t, err)
	require.NotNil(t, got.covered)
	require.Equal(t, CoveredBySuccess, got.covered.By)
	require.Equal(t, second.Token(), got.covered.Token)

	// A call that began after that success is not covered: it runs.
	third, err := a.TryAcquire(ctx, "k", co)
	require.NoError(t, err)
	// A failed run records nothing.
	require.Error(t, third.Run(ctx, func(context.Context) error { return errors.New("boom") }))
	early.since = third.Token() - 1
	early.aid = randomID(8)
	got, err = e.b.acquire(ctx, &early)
	require.NoError(t, err)
	require.True(t, got.ok, "a failed run covers nothing")
	_, err = e.b.release(ctx, []*Lease{{e: e, key: "k", aid: early.aid}}, nil)
	require.NoError(t, err)

	// Since: work asked for before a run began is covered by it; a Since
	// in the future means the call's first attempt.
	held, err := a.TryAcquire(ctx, "s", co)
	require.NoError(t, err)
	asked := &AcquireOptions{FollowUp: Coalesce{Since: time.UnixMicro(held.Token() - 1)}}
	_, err = b.TryAcquire(ctx, "s", asked)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, CoveredByRun, ce.By)
	require.NoError(t, held.Succeed(ctx))
	_, err = b.TryAcquire(ctx, "s", asked)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, CoveredBySuccess, ce.By)
	late, err := b.TryAcquire(ctx, "s", &AcquireOptions{FollowUp: Coalesce{Since: time.Now().Add(time.Hour)}})
	require.NoError(t, err, "a future Since counts from the call")
	require.NoError(t, late.Release(ctx))

	// A waiter without Coalesce may give up unrun: it covers nothing.
	blocker, err := a.TryAcquire(ctx, "w", nil)
	require.NoError(t, err)
	plainCtx, stopPlain := context.WithCancel(ctx)
	plainDone := make(chan struct{})
	go func() {
		defer close(plainDone)
		_, _ = b.Acquire(plainCtx, "w", nil)
	}()
	require.Eventually(t, func() bool {
		info, err := a.Inspect(ctx, "w")
		require.NoError(t, err)
		return info.Waiters == 1
	}, 5*time.Second, time.Millisecond)
	_, err = a.TryAcquire(ctx, "w", co)
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NotErrorIs(t, err, ErrCovered, "a plain waiter is no follow-up to fold into")
	stopPlain()
	<-plainDone
	require.NoError(t, blocker.Release(ctx))

	// Bad options.
	_, err = a.TryAcquire(ctx, "k", &AcquireOptions{FollowUp: Coalesce{Since: time.Unix(-1, 0)}})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = a.TryAcquire(ctx, "k", &AcquireOptions{FollowUp: Coalesce{}, Limit: 2})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = a.TryAcquire(ctx, "k", &AcquireOptions{FollowUp: Coalesce{CoverFor: -time.Second}})
	require.ErrorIs(t, err, ErrInvalid)
}

// A reservation is not renewed and survives its
// Locker's Close; any Locker frees it by its label.
func testReservation(t *testing.T, h *harness) {
	ctx := ctxT(t)
	client := h.locker(t, WithOwner("client"))
	worker := h.locker(t, WithOwner("worker"))
	res, err := client.TryAcquire(ctx, "u", &AcquireOptions{Label: "q/t1", Reserve: true, TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, client.Close(ctx))
	info, err := worker.Inspect(ctx, "u")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1, "Close leaves a reservation")
	require.Equal(t, "q/t1", info.Holders[0].Label)

	_, err = worker.TryAcquire(ctx, "u", &AcquireOptions{Label: "q/t2", Reserve: true})
	require.ErrorIs(t, err, ErrNotAcquired, "a reserved key refuses another reservation")
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "q/t1", ce.Label)

	n, err := worker.ForceRelease(ctx, "u", Select{Label: "q/other"})
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = worker.ForceRelease(ctx, "u", Select{Label: "q/t1"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	next, err := worker.TryAcquire(ctx, "u", &AcquireOptions{Label: "q/t2", Reserve: true, TTL: 200 * time.Millisecond})
	require.NoError(t, err)
	require.ErrorIs(t, res.Release(ctx), ErrNotHeld, "the freed reservation is gone")

	// Not renewed: it ends with its TTL.
	require.Eventually(t, func() bool {
		info, err := worker.Inspect(ctx, "u")
		require.NoError(t, err)
		return len(info.Holders) == 0
	}, 5*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, next.Release(ctx), ErrNotHeld)

	_, err = worker.ForceRelease(ctx, "u", Select{Label: "q/t1", Owner: "worker"})
	require.ErrorIs(t, err, ErrInvalid, "one selector at a time")

	// TakeReservation: a run takes the reservation over and renews it; Detach gives
	// it back as a reservation.
	other := h.locker(t, WithOwner("other"))
	_, err = other.TryAcquire(ctx, "v", &AcquireOptions{Label: "q/t3", Reserve: true, TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	_, err = worker.TryAcquire(ctx, "v", &AcquireOptions{Label: "q/t4", TakeReservation: true})
	require.ErrorIs(t, err, ErrNotAcquired, "another label's reservation is not adopted")
	run, err := worker.TryAcquire(ctx, "v", &AcquireOptions{Label: "q/t3", TakeReservation: true, TTL: 10 * time.Second})
	require.NoError(t, err)
	info, err = worker.Inspect(ctx, "v")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "worker", info.Holders[0].Owner)
	require.Greater(t, info.Holders[0].TTL, 5*time.Second, "the run's lease, not the reservation")
	_, err = other.TryAcquire(ctx, "v", &AcquireOptions{Label: "q/t3", TakeReservation: true})
	require.ErrorIs(t, err, ErrNotAcquired, "a running lease is not a reservation")

	require.NoError(t, run.Reserve(ctx, time.Second))
	info, err = worker.Inspect(ctx, "v")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "q/t3", info.Holders[0].Label)
	require.LessOrEqual(t, info.Holders[0].TTL, time.Second)
	require.ErrorIs(t, run.Release(ctx), ErrNotHeld, "a detached lease is no longer this run's")
	again, err := other.TryAcquire(ctx, "v", &AcquireOptions{Label: "q/t3", TakeReservation: true})
	require.NoError(t, err, "a detached lease is a reservation again")
	require.NoError(t, again.Release(ctx))

	_, err = worker.TryAcquire(ctx, "v", &AcquireOptions{TakeReservation: true})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorIs(t, again.Reserve(ctx, time.Second), ErrNotHeld)
}

// A lease acquired with HoldAtLeast keeps its key that long after it was
// acquired, however soon it is released; a release after that frees it.
func testHoldAtLeast(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a, b := h.locker(t), h.locker(t)
	const hold = 400 * time.Millisecond
	start := time.Now()
	l, err := a.TryAcquire(ctx, "k", &AcquireOptions{HoldAtLeast: hold})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	_, err = b.TryAcquire(ctx, "k", nil)
	var ce *ConflictError
	require.ErrorAs(t, err, &ce, "held after its release")
	require.LessOrEqual(t, ce.TTL, hold)
	// A waiter gets the key when the hold ends (no release wakes it).
	got, err := b.Acquire(ctx, "k", nil)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), hold-10*time.Millisecond)
	require.NoError(t, got.Release(ctx))

	// Released after the hold: freed at once.
	l, err = a.TryAcquire(ctx, "late", &AcquireOptions{HoldAtLeast: 100 * time.Millisecond})
	require.NoError(t, err)
	time.Sleep(150 * time.Millisecond) // the run outlasts the hold
	require.NoError(t, l.Release(ctx))
	free, err := b.TryAcquire(ctx, "late", nil)
	require.NoError(t, err)
	require.NoError(t, free.Release(ctx))

	// A run that fails holds nothing back; one that succeeds is held.
	for _, async := range []bool{false, true} {
		opt := &AcquireOptions{HoldAtLeast: time.Minute, AsyncRelease: async}
		l, err = a.TryAcquire(ctx, "failed", opt)
		require.NoError(t, err)
		require.Error(t, l.Run(ctx, func(context.Context) error { return errors.New("boom") }))
		free, err = a.Acquire(ctx, "failed", nil) // waits for an async release
		require.NoError(t, err, "free at once after a failed run (async %v)", async)
		require.NoError(t, free.Release(ctx))
	}
	l, err = a.TryAcquire(ctx, "succeeded", &AcquireOptions{HoldAtLeast: time.Minute})
	require.NoError(t, err)
	require.NoError(t, l.Run(ctx, func(context.Context) error { return nil }))
	_, err = b.TryAcquire(ctx, "succeeded", nil)
	require.ErrorIs(t, err, ErrNotAcquired, "held after a run that succeeded")

	_, err = a.TryAcquire(ctx, "k", &AcquireOptions{HoldAtLeast: -time.Second})
	require.ErrorIs(t, err, ErrInvalid)
}

// KeepNewest: while the key is held, the newest waiting follow-up stays; the
// one it replaces gives up at once.
func testSupersede(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a, b := h.locker(t), h.locker(t)
	holder, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	sup := &AcquireOptions{FollowUp: KeepNewest{}}
	type res struct {
		l   *Lease
		err error
	}
	waitFor := func(l Locker) <-chan res {
		ch := make(chan res, 1)
		go func() {
			lease, err := l.Acquire(ctx, "k", sup)
			ch <- res{lease, err}
		}()
		return ch
	}
	waiters := func(n int) {
		require.Eventually(t, func() bool {
			info, err := a.Inspect(ctx, "k")
			require.NoError(t, err)
			return info.Waiters == n
		}, 5*time.Second, time.Millisecond)
	}
	older := waitFor(a)
	waiters(1)
	newer := waitFor(b)
	start := time.Now()
	r := <-older
	require.ErrorIs(t, r.err, ErrSuperseded)
	require.Less(t, time.Since(start), time.Second, "woken, not polled")
	waiters(1)
	require.NoError(t, holder.Release(ctx))
	r = <-newer
	require.NoError(t, r.err, "the newest follow-up runs")
	require.NoError(t, r.l.Release(ctx))

	// Later, a single follow-up is no one's replacement.
	holder, err = a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	only := waitFor(b)
	waiters(1)
	require.NoError(t, holder.Release(ctx))
	r = <-only
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))
}

// Preempt: a newer acquire cancels the holder's work at once (pub/sub, not
// a renewal: the TTL is 30s), gets the key when the holder returns, with a
// higher token; a holder that ignores it loses the key after the grace.
func testPreempt(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a, b := h.locker(t), h.locker(t)
	pre := &AcquireOptions{FollowUp: Preempt{}, TTL: 30 * time.Second}
	old, err := a.TryAcquire(ctx, "k", pre)
	require.NoError(t, err)
	work, cancel := old.Context(ctx)
	defer cancel()
	type res struct {
		l   *Lease
		err error
	}
	acquire := func(l Locker, opt *AcquireOptions) <-chan res {
		ch := make(chan res, 1)
		go func() {
			lease, err := l.Acquire(ctx, "k", opt)
			ch <- res{lease, err}
		}()
		return ch
	}
	start := time.Now()
	newer := acquire(b, pre)
	select {
	case <-work.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the preempted holder's work was not cancelled")
	}
	require.Less(t, time.Since(start), 2*time.Second, "told through the channel, not at a renewal (every 10s)")
	require.ErrorIs(t, context.Cause(work), ErrPreempted)
	require.ErrorIs(t, context.Cause(work), ErrLost)
	require.ErrorIs(t, old.Err(), ErrPreempted)
	select {
	case r := <-newer:
		t.Fatalf("the newer acquire got the key while the preempted run still held it: %v", r.err)
	case <-time.After(50 * time.Millisecond):
	}
	require.ErrorIs(t, old.Release(ctx), ErrNotHeld, "a preempted lease is lost")
	r := <-newer
	require.NoError(t, r.err)
	require.Greater(t, r.l.Token(), old.Token(), "the preempted token is superseded")

	// A holder that did not ask for Preempt learns it at its next renewal.
	plain := &AcquireOptions{TTL: 600 * time.Millisecond}
	require.NoError(t, r.l.Release(ctx))
	slow, err := a.TryAcquire(ctx, "k", plain)
	require.NoError(t, err)
	newer = acquire(b, pre)
	select {
	case <-slow.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a preempted holder went on renewing")
	}
	require.ErrorIs(t, slow.Err(), ErrPreempted)
	require.ErrorIs(t, slow.Release(ctx), ErrNotHeld)
	r = <-newer
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))

	// A holder that missed the notice (it did not listen, or its pub/sub
	// connection was down) and renews only after a short grace ended its
	// lease still learns that it was preempted, not that it expired.
	deaf, err := a.TryAcquire(ctx, "k", &AcquireOptions{TTL: 900 * time.Millisecond})
	require.NoError(t, err)
	r = <-acquire(b, &AcquireOptions{FollowUp: Preempt{Grace: 50 * time.Millisecond}})
	require.NoError(t, r.err, "the grace ended the old lease")
	select {
	case <-deaf.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the preempted holder was not told at its renewal")
	}
	require.ErrorIs(t, deaf.Err(), ErrPreempted)
	require.NoError(t, r.l.Release(ctx))

	// A run that never returns keeps the key for the grace only.
	stuck, err := a.TryAcquire(ctx, "k", pre)
	require.NoError(t, err)
	start = time.Now()
	r = <-acquire(b, &AcquireOptions{FollowUp: Preempt{Grace: 300 * time.Millisecond}})
	require.NoError(t, r.err)
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Greater(t, r.l.Token(), stuck.Token())
	require.ErrorIs(t, stuck.Err(), ErrPreempted)
	info, err := a.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, r.l.Token(), info.Holders[0].Token)
	require.NoError(t, r.l.Release(ctx))

	// A free key is simply taken.
	r = <-acquire(a, pre)
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))
	for _, bad := range []*AcquireOptions{
		{FollowUp: Preempt{}, Limit: 2},
		{FollowUp: Preempt{}, Fair: true},
		{FollowUp: Preempt{Grace: -time.Second}},
	} {
		_, err := a.Acquire(ctx, "k", bad)
		require.ErrorIs(t, err, ErrInvalid)
	}
}

// ForceRelease: an operator removes a key's holders; a waiter gets the key
// at once with a greater token; the evicted work is cancelled with ErrLost
// at once (a Preempt lease) or by its next renewal; an owner filter spares
// the other owners.
func testForceRelease(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a, b, op := h.locker(t), h.locker(t), h.locker(t)
	watched, err := a.TryAcquire(ctx, "k", &AcquireOptions{FollowUp: Preempt{}, TTL: 30 * time.Second})
	require.NoError(t, err)
	work, cancel := watched.Context(ctx)
	defer cancel()
	got := make(chan *Lease, 1)
	go func() {
		l, err := b.Acquire(ctx, "k", nil)
		assert.NoError(t, err)
		got <- l
	}()
	waitWaiters(t, a, "k", 1)
	start := time.Now()
	n, err := op.ForceRelease(ctx, "k", Select{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	<-work.Done()
	require.Less(t, time.Since(start), time.Second, "told on the channel, not at a renewal (every 10s)")
	require.ErrorIs(t, context.Cause(work), ErrLost)
	next := <-got
	require.Greater(t, next.Token(), watched.Token())
	require.ErrorIs(t, watched.Release(ctx), ErrNotHeld)
	require.NoError(t, next.Release(ctx))

	// A lease that does not listen learns at its next renewal.
	plain, err := a.TryAcquire(ctx, "k", &AcquireOptions{TTL: 900 * time.Millisecond})
	require.NoError(t, err)
	start = time.Now()
	n, err = op.ForceRelease(ctx, "k", Select{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	select {
	case <-plain.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("an evicted lease went on")
	}
	require.Less(t, time.Since(start), 700*time.Millisecond, "within a renewal interval (300ms) and a round trip")
	require.ErrorIs(t, plain.Err(), ErrLost)
	require.ErrorContains(t, plain.Err(), "released by an operator", "the renewal tells why")

	// So does an Extend, of a lease released by its token.
	plain, err = a.TryAcquire(ctx, "k", &AcquireOptions{TTL: 30 * time.Second})
	require.NoError(t, err)
	require.NoError(t, forceToken(ctx, op, "k", plain.Token()))
	err = plain.Extend(ctx, time.Minute)
	require.ErrorIs(t, err, ErrNotHeld)
	require.ErrorContains(t, err, "released by an operator")
	require.ErrorContains(t, plain.Err(), "released by an operator")

	// Only one owner's holders.
	la, err := a.TryAcquire(ctx, "m", &AcquireOptions{Limit: 2})
	require.NoError(t, err)
	lb, err := b.TryAcquire(ctx, "m", &AcquireOptions{Limit: 2})
	require.NoError(t, err)
	n, err = op.ForceRelease(ctx, "m", Select{Owner: lb.Owner()})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	info, err := op.Inspect(ctx, "m")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, la.Owner(), info.Holders[0].Owner)
	require.NoError(t, la.Release(ctx))
	n, err = op.ForceRelease(ctx, "m", Select{})
	require.NoError(t, err)
	require.Zero(t, n, "nothing left")
	_, err = op.ForceRelease(ctx, "", Select{})
	require.ErrorIs(t, err, ErrInvalid)
}

// ForceRelease by token: an operator releases the holder they saw, by its
// fencing token; once that holder is gone, nothing is released and the error
// names the holder now. The evicted work's cause says an operator released it.
func testForceReleaseToken(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a, b, op := h.locker(t), h.locker(t), h.locker(t)
	seen, err := a.TryAcquire(ctx, "k", &AcquireOptions{FollowUp: Preempt{}, TTL: 30 * time.Second})
	require.NoError(t, err)
	require.NoError(t, seen.Release(ctx))
	now, err := a.TryAcquire(ctx, "k", &AcquireOptions{FollowUp: Preempt{}, TTL: 30 * time.Second})
	require.NoError(t, err)
	work, cancel := now.Context(ctx)
	defer cancel()
	err = forceToken(ctx, op, "k", seen.Token())
	require.ErrorIs(t, err, ErrNotHeld)
	require.ErrorContains(t, err, fmt.Sprintf("token %d no longer holds it", seen.Token()))
	require.ErrorContains(t, err, fmt.Sprintf("token %d", now.Token()), "names the holder now")
	require.NoError(t, forceToken(ctx, op, "k", now.Token()))
	<-work.Done()
	require.ErrorIs(t, context.Cause(work), ErrLost)
	require.ErrorContains(t, context.Cause(work), "released by an operator")
	require.ErrorContains(t, forceToken(ctx, op, "k", now.Token()), "the key has no holder now")

	// Of two holders, only the one of the token; a watched lease of the
	// same key and Locker is not told it was released.
	l1, err := a.TryAcquire(ctx, "m", &AcquireOptions{Limit: 2})
	require.NoError(t, err)
	l2, err := b.TryAcquire(ctx, "m", &AcquireOptions{Limit: 2})
	require.NoError(t, err)
	require.NoError(t, forceToken(ctx, op, "m", l2.Token()))
	info, err := op.Inspect(ctx, "m")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, l1.Token(), info.Holders[0].Token)
	require.NoError(t, l1.Release(ctx))
	require.ErrorIs(t, forceToken(ctx, op, "", 1), ErrInvalid)
	require.ErrorIs(t, forceToken(ctx, op, "m", -1), ErrInvalid)
}

// forceToken is ForceRelease of the holder of token, which it reports removed.
func forceToken(ctx context.Context, l Locker, key string, token int64) error {
	n, err := l.ForceRelease(ctx, key, Select{Token: token})
	if err == nil && n != 1 {
		return fmt.Errorf("ForceRelease by token removed %d holders", n)
	}
	return err
}

// AsyncRelease: Run returns before the release; the Locker's own next
// acquire of the key waits for it; another Locker's waiter is woken by it;
// the success record is written; Close sends what is queued.
func testAsyncRelease(t *testing.T, h *harness) {
	ctx := ctxT(t)
	var released atomic.Int32
	a := h.locker(t, WithObserver(func(e Event) {
		if e.Kind == LeaseReleased {
			released.Add(1)
		}
	}))
	b := h.locker(t)
	async := &AcquireOptions{AsyncRelease: true}
	for i := range 20 { // back to back on one Locker: never its own conflict
		l, err := a.TryAcquire(ctx, "k", async)
		require.NoError(t, err, "run %d", i)
		require.NoError(t, l.Run(ctx, func(context.Context) error { return nil }))
	}
	require.Eventually(t, func() bool { return released.Load() == 20 }, 5*time.Second, time.Millisecond)

	// A waiter elsewhere is woken by the background release.
	l, err := a.TryAcquire(ctx, "k", async)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		w, err := b.Acquire(ctx, "k", nil)
		if err == nil {
			err = w.Release(ctx)
		}
		got <- err
	}()
	waitWaiters(t, a, "k", 1)
	start := time.Now()
	require.NoError(t, l.Run(ctx, func(context.Context) error { return nil }))
	require.NoError(t, <-got)
	require.Less(t, time.Since(start), time.Second, "woken, not polled")

	// What Run records on success is written too.
	c, err := a.TryAcquire(ctx, "cover", &AcquireOptions{FollowUp: Coalesce{}, AsyncRelease: true})
	require.NoError(t, err)
	before := time.UnixMicro(c.Token() - 1)
	require.NoError(t, c.Run(ctx, func(context.Context) error { return nil }))
	_, err = a.TryAcquire(ctx, "cover", &AcquireOptions{FollowUp: Coalesce{Since: before}})
	require.ErrorIs(t, err, ErrCovered)

	// Close sends the queued releases.
	closing := h.locker(t)
	for i := range 5 {
		l, err := closing.TryAcquire(ctx, fmt.Sprint("q", i), async)
		require.NoError(t, err)
		require.NoError(t, l.Run(ctx, func(context.Context) error { return nil }))
	}
	require.NoError(t, closing.Close(ctx))
	for i := range 5 {
		info, err := b.Inspect(ctx, fmt.Sprint("q", i))
		require.NoError(t, err)
		require.Empty(t, info.Holders)
	}
}

// Many leases renewed in shared calls (one per hash slot) all stay held
// past several TTLs; one taken over in between is lost, the others not.
func testRenewMany(t *testing.T, h *harness) {
	ctx := ctxT(t)
	var renewed atomic.Int32
	l := h.locker(t, WithObserver(func(e Event) {
		if e.Kind == LeaseRenewed {
			renewed.Add(1)
		}
	}))
	var leases []*Lease
	for i := range 100 {
		// Every other lease claims an epoch, and every third has a TTL of
		// its own: one script call renews every kind. The TTLs leave a
		// renewal more than a second to get through a loaded machine.
		ttl := 2000 * time.Millisecond
		if i%3 == 2 {
			ttl = 2500 * time.Millisecond
		}
		lease, err := l.TryAcquire(ctx, fmt.Sprint("many-", i), &AcquireOptions{TTL: ttl, Epoch: int64(i % 2)})
		require.NoError(t, err)
		leases = append(leases, lease)
	}
	h.steal(t, "many-7")
	time.Sleep(3 * time.Second) // more than every TTL, and four renewal intervals
	for i, lease := range leases {
		if i == 7 {
			require.ErrorIs(t, lease.Err(), ErrLost, "the stolen one")
			continue
		}
		require.NoError(t, lease.Err(), "lease %d", i)
	}
	require.Greater(t, renewed.Load(), int32(2*99))
	for i, lease := range leases {
		if i != 7 {
			require.NoError(t, lease.Release(ctx))
		}
	}
	// The epochs outlived their first TTL: the renewals kept them.
	other := h.locker(t)
	for i := 1; i < len(leases); i += 2 {
		if i != 7 {
			_, err := other.TryAcquire(ctx, fmt.Sprint("many-", i), &AcquireOptions{Epoch: 1})
			require.ErrorIs(t, err, ErrEpochUsed, "lease %d's epoch", i)
		}
	}
}

// TTLs past MaxTTL are refused, never stored as already expired.
func testHugeTTL(t *testing.T, h *harness) {
	ctx := ctxT(t)
	l := h.locker(t)
	for _, opt := range []*AcquireOptions{
		{TTL: math.MaxInt64},
		{TTL: MaxTTL + time.Millisecond},
		{EpochTTL: math.MaxInt64, Epoch: 1},
	} {
		_, err := l.TryAcquire(ctx, "k", opt)
		require.ErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, "MaxTTL")
	}
	lease, err := l.TryAcquire(ctx, "k", &AcquireOptions{TTL: MaxTTL})
	require.NoError(t, err)
	require.ErrorIs(t, lease.Extend(ctx, math.MaxInt64), ErrInvalid)
	_, err = h.locker(t).TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, ErrNotAcquired, "a MaxTTL lease is held")
	require.NoError(t, lease.Release(ctx))
}

func testPark(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t, WithOwner("a"))
	b := h.locker(t, WithOwner("b"))
	// OnParked runs on a goroutine of its own once the release returned.
	calls := make(chan string, 16)
	onParked := func(_, id string) { calls <- id }
	var resumed []string
	// settle collects the calls the releases so far started: n of them,
	// then none for a while.
	settle := func(n int) {
		t.Helper()
		for range n {
			select {
			case id := <-calls:
				resumed = append(resumed, id)
			case <-ctx.Done():
				t.Fatalf("OnParked not called; so far %v", resumed)
			}
		}
		select {
		case id := <-calls:
			t.Fatalf("OnParked called once more, with %s", id)
		case <-time.After(20 * time.Millisecond):
		}
	}
	park := func(label, id string) *AcquireOptions {
		return &AcquireOptions{Label: label, TakeReservation: true, Park: &Parking{ID: id, Hold: time.Minute, OnParked: onParked}}
	}
	holder, err := a.TryAcquire(ctx, "p", &AcquireOptions{Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	for i, j := range []string{"j1", "j2", "j1"} {
		_, err := b.TryAcquire(ctx, "p", park(j, "id-"+j))
		require.ErrorIs(t, err, ErrNotAcquired)
		var ce *ConflictError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, []int{0, 1, 0}[i], ce.Parked, "parked jobs ahead of %s", j)
	}
	_, err = b.TryAcquire(ctx, "p", nil)
	var unparked *ConflictError
	require.ErrorAs(t, err, &unparked)
	require.Equal(t, -1, unparked.Parked)
	info, err := b.Inspect(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, 2, info.Parked, "j1 and j2 are parked, j1 once")
	require.NoError(t, holder.Release(ctx))
	settle(1)
	require.Equal(t, []string{"id-j1"}, resumed, "the oldest parked job, once")
	info, err = b.Inspect(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, 1, info.Parked, "j1 has the key reserved, j2 is still parked")
	require.Len(t, info.Holders, 1)
	require.Equal(t, "parked:id-j1", info.Holders[0].Owner)
	require.Equal(t, "j1", info.Holders[0].Label)
	require.Greater(t, info.Holders[0].Token, holder.Token())
	require.Greater(t, info.Holders[0].TTL, 30*time.Second, "reserved for Parking.Hold")

	// The reservation refuses other jobs; the parked job adopts it.
	_, err = b.TryAcquire(ctx, "p", &AcquireOptions{Label: "other"})
	require.ErrorIs(t, err, ErrNotAcquired)
	j1, err := b.TryAcquire(ctx, "p", park("j1", "id-j1"))
	require.NoError(t, err)
	require.NoError(t, j1.Run(ctx, func(context.Context) error { return nil }))
	settle(1)
	require.Equal(t, []string{"id-j1", "id-j2"}, resumed)
	j2, err := b.TryAcquire(ctx, "p", park("j2", "id-j2"))
	require.NoError(t, err)
	require.NoError(t, j2.Release(ctx))
	settle(0)
	require.Equal(t, []string{"id-j1", "id-j2"}, resumed, "the queue is empty")
	info, err = b.Inspect(ctx, "p")
	require.NoError(t, err)
	require.Empty(t, info.Holders)

	// A parked job that takes the key itself leaves the queue; a release
	// without OnParked leaves the queue as it is.
	plain, err := a.TryAcquire(ctx, "q", nil)
	require.NoError(t, err)
	for _, j := range []string{"j3", "j4"} {
		_, err := b.TryAcquire(ctx, "q", park(j, "id-"+j))
		require.ErrorIs(t, err, ErrNotAcquired)
	}
	require.NoError(t, plain.Release(ctx))
	j3, err := b.TryAcquire(ctx, "q", park("j3", "id-j3"))
	require.NoError(t, err, "nothing was reserved")
	require.NoError(t, j3.Release(ctx))
	settle(1)
	require.Equal(t, []string{"id-j1", "id-j2", "id-j4"}, resumed)

	// A parked job whose label was completed meanwhile is passed over.
	first, err := a.TryAcquire(ctx, "r", &AcquireOptions{Label: "j5", Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "r", park("j5", "id-j5"))
	require.ErrorIs(t, err, ErrNotAcquired)
	_, err = b.TryAcquire(ctx, "r", park("j6", "id-j6"))
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NoError(t, first.Complete(ctx, time.Minute))
	settle(1)
	require.Equal(t, []string{"id-j1", "id-j2", "id-j4", "id-j6"}, resumed)

	_, err = a.TryAcquire(ctx, "v", &AcquireOptions{Park: &Parking{ID: "x"}})
	require.ErrorIs(t, err, ErrInvalid, "Park needs a Label")
	_, err = a.TryAcquire(ctx, "v", &AcquireOptions{Park: &Parking{ID: "x"}, Label: "l", Limit: 2})
	require.ErrorIs(t, err, ErrInvalid, "Park needs Limit 1")
}

// A parked KeepNewest follow-up is replaced by a newer one, waiting or
// parked, and its next acquire gives up once; a parked Coalesce follow-up
// covers later Coalesce calls while it stays parked.
func testParkFollowUp(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t, WithOwner("a"))
	b := h.locker(t, WithOwner("b"))
	calls := make(chan string, 16)
	onParked := func(_, id string) { calls <- id }
	follow := func(label string) *AcquireOptions {
		return &AcquireOptions{Label: label, TakeReservation: true, FollowUp: KeepNewest{}, Park: &Parking{ID: "id-" + label, Hold: time.Minute, OnParked: onParked}}
	}
	// parks tries label as a follow-up and returns whom it replaced.
	parks := func(key, label string) string {
		t.Helper()
		_, err := b.TryAcquire(ctx, key, follow(label))
		var ce *ConflictError
		require.ErrorAs(t, err, &ce, "%s parks", label)
		require.Equal(t, 0, ce.Parked, "%s is the only parked job", label)
		return ce.Superseded
	}
	parked := func(key string) int {
		t.Helper()
		info, err := a.Inspect(ctx, key)
		require.NoError(t, err)
		return info.Parked
	}
	started := func(want string) {
		t.Helper()
		select {
		case id := <-calls:
			require.Equal(t, want, id, "the release reserved the key for the parked follow-up")
		case <-ctx.Done():
			t.Fatal("OnParked not called")
		}
	}
	holder, err := a.TryAcquire(ctx, "s", &AcquireOptions{Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	require.Empty(t, parks("s", "j1"))
	require.Equal(t, "id-j1", parks("s", "j2"), "the newer follow-up replaces the parked one")
	require.Equal(t, 1, parked("s"))
	// A pass-on's adopt (no Park) carrying j1's label leaves the mark.
	_, err = b.TryAcquire(ctx, "s", &AcquireOptions{Label: "j1", TakeReservation: true})
	require.ErrorIs(t, err, ErrNotAcquired)
	_, err = b.TryAcquire(ctx, "s", follow("j1"))
	require.ErrorIs(t, err, ErrSuperseded, "the replaced job gives up")
	require.Equal(t, "id-j2", parks("s", "j1"), "once: delivered again, it is a newer follow-up")
	require.Empty(t, parks("s", "j1"), "j1 delivered once more (its backstop) replaces no one")
	_, err = b.TryAcquire(ctx, "s", follow("j2"))
	require.ErrorIs(t, err, ErrSuperseded)

	// A waiting follow-up replaces a parked one, and a parked one a waiting one.
	waited := make(chan error, 1)
	go func() {
		l, err := a.Acquire(ctx, "s", &AcquireOptions{FollowUp: KeepNewest{}})
		if err == nil {
			err = l.Release(ctx)
		}
		waited <- err
	}()
	require.Eventually(t, func() bool { return parked("s") == 0 }, 5*time.Second, time.Millisecond, "the waiter replaced j1")
	_, err = b.TryAcquire(ctx, "s", follow("j1"))
	require.ErrorIs(t, err, ErrSuperseded)
	require.Empty(t, parks("s", "j3"), "a waiting follow-up is woken, not named")
	require.ErrorIs(t, <-waited, ErrSuperseded)

	// The release reserves the key for the parked follow-up, which adopts it
	// and replaces no one; the next follow-up parks behind its run.
	require.NoError(t, holder.Release(ctx))
	started("id-j3")
	j3, err := b.TryAcquire(ctx, "s", follow("j3"))
	require.NoError(t, err)
	require.Empty(t, parks("s", "j4"))
	require.NoError(t, j3.Release(ctx))
	started("id-j4")

	// Coalesce: the first parked call is the follow-up that covers later ones.
	coalesce := func(label string) *AcquireOptions {
		return &AcquireOptions{Label: label, TakeReservation: true, FollowUp: Coalesce{}, Park: &Parking{ID: "id-" + label, Hold: time.Minute, OnParked: onParked}}
	}
	holder, err = a.TryAcquire(ctx, "c", &AcquireOptions{Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "c", coalesce("c1"))
	require.ErrorIs(t, err, ErrNotAcquired, "c1 parks")
	_, err = b.TryAcquire(ctx, "c", coalesce("c2"))
	var ce *CoveredError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, CoveredByFollowUp, ce.By, "c1 will run after c2 asked")
	_, err = b.TryAcquire(ctx, "c", coalesce("c1"))
	require.ErrorIs(t, err, ErrNotAcquired, "c1 does not cover itself")
	require.Equal(t, 1, parked("c"))
	require.NoError(t, holder.Release(ctx))
	started("id-c1")
	_, err = b.TryAcquire(ctx, "c", coalesce("c3"))
	require.ErrorAs(t, err, &ce, "c3 asked after the key was reserved for c1, which begins later")
	require.Equal(t, CoveredByFollowUp, ce.By)
	c1, err := b.TryAcquire(ctx, "c", coalesce("c1"))
	require.NoError(t, err, "c1 is the key's run")
	_, err = b.TryAcquire(ctx, "c", coalesce("c4"))
	require.ErrorIs(t, err, ErrNotAcquired, "c4 asked after c1 began: it parks, and the follow-up parked behind c1 does not cover c1")
	require.NoError(t, c1.Succeed(ctx))
	started("id-c4")

	// A follow-up that a later call folded into is not covered by a run that
	// began before that call: here a plain waiter handed the key between
	// the follow-up's park and the fold.
	holder, err = a.TryAcquire(ctx, "f", &AcquireOptions{Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	f1 := coalesce("f1")
	f1.FollowUp = Coalesce{Since: time.Now()} // as a delivery of the same task asks again
	_, err = b.TryAcquire(ctx, "f", f1)
	require.ErrorIs(t, err, ErrNotAcquired, "f1 parks")
	handed := make(chan *Lease, 1)
	go func() {
		l, err := a.Acquire(ctx, "f", &AcquireOptions{Park: &Parking{OnParked: onParked}})
		assert.NoError(t, err)
		handed <- l
	}()
	waitWaiters(t, a, "f", 1)
	require.NoError(t, holder.Release(ctx))
	run := <-handed
	_, err = b.TryAcquire(ctx, "f", coalesce("f2"))
	require.ErrorAs(t, err, &ce, "f2 asked after the run began: it folds into f1")
	require.Equal(t, CoveredByFollowUp, ce.By)
	_, err = b.TryAcquire(ctx, "f", f1)
	require.ErrorIs(t, err, ErrNotAcquired, "f1 is not covered by the run that began before f2 asked")
	require.NoError(t, run.Release(ctx))
	started("id-f1")

	// A Final call (its work is not tried again) covers no other call:
	// neither its run nor its parked entry.
	final := func(label string) *AcquireOptions {
		o := coalesce(label)
		o.FollowUp = Coalesce{Final: true}
		return o
	}
	z1, err := b.TryAcquire(ctx, "z", final("z1"))
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "z", &AcquireOptions{FollowUp: Coalesce{Since: time.UnixMicro(z1.Token() - 1)}})
	require.ErrorIs(t, err, ErrNotAcquired, "the Final run does not cover a call that began before it")
	_, err = b.TryAcquire(ctx, "z", final("z2"))
	require.ErrorIs(t, err, ErrNotAcquired, "z2 parks")
	_, err = b.TryAcquire(ctx, "z", coalesce("z3"))
	require.ErrorIs(t, err, ErrNotAcquired, "z3 parks: z2 is Final, no follow-up")
	require.Equal(t, 2, parked("z"))
	require.NoError(t, z1.Release(ctx))
	started("id-z2")
}

// testRedelivery: a delivery of the work whose earlier delivery holds the key
// (the same label) is no follow-up. It replaces no follow-up and covers no
// later Coalesce call, parked or waiting: when the run completes the label,
// the redelivery gives up, and the follow-up it would have displaced runs.
func testRedelivery(t *testing.T, h *harness) {
	ctx := ctxT(t)
	contended := make(chan string, 16)
	a := h.locker(t, WithOwner("a"))
	b := h.locker(t, WithOwner("b"), WithObserver(func(e Event) {
		if e.Kind == LeaseContended {
			contended <- e.Key
		}
	}))
	calls := make(chan string, 16)
	onParked := func(_, id string) { calls <- id }
	started := func(want string) {
		t.Helper()
		select {
		case id := <-calls:
			require.Equal(t, want, id)
		case <-ctx.Done():
			t.Fatalf("OnParked(%s) not called", want)
		}
	}
	opts := func(label string, supersede bool) *AcquireOptions {
		var mode FollowUp = Coalesce{}
		if supersede {
			mode = KeepNewest{}
		}
		return &AcquireOptions{Label: label, TakeReservation: true, FollowUp: mode, Park: &Parking{ID: "id-" + label, Hold: time.Minute, OnParked: onParked}}
	}
	conflict := func(key, label string, supersede bool) *ConflictError {
		t.Helper()
		_, err := b.TryAcquire(ctx, key, opts(label, supersede))
		var ce *ConflictError
		require.ErrorAs(t, err, &ce, "%s parks", label)
		for len(contended) > 0 {
			<-contended
		}
		return ce
	}

	// KeepNewest, parked: y runs, x parks as its follow-up, y is delivered again.
	y, err := a.TryAcquire(ctx, "s", opts("y", true))
	require.NoError(t, err)
	require.Empty(t, conflict("s", "x", true).Superseded)
	require.Empty(t, conflict("s", "y", true).Superseded, "the redelivery of the run replaces no follow-up")
	require.NoError(t, y.Complete(ctx, time.Minute))
	started("id-x")
	x, err := b.TryAcquire(ctx, "s", opts("x", true))
	require.NoError(t, err, "the follow-up runs")
	_, err = b.TryAcquire(ctx, "s", opts("y", true))
	require.ErrorIs(t, err, ErrCompleted, "the redelivery gives up: its run completed")
	require.NoError(t, x.Release(ctx))

	// Coalesce, parked: c1 runs and is delivered again; c2 comes later.
	c1, err := a.TryAcquire(ctx, "c", opts("c1", false))
	require.NoError(t, err)
	conflict("c", "c1", false)
	conflict("c", "c2", false) // not covered by the redelivery: it parks
	require.NoError(t, c1.Complete(ctx, time.Minute))
	started("id-c2")
	c2, err := b.TryAcquire(ctx, "c", opts("c2", false))
	require.NoError(t, err, "the call the redelivery would have covered runs")
	require.NoError(t, c2.Release(ctx))

	// A follow-up delivered again under another parked id (a copy of the
	// task) takes its own earlier entry's place: it neither replaces nor is
	// covered by itself.
	holder, err := a.TryAcquire(ctx, "p", &AcquireOptions{Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	copyOf := func(label, id string, supersede bool) *AcquireOptions {
		o := opts(label, supersede)
		o.Park.ID = id
		return o
	}
	_, err = b.TryAcquire(ctx, "p", copyOf("x", "id-x", true))
	require.ErrorIs(t, err, ErrNotAcquired)
	_, err = b.TryAcquire(ctx, "p", copyOf("x", "id-x-copy", true))
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Empty(t, ce.Superseded, "a job does not replace itself")
	require.Equal(t, 0, ce.Parked, "its earlier entry is gone")
	require.NoError(t, holder.Release(ctx))
	started("id-x-copy")
	x, err = b.TryAcquire(ctx, "p", copyOf("x", "id-x-copy", true))
	require.NoError(t, err, "the copy runs: it was not marked superseded")
	_, err = b.TryAcquire(ctx, "p", copyOf("d", "id-d", false))
	require.ErrorIs(t, err, ErrNotAcquired)
	_, err = b.TryAcquire(ctx, "p", copyOf("d", "id-d-copy", false))
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NotErrorIs(t, err, ErrCovered, "a job is not covered by its own earlier entry")
	info, err := b.Inspect(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, 1, info.Parked)
	require.NoError(t, x.Release(ctx))
	started("id-d-copy")

	// Coalesce: a run covers calls asked before it began, but not a
	// delivery of its own work, which waits for the run's outcome.
	before := time.Now().Add(-time.Second)
	run, err := a.TryAcquire(ctx, "o", &AcquireOptions{Label: "o1", FollowUp: Coalesce{Since: before}})
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "o", &AcquireOptions{Label: "o1", FollowUp: Coalesce{Since: before}})
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NotErrorIs(t, err, ErrCovered)
	_, err = b.TryAcquire(ctx, "o", &AcquireOptions{Label: "o2", FollowUp: Coalesce{Since: before}})
	require.ErrorIs(t, err, ErrCovered, "another call is covered")
	require.NoError(t, run.Release(ctx))

	// Waiting: y's redelivery waits beside the follow-up x, and c1's beside
	// nobody, without replacing or covering.
	for _, supersede := range []bool{true, false} {
		key := fmt.Sprintf("w-%v", supersede)
		wait := func(label string) <-chan error {
			done := make(chan error, 1)
			go func() {
				o := opts(label, supersede)
				o.Park, o.TakeReservation = &Parking{OnParked: onParked}, false
				l, err := b.Acquire(ctx, key, o)
				if err == nil {
					err = l.Release(ctx)
				}
				done <- err
			}()
			select {
			case <-contended:
			case <-ctx.Done():
				t.Fatalf("%s did not wait", label)
			}
			return done
		}
		o := opts("r1", supersede)
		o.Park, o.TakeReservation = &Parking{OnParked: onParked}, false
		r1, err := a.TryAcquire(ctx, key, o)
		require.NoError(t, err)
		var follow <-chan error
		if supersede {
			follow = wait("f1")
		}
		again := wait("r1")
		if !supersede {
			// A later Coalesce call is not covered by the redelivery.
			_, err := b.TryAcquire(ctx, key, &AcquireOptions{Label: "f2", FollowUp: Coalesce{}})
			require.ErrorIs(t, err, ErrNotAcquired)
			require.NotErrorIs(t, err, ErrCovered)
		}
		require.NoError(t, r1.Complete(ctx, time.Minute))
		require.ErrorIs(t, <-again, ErrCompleted, "supersede %v", supersede)
		if follow != nil {
			require.NoError(t, <-follow, "the follow-up runs")
		}
	}
}

// testHandOverBeforeParked: a release that can hand the key to a waiting
// plain acquire does so, and reserves it for no parked job.
func testHandOverBeforeParked(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t, WithOwner("a"))
	b := h.locker(t, WithOwner("b"))
	c := h.locker(t, WithOwner("c"))
	calls := make(chan string, 4)
	holder, err := a.TryAcquire(ctx, "k", &AcquireOptions{Park: &Parking{OnParked: func(_, id string) { calls <- id }}})
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "k", &AcquireOptions{Label: "j1", TakeReservation: true, Park: &Parking{ID: "id-j1", Hold: time.Minute}})
	require.ErrorIs(t, err, ErrNotAcquired)
	got := make(chan *Lease, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := c.Acquire(wctx, "k", nil)
		assert.NoError(t, err, "the waiter is handed the key, not kept out by a reservation")
		got <- l
	}()
	waitWaiters(t, b, "k", 1)
	require.NoError(t, holder.Release(ctx))
	l := <-got
	require.NotNil(t, l)
	info, err := b.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, info.Parked, "the parked job stays parked")
	require.Len(t, info.Holders, 1)
	require.Len(t, calls, 0, "no parked job was resumed")
	require.NoError(t, l.Release(ctx))
}

// testCloseResumesParked: Close's release of a lease with OnParked reserves
// the key for the oldest parked job and starts it, as Release does.
func testCloseResumesParked(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t, WithOwner("a"))
	b := h.locker(t, WithOwner("b"))
	calls := make(chan string, 4)
	_, err := a.TryAcquire(ctx, "k", &AcquireOptions{Park: &Parking{OnParked: func(_, id string) { calls <- id }}})
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "k", &AcquireOptions{Label: "j1", TakeReservation: true, Park: &Parking{ID: "id-j1", Hold: time.Minute}})
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NoError(t, a.Close(ctx))
	require.Len(t, calls, 1, "Close returns after OnParked")
	require.Equal(t, "id-j1", <-calls)
	l, err := b.TryAcquire(ctx, "k", &AcquireOptions{Label: "j1", TakeReservation: true, Park: &Parking{ID: "id-j1", Hold: time.Minute}})
	require.NoError(t, err, "the parked job adopts its reservation")
	require.NoError(t, l.Release(ctx))
}

// Order: a KeepNewest call older than the key's follow-up gives up at once
// and takes no newer call's place; one older than the key's latest run gives
// up while that run holds the key and after it, and preempts no newer run; a
// delivery of the same task (the same order) is not older; a call without an
// order goes by arrival.
func testOrder(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a, b := h.locker(t, WithOwner("a")), h.locker(t, WithOwner("b"))
	type res struct {
		l   *Lease
		err error
	}
	acquire := func(l Locker, key string, opt *AcquireOptions) <-chan res {
		ch := make(chan res, 1)
		go func() {
			lease, err := l.Acquire(ctx, key, opt)
			ch <- res{lease, err}
		}()
		return ch
	}
	waiters := func(key string, n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			info, err := a.Inspect(ctx, key)
			require.NoError(t, err)
			return info.Waiters == n
		}, 5*time.Second, time.Millisecond)
	}
	sup := func(order int64) *AcquireOptions { return &AcquireOptions{FollowUp: KeepNewest{Order: order}} }

	// KeepNewest: the older call reaches the store last and gives up.
	holder, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	newer := acquire(b, "k", sup(20))
	waiters("k", 1)
	r := <-acquire(a, "k", sup(10))
	require.ErrorIs(t, r.err, ErrSuperseded, "an older call takes no newer one's place")
	waiters("k", 1)
	require.NoError(t, holder.Release(ctx))
	r = <-newer
	require.NoError(t, r.err, "the newest runs")
	late := acquire(a, "k", sup(15))
	r2 := <-late
	require.ErrorIs(t, r2.err, ErrSuperseded, "an older call gives up while the newer run holds the key")
	require.NoError(t, r.l.Release(ctx))
	_, err = a.Acquire(ctx, "k", sup(15))
	require.ErrorIs(t, err, ErrSuperseded, "and after it")
	again, err := b.Acquire(ctx, "k", sup(20))
	require.NoError(t, err, "a delivery of the same task is not older")
	require.NoError(t, again.Release(ctx))

	// Parked follow-ups: the older gives up, the newer's entry stays.
	resumed := make(chan string, 1)
	holder, err = a.TryAcquire(ctx, "q", &AcquireOptions{Park: &Parking{OnParked: func(_, id string) { resumed <- id }}})
	require.NoError(t, err)
	park := func(label string, order int64) error {
		l, err := b.TryAcquire(ctx, "q", &AcquireOptions{Label: label, TakeReservation: true, FollowUp: KeepNewest{Order: order}, Park: &Parking{ID: "id-" + label}})
		if err == nil {
			err = l.Release(ctx)
		}
		return err
	}
	var ce *ConflictError
	require.ErrorAs(t, park("b", 20), &ce)
	require.ErrorIs(t, park("a", 10), ErrSuperseded)
	info, err := a.Inspect(ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 1, info.Parked)
	require.ErrorAs(t, park("c", 30), &ce)
	require.Equal(t, "id-b", ce.Superseded, "a newer one replaces it")
	require.NoError(t, holder.Release(ctx))
	require.Equal(t, "id-c", <-resumed, "the release reserves the key for c")
	require.ErrorIs(t, park("d", 25), ErrSuperseded, "older than the follow-up the key is reserved for")
	require.NoError(t, park("c", 30), "c adopts its reservation")

	// Preempt: an older call preempts no newer run.
	pre := func(order int64) *AcquireOptions {
		return &AcquireOptions{FollowUp: Preempt{Order: order}, TTL: 30 * time.Second}
	}
	r = <-acquire(a, "p", pre(20))
	require.NoError(t, r.err)
	run := r.l
	r = <-acquire(b, "p", pre(10))
	require.ErrorIs(t, r.err, ErrSuperseded)
	require.NoError(t, run.Err(), "the newer run goes on")
	newer = acquire(b, "p", pre(30))
	select {
	case <-run.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a newer call did not preempt the run")
	}
	require.ErrorIs(t, run.Err(), ErrPreempted)
	r = <-acquire(a, "p", pre(25))
	require.ErrorIs(t, r.err, ErrSuperseded, "older than the follow-up")
	_ = run.Release(ctx)
	r = <-newer
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))

	// Without an order: arrival.
	holder, err = a.TryAcquire(ctx, "u", nil)
	require.NoError(t, err)
	first := acquire(b, "u", sup(0))
	waiters("u", 1)
	second := acquire(a, "u", sup(5))
	require.ErrorIs(t, (<-first).err, ErrSuperseded, "the later arrival replaces an unordered follow-up")
	require.NoError(t, holder.Release(ctx))
	r = <-second
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))
	r = <-acquire(b, "u", sup(0))
	require.NoError(t, r.err, "an unordered call is not older")
	require.NoError(t, r.l.Release(ctx))
	r = <-acquire(a, "u", sup(1))
	require.NoError(t, r.err, "after an unordered run, arrival")
	require.NoError(t, r.l.Release(ctx))

	_, err = a.Acquire(ctx, "v", &AcquireOptions{FollowUp: KeepNewest{Order: -1}})
	require.ErrorIs(t, err, ErrInvalid)
}

// A release held at least a while (HoldAtLeast) with jobs parked on its key
// frees the key at the hold's end and reserves it then for the oldest parked
// job, which is passed to OnParked, as a release that frees the key at once
// does; nothing is resumed before the hold ends.
func testHoldHandOver(t *testing.T, h *harness) {
	ctx := ctxT(t)
	a := h.locker(t, WithOwner("a"))
	b := h.locker(t, WithOwner("b"))
	calls := make(chan string, 4)
	onParked := func(_, id string) { calls <- id }
	next := func() string {
		t.Helper()
		select {
		case id := <-calls:
			return id
		case <-ctx.Done():
			t.Fatal("OnParked not called")
			return ""
		}
	}
	const hold = 300 * time.Millisecond
	start := time.Now()
	holder, err := a.TryAcquire(ctx, "p", &AcquireOptions{HoldAtLeast: hold, Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	for _, j := range []string{"j1", "j2"} {
		_, err := b.TryAcquire(ctx, "p", &AcquireOptions{Label: j, TakeReservation: true, Park: &Parking{ID: "id-" + j, Hold: time.Minute, OnParked: onParked}})
		require.ErrorIs(t, err, ErrNotAcquired)
	}
	require.NoError(t, holder.Release(ctx), "a run shorter than its hold")
	// A hand-over sent early (a client clock ahead of the server's) leaves
	// the holder until the hold's end, and is sent again then.
	rl, ok := a.(*RedisLocker)
	require.True(t, ok)
	held, err := rl.r.release(ctx, []*Lease{holder}, []ending{{nohold: true, handOver: true}})
	require.NoError(t, err)
	require.True(t, held[0])
	info, err := b.Inspect(ctx, "p")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "a", info.Holders[0].Owner, "still held by the released lease")
	require.Greater(t, holder.holdLeft.Load(), int64(0), "told the hold left")
	holder.resumeParked()
	require.Equal(t, "id-j1", next(), "the oldest parked job")
	require.GreaterOrEqual(t, time.Since(start), hold-10*time.Millisecond, "not before the hold's end")
	info, err = b.Inspect(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, 1, info.Parked, "j2 is still parked")
	require.Len(t, info.Holders, 1)
	require.Equal(t, "parked:id-j1", info.Holders[0].Owner, "reserved for j1")
	require.Greater(t, info.Holders[0].Token, holder.Token())
	select {
	case id := <-calls:
		t.Fatalf("OnParked called once more, with %s", id)
	case <-time.After(20 * time.Millisecond):
	}
	j1, err := b.TryAcquire(ctx, "p", &AcquireOptions{Label: "j1", TakeReservation: true, Park: &Parking{ID: "id-j1", OnParked: onParked}})
	require.NoError(t, err, "j1 adopts its reservation")
	require.NoError(t, j1.Release(ctx))
	require.Equal(t, "id-j2", next())

	// A held release whose reply was lost, sent again by go-redis after the
	// hold's end: no hand-over was scheduled, so the repeat hands over.
	again, err := a.TryAcquire(ctx, "q", &AcquireOptions{HoldAtLeast: hold, Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "q", &AcquireOptions{Label: "j3", TakeReservation: true, Park: &Parking{ID: "id-j3", OnParked: onParked}})
	require.ErrorIs(t, err, ErrNotAcquired)
	held, err = rl.r.release(ctx, []*Lease{again}, []ending{{}}) // the first run; its reply is dropped
	require.NoError(t, err)
	require.True(t, held[0])
	again.holdLeft.Store(0)
	require.Eventually(t, func() bool {
		info, err := b.Inspect(ctx, "q")
		require.NoError(t, err)
		return len(info.Holders) == 0
	}, 5*time.Second, 5*time.Millisecond, "the hold ends")
	held, err = rl.r.release(ctx, []*Lease{again}, []ending{{}}) // go-redis' retry
	require.NoError(t, err)
	require.True(t, held[0], "the repeat reports the release")
	again.resumeParked()
	require.Equal(t, "id-j3", next())
	info, err = b.Inspect(ctx, "q")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "parked:id-j3", info.Holders[0].Owner, "reserved for j3")
}

// ForceRelease by Label gives the labelled job up: its reservation ends,
// and its entries leave the key's parked queue (the job will never start:
// no release reserves the key for it), whatever else is parked; a repeat
// (go-redis sends it again after a lost reply) finds nothing more to do.
func testForceReleaseLabelParked(t *testing.T, h *harness) {
	ctx := ctxT(t)
	client := h.locker(t, WithOwner("client"))
	worker := h.locker(t, WithOwner("worker"))
	park := func(label string) {
		t.Helper()
		_, err := client.TryAcquire(ctx, "p", &AcquireOptions{Label: label, Reserve: true, TTL: time.Minute,
			Park: &Parking{ID: "q/" + label, Hold: time.Minute}})
		require.ErrorIs(t, err, ErrNotAcquired)
	}
	_, err := client.TryAcquire(ctx, "p", &AcquireOptions{Label: "t:0", Reserve: true, TTL: time.Minute,
		Park: &Parking{ID: "q/t:0", Hold: time.Minute}})
	require.NoError(t, err, "the first reserves the key")
	for _, l := range []string{"t:1", "t:2", "t:3"} {
		park(l)
	}
	for range 2 {
		n, err := worker.ForceRelease(ctx, "p", Select{Label: "t:2"})
		require.NoError(t, err)
		require.Zero(t, n, "a parked job holds nothing")
		info, err := worker.Inspect(ctx, "p")
		require.NoError(t, err)
		require.Equal(t, 2, info.Parked)
		require.Equal(t, []string{"q/t:1", "q/t:3"}, info.ParkedIDs)
		require.Len(t, info.Holders, 1)
	}
	n, err := worker.ForceRelease(ctx, "p", Select{Label: "t:0"})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = worker.ForceRelease(ctx, "p", Select{Label: "t:1"})
	require.NoError(t, err)
	require.Zero(t, n)
	info, err := worker.Inspect(ctx, "p")
	require.NoError(t, err)
	require.Empty(t, info.Holders)
	require.Equal(t, []string{"q/t:3"}, info.ParkedIDs, "the others stay parked")
}

// A lease whose validity ran out before its work began (its process was
// paused between the acquire and Run) does not start the work: another
// holder may have the key by then. Run returns the loss.
func testRunPastValidity(t *testing.T, h *harness) {
	ctx := ctxT(t)
	l, err := h.locker(t).TryAcquire(ctx, "k", &AcquireOptions{TTL: MinTTL, NoRenew: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.Err() != nil }, 10*time.Second, time.Millisecond, "the lease's validity runs out")
	ran := false
	err = l.Run(ctx, func(context.Context) error { ran = true; return nil })
	require.False(t, ran, "the work did not start")
	require.ErrorIs(t, err, ErrLost)
}
