package lockcore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// replicated is a master with one replica, each a redis-server of the
// test's own, and clients of both.
type replicated struct {
	master, replica  *testredis.Server
	mclient, rclient *redis.Client
}

func startReplicated(t *testing.T) *replicated {
	t.Helper()
	m := testredis.StartServer(t)
	r := testredis.StartReplica(t, m)
	mc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	rc := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = mc.Close(); _ = rc.Close() })
	return &replicated{master: m, replica: r, mclient: mc, rclient: rc}
}

func (p *replicated) locker(t *testing.T, owner string, opts ...Option) *RedisLocker {
	t.Helper()
	l, err := NewRedis(p.mclient, append([]Option{WithOwner(owner)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// holdersOn reads key's holders as the server c has them.
func holdersOn(t *testing.T, c *redis.Client, key string) []Holder {
	t.Helper()
	info, err := (&RedisLocker{r: &redisBackend{c: c, prefix: escapeKey(DefaultPrefix)}}).r.inspect(context.Background(), key)
	require.NoError(t, err)
	return info.Holders
}

// An acknowledged acquire is on the replica when it returns: a failover
// that promoted it would keep the lease.
func TestReplicaAcksAcquireIsOnTheReplica(t *testing.T) {
	p := startReplicated(t)
	ctx := context.Background()
	for _, opt := range []*AcquireOptions{nil, {Limit: 2}, {Label: "task-1", Epoch: 5}} {
		key := t.Name() + "-" + randomID(4)
		l := p.locker(t, "a", WithReplicaAcks(1, time.Second))
		lease, err := l.TryAcquire(ctx, key, opt)
		require.NoError(t, err)
		on := holdersOn(t, p.rclient, key)
		require.Len(t, on, 1, "%+v: the replica has the lease", opt)
		require.Equal(t, lease.Token(), on[0].Token)
		require.NoError(t, lease.Release(ctx))
	}
}

// A write the replica does not acknowledge in time is not a lease: the
// acquire fails with ErrNotReplicated and gives the key back.
func TestReplicaAcksUnacknowledgedAcquireGivesTheKeyBack(t *testing.T) {
	p := startReplicated(t)
	ctx := context.Background()
	key := t.Name()
	l := p.locker(t, "a", WithReplicaAcks(1, 50*time.Millisecond))
	p.replica.Pause()
	_, err := l.TryAcquire(ctx, key, nil)
	require.ErrorIs(t, err, ErrNotReplicated)
	require.ErrorContains(t, err, "0 of 1 replicas acknowledged within 50ms")
	other := p.locker(t, "b")
	require.Eventually(t, func() bool {
		lease, err := other.TryAcquire(ctx, key, nil)
		if err != nil {
			return false
		}
		return lease.Release(ctx) == nil
	}, 5*time.Second, 10*time.Millisecond, "the key is given back")
	p.replica.Resume()
}

// A renewal the replica does not acknowledge does not count: with none
// acknowledged before the lease runs out, it is lost, and the work's ctx
// is cancelled before the master would let another process take the key.
func TestReplicaAcksUnacknowledgedRenewalsLoseTheLease(t *testing.T) {
	p := startReplicated(t)
	ctx := context.Background()
	// The acquire waits for the running replica up to a second (a loaded
	// machine took over 500 ms); the renewals, every TTL/3, each wait as
	// long for the paused one, so none succeeds before the 3 s lease runs
	// out.
	l := p.locker(t, "a", WithReplicaAcks(1, time.Second))
	lease, err := l.TryAcquire(ctx, t.Name(), &AcquireOptions{TTL: 3 * time.Second})
	require.NoError(t, err)
	p.replica.Pause()
	defer p.replica.Resume()
	select {
	case <-lease.Lost():
	case <-time.After(15 * time.Second):
		t.Fatal("the lease was not lost")
	}
	require.ErrorIs(t, lease.Release(ctx), ErrNotHeld)
}

// A key handed over by a release (a write of the releasing connection) is
// confirmed by an acknowledged write of the taker's own: a replica that
// acknowledged the taker's earlier writes but not the hand-over must not
// let the taker run.
func TestReplicaAcksHandOverIsConfirmedByTheTaker(t *testing.T) {
	p := startReplicated(t)
	ctx := context.Background()
	key := t.Name()
	a := p.locker(t, "a", WithReplicaAcks(1, time.Second))
	b := p.locker(t, "b", WithReplicaAcks(1, time.Second))
	held, err := a.TryAcquire(ctx, key, nil)
	require.NoError(t, err)
	waiting := make(chan struct{})
	got := make(chan error, 1)
	b.e.cfg.observer = func(e Event) {
		if e.Kind == LeaseContended {
			close(waiting)
		}
	}
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		lease, err := b.Acquire(wctx, key, nil)
		if err == nil {
			_ = lease.Release(ctx)
		}
		got <- err
	}()
	<-waiting
	// Its second attempt registered it as a waiter, acknowledged.
	require.Eventually(t, func() bool {
		info, err := a.Inspect(ctx, key)
		return err == nil && info.Waiters == 1
	}, 5*time.Second, 5*time.Millisecond)
	p.replica.Pause()
	defer p.replica.Resume()
	require.NoError(t, held.Release(ctx)) // records nothing: does not wait
	err = <-got
	require.ErrorIs(t, err, ErrNotReplicated)
}

// A release that records a completion waits: a completion lost in a
// failover would let the work run again.
func TestReplicaAcksCompletionWaits(t *testing.T) {
	p := startReplicated(t)
	ctx := context.Background()
	l := p.locker(t, "a", WithReplicaAcks(1, time.Second))
	lease, err := l.TryAcquire(ctx, t.Name(), &AcquireOptions{Label: "task-1"})
	require.NoError(t, err)
	p.replica.Pause()
	defer p.replica.Resume()
	require.ErrorIs(t, lease.Complete(ctx, time.Minute), ErrNotReplicated)
}

// On a Cluster each write waits on the master of its key's slot: with no
// replicas there, every acquire is refused for want of acknowledgements,
// whichever master keeps its key, never with a redirection.
func TestReplicaAcksClusterWaitsOnTheKeysMaster(t *testing.T) {
	c := testredis.Cluster(t)
	ctx := context.Background()
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)), WithReplicaAcks(1, 10*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	for i := range 12 {
		_, err := l.TryAcquire(ctx, "k"+randomID(3)+string(rune('a'+i)), nil)
		require.ErrorIs(t, err, ErrNotReplicated)
		require.ErrorContains(t, err, "0 of 1 replicas")
	}
}

// A repeat of an acquire (go-redis sent it again) finds the lease its
// first run took, without writing, and still waits for the replica. (Redis
// 7.0's WAIT counts all the server wrote before it; where a WAIT counts only
// its connection's own writes, the repeat's confirming write is what it
// counts.)
func TestReplicaAcksRepeatedAcquireConfirms(t *testing.T) {
	p := startReplicated(t)
	ctx := context.Background()
	l := p.locker(t, "a", WithReplicaAcks(1, time.Second))
	for _, opt := range []*AcquireOptions{nil, {Limit: 2}} {
		r, err := l.e.cfg.request(t.Name()+"-"+randomID(4), opt)
		require.NoError(t, err)
		first, err := l.r.acquire(ctx, &r)
		require.NoError(t, err)
		require.True(t, first.ok)
		p.replica.Pause()
		_, err = l.r.acquire(ctx, &r)
		p.replica.Resume()
		require.ErrorIs(t, err, ErrNotReplicated, "%+v", opt)
	}
}

func TestReplicaAcksRefusesWhatCannotWork(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: 2 * time.Second})
	defer c.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	for _, tc := range []struct {
		client redis.UniversalClient
		opt    Option
		want   string
	}{
		{c, WithReplicaAcks(-1, time.Second), "n must be between 0 and 100"},
		{c, WithReplicaAcks(101, time.Second), "n must be between 0 and 100"},
		{c, WithReplicaAcks(1, 0), "the timeout must be at least 1ms"},
		{c, WithReplicaAcks(1, 2*time.Second), "shorter than the client's ReadTimeout (2s)"},
		{ring, WithReplicaAcks(1, time.Second), "not a *redis.Ring"},
	} {
		_, err := NewRedis(tc.client, tc.opt)
		require.ErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := NewRedis(c, WithReplicaAcks(0, 0))
	require.NoError(t, err, "0 turns it off")
}
