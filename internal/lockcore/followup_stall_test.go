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

// stallCase is what happens while a waiting follow-up (order 7, or none)
// stalls past its waiter TTL, with the key free: during runs then, given
// the follow-up's FollowUp of an order, and returns what is to be released
// once the stalled call ended. superseded says how that call ends.
type stallCase struct {
	name       string
	ordered    bool // only for a follow-up with an order
	during     func(t *testing.T, ctx context.Context, other Locker, mode func(int64) FollowUp, order int64) (release []*Lease, before func())
	superseded bool
}

// A waiting KeepNewest or Preempt follow-up whose process stalls for longer
// than its waiter TTL (its waiter record expires meanwhile) is still the
// key's follow-up when no newer call came: its next attempt takes the key
// instead of giving up as superseded. A newer follow-up that took the key
// meanwhile supersedes it as before; an older one (by order) that took its
// place, waiting or running, gives it back.
func TestFollowUpOutlivesAStallLongerThanItsWaiterTTL(t *testing.T) {
	acquire := func(t *testing.T, ctx context.Context, l Locker, f FollowUp) *Lease {
		lease, err := l.Acquire(ctx, "k", &AcquireOptions{FollowUp: f, TTL: 30 * time.Second})
		require.NoError(t, err)
		return lease
	}
	cases := []stallCase{
		{name: "alone", during: func(*testing.T, context.Context, Locker, func(int64) FollowUp, int64) ([]*Lease, func()) {
			return nil, nil
		}},
		{name: "newer ran", superseded: true, during: func(t *testing.T, ctx context.Context, other Locker, mode func(int64) FollowUp, order int64) ([]*Lease, func()) {
			next := order // by its order, or by its arrival
			if next > 0 {
				next++
			}
			return []*Lease{acquire(t, ctx, other, mode(next))}, nil
		}},
		{name: "older ran", ordered: true, during: func(t *testing.T, ctx context.Context, other Locker, mode func(int64) FollowUp, order int64) ([]*Lease, func()) {
			older := acquire(t, ctx, other, mode(order-1))
			// The stalled call waits for it: its release comes after.
			return nil, func() { require.NoError(t, older.Release(ctx)) }
		}},
		{name: "older waits", ordered: true, during: func(t *testing.T, ctx context.Context, other Locker, mode func(int64) FollowUp, order int64) ([]*Lease, func()) {
			plain, err := other.TryAcquire(ctx, "k", &AcquireOptions{TTL: 30 * time.Second})
			require.NoError(t, err)
			olderDone := make(chan error, 1)
			go func() {
				l, err := other.Acquire(ctx, "k", &AcquireOptions{FollowUp: mode(order - 1), TTL: 30 * time.Second})
				if err == nil {
					err = l.Release(ctx)
				}
				olderDone <- err
			}()
			k := engineOf(other).b.(*redisBackend).keys("k")
			require.Eventually(t, func() bool {
				o, err := engineOf(other).b.(*redisBackend).c.HGet(ctx, k.follow, "o").Result()
				return err == nil && o == fmt.Sprint(order-1)
			}, 5*time.Second, time.Millisecond)
			return nil, func() {
				// The older call gives up once the stalled one is back.
				require.ErrorIs(t, <-olderDone, ErrSuperseded)
				_ = plain.Release(ctx) // a preempted lease may report it lost
			}
		}},
	}
	modes := []func(order int64) FollowUp{
		func(order int64) FollowUp { return Preempt{Order: order} },
		func(order int64) FollowUp { return KeepNewest{Order: order} },
	}
	for _, mode := range modes {
		for _, order := range []int64{0, 7} {
			for _, tc := range cases {
				if tc.ordered && order == 0 {
					continue
				}
				t.Run(fmt.Sprintf("%T/order=%d/%s", mode(0), order, tc.name), func(t *testing.T) {
					testFollowUpStall(t, mode, order, tc)
				})
			}
		}
	}
}

func testFollowUpStall(t *testing.T, mode func(order int64) FollowUp, order int64, tc stallCase) {
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
	other, err := NewRedis(clean, WithPrefix(prefix), WithOwner("other"), WithPollInterval(poll))
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
	release, before := tc.during(t, ctx, other, mode, order)
	close(resume)
	if before != nil {
		before()
	}
	r := <-done
	for _, l := range release {
		require.NoError(t, l.Release(ctx))
	}
	if tc.superseded {
		require.ErrorIs(t, r.err, ErrSuperseded)
		return
	}
	require.NoError(t, r.err, "the stalled follow-up was the newest: it takes the key")
	require.NoError(t, r.l.Release(ctx))
}
