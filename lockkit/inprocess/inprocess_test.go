package inprocess_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

// go-redis v9.17's process-wide clock goroutine is go-redis's, not a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

func start(t *testing.T) *inprocess.Store {
	t.Helper()
	s, err := inprocess.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// deadHolder returns a Store whose key "report" is held, for ttl, by a Locker
// that has stopped renewing (its process froze or died), with the time it
// stopped and its lease.
func deadHolder(t *testing.T, ctx context.Context, ttl time.Duration) (*inprocess.Store, time.Time, *lockkit.Lease) {
	s := start(t)
	// The holder has a client of its own, whose close stops its renewals
	// without releasing anything.
	own := redis.NewClient(&redis.Options{Addr: s.Client().Options().Addr, Password: s.Client().Options().Password})
	holder, err := lockkit.NewRedis(own, lockkit.WithOwner("holder"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	lh, err := holder.TryAcquire(ctx, "report", &lockkit.AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	require.NoError(t, own.Close())
	return s, time.Now(), lh
}

// A dead holder's lease expires as real time passes: a later attempt gets the
// key with a greater token, and Keys stops listing it.
func TestDeadHoldersLeaseExpires(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const ttl = 300 * time.Millisecond
	s, killed, lh := deadHolder(t, ctx, ttl)
	l, err := s.Locker(lockkit.WithOwner("next"))
	require.NoError(t, err)
	defer l.Close(ctx)

	_, err = l.TryAcquire(ctx, "report", nil)
	var conflict *lockkit.ConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, "holder", conflict.Owner)
	keys, err := l.Keys(ctx, "*")
	require.NoError(t, err)
	require.Equal(t, []string{"report"}, keys)

	require.Eventually(t, func() bool {
		keys, err := l.Keys(ctx, "*")
		return err == nil && len(keys) == 0
	}, 5*time.Second, 10*time.Millisecond, "the expired lease is not listed")
	require.GreaterOrEqual(t, time.Since(killed), ttl/2, "the key was held until the holder's TTL ran out")
	ln, err := l.TryAcquire(ctx, "report", nil)
	require.NoError(t, err)
	require.Greater(t, ln.Token(), lh.Token())
	require.NoError(t, ln.Release(ctx))
}

// A waiter in Acquire is woken when a dead holder's lease expires.
func TestDeadHoldersExpiryWakesAWaiter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const ttl = 300 * time.Millisecond
	s, killed, lh := deadHolder(t, ctx, ttl)
	waiter, err := s.Locker(lockkit.WithOwner("waiter"), lockkit.WithPollInterval(20*time.Millisecond))
	require.NoError(t, err)
	defer waiter.Close(ctx)

	got := make(chan *lockkit.Lease, 1)
	go func() {
		lw, err := waiter.Acquire(ctx, "report", nil)
		if err != nil {
			t.Error(err)
		}
		got <- lw
	}()
	var lw *lockkit.Lease
	select {
	case lw = <-got:
	case <-ctx.Done():
		t.Fatal("the dead holder's lease never expired")
	}
	require.NotNil(t, lw)
	require.GreaterOrEqual(t, time.Since(killed), ttl/2, "the key was held until the holder's TTL ran out")
	require.Greater(t, lw.Token(), lh.Token())
	info, err := waiter.Inspect(ctx, "report")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "waiter", info.Holders[0].Owner)
	require.NoError(t, lw.Release(ctx))
}

// A release wakes a waiting Locker of the same Store at once.
func TestReleaseWakesAWaiter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := start(t)
	a, err := s.Locker()
	require.NoError(t, err)
	defer a.Close(ctx)
	// A poll interval longer than the test's ctx: only the release's wake-up
	// can hand the key over in time.
	b, err := s.Locker(lockkit.WithPollInterval(time.Minute))
	require.NoError(t, err)
	defer b.Close(ctx)

	la, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	waiting := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		close(waiting)
		lb, err := b.Acquire(ctx, "k", nil)
		if err == nil {
			err = lb.Release(ctx)
		}
		got <- err
	}()
	<-waiting
	require.Eventually(t, func() bool {
		info, err := a.Inspect(ctx, "k")
		return err == nil && info.Waiters == 1
	}, 5*time.Second, 5*time.Millisecond, "b waits")
	require.NoError(t, la.Release(ctx))
	require.NoError(t, <-got)
}

// Keys lists the held locks of every Locker of the Store, not the released ones.
func TestKeysListsHeldLocks(t *testing.T) {
	ctx := context.Background()
	s := start(t)
	a, err := s.Locker()
	require.NoError(t, err)
	defer a.Close(ctx)
	b, err := s.Locker()
	require.NoError(t, err)
	defer b.Close(ctx)
	_, err = a.TryAcquire(ctx, "report:1", nil)
	require.NoError(t, err)
	lb, err := b.TryAcquire(ctx, "report:2", nil)
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "invoice:1", nil)
	require.NoError(t, err)
	require.NoError(t, lb.Release(ctx))
	keys, err := b.Keys(ctx, "report:*")
	require.NoError(t, err)
	require.Equal(t, []string{"report:1"}, keys)
}

// A closed Store's Lockers fail rather than block.
func TestCloseStopsTheStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := inprocess.Start()
	require.NoError(t, err)
	l, err := s.Locker()
	require.NoError(t, err)
	defer l.Close(ctx)
	require.NoError(t, s.Close())
	_, err = l.TryAcquire(ctx, "k", nil)
	require.Error(t, err)
	require.False(t, errors.Is(err, lockkit.ErrNotAcquired), "a closed Store is an error, not a held key: %v", err)
}

// Only the Store's client knows its password: another process of the
// machine cannot reach its keys.
func TestStoreRefusesOtherClients(t *testing.T) {
	ctx := context.Background()
	s := start(t)
	require.NoError(t, s.Client().Ping(ctx).Err())
	other := redis.NewClient(&redis.Options{Addr: s.Client().Options().Addr})
	defer other.Close()
	require.ErrorContains(t, other.Set(ctx, "k", "v", 0).Err(), "NOAUTH")
}

func TestInvalidOption(t *testing.T) {
	_, err := start(t).Locker(lockkit.WithTTL(time.Millisecond))
	require.ErrorIs(t, err, lockkit.ErrInvalid)
}
