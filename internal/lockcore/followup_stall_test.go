package lockcore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// A waiting KeepNewest or Preempt follow-up whose process stalls for longer
// than its waiter TTL (its waiter record expires meanwhile) is still the
// key's follow-up when no newer call came: its next attempt takes the key
// instead of giving up as superseded. When a newer follow-up came and took
// the key during the stall, the stalled call gives up as before.
func TestFollowUpOutlivesAStallLongerThanItsWaiterTTL(t *testing.T) {
	const grace = 50 * time.Millisecond
	modes := []func(order int64) FollowUp{
		func(order int64) FollowUp { return Preempt{Order: order, Grace: grace} },
		func(order int64) FollowUp { return KeepNewest{Order: order} },
	}
	for _, mode := range modes {
		for _, order := range []int64{0, 7} {
			for _, newer := range []bool{false, true} {
				name := fmt.Sprintf("%T/order=%d/newer=%v", mode(0), order, newer)
				t.Run(name, func(t *testing.T) {
					testFollowUpStall(t, mode, order, newer)
				})
			}
		}
	}
}

func testFollowUpStall(t *testing.T, mode func(order int64) FollowUp, order int64, newer bool) {
	ctx := ctxT(t)
	clean := testredis.Client(t)
	prefix := testredis.Prefix(t, clean)
	// The stall: the waiter's next acquire script, once armed, waits for
	// resume before it is sent.
	var armed atomic.Bool
	stalled, resume := make(chan struct{}), make(chan struct{})
	isAcquire := anyScript(acquireSources()...)
	stall := beforeHook(func(cmds []redis.Cmder) {
		if len(cmds) == 1 && isAcquire(cmds[0]) && armed.CompareAndSwap(true, false) {
			close(stalled)
			<-resume
		}
	})
	const poll = 20 * time.Millisecond // a waiter TTL of 80ms
	waiter, err := NewRedis(hookedClient(t, stall), WithPrefix(prefix), WithOwner("waiter"), WithPollInterval(poll))
	require.NoError(t, err)
	t.Cleanup(func() { _ = waiter.Close(context.Background()) })
	other, err := NewRedis(clean, WithPrefix(prefix), WithOwner("other"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close(context.Background()) })
	k := engineOf(waiter).b.(*redisBackend).keys("k")

	held, err := other.TryAcquire(ctx, "k", &AcquireOptions{TTL: 30 * time.Second})
	require.NoError(t, err)
	type result struct {
		l   *Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "k", &AcquireOptions{FollowUp: mode(order), TTL: 30 * time.Second})
		done <- result{l, err}
	}()
	// The waiter is the key's follow-up; then its next attempt stalls.
	require.Eventually(t, func() bool {
		p, err := clean.HGet(ctx, k.follow, "p").Result()
		return err == nil && p != ""
	}, 5*time.Second, time.Millisecond)
	armed.Store(true)
	select {
	case <-stalled:
	case r := <-done:
		t.Fatalf("the acquire ended before it stalled: %v", r.err)
	}
	_ = held.Release(ctx) // a preempted lease may report it lost
	// The stall outlasts the waiter TTL: the waiter record expired, and the
	// key is free.
	require.Eventually(t, func() bool {
		n, err := clean.Exists(ctx, k.waiters).Result()
		return err == nil && n == 0 && len(holders(t, other, "k")) == 0
	}, 5*time.Second, time.Millisecond)
	var newest *Lease
	if newer {
		// A newer follow-up (by its order, or by its arrival) takes the
		// key meanwhile.
		next := order
		if next > 0 {
			next++
		}
		newest, err = other.Acquire(ctx, "k", &AcquireOptions{FollowUp: mode(next), TTL: 30 * time.Second})
		require.NoError(t, err)
	}
	close(resume)
	r := <-done
	if newer {
		require.ErrorIs(t, r.err, ErrSuperseded)
		require.NoError(t, newest.Release(ctx))
		return
	}
	require.NoError(t, r.err, "the stalled follow-up was the newest: it takes the key")
	require.NoError(t, r.l.Release(ctx))
}
