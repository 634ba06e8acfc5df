package lockcore

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// An acquire of a key whose AsyncRelease is still queued does not hold up
// Close: Close sends the queued releases only after the calls in progress
// have ended, so the acquire stops waiting for its own release once Close
// has begun. The race between the releaser and Close is tried at many
// offsets; without the rule, Close hangs within a few hundred tries.
func TestCloseWithAQueuedReleaseAndAnAcquireWaitingForIt(t *testing.T) {
	c := mini(t)
	for i := range 1000 {
		m, err := NewRedis(c)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		l, err := m.TryAcquire(ctx, "k", &AcquireOptions{AsyncRelease: true})
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		acquired := make(chan error, 1)
		go func() {
			<-start
			l2, err := m.Acquire(ctx, "k", nil) // no deadline
			if err == nil {
				_ = l2.Release(ctx)
			}
			acquired <- err
		}()
		closed := make(chan error, 1)
		go func() {
			<-start
			for range i % 64 {
				runtime.Gosched()
			}
			closed <- m.Close(ctx)
		}()
		_ = l.Run(ctx, func(context.Context) error { return nil }) // queues the release
		close(start)
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
			<-acquired
		case <-time.After(5 * time.Second):
			t.Fatalf("try %d: Close hangs", i)
		}
	}
}

// slowExtend delays extend.lua calls before they reach the connection pool
// (a client-side hook, or a busy client, does the same).
type slowExtend struct{}

func (slowExtend) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (slowExtend) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (slowExtend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	is := testredis.IsScript(extendSrc)
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && is(cmds[0]) {
			time.Sleep(2 * time.Millisecond)
		}
		return next(ctx, cmds)
	}
}

// A Lease is safe for concurrent use: a heartbeat goroutine extends the
// lease with the work's context while Run, fn having returned, cancels that
// context and releases. The failing Extend puts the old TTL back while the
// release reads it for its script (-race reports it if that is unguarded).
func TestExtendBesideReleaseIsNoDataRace(t *testing.T) {
	clean := testredis.Client(t)
	c := redis.NewClient(clean.Options())
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(slowExtend{})
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, clean)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		lease, err := l.Acquire(ctx, "k", nil) // not the plain form: release.lua
		require.NoError(t, err)
		var wg sync.WaitGroup
		started := make(chan struct{})
		_ = lease.Run(ctx, func(wctx context.Context) error {
			wg.Add(1)
			go func() { // heartbeat
				defer wg.Done()
				close(started)
				for lease.Extend(wctx, 10*time.Second) == nil {
				}
			}()
			<-started
			time.Sleep(time.Millisecond) // the heartbeat's Extend is on its way
			return nil
		})
		wg.Wait()
	}
}
