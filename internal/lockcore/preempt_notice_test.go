package lockcore

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// afterAcquired is a go-redis hook that calls fn, once, after an acquire
// script took the key (its reply starts with 1), before the caller reads it.
type afterAcquired struct {
	once sync.Once
	fn   func()
}

func (h *afterAcquired) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *afterAcquired) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && err == nil && anyScript(acquireSources()...)(cmd) {
			if vals, _ := c.Slice(); len(vals) > 1 && toInt(vals[0]) == 1 {
				h.once.Do(h.fn)
			}
		}
		return err
	}
}

func (h *afterAcquired) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// preemptedWithin fails unless l is lost as preempted within d.
func preemptedWithin(t *testing.T, l *Lease, d time.Duration) {
	t.Helper()
	select {
	case <-l.Lost():
	case <-time.After(d):
		t.Fatal("the preempted lease was not told; it would run on until its next renewal")
	}
	require.ErrorIs(t, l.Err(), ErrPreempted)
}

// A waiting Preempt acquire is subscribed to its key's channel before it
// takes the key, but its lease listens for preemption only once the reply
// is read: a newer acquire's notice in between still reaches the lease.
func TestPreemptNoticeBeforeTheLeaseListens(t *testing.T) {
	ctx := ctxT(t)
	clean := testredis.Client(t)
	prefix := testredis.Prefix(t, clean)
	hook := &afterAcquired{}
	a, err := NewRedis(hookedClient(t, hook), WithPrefix(prefix), WithOwner("a"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	b, err := NewRedis(clean, WithPrefix(prefix), WithOwner("b"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })

	held, err := b.TryAcquire(ctx, "k", nil)
	require.NoError(t, err)
	be := engineOf(a).b.(*redisBackend)
	channel := be.keys("k").channel
	newer := make(chan error, 1)
	bctx, stopNewer := context.WithCancel(ctx)
	defer stopNewer()
	hook.fn = func() {
		// a took the key; before it reads the reply, a newer acquire
		// preempts it, and a's Locker receives the notice.
		be.mu.Lock()
		var wake chan int64
		for ch := range be.subs[channel].chans {
			wake = ch
		}
		be.mu.Unlock()
		for len(wake) > 0 {
			<-wake
		}
		go func() {
			l, err := b.Acquire(bctx, "k", &AcquireOptions{FollowUp: Preempt{}})
			if err == nil {
				err = l.Release(context.Background())
			}
			newer <- err
		}()
		require.Eventually(t, func() bool {
			info, err := b.Inspect(ctx, "k")
			return err == nil && info.Waiters == 1
		}, 5*time.Second, time.Millisecond)
		// A message published after the notice is dispatched after it.
		require.NoError(t, clean.Publish(ctx, channel, "1").Err())
		require.Eventually(t, func() bool { return len(wake) > 0 }, 5*time.Second, time.Millisecond)
	}
	l, err := a.Acquire(ctx, "k", &AcquireOptions{FollowUp: Preempt{Grace: 50 * time.Millisecond}, TTL: 30 * time.Second})
	require.NoError(t, err)
	preemptedWithin(t, l, 3*time.Second)
	require.ErrorIs(t, l.Release(ctx), ErrNotHeld)
	require.ErrorIs(t, held.Release(ctx), ErrNotHeld)
	require.NoError(t, <-newer)
}

// A preemption sent while the pub/sub connection is down reaches the
// lease when the connection is back, not at its next renewal.
func TestPreemptNoticeAfterAPubSubReconnect(t *testing.T) {
	ctx := ctxT(t)
	clean := testredis.Client(t)
	prefix := testredis.Prefix(t, clean)
	name := "preempt-" + strings.TrimSuffix(prefix, ":")
	var blocked atomic.Pointer[chan struct{}]
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), ClientName: name,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if gate := blocked.Load(); gate != nil {
				select {
				case <-*gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = c.Close() })
	a, err := NewRedis(c, WithPrefix(prefix), WithOwner("a"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	b, err := NewRedis(clean, WithPrefix(prefix), WithOwner("b"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })

	l, err := a.TryAcquire(ctx, "k", &AcquireOptions{FollowUp: Preempt{}, TTL: 30 * time.Second})
	require.NoError(t, err)
	be := engineOf(a).b.(*redisBackend)
	be.mu.Lock()
	ready := be.subs[be.keys("k").channel].ready
	be.mu.Unlock()
	<-ready

	// The pub/sub connection drops and cannot come back yet.
	gate := make(chan struct{})
	blocked.Store(&gate)
	clients, err := clean.ClientList(ctx).Result()
	require.NoError(t, err)
	killed := 0
	for _, line := range strings.Split(clients, "\n") {
		if strings.Contains(line, " name="+name+" ") && !strings.Contains(line, " sub=0 ") {
			id := strings.TrimPrefix(strings.Fields(line)[0], "id=")
			require.NoError(t, clean.Do(ctx, "CLIENT", "KILL", "ID", id).Err())
			killed++
		}
	}
	require.Equal(t, 1, killed, "a's pub/sub connection")

	newer := make(chan error, 1)
	go func() {
		n, err := b.Acquire(ctx, "k", &AcquireOptions{FollowUp: Preempt{Grace: 5 * time.Second}})
		if err == nil {
			err = n.Release(context.Background())
		}
		newer <- err
	}()
	require.Eventually(t, func() bool {
		info, err := b.Inspect(ctx, "k")
		return err == nil && info.Waiters == 1
	}, 5*time.Second, time.Millisecond, "the newer acquire preempted l while a could not hear it")
	blocked.Store(nil)
	close(gate)
	preemptedWithin(t, l, 3*time.Second)
	require.ErrorIs(t, l.Release(ctx), ErrNotHeld)
	require.NoError(t, <-newer)
}
