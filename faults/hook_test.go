//go:build faults

package faults_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/debounce"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/internal/throttle"
)

// leaseSet is the leases a Locker handed out in one scenario.
type leaseSet struct {
	mu     sync.Mutex
	leases []*lockcore.Lease
	kept   map[int64]bool // tokens of holders that stay by design (HoldAtLeast)
}

// keep records that the holder with token stays on the key by design.
func (s *leaseSet) keep(token int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kept == nil {
		s.kept = map[int64]bool{}
	}
	s.kept[token] = true
}

func (s *leaseSet) add(l *lockcore.Lease) *lockcore.Lease {
	if l != nil {
		s.mu.Lock()
		s.leases = append(s.leases, l)
		s.mu.Unlock()
	}
	return l
}

// held returns the tokens of the leases that still count as held.
func (s *leaseSet) held() map[int64]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int64]bool{}
	for tok := range s.kept {
		out[tok] = true
	}
	for _, l := range s.leases {
		select {
		case <-l.Lost():
			continue
		default:
		}
		if ctx, cancel := l.Context(context.Background()); ctx.Err() == nil {
			out[l.Token()] = true
			cancel()
		} else {
			cancel()
		}
	}
	return out
}

// faultOp is one lockkit operation run while its command suffers a fault.
type faultOp struct {
	name  string
	match func(redis.Cmder) bool
	// run performs the operation on l (whose client is faulted once armed);
	// other is a Locker on a clean client.
	run func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error
}

var (
	acquireCmd = testredis.ScriptShape(8, 20)
	releaseCmd = testredis.ScriptShape(8, 11)
	// A plain acquire and its release use the plain form of the key.
	plainAcquireCmd = testredis.ScriptShape(1, 2) // as claim's: no op calls both
	plainReleaseCmd = testredis.ScriptShape(2, 3)
	extendCmd       = testredis.ScriptShape(2, 4)
	inspectCmd      = testredis.ScriptShape(3, 1)
	freeCmd         = testredis.ScriptShape(4, 3)
	cancelCmd       = testredis.ScriptShape(2, 5)
	throttleCmd     = testredis.ScriptShape(3, 6)
	detachCmd       = testredis.ScriptShape(2, 3) // as the plain release's: no op calls both
	debounceCmd     = testredis.ScriptShape(1, 4)
	claimCmd        = testredis.ScriptShape(1, 2)
	evictCmd        = testredis.ScriptShape(3, 7)
)

const faultKey = "job"

var faultOps = []faultOp{
	{"acquire", plainAcquireCmd, acquireOp(nil)},
	{"acquire-limit", acquireCmd, acquireOp(&lockcore.AcquireOptions{Limit: 2})},
	{"acquire-coalesce", acquireCmd, acquireOp(&lockcore.AcquireOptions{FollowUp: lockcore.Coalesce{}})},
	{"acquire-park", acquireCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		got.add(must(other.TryAcquire(context.Background(), faultKey, nil)))
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		// As singleton.ParkAtEnqueue parks a task: a reservation if the key
		// is free, else a place in its parked queue.
		_, err := l.TryAcquire(ctx, faultKey, &lockcore.AcquireOptions{Label: "j1", Reserve: true, Park: &lockcore.Parking{ID: "p1"}})
		var ce *lockcore.ConflictError
		if errors.As(err, &ce) {
			require.Zero(t, ce.Parked, "parked first")
			err = nil
		}
		// However its reply fared, the call parked once: one job is ahead
		// of the next.
		_, perr := other.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{Label: "j2", Reserve: true, Park: &lockcore.Parking{ID: "p2"}})
		require.ErrorAs(t, perr, &ce)
		require.Equal(t, 1, ce.Parked, "p1 is parked exactly once")
		return err
	}},
	{"acquire-supersede-park", acquireCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		got.add(must(other.TryAcquire(context.Background(), faultKey, nil)))
		follow := func(label string) *lockcore.AcquireOptions {
			return &lockcore.AcquireOptions{Label: label, FollowUp: lockcore.KeepNewest{}, TakeReservation: true, Park: &lockcore.Parking{ID: "p-" + label}}
		}
		var ce *lockcore.ConflictError
		_, err := other.TryAcquire(context.Background(), faultKey, follow("j1"))
		require.ErrorAs(t, err, &ce)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		// As a KeepNewest task parks as its key's follow-up.
		_, err = l.TryAcquire(ctx, faultKey, follow("j2"))
		if errors.As(err, &ce) {
			require.Equal(t, "p-j1", ce.Superseded, "a repeated reply still names whom the call replaced")
			err = nil
		}
		// However its reply fared, j2 replaced j1 once: j1 gives up once.
		hook.Disarm()
		info, ierr := other.Inspect(context.Background(), faultKey)
		require.NoError(t, ierr)
		require.Equal(t, 1, info.Parked, "only j2 is parked")
		_, serr := other.TryAcquire(context.Background(), faultKey, follow("j1"))
		require.ErrorIs(t, serr, lockcore.ErrSuperseded)
		_, serr = other.TryAcquire(context.Background(), faultKey, follow("j1"))
		require.ErrorAs(t, serr, &ce, "j1 gave up once")
		require.Equal(t, "p-j2", ce.Superseded)
		return err
	}},
	{"acquire-superseded", acquireCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		got.add(must(other.TryAcquire(context.Background(), faultKey, nil)))
		follow := func(label string) *lockcore.AcquireOptions {
			return &lockcore.AcquireOptions{Label: label, FollowUp: lockcore.KeepNewest{}, TakeReservation: true, Park: &lockcore.Parking{ID: "p-" + label}}
		}
		for _, j := range []string{"j1", "j2"} {
			_, err := other.TryAcquire(context.Background(), faultKey, follow(j))
			require.ErrorIs(t, err, lockcore.ErrNotAcquired, "%s parks", j)
		}
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		// j2 replaced j1: j1's next acquire gives up, and so does a repeat
		// of that call (a conflict here fails the row).
		_, err := l.TryAcquire(ctx, faultKey, follow("j1"))
		if errors.Is(err, lockcore.ErrSuperseded) {
			err = nil
		}
		return err
	}},
	{"throttle", throttleCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := startsOf(t, l, 2, time.Minute).Take(ctx, faultKey)
		// However its reply fared, the call took one start: one is left.
		wait, cerr := startsOf(t, other, 2, time.Minute).Take(context.Background(), faultKey)
		require.NoError(t, cerr)
		require.Zero(t, wait, "a repeated or lost reply took a second start")
		wait, cerr = startsOf(t, other, 2, time.Minute).Take(context.Background(), faultKey)
		require.NoError(t, cerr)
		require.Positive(t, wait)
		return err
	}},
	{"throttle-reserve", throttleCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := startsOf(t, l, 2, time.Minute).Reserve(ctx, faultKey, "s1")
		// However its reply fared, the call reserved at most one start, and
		// taking it spends one.
		wait, cerr := startsOf(t, other, 2, time.Minute).Start(context.Background(), faultKey, "s1")
		require.NoError(t, cerr)
		require.Zero(t, wait)
		wait, cerr = startsOf(t, other, 2, time.Minute).Take(context.Background(), faultKey)
		require.NoError(t, cerr)
		require.Zero(t, wait, "a repeated or lost reply reserved a second start")
		wait, cerr = startsOf(t, other, 2, time.Minute).Take(context.Background(), faultKey)
		require.NoError(t, cerr)
		require.Positive(t, wait)
		return err
	}},
	{"throttle-turn", throttleCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		_, err := startsOf(t, l, 1, time.Minute).Start(context.Background(), faultKey, "s0")
		require.NoError(t, err)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err = startsOf(t, l, 1, time.Minute).ReserveInTurn(ctx, faultKey, "s1", "T")
		// However its reply fared, the call booked the turn once and
		// reserved nothing: the start is spent, and once it is given back
		// the turn is ahead of newcomers and gets it.
		starts := startsOf(t, other, 1, time.Minute)
		require.NoError(t, starts.Return(context.Background(), faultKey, "s0"))
		wait, cerr := starts.Take(context.Background(), faultKey)
		require.NoError(t, cerr)
		require.Positive(t, wait, "the turn is booked")
		wait, cerr = starts.ReserveInTurn(context.Background(), faultKey, "s2", "T")
		require.NoError(t, cerr)
		require.Zero(t, wait, "the turn's next try reserves the start")
		wait, cerr = starts.Take(context.Background(), faultKey)
		require.NoError(t, cerr)
		require.Positive(t, wait, "a repeated or lost reply reserved a second start")
		return err
	}},
	{"free", freeCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		_, err := other.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{Label: "q/t1", Reserve: true})
		require.NoError(t, err)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err = l.ForceRelease(ctx, faultKey, lockcore.Select{Label: "q/t1"})
		return err
	}},
	{"acquire-wait", acquireCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		holder, err := other.TryAcquire(context.Background(), faultKey, nil)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			// With an epoch the waiter is woken to try again, not handed
			// the key by the release (release-handover covers that).
			lease, err := l.Acquire(ctx, faultKey, &lockcore.AcquireOptions{Epoch: 1})
			got.add(lease)
			done <- err
		}()
		// The waiter's first attempt finds the key held and queues it; a
		// second, right after it subscribed to releases, finds it still held.
		// Arm only then, between attempts: an attempt in flight while the key
		// is released could take it unfaulted.
		require.Eventually(t, func() bool { return hook.Done() >= 2 }, 5*time.Second, time.Millisecond)
		i, err := other.Inspect(context.Background(), faultKey)
		require.NoError(t, err)
		require.Equal(t, 1, i.Waiters)
		hook.Arm(f, 1) // the attempt after the wake-up
		require.NoError(t, holder.Release(context.Background()))
		return <-done
	}},
	{"acquire-preempt", acquireCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		pre := &lockcore.AcquireOptions{FollowUp: lockcore.Preempt{}}
		holder, err := other.TryAcquire(context.Background(), faultKey, pre)
		require.NoError(t, err)
		ran := make(chan error, 1)
		go func() {
			ran <- holder.Run(context.Background(), func(ctx context.Context) error {
				<-ctx.Done()
				return context.Cause(ctx)
			})
		}()
		hook.Arm(f, 1) // the first attempt, which preempts
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lease, err := l.Acquire(ctx, faultKey, pre)
		got.add(lease)
		// However the reply fared, the script ran: the holder was preempted
		// once, and nothing else was.
		require.ErrorIs(t, <-ran, lockcore.ErrPreempted)
		return err
	}},
	{"debounce", debounceCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		r, err := requestsOf(t, l).Debounce(ctx, faultKey, "t1", time.Second, 0)
		// However its reply fared, the call recorded one request: asking
		// again with the same id is the same request, and a later one is
		// newer and the only one claimed.
		again, aerr := requestsOf(t, other).Debounce(context.Background(), faultKey, "t1", time.Second, 0)
		require.NoError(t, aerr)
		if err == nil {
			require.Equal(t, r.Gen, again.Gen)
		}
		newer, nerr := requestsOf(t, other).Debounce(context.Background(), faultKey, "t2", time.Second, 0)
		require.NoError(t, nerr)
		require.Greater(t, newer.Gen, again.Gen)
		_, ok, cerr := requestsOf(t, other).Claim(context.Background(), faultKey, again.Gen, false)
		require.NoError(t, cerr)
		require.False(t, ok)
		_, ok, cerr = requestsOf(t, other).Claim(context.Background(), faultKey, newer.Gen, false)
		require.NoError(t, cerr)
		require.True(t, ok)
		return err
	}},
	{"claim", claimCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		older, err := requestsOf(t, other).Debounce(context.Background(), faultKey, "t1", time.Second, 0)
		require.NoError(t, err)
		newest, err := requestsOf(t, other).Debounce(context.Background(), faultKey, "t2", time.Second, 0)
		require.NoError(t, err)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, ok, err := requestsOf(t, l).Claim(ctx, faultKey, newest.Gen, false)
		if err == nil {
			require.True(t, ok)
		}
		// However its reply fared, the newest request is claimed once, and
		// the older one gives way to it.
		n, ok, cerr := requestsOf(t, other).Claim(context.Background(), faultKey, older.Gen, false)
		require.NoError(t, cerr)
		require.False(t, ok)
		require.True(t, n.Claimed)
		return err
	}},
	{"force-release", evictCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		holder, err := other.TryAcquire(context.Background(), faultKey, nil)
		require.NoError(t, err)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		n, err := l.ForceRelease(ctx, faultKey, lockcore.Select{})
		if err == nil {
			require.Equal(t, 1, n, "a repeated call reports the first run's count")
		}
		// However its reply fared, the holder is gone and cannot renew.
		info, ierr := other.Inspect(context.Background(), faultKey)
		require.NoError(t, ierr)
		require.Empty(t, info.Holders)
		require.ErrorIs(t, holder.Extend(context.Background(), 0), lockcore.ErrNotHeld)
		return err
	}},
	{"force-release-token", evictCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		holder, err := other.TryAcquire(context.Background(), faultKey, nil)
		require.NoError(t, err)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		// A repeated call finds its first run's record: no error that the
		// holder is gone.
		_, err = l.ForceRelease(ctx, faultKey, lockcore.Select{Token: holder.Token()})
		require.NotErrorIs(t, err, lockcore.ErrNotHeld)
		// However its reply fared, the holder is gone and learns why.
		info, ierr := other.Inspect(context.Background(), faultKey)
		require.NoError(t, ierr)
		require.Empty(t, info.Holders)
		xerr := holder.Extend(context.Background(), 0)
		require.ErrorIs(t, xerr, lockcore.ErrNotHeld)
		require.ErrorContains(t, xerr, "released by an operator")
		return err
	}},
	{"cancel-run", cancelCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		holder, err := other.TryAcquire(context.Background(), faultKey, nil)
		require.NoError(t, err)
		hctx, hcancel := holder.Context(context.Background())
		defer hcancel()
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		// A repeated call finds its first run's record: the same count.
		n, err := l.CancelRun(ctx, faultKey, lockcore.Select{Token: holder.Token()})
		if err == nil {
			require.Equal(t, 1, n, "a repeated call reports the first run's count")
		}
		// However its reply fared, the run is asked to stop and still holds
		// the key until it returns; its release hands the key on.
		select {
		case <-hctx.Done():
			require.ErrorIs(t, context.Cause(hctx), lockcore.ErrCancelled)
		case <-time.After(2 * time.Second):
			t.Fatal("the run's ctx was not cancelled")
		}
		info, ierr := other.Inspect(context.Background(), faultKey)
		require.NoError(t, ierr)
		require.Len(t, info.Holders, 1)
		require.True(t, info.Holders[0].Cancelling)
		require.NoError(t, holder.Release(context.Background()))
		info, ierr = other.Inspect(context.Background(), faultKey)
		require.NoError(t, ierr)
		require.Empty(t, info.Holders, "the run's release frees the key")
		return err
	}},
	{"release", plainReleaseCmd, releaseOp(nil)},
	{"release-limit", releaseCmd, releaseOp(&lockcore.AcquireOptions{Limit: 2})},
	{"release-promoted", releaseCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		// Taken in the plain form; a conflicting acquire with a limit turns
		// the key into the sorted set, so the release goes on to release.lua.
		lease, err := l.TryAcquire(context.Background(), faultKey, nil)
		require.NoError(t, err)
		_, err = other.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{Limit: 1, Fair: true})
		require.ErrorIs(t, err, lockcore.ErrNotAcquired)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return lease.Release(ctx)
	}},
	{"release-handover", releaseCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		lease, err := l.TryAcquire(context.Background(), faultKey, nil)
		require.NoError(t, err)
		wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer wcancel()
		handed := make(chan error, 1)
		go func() {
			w, err := other.Acquire(wctx, faultKey, nil)
			got.add(w)
			handed <- err
		}()
		require.Eventually(t, func() bool {
			i, err := other.Inspect(context.Background(), faultKey)
			require.NoError(t, err)
			return i.Waiters == 1
		}, 5*time.Second, time.Millisecond)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err = lease.Release(ctx)
		// However the reply fared, the release handed the key to the waiter
		// once, or its cleanup woke it to take the key.
		require.NoError(t, <-handed)
		return err
	}},
	{"release-park", releaseCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		var mu sync.Mutex
		var resumed []string
		lease, err := l.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{Label: "j0", Park: &lockcore.Parking{OnParked: func(_, id string) {
			mu.Lock()
			resumed = append(resumed, id)
			mu.Unlock()
		}}})
		require.NoError(t, err)
		for _, j := range []string{"1", "2"} {
			_, err := other.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{Label: "j" + j, Reserve: true, Park: &lockcore.Parking{ID: "p" + j}})
			require.ErrorIs(t, err, lockcore.ErrNotAcquired)
		}
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err = lease.Release(ctx)
		// However the reply fared, the key was reserved once, for the oldest
		// parked job, and only that job was resumed.
		var res lockcore.Holder
		require.Eventually(t, func() bool {
			info, ierr := other.Inspect(context.Background(), faultKey)
			require.NoError(t, ierr)
			if len(info.Holders) != 1 {
				return false
			}
			res = info.Holders[0]
			return true
		}, 5*time.Second, time.Millisecond)
		require.Equal(t, "j1", res.Label, "reserved for the oldest parked job")
		got.keep(res.Token)
		require.NoError(t, l.Close(context.Background())) // waits for OnParked and the cleanup
		info, err2 := other.Inspect(context.Background(), faultKey)
		require.NoError(t, err2)
		require.Equal(t, []lockcore.Holder{res}, clearTTL(info.Holders, res.TTL), "the cleanup of a failed release reserved nothing more")
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			require.Equal(t, []string{"p1"}, resumed)
		} else {
			require.Subset(t, []string{"p1"}, resumed)
		}
		return err
	}},
	{"release-hold", releaseCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		lease, err := l.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{HoldAtLeast: time.Minute})
		require.NoError(t, err)
		got.keep(lease.Token())
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err = lease.Release(ctx)
		// However the reply fared (and after the background cleanup of a
		// failed release), the key stays held for the minute.
		require.Never(t, func() bool {
			taken, err := other.TryAcquire(context.Background(), faultKey, nil)
			if err == nil {
				_ = taken.Release(context.Background())
			}
			return err == nil
		}, 200*time.Millisecond, 5*time.Millisecond, "the hold outlives the release and its cleanup")
		return err
	}},
	{"detach", detachCmd, func(t *testing.T, l, other *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		lease, err := l.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{Label: "q/t1"})
		require.NoError(t, err)
		got.keep(lease.Token())
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err = lease.Reserve(ctx, time.Minute)
		// However the reply fared, the key is now a reservation for a minute
		// that the task's label can adopt.
		info, ierr := other.Inspect(context.Background(), faultKey)
		require.NoError(t, ierr)
		require.Len(t, info.Holders, 1)
		require.Equal(t, "q/t1", info.Holders[0].Label)
		require.Greater(t, info.Holders[0].TTL, 30*time.Second, "the reservation's TTL, not the lease's")
		return err
	}},
	{"extend", extendCmd, func(t *testing.T, l, _ *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		lease := got.add(must(l.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{NoRenew: true, TTL: 5 * time.Second})))
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return lease.Extend(ctx, 10*time.Second)
	}},
	{"renewal", extendCmd, func(t *testing.T, l, _ *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		got.add(must(l.TryAcquire(context.Background(), faultKey, &lockcore.AcquireOptions{TTL: 900 * time.Millisecond})))
		require.Eventually(t, func() bool { return hook.Hits() == 1 }, 5*time.Second, time.Millisecond)
		return nil
	}},
	{"inspect", inspectCmd, func(t *testing.T, l, _ *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		got.add(must(l.TryAcquire(context.Background(), faultKey, nil)))
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := l.Inspect(ctx, faultKey)
		return err
	}},
	{"close", plainReleaseCmd, func(t *testing.T, l, _ *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		for i := range 3 {
			must(l.TryAcquire(context.Background(), fmt.Sprint(faultKey, i), nil))
		}
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return l.Close(ctx)
	}},
}

// acquireOp takes the key with opt while the acquire is faulted.
func acquireOp(opt *lockcore.AcquireOptions) func(t *testing.T, l, _ *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
	return func(t *testing.T, l, _ *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		lease, err := l.TryAcquire(ctx, faultKey, opt)
		got.add(lease)
		return err
	}
}

// releaseOp releases a lease taken with opt while the release is faulted.
func releaseOp(opt *lockcore.AcquireOptions) func(t *testing.T, l, _ *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
	return func(t *testing.T, l, _ *lockcore.RedisLocker, hook *testredis.Faults, got *leaseSet) error {
		f := pendingFault(hook)
		hook.Disarm()
		lease, err := l.TryAcquire(context.Background(), faultKey, opt)
		require.NoError(t, err)
		hook.Arm(f, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return lease.Release(ctx)
	}
}

// clearTTL returns hs with every TTL set to ttl, to compare holders.
func clearTTL(hs []lockcore.Holder, ttl time.Duration) []lockcore.Holder {
	out := make([]lockcore.Holder, len(hs))
	for i, h := range hs {
		h.TTL = ttl
		out[i] = h
	}
	return out
}

func must(l *lockcore.Lease, err error) *lockcore.Lease {
	if err != nil {
		panic(err)
	}
	return l
}

// pendingFault returns the fault hook was armed with before the operation
// disarms it to set up.
func pendingFault(hook *testredis.Faults) testredis.Fault { return hook.Pending() }

// Every lockkit operation, with its command repeated, its reply dropped after
// the command ran, or its reply arriving after the caller gave up: once the
// call returns, no holder exists that no Lease represents (beyond one renewal
// interval), no lease is reported lost while Redis is healthy, and a limit-1
// key never has two holders. Batched, the same with the faulty Locker
// batching its calls (WithBatching) while other calls of it keep its lane
// to the key's server busy: the faulted call goes in a pipeline with theirs
// and the fault hits the whole pipeline, as a lost connection would.
func TestOperationsUnderReplyFaults(t *testing.T) {
	var batchedRows, sharedRows atomic.Int64
	for dname, connect := range replyDeployments {
		for _, batched := range []bool{false, true} {
			mode := dname
			if batched {
				mode += "-batched"
			}
			for _, op := range faultOps {
				for _, f := range []testredis.Fault{testredis.Repeat, testredis.DropReply, testredis.Late} {
					t.Run(fmt.Sprintf("%s/%s/%s", mode, op.name, f), func(t *testing.T) {
						faulty, clean := connect(t)
						match := op.match
						if batched {
							match = func(cmd redis.Cmder) bool { return op.match(cmd) && !isSideCall(cmd) }
						}
						hook := &testredis.Faults{Match: match, Delay: 200 * time.Millisecond}
						faulty.AddHook(hook)
						prefix := testredis.Prefix(t, clean)
						lost := make(chan lockcore.Event, 16)
						ttl := 900 * time.Millisecond
						opts := []lockcore.Option{lockcore.WithPrefix(prefix), lockcore.WithTTL(ttl), lockcore.WithOwner("faulty"),
							lockcore.WithObserver(func(e lockcore.Event) {
								if e.Kind == lockcore.LeaseLost {
									lost <- e
								}
							})}
						if batched {
							opts = append(opts, lockcore.WithBatching())
						}
						l, err := lockcore.NewRedis(faulty, opts...)
						require.NoError(t, err)
						defer l.Close(context.Background())
						other, err := lockcore.NewRedis(clean, lockcore.WithPrefix(prefix), lockcore.WithOwner("observer"))
						require.NoError(t, err)
						defer other.Close(context.Background())
						if batched {
							stop := busyLane(t, faulty, l)
							defer stop()
						}

						got := &leaseSet{}
						hook.Arm(f, 1)
						start := time.Now()
						err = op.run(t, l, other, hook, got)
						returned := time.Now()
						require.EqualValues(t, 1, hook.Hits(), "the fault was injected once")
						if err != nil && errors.Is(err, lockcore.ErrNotAcquired) {
							t.Fatalf("a fault was reported as a conflict: %v", err)
						}
						if batched && lockerOp(op.name) {
							batchedRows.Add(1)
							if hook.Carried() > 1 {
								sharedRows.Add(1)
							}
						}

						// No holder that no Lease represents survives one renewal interval.
						keys := []string{faultKey, faultKey + "0", faultKey + "1", faultKey + "2"}
						orphansGone := func() bool {
							held := got.held()
							for _, k := range keys {
								info, err := other.Inspect(context.Background(), k)
								require.NoError(t, err)
								if len(info.Holders) > 1 {
									t.Fatalf("%q has %d holders", k, len(info.Holders))
								}
								for _, h := range info.Holders {
									if !held[h.Token] {
										return false
									}
								}
							}
							return true
						}
						require.Eventually(t, orphansGone, ttl/3, time.Millisecond, "a holder no Lease represents survived a renewal interval")
						cleaned := time.Since(returned)

						// A held lease keeps the key: nobody else gets it.
						for tok := range got.held() {
							_, err := other.TryAcquire(context.Background(), faultKey, nil)
							require.ErrorIs(t, err, lockcore.ErrNotAcquired, "token %d is held", tok)
						}
						select {
						case e := <-lost:
							t.Fatalf("lease %q lost while Redis was healthy: %v", e.Key, e.Err)
						default:
						}
						t.Logf("%s %s %s: call %s (err %v), state consistent %s after it returned, %d lease(s) held, the faulted round trip carried %d command(s)",
							mode, op.name, f, returned.Sub(start).Round(time.Millisecond), err, cleaned.Round(time.Millisecond), len(got.held()), hook.Carried())
					})
				}
			}
		}
	}
	// Whether a call finds its lane busy is up to timing, and a call that
	// Redis answered NOSCRIPT is sent again alone; the faulted Locker call
	// of most batched rows went in a pipeline with other calls.
	if n := batchedRows.Load(); n >= 20 {
		t.Logf("batched: the faulted Locker call shared its round trip in %d of %d rows", sharedRows.Load(), n)
		require.GreaterOrEqual(t, sharedRows.Load()*4, n*3, "the faulted calls of most batched rows went in a pipeline with others")
	}
}

// lockerOp tells whether the fault operation name faults a call of the
// Locker (not one of the throttle's or the debouncer's, which share no
// lane).
func lockerOp(name string) bool {
	return !strings.HasPrefix(name, "throttle") && name != "debounce" && name != "claim"
}

// sideKeys is how many keys busyLane's calls read, each in a goroutine of
// its own.
const sideKeys = 4

// isSideCall tells whether cmd is a script call of busyLane's.
func isSideCall(cmd redis.Cmder) bool {
	a := cmd.Args()
	return len(a) > 3 && strings.Contains(fmt.Sprint(a[3]), "{side-")
}

// busyLane keeps l's lane to the server of faultKey's records busy until
// stop is called: sideKeys goroutines Inspect keys on that server, one
// call after another, each round trip of theirs a millisecond long (as
// over a network), so that l's own calls mostly find a call in flight and
// go in the next pipeline, with theirs.
func busyLane(t *testing.T, c redis.UniversalClient, l *lockcore.RedisLocker) (stop func()) {
	t.Helper()
	var keys []string
	if cc, ok := c.(*redis.ClusterClient); ok {
		want, err := cc.MasterForKey(context.Background(), "{"+faultKey+"}")
		require.NoError(t, err)
		for i := 0; len(keys) < sideKeys; i++ {
			m, err := cc.MasterForKey(context.Background(), fmt.Sprint("{side-", i, "}"))
			require.NoError(t, err)
			if m.Options().Addr == want.Options().Addr {
				keys = append(keys, fmt.Sprint("side-", i))
			}
		}
	} else {
		for i := range sideKeys {
			keys = append(keys, fmt.Sprint("side-", i))
		}
	}
	c.AddHook(slowSide{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, k := range keys {
		_, err := l.Inspect(ctx, k) // the script is loaded
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, _ = l.Inspect(ctx, k)
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// slowSide makes every round trip that carries a busyLane call take a
// millisecond more.
type slowSide struct{}

func (slowSide) DialHook(next redis.DialHook) redis.DialHook { return next }

func (slowSide) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isSideCall(cmd) {
			time.Sleep(time.Millisecond)
		}
		return next(ctx, cmd)
	}
}

func (slowSide) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if isSideCall(c) {
				time.Sleep(time.Millisecond)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// startsOf returns the Throttle of n starts per period on l's Redis and
// prefix.
func startsOf(t *testing.T, l *lockcore.RedisLocker, n int, period time.Duration) *throttle.Throttle {
	t.Helper()
	client, prefix := l.Redis()
	th, err := throttle.New(client, n, period, throttle.WithPrefix(prefix))
	require.NoError(t, err)
	return th
}

// requestsOf returns the Debouncer on l's Redis and prefix.
func requestsOf(t *testing.T, l *lockcore.RedisLocker) *debounce.Debouncer {
	t.Helper()
	client, prefix := l.Redis()
	d, err := debounce.New(client, debounce.WithPrefix(prefix))
	require.NoError(t, err)
	return d
}
