package cronguard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/middleware"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis v9.23 starts this loop for a cluster node client and does not
		// stop it when a ClusterClient is closed while a command on it is still
		// in flight, which is how the dead-replica test on the cluster kills its
		// replica. It belongs to go-redis, not to cronguard.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/maintnotifications.(*CircuitBreakerManager).cleanupLoop"),
		// go-redis v9.17 shares one clock goroutine among its connection
		// pools, stopped when the last pool closes: the same killed cluster
		// client keeps it running.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// t0 is a whole second, like every activation of a cron spec.
var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// clock is a settable clock for WithClock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// recorder is a middleware.Observer that keeps every event with its tick.
type recorder struct {
	mu     sync.Mutex
	events []event
	notify chan struct{}
}

type event struct {
	middleware.Event
	tick time.Time
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1)} }

func (r *recorder) observe(ctx context.Context, e middleware.Event) {
	tick, _ := cronguard.Tick(ctx)
	r.mu.Lock()
	r.events = append(r.events, event{Event: e, tick: tick})
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// count returns how many events of kind were reported (for tick, unless zero).
func (r *recorder) count(kind middleware.EventKind, tick time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == kind && (tick.IsZero() || e.tick.Equal(tick)) {
			n++
		}
	}
	return n
}

func (r *recorder) find(kind middleware.EventKind) (event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Kind == kind {
			return e, true
		}
	}
	return event{}, false
}

// logRecorder is a cron.Logger that keeps every line.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (l *logRecorder) Info(msg string, kv ...any) { l.add("info " + msg + fmt.Sprint(kv...)) }

func (l *logRecorder) Error(err error, msg string, kv ...any) {
	l.add("error " + msg + ": " + err.Error() + " " + fmt.Sprint(kv...))
}

func (l *logRecorder) add(s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
}

func (l *logRecorder) has(prefix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
			return true
		}
	}
	return false
}

var _ cron.Logger = (*logRecorder)(nil)

// fleet is replicas sharing one lock store: Lockers of one
// lockkittest.Store, or of one Redis (redisFleet).
type fleet struct {
	t    *testing.T
	base *lockkit.Locker
	// peer returns the i-th replica's Locker (i > 0).
	peer func(i int) *lockkit.Locker
}

func newFleet(t *testing.T) *fleet {
	store := lockkittest.NewStore(t)
	return &fleet{t: t, base: store.Locker(lockkit.WithOwner("replica-0")), peer: func(i int) *lockkit.Locker {
		return store.Locker(lockkit.WithOwner(fmt.Sprintf("replica-%d", i)))
	}}
}

// redisFleet is a fleet of Lockers on the standalone Redis or the
// Cluster, under one test prefix.
func redisFleet(t *testing.T, cluster bool) *fleet {
	var c redis.UniversalClient = testredis.Client(t)
	if cluster {
		c = testredis.Cluster(t)
	}
	prefix := testredis.Prefix(t, c)
	locker := func(i int) *lockkit.Locker {
		l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix), lockkit.WithOwner(fmt.Sprintf("replica-%d", i)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	return &fleet{t: t, base: locker(0), peer: locker}
}

// locker returns the i-th replica's Locker.
func (f *fleet) locker(i int) *lockkit.Locker {
	if i == 0 {
		return f.base
	}
	return f.peer(i)
}

// replica is one process running a guarded entry, with its own clock.
type replica struct {
	clock *clock
	wrap  cron.JobWrapper
}

// replica returns the i-th replica of entry name on spec, observed by rec.
func (f *fleet) replica(i int, name, spec string, rec *recorder, opts ...cronguard.Option) *replica {
	c := newClock(t0)
	opts = append([]cronguard.Option{
		cronguard.WithSeconds(),
		cronguard.WithClock(c.Now),
		cronguard.WithLogger(cron.DiscardLogger),
		cronguard.WithObserver(rec.observe),
	}, opts...)
	w, err := cronguard.Wrap(f.locker(i), name, spec, opts...)
	require.NoError(f.t, err)
	return &replica{clock: c, wrap: w}
}

// fire runs job as the replica's cron would at the replica's clock reading at.
func (r *replica) fire(at time.Time, job cron.Job) {
	r.clock.Set(at)
	r.wrap(job).Run()
}

// fireAsync fires in a goroutine; the returned channel closes when it returns.
func (r *replica) fireAsync(at time.Time, job cron.Job) <-chan struct{} {
	r.clock.Set(at)
	j := r.wrap(job)
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.Run()
	}()
	return done
}

// blocking is a job that signals when it starts and returns when released.
type blocking struct {
	started chan time.Time
	release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{started: make(chan time.Time, 16), release: make(chan struct{})}
}

func (b *blocking) job() cronguard.Func {
	return func(ctx context.Context) error {
		tick, _ := cronguard.Tick(ctx)
		b.started <- tick
		<-b.release
		return nil
	}
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out")
	}
	var zero T
	return zero
}
