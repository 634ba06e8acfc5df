package lockkittest_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// go-redis v9.17's process-wide clock goroutine is go-redis's, not a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// Lockers of one Store share leases; Lockers of New each have their own.
func TestStoresShareLeasesWithinAndNotAcross(t *testing.T) {
	ctx := context.Background()
	store := lockkittest.NewStore(t)
	a := store.Locker(lockkit.WithOwner("a"))
	b := store.Locker(lockkit.WithOwner("b"))
	_, err := a.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, lockkit.ErrNotAcquired)
	info, err := a.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "a", info.Holders[0].Owner)

	_, err = lockkittest.New(t).TryAcquire(ctx, "k", nil)
	require.NoError(t, err, "a Locker of New has a Store of its own")
}

// The test's end closes its Lockers (releasing their leases) and then its
// Stores.
func TestCleanupClosesTheLockers(t *testing.T) {
	ctx := context.Background()
	var l *lockkit.Locker
	var lease *lockkit.Lease
	t.Run("user", func(t *testing.T) {
		l = lockkittest.New(t)
		var err error
		lease, err = l.TryAcquire(ctx, "k", nil)
		require.NoError(t, err)
	})
	select {
	case <-lease.Lost():
	default:
		t.Fatal("the lease outlived its test")
	}
	_, err := l.TryAcquire(ctx, "k", nil)
	require.ErrorIs(t, err, lockkit.ErrClosed)
}

func TestInvalidOptionFailsTheTest(t *testing.T) {
	tb := &recorder{TB: t}
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine, as it ends a test.
		defer close(done)
		lockkittest.New(tb, lockkit.WithTTL(time.Millisecond))
	}()
	<-done
	require.True(t, tb.failed)
}

// recorder is a testing.TB whose Fatalf records the failure and ends the
// calling goroutine, as the testing package does.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Fatalf(string, ...any) {
	r.failed = true
	runtime.Goexit()
}
