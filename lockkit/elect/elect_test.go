package elect_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/elect"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// candidates returns Lockers on one Redis with a key prefix of the test's
// own: locker shares client, killable has a client of its own whose closing
// stops its renewals without releasing anything, as if its process froze.
type candidates struct {
	locker   func(t *testing.T) *lockkit.Locker
	killable func(t *testing.T) (*lockkit.Locker, func())
}

func newCandidates(t *testing.T, client redis.UniversalClient, newClient func() redis.UniversalClient) candidates {
	prefix := testredis.Prefix(t, client)
	build := func(t *testing.T, c redis.UniversalClient) *lockkit.Locker {
		l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	return candidates{
		locker: func(t *testing.T) *lockkit.Locker { return build(t, client) },
		killable: func(t *testing.T) (*lockkit.Locker, func()) {
			own := newClient()
			t.Cleanup(func() { _ = own.Close() })
			return build(t, own), func() { _ = own.Close() }
		},
	}
}

func TestElectionMiniredis(t *testing.T) {
	mr, client := testredis.Mini(t)
	mr.ClockTTL(true)
	testElection(t, newCandidates(t, client, func() redis.UniversalClient { return redis.NewClient(client.Options()) }))
}

func TestElectionRedis(t *testing.T) {
	testredis.Addr(t)
	client := testredis.Client(t)
	testElection(t, newCandidates(t, client, func() redis.UniversalClient { return redis.NewClient(client.Options()) }))
}

func TestElectionRedisCluster(t *testing.T) {
	testredis.ClusterAddrs(t)
	testElection(t, newCandidates(t, testredis.Cluster(t), func() redis.UniversalClient {
		return redis.NewClusterClient(testredis.ClusterOptions(t))
	}))
}

// One leader at a time; a resigning leader hands over at once (pub/sub), a
// dead one after its TTL; every term is greater than the last.
func testElection(t *testing.T, h candidates) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := h.locker(t)
	dead, kill := h.killable(t)
	opt := &lockkit.AcquireOptions{TTL: 600 * time.Millisecond}
	ca, err := elect.New(a, "leader", opt)
	require.NoError(t, err)
	var term int64
	require.Eventually(t, func() bool { term, _ = ca.Leader(); return term > 0 }, 5*time.Second, time.Millisecond)
	cd, err := elect.New(dead, "leader", opt)
	require.NoError(t, err)
	_, lead := cd.Leader()
	require.False(t, lead, "one leader at a time")

	start := time.Now()
	require.NoError(t, ca.Stop(ctx))
	_, lead = ca.Leader()
	require.False(t, lead)
	var next int64
	require.Eventually(t, func() bool { next, _ = cd.Leader(); return next > 0 }, 5*time.Second, time.Millisecond)
	require.Less(t, time.Since(start), 200*time.Millisecond, "woken by the resignation, not a poll")
	require.Greater(t, next, term)

	// A leader whose process froze loses the key after its TTL; its own
	// Campaign stops claiming leadership by then.
	cb, err := elect.New(h.locker(t), "leader", opt)
	require.NoError(t, err)
	defer cb.Stop(ctx)
	kill()
	require.Eventually(t, func() bool { _, ok := cd.Leader(); return !ok }, 5*time.Second, time.Millisecond)
	var last int64
	require.Eventually(t, func() bool { last, _ = cb.Leader(); return last > 0 }, 5*time.Second, time.Millisecond)
	require.Greater(t, last, next)
	stopCtx, stopCancel := context.WithTimeout(ctx, time.Second)
	defer stopCancel()
	_ = cd.Stop(stopCtx)

	// Elect: lead runs while leader, with the term, and resigns on return.
	done := make(chan int64)
	go func() {
		_ = elect.Elect(ctx, h.locker(t), "elect", nil, func(ctx context.Context, term int64) error {
			done <- term
			<-done
			return nil
		})
	}()
	first := <-done
	got := make(chan int64, 1)
	go func() {
		_ = elect.Elect(ctx, h.locker(t), "elect", nil, func(ctx context.Context, term int64) error {
			got <- term
			return nil
		})
	}()
	select {
	case <-got:
		t.Fatal("two leaders")
	case <-time.After(50 * time.Millisecond):
	}
	done <- 0
	require.Greater(t, <-got, first)
}

func TestNewRequiresALockerAndAKey(t *testing.T) {
	_, err := elect.New(nil, "k", nil)
	require.ErrorIs(t, err, lockkit.ErrInvalid)
	_, client := testredis.Mini(t)
	l, err := lockkit.NewRedis(client)
	require.NoError(t, err)
	defer l.Close(context.Background())
	_, err = elect.New(l, "", nil)
	require.ErrorIs(t, err, lockkit.ErrInvalid)
}
