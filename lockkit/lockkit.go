package lockkit

import (
	"context"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

func init() {
	lockcore.SetUnwrap(func(l any) (*lockcore.RedisLocker, bool) {
		rl, ok := l.(*Locker)
		if !ok || rl == nil {
			return nil, false
		}
		return rl.core, true
	})
}

// Errors returned by lockkit. Compare with errors.Is. The adapters built on
// lockkit (middleware, singleton, cronguard) return the same values.
var (
	// ErrNotAcquired is returned by TryAcquire when the key already has as many
	// holders as its limit allows, and wrapped by Acquire when its ctx ends first.
	// The error is a *ConflictError that names the current holder.
	ErrNotAcquired = lockcore.ErrNotAcquired
	// ErrNotHeld is returned by Release and Extend when the lease is no longer held:
	// it was released already, it expired, or it was lost. It never deletes another
	// owner's lock. ForceRelease returns it when the Select.Token it names is gone.
	ErrNotHeld = lockcore.ErrNotHeld
	// ErrLost is the cause of a lease context's cancellation (context.Cause) when the
	// lease could not be renewed: the key was taken over or deleted, or Redis stayed
	// unreachable until the TTL would have run out.
	ErrLost = lockcore.ErrLost
	// ErrClosed is returned by a Locker after Close, and is the cause (together with
	// ErrLost) of cancelling the contexts of leases that Close released.
	ErrClosed = lockcore.ErrClosed
	// ErrInvalid is wrapped by every validation error; the message names the field
	// and the bad value.
	ErrInvalid = lockcore.ErrInvalid
	// ErrCancelled is the cause (context.Cause) of the cancellation of a
	// lease's contexts when an operator asked its run to stop
	// (Locker.CancelRun). The lease is not lost (it does not match
	// ErrLost): it stays held and renewed, its fencing token valid, until
	// the run returns and releases it, which hands the key on.
	ErrCancelled = lockcore.ErrCancelled
	// ErrUnsupported is returned by the first call of a Locker on a Redis
	// server older than 6.2 (its scripts renew with ZADD GT); the message
	// names the version found.
	ErrUnsupported = lockcore.ErrUnsupported
	// ErrNotReplicated is returned when a lease write was not acknowledged
	// by as many replicas as WithReplicaAcks asks for within its timeout;
	// the message says how many did.
	ErrNotReplicated = lockcore.ErrNotReplicated
)

// ConflictError is returned when a key has no free holder slot. It matches
// ErrNotAcquired with errors.Is; errors.As finds it in the errors of
// lockkit and of the adapters built on it. Its fields tell who holds the
// key now: Key; Owner, Label, Token and TTL of the holder whose lease runs
// out first (Owner is empty when the slot is free but earlier waiters are
// queued ahead, AcquireOptions.Fair); Holders, the number of live holders;
// Ahead, the number of live fair waiters queued before the caller.
type ConflictError = lockcore.ConflictError

// AcquireOptions are per-acquire settings. A nil *AcquireOptions means all defaults.
type AcquireOptions struct {
	// TTL is how long the lease lives without renewal. Zero means the Locker's
	// default (WithTTL, 30s unless set). Must be between 100ms and 100 years.
	TTL time.Duration
	// RenewInterval is how often the lease is renewed while held. Zero means TTL/3.
	// Must be shorter than TTL.
	RenewInterval time.Duration
	// NoRenew turns auto-renewal off: the lease then lives for TTL unless Extend
	// is called. Defaults to false (renewed until released).
	NoRenew bool
	// Limit is how many holders the key allows at once (a counting semaphore).
	// Zero means 1, a plain lock; it must be at most 10,000, and a negative
	// value is an error. Callers may pass different limits for one key (a
	// rolling deploy that changes it): the key keeps the limit of each live
	// holder, and an acquire is admitted only while the live holders are
	// fewer than its own limit and than the limit of every one of them, so
	// the key never has more holders than the smallest limit among them
	// allows. When the holders with the smaller limit are gone, the larger
	// one applies again; a waiter with the larger limit is never blocked
	// beyond that, and one with the smaller waits until the holders are
	// fewer than its limit. Defaults to 1.
	Limit int
	// Fair makes a waiting Acquire queue in arrival order: a slot goes to the
	// earliest live waiter. A waiter that stops polling (its process died) is
	// dropped from the queue after 4 poll intervals. Callers that do not queue
	// also respect the queue. Defaults to false.
	Fair bool
	// HoldAtLeast keeps the key held for at least this long after the
	// lease was acquired, even when it is released sooner: a release before
	// then leaves the holder in place, no longer renewed, until then. It
	// makes "at most one run per period" of a fast job. Do releases at once
	// when fn fails or panics: failed work holds nothing back. Zero means
	// none; at most 100 years.
	HoldAtLeast time.Duration
	// AsyncRelease makes Do return without waiting for Redis: the lease
	// ends when fn returns (it is no longer renewed, its contexts are
	// cancelled), and its release is sent by the Locker's background
	// releaser within about 1ms plus two round trips, pipelined with other
	// releases; an acquire of the same key by this Locker waits for it.
	// Release stays synchronous. A process that dies before sending leaves
	// the key held until its TTL, as any crash does. Defaults to false.
	AsyncRelease bool
}

// core returns the engine's options for o (nil for nil).
func (o *AcquireOptions) core() *lockcore.AcquireOptions {
	if o == nil {
		return nil
	}
	return &lockcore.AcquireOptions{TTL: o.TTL, RenewInterval: o.RenewInterval, NoRenew: o.NoRenew,
		Limit: o.Limit, Fair: o.Fair, HoldAtLeast: o.HoldAtLeast, AsyncRelease: o.AsyncRelease}
}

// Select selects the live holders of a key that Locker.ForceRelease and
// Locker.CancelRun act on. The zero Select selects every holder; at most
// one field may be set (ErrInvalid otherwise).
type Select struct {
	// Owner, when not empty, selects the holders of that owner id.
	Owner string
	// Token, when not zero, selects the one holder with that fencing token:
	// the holder an operator saw (Inspect), not whoever holds the key by
	// the time the operator confirms. Must not be negative.
	Token int64
}

// Info describes a key's state, as returned by Inspect.
type Info struct {
	Key     string
	Holders []Holder
	// Waiters is the number of live callers waiting in Acquire.
	Waiters int
}

// Holder is one live lease on a key.
type Holder struct {
	Owner string
	Token int64
	TTL   time.Duration
	// Label names the work of a holder that an adapter (middleware,
	// singleton, cronguard) took, such as a task ID; empty for a lease of
	// this package.
	Label string
	// Reserved is true for a reservation that an adapter holds for work
	// that no process runs yet (a queued task); false for a run.
	Reserved bool
	// Cancelling is true when an operator asked the holder's run to stop
	// (Locker.CancelRun): the key stays held until the run returns.
	// CancelAge is how long ago that was (server time); zero when not
	// Cancelling.
	Cancelling bool
	CancelAge  time.Duration
}

// Do acquires key on l (waiting, bounded by ctx), runs fn under the lease and
// releases it when fn returns or panics. fn's ctx is cancelled with a cause
// matching ErrLost if the lease is lost, and carries the lease
// (LeaseFromContext). It returns fn's error, else the release's: one
// matching ErrLost (and ErrNotHeld) if the lease was lost while fn ran. A
// lease whose validity ran out before fn could start (the process paused
// right after the acquire) does not start fn: Do returns an error matching
// ErrLost.
func Do(ctx context.Context, l *Locker, key string, opt *AcquireOptions, fn func(context.Context) error) error {
	if l == nil {
		return fmt.Errorf("%w: Do: locker is nil", ErrInvalid)
	}
	lease, err := l.Acquire(ctx, key, opt)
	if err != nil {
		return err
	}
	return lease.c.Run(ctx, fn)
}
