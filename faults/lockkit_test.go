//go:build faults

package faults_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
)

// work is a running piece of work under a lease: it records when its ctx was
// cancelled and why.
type work struct {
	lease     *lockkit.Lease
	cancelled chan struct{}
	at        time.Time
	cause     error
}

func startWork(t *testing.T, l *lockkit.Locker, key string, opt *lockkit.AcquireOptions) *work {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), key, opt)
	require.NoError(t, err)
	w := &work{lease: lease, cancelled: make(chan struct{})}
	ctx, cancel := lease.Context(context.Background())
	t.Cleanup(cancel)
	context.AfterFunc(ctx, func() {
		w.at, w.cause = time.Now(), context.Cause(ctx)
		close(w.cancelled)
	})
	return w
}

// Scenario 1: Redis restarts (same port, no persistence) while leases are
// held. Every lease is reported lost and its work cancelled; new work proceeds
// once Redis is back; nothing panics or hangs.
func TestRedisRestartWhileLeasesHeld(t *testing.T) {
	srv := testredis.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	locker, err := lockkit.NewRedis(c, lockkit.WithPollInterval(50*time.Millisecond))
	require.NoError(t, err)
	defer locker.Close(context.Background())

	const n = 20
	ttl := time.Second
	works := make([]*work, n)
	for i := range works {
		works[i] = startWork(t, locker, fmt.Sprint("job-", i), &lockkit.AcquireOptions{TTL: ttl})
	}
	restartedAt := time.Now()
	srv.Kill()
	srv.Start()

	for i, w := range works {
		select {
		case <-w.cancelled:
			require.ErrorIs(t, w.cause, lockkit.ErrLost, "work %d", i)
			require.ErrorIs(t, w.lease.Err(), lockkit.ErrLost)
		case <-time.After(ttl + 5*time.Second):
			t.Fatalf("work %d was not cancelled after Redis lost its lease", i)
		}
	}
	lostWithin := time.Since(restartedAt)
	// New work proceeds on the restarted Redis, through the same client and Locker.
	recovered := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		l, err := locker.Acquire(ctx, fmt.Sprint("job-", i), nil)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	t.Logf("restart: %d/%d leases reported lost within %s; new work took %s", n, n,
		lostWithin.Round(time.Millisecond), time.Since(recovered).Round(time.Millisecond))
}

// Scenario 2: a worker partitioned from Redis for longer than the TTL has its
// work cancelled before another worker can take the key. Latency below the
// renewal interval costs nothing.
func TestPartitionCancelsWorkBeforeTakeover(t *testing.T) {
	addr := testredis.Addr(t)
	direct := testredis.Client(t)
	prefix := testredis.Prefix(t, direct)
	px := newProxy(t, addr)

	// The partitioned worker's client must not hang past the TTL on a read.
	cut := redis.NewClient(&redis.Options{Addr: px.Listen(), ReadTimeout: 200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer cut.Close()
	a, err := lockkit.NewRedis(cut, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer a.Close(context.Background())
	b, err := lockkit.NewRedis(direct, lockkit.WithPrefix(prefix), lockkit.WithPollInterval(10*time.Millisecond))
	require.NoError(t, err)
	defer b.Close(context.Background())

	ttl := 900 * time.Millisecond
	renewed := make(chan struct{}, 64)
	obs, err := lockkit.NewRedis(cut, lockkit.WithPrefix(prefix), lockkit.WithObserver(func(e lockkit.Event) {
		if e.Kind == lockkit.LeaseRenewed {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	}))
	require.NoError(t, err)
	defer obs.Close(context.Background())

	// Latency well under the renewal interval: renewals keep succeeding.
	px.latency(50 * time.Millisecond)
	wl := startWork(t, obs, "latency", &lockkit.AcquireOptions{TTL: ttl})
	for range 4 {
		select {
		case <-renewed:
		case <-wl.cancelled:
			t.Fatalf("lease lost under 50ms latency: %v", wl.cause)
		case <-time.After(5 * time.Second):
			t.Fatal("no renewal under latency")
		}
	}
	px.clear()

	w := startWork(t, a, "k", &lockkit.AcquireOptions{TTL: ttl})
	partitioned := time.Now()
	px.blackhole()

	var takeover time.Time
	for {
		l, err := b.TryAcquire(context.Background(), "k", nil)
		if err == nil {
			takeover = time.Now()
			require.Greater(t, l.Token(), w.lease.Token())
			require.NoError(t, l.Release(context.Background()))
			break
		}
		require.ErrorIs(t, err, lockkit.ErrNotAcquired)
		require.Less(t, time.Since(partitioned), ttl+5*time.Second, "the key was never freed")
		time.Sleep(2 * time.Millisecond) // polls the takeover moment
	}
	select {
	case <-w.cancelled:
	default:
		t.Fatal("the key was taken over while the partitioned worker's work still ran")
	}
	require.ErrorIs(t, w.cause, lockkit.ErrLost)
	require.True(t, w.at.Before(takeover), "cancelled at %s, taken over at %s", w.at, takeover)
	t.Logf("partition: work cancelled %s after the cut, key taken over %s after the cut (margin %s)",
		w.at.Sub(partitioned).Round(time.Millisecond), takeover.Sub(partitioned).Round(time.Millisecond),
		takeover.Sub(w.at).Round(time.Millisecond))
}

// Scenario 3: a holder process killed with SIGKILL. The key becomes free
// within TTL + 1s, and not before the dead holder's lease would have expired.
func TestKilledHolderProcess(t *testing.T) {
	if os.Getenv("JOBGUARD_FAULT_CHILD") == "holder" {
		return // runs as the child in TestMain
	}
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	ttl := time.Second
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "JOBGUARD_FAULT_CHILD=holder", "JOBGUARD_PREFIX="+prefix,
		"JOBGUARD_TTL="+ttl.String(), "REDIS_ADDR="+testredis.Addr(t))
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	token, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "held ")), 10, 64)
	require.NoError(t, err, "child said %q", line)

	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix), lockkit.WithPollInterval(20*time.Millisecond))
	require.NoError(t, err)
	defer l.Close(context.Background())
	// Let the child renew at least once, then kill it mid-lease.
	require.Eventually(t, func() bool {
		info, err := l.Inspect(context.Background(), "k")
		return err == nil && len(info.Holders) == 1 && info.Holders[0].TTL > ttl*3/4
	}, 5*time.Second, 5*time.Millisecond)
	info, err := l.Inspect(context.Background(), "k")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, token, info.Holders[0].Token)
	require.NoError(t, child.Process.Kill())
	killed := time.Now()
	expiresNoEarlierThan := killed.Add(info.Holders[0].TTL - 50*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), ttl+5*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, "k", nil)
	require.NoError(t, err)
	got := time.Now()
	require.NoError(t, lease.Release(ctx))
	require.Greater(t, lease.Token(), token)
	require.Less(t, got.Sub(killed), ttl+time.Second, "free within TTL + 1s")
	require.False(t, got.Before(expiresNoEarlierThan), "taken %s before the dead holder's lease expired", expiresNoEarlierThan.Sub(got))
	t.Logf("SIGKILL: key free %s after the kill (TTL %s)", got.Sub(killed).Round(time.Millisecond), ttl)
}

// holderChild is the killed process of TestKilledHolderProcess: it takes the
// key, reports the token and works until it is killed.
func holderChild() {
	ttl, _ := time.ParseDuration(os.Getenv("JOBGUARD_TTL"))
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(os.Getenv("JOBGUARD_PREFIX")))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	lease, err := l.TryAcquire(context.Background(), "k", &lockkit.AcquireOptions{TTL: ttl})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("held", lease.Token())
	var mu sync.Mutex
	mu.Lock()
	mu.Lock() // works forever
}
