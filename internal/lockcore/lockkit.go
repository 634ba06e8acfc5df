package lockcore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Defaults used when an option or field is left at its zero value.
const (
	// DefaultTTL is a lease's time to live when neither WithTTL nor AcquireOptions.TTL sets one.
	DefaultTTL = 30 * time.Second
	// DefaultPrefix is prepended to every Redis key and channel when WithPrefix is not given.
	DefaultPrefix = "jobguard:"
	// CompletedRetention is how long Lease.Run remembers that the work of a
	// labeled lease succeeded after its caller had given up on it.
	CompletedRetention = 24 * time.Hour
	// DefaultCoverFor is how long a Coalesce lease's success is remembered
	// when Coalesce.CoverFor is zero.
	DefaultCoverFor = 24 * time.Hour
	// DefaultParkHold is how long the key is reserved for a parked job
	// when Parking.Hold is zero.
	DefaultParkHold = 5 * time.Second
	// DefaultPollInterval bounds how long a waiter sleeps between attempts when no
	// release notification reaches it (a missed wake-up or a holder that died).
	DefaultPollInterval = 250 * time.Millisecond
	// DefaultRenewBatch is how many renewals the renewer pipelines in one round trip.
	DefaultRenewBatch = 1000
	// MinTTL is the shortest lease TTL accepted: anything shorter cannot be renewed
	// reliably over a network.
	MinTTL = 100 * time.Millisecond
	// MaxTTL is the longest TTL, EpochTTL or Complete keep accepted (100 years
	// of 365 days): longer values would not fit Redis' expiry arithmetic. Both
	// Lockers reject a longer value with ErrInvalid.
	MaxTTL = 100 * 365 * 24 * time.Hour
	// MaxEpochTag is the longest AcquireOptions.EpochTag accepted, in bytes.
	MaxEpochTag = 64
	// MaxLimit is the largest AcquireOptions.Limit accepted: every acquire
	// of a key reads each of its live holders.
	MaxLimit = 10000
	// MinRedisVersion is the oldest Redis server RedisLocker works with: its
	// scripts renew with ZADD GT (6.2), and asynq needs 6.2 as well.
	MinRedisVersion = "6.2.0"
)

// Errors returned by lockkit. Compare with errors.Is.
var (
	// ErrNotAcquired is returned by TryAcquire when the key already has as many
	// holders as its limit allows, and wrapped by Acquire when its ctx ends first.
	// The error is a *ConflictError that names the current holder.
	ErrNotAcquired = errors.New("lockkit: not acquired")
	// ErrNotHeld is returned by Release and Extend when the lease is no longer held:
	// it was released already, it expired, or it was lost. It never deletes another
	// owner's lock. ForceRelease returns it when the Select.Token it names is gone.
	ErrNotHeld = errors.New("lockkit: lease not held")
	// ErrLost is the cause of a lease context's cancellation (context.Cause) when the
	// lease could not be renewed: the key was taken over or deleted, or Redis stayed
	// unreachable until the TTL would have run out.
	ErrLost = errors.New("lockkit: lease lost")
	// ErrEpochUsed is returned when AcquireOptions.Epoch is not greater than the last epoch
	// that acquired the key: that unit of work was already claimed. The error is
	// an *EpochUsedError.
	ErrEpochUsed = errors.New("lockkit: epoch already used")
	// ErrClosed is returned by a Locker after Close, and is the cause (together with
	// ErrLost) of cancelling the contexts of leases that Close released.
	ErrClosed = errors.New("lockkit: locker closed")
	// ErrInvalid is wrapped by every validation error; the message names the field
	// and the bad value.
	ErrInvalid = errors.New("lockkit: invalid argument")
	// ErrCompleted is returned by an acquire whose AcquireOptions.Label was recorded as
	// completed on the key by Lease.Complete, while that record lasts: the work
	// it names is done.
	ErrCompleted = errors.New("lockkit: already completed")
	// ErrSuperseded is returned by a KeepNewest or Preempt acquire (see
	// AcquireOptions.FollowUp) that a later one of the key replaced as its
	// pending follow-up, or that is older than the key's follow-up or run.
	ErrSuperseded = errors.New("lockkit: superseded by a newer follow-up")
	// ErrCovered is matched by the *CoveredError of a Coalesce acquire
	// whose work a run of the key that began after it already covers.
	ErrCovered = errors.New("lockkit: covered by another run")
	// ErrPreempted is the cause (context.Cause) of the cancellation of a
	// lease's contexts when a Preempt acquire of its key took over: the
	// lease is lost, so it also matches ErrLost.
	ErrPreempted = fmt.Errorf("%w: preempted", ErrLost)
	// ErrCancelled is the cause (context.Cause) of the cancellation of a
	// lease's contexts when an operator asked its run to stop
	// (Locker.CancelRun). The lease is not lost (it does not match
	// ErrLost): it stays held and renewed, its fencing token valid, until
	// the run returns and releases it, which hands the key on.
	ErrCancelled = errors.New("lockkit: run cancelled by an operator")
	// ErrUnsupported is returned by the first call of a RedisLocker on a Redis
	// server older than MinRedisVersion; the message names the version found.
	ErrUnsupported = errors.New("lockkit: unsupported Redis server")
	// ErrNotReplicated is returned when a lease write was not acknowledged
	// by as many replicas as WithReplicaAcks asks for in its timeout; the
	// message says how many did.
	ErrNotReplicated = errors.New("lockkit: lease write not acknowledged by enough replicas")
)

// ConflictError is returned when a key has no free holder slot. It matches
// ErrNotAcquired with errors.Is and tells who holds the key now.
type ConflictError struct {
	Key string
	// Owner is the owner id of the holder whose lease runs out first, or of
	// the holder carrying the caller's AcquireOptions.Label; empty when the slot is
	// free but earlier waiters are queued ahead (fair mode).
	Owner string
	// Label is that holder's AcquireOptions.Label. When it equals the caller's label,
	// the key is held by the same work (see AcquireOptions.Label).
	Label string
	// Token is that holder's fencing token.
	Token int64
	// TTL is the time that holder's lease has left.
	TTL time.Duration
	// Holders is the number of live holders.
	Holders int
	// Limit, when not zero, is the limit the call was refused under: a live
	// holder took the key with a smaller limit than the call's own
	// (AcquireOptions.Limit), and holders that disagree keep the smallest.
	// Zero when the call's own limit applied.
	Limit int
	// Ahead is the number of live fair waiters queued before the caller.
	Ahead int
	// Parked, for an acquire with a Parking.ID, is the number of
	// parked jobs ahead of the caller's in the key's parked queue; -1 when
	// the caller did not park.
	Parked int
	// Superseded, for a KeepNewest or Preempt acquire with a Parking.ID, is
	// the Parking.ID of the parked follow-up that this call replaced; empty
	// when it replaced none (a later call with the same Parking.ID, such as
	// the job delivered again, replaced no one). That job's next acquire
	// with Park carrying its Label fails with ErrSuperseded: start it, so
	// that it completes.
	Superseded string
}

// Error implements error.
func (e *ConflictError) Error() string {
	if e.Owner == "" {
		limit := ""
		if e.Limit > 0 {
			limit = fmt.Sprintf(", at a holder's limit of %d", e.Limit)
		}
		return fmt.Sprintf("lockkit: not acquired: %q has %d holder(s) and %d waiter(s) ahead%s", e.Key, e.Holders, e.Ahead, limit)
	}
	label := ""
	if e.Label != "" {
		label = fmt.Sprintf(" for %q", e.Label)
	}
	limit := ""
	if e.Limit > 0 {
		limit = fmt.Sprintf(", at a holder's limit of %d", e.Limit)
	}
	return fmt.Sprintf("lockkit: not acquired: %q is held by %s%s (token %d, ttl %s, %d holder(s)%s)",
		e.Key, e.Owner, label, e.Token, e.TTL.Round(time.Millisecond), e.Holders, limit)
}

// Is reports whether target is ErrNotAcquired.
func (e *ConflictError) Is(target error) bool { return target == ErrNotAcquired }

// EpochUsedError is returned when an acquire's AcquireOptions.Epoch was
// claimed already. It matches ErrEpochUsed with errors.Is.
type EpochUsedError struct {
	Key string
	// Epoch is the acquire's, Last the key's last claimed epoch.
	Epoch, Last int64
	// OtherTag is the AcquireOptions.EpochTag of the key's last claim when
	// it is not the acquire's (both not empty); empty otherwise.
	OtherTag string
}

// Error implements error.
func (e *EpochUsedError) Error() string {
	return fmt.Sprintf("%s: %q epoch %d is not after %d", ErrEpochUsed, e.Key, e.Epoch, e.Last)
}

// Is reports whether target is ErrEpochUsed.
func (e *EpochUsedError) Is(target error) bool { return target == ErrEpochUsed }

// Locker hands out leases on keys. The layers above lockkit take their
// leases through this interface; what is kept beside leases (lockkit/throttle's
// budgets, lockkit/debounce's requests) and the logger they default to come
// from a *RedisLocker's Redis, prefix (RedisLocker.Redis) and options. RedisLocker implements it for
// a fleet of processes sharing a Redis (or one process with an embedded
// Redis: package lockkit/inprocess).
type Locker interface {
	// TryAcquire, Acquire, Inspect, Keys and Close are *lockkit.Locker's,
	// whose docs say what they do, with this package's options: an acquire
	// may also fail with ErrEpochUsed, ErrCompleted, ErrSuperseded or
	// ErrCovered (see AcquireOptions), and Inspect also reports the parked
	// jobs.
	TryAcquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error)
	Acquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error)
	Inspect(ctx context.Context, key string) (*Info, error)
	Keys(ctx context.Context, pattern string) ([]string, error)
	// ForceRelease removes the live holders of key that which selects,
	// whoever holds them, and wakes waiters. It returns how many holders
	// were removed (a repeated call, as after a lost reply, returns the
	// first run's count), ErrInvalid for an empty key or an invalid
	// Select, and ErrNotHeld (naming the key's holders now) when which
	// names a Token whose holder no longer holds the key.
	//
	// Selected by owner or token (or all, the zero Select), it is an
	// operator's release of a stuck key: a removed holder can no longer be
	// renewed, and every later acquire of the key gets a greater fencing
	// token, so a resource that checks tokens refuses the removed holder's
	// late writes. Its work's ctx is cancelled with a cause matching ErrLost
	// that says an operator released it, within milliseconds: every
	// RedisLocker that holds a lease listens on its prefix's operators'
	// channel (one subscription per Locker). A Locker that missed the
	// notice (its pub/sub connection was down) learns it at the lease's
	// next renewal attempt, within its RenewInterval (TTL/3 by default)
	// plus one round trip.
	//
	// The key is free at once, while the removed holder's work may still
	// run (a handler that ignores its ctx): a new run may start beside it.
	// To stop a run without that, use CancelRun.
	//
	// Selected by Label, it gives up the work carrying the label from
	// another process: the one live holder carrying it, a reservation (a
	// Reserve lease), is removed, nobody is notified (a reservation has no
	// work running), and its own Release then returns ErrNotHeld; the jobs
	// parked for the key with the label (AcquireOptions.Park) leave its
	// parked queue, so that no release reserves the key for them. It
	// returns 1 when such a holder was removed, by this call or an earlier
	// run of it, and 0 otherwise (parked jobs removed are not counted).
	ForceRelease(ctx context.Context, key string, which Select) (int, error)
	// CancelRun asks the runs holding key that which selects (by Owner,
	// Token, or all: the zero Select) to stop, whoever holds them: an
	// operator's release that never lets two runs of the key overlap. The
	// contexts of each selected lease are cancelled with a cause matching
	// ErrCancelled (not ErrLost), within milliseconds (the notice comes on
	// the operators' channel, as ForceRelease's does) or at its next
	// renewal (RenewInterval, TTL/3 by default) when its Locker missed the
	// notice. The lease stays held and renewed until its run returns; its
	// release then hands the key on as any release does. A process that
	// stopped renewing (dead or cut off) loses the key when its TTL runs
	// out, as always. Inspect shows the request (Holder.Cancelling) until
	// the holder's release, for a day at most.
	//
	// Reservations (Holder.Reserved) run no work and are never selected.
	// It returns how many runs were selected (a repeated call, as after a
	// lost reply, returns the same and keeps the first request's time),
	// ErrInvalid for an empty key, a Select with more than one field, a
	// negative Token or a Label, and ErrNotHeld (naming the key's holders
	// now) when which names a Token that no run holds.
	CancelRun(ctx context.Context, key string, which Select) (int, error)
	Close(ctx context.Context) error
}

// AcquireOptions are per-acquire settings. A nil *AcquireOptions means all defaults.
type AcquireOptions struct {
	// TTL, RenewInterval, NoRenew, Limit and Fair are lockkit.AcquireOptions'
	// (its docs say what each means); TTL defaults to the Locker's
	// (DefaultTTL unless WithTTL) and must be between MinTTL and MaxTTL.
	TTL           time.Duration
	RenewInterval time.Duration
	NoRenew       bool
	Limit         int
	Fair          bool
	// Epoch, when positive, makes the acquire succeed only if it is greater than
	// the epoch of the previous successful acquire of the key; otherwise it fails
	// with ErrEpochUsed. Use it to claim a unit of work (such as a cron tick) once.
	// Zero means no epoch check.
	Epoch int64
	// EpochTag, with Epoch, is kept with the claim: an acquire whose
	// EpochTag is not the one kept with the key's last claim (both not
	// empty) is told it, by Lease.OtherEpochTag, or EpochUsedError.OtherTag
	// when the epoch was used. Callers that should claim the same units of
	// work (cronguard: replicas of one entry, tagged with their schedule)
	// learn so that one of them claims others. At most MaxEpochTag bytes;
	// needs Epoch. Empty means none.
	EpochTag string
	// EpochTTL is how long the key remembers its last epoch. Zero means TTL.
	// Must not exceed MaxTTL.
	EpochTTL time.Duration
	// Label names the work that takes the lease, such as a task ID; empty means
	// none. It is recorded with the holder (Holder.Label, ConflictError.Label).
	// Two live holders of a key never share a label: an acquire whose label a
	// live holder carries fails with a *ConflictError naming that holder, even
	// below Limit. An acquire whose label was recorded by Lease.Complete fails
	// with ErrCompleted.
	Label string
	// FollowUp says what the acquire does about the key's other runs: give
	// way to a later run (Coalesce), keep only the newest pending call
	// (KeepNewest), or end the running ones (Preempt). Nil means none: a
	// plain lease.
	FollowUp FollowUp
	// AsyncRelease makes Lease.Run return without waiting for Redis: the
	// lease ends when fn returns (it is no longer renewed, its contexts are
	// cancelled), and its release, with what Run records on success, is
	// sent by the Locker's background releaser. The releaser gathers
	// releases for up to 1ms (or until 64 are queued) and sends them in
	// one pipeline per server, and what is queued while a batch is in
	// flight as soon as that batch returns: a release reaches Redis within
	// about 1ms plus two round trips after Run returns. An acquire of the
	// same key by this Locker has it sent at once and waits for it, so
	// work that one process runs one after another never meets its own
	// release. Release,
	// Succeed and Complete stay synchronous. A release that fails is retried
	// in the background until the lease would have expired; Close sends the
	// queued releases. A process that dies before sending leaves the key
	// held until its TTL, as any crash does. Defaults to false.
	AsyncRelease bool
	// HoldAtLeast keeps the key held for at least this long after the
	// lease was acquired, even when it is released sooner: a release before
	// then leaves the holder in place, no longer renewed, until then (with
	// Park.OnParked, the Locker reserves the key for the oldest parked job
	// when the hold ends, as a release that frees the key at once does). It
	// makes "at most one run per period" of a fast job. A Lease.Run whose
	// fn fails or panics releases at once: failed work holds nothing back,
	// such as its own retry. Zero means none; at most MaxTTL.
	HoldAtLeast time.Duration
	// Reserve makes the lease a reservation: it stands for work that no
	// process runs yet (a queued task), so it is not renewed, Close does not
	// release it, and it lasts for TTL unless Release or another process's
	// ForceRelease by its Label (Select.Label) ends it first. Defaults to false.
	Reserve bool
	// TakeReservation, with Label, takes over a reservation (a reservation) of the
	// key that carries Label: it is replaced by this lease, which is renewed
	// like any other; Lease.Reserve turns it back into a reservation. It
	// needs a Label and excludes Reserve (ErrInvalid otherwise). Defaults
	// to false.
	TakeReservation bool
	// Park queues the caller's job for the key while it is held, and lets
	// the lease's release hand the key to the jobs so queued (see Parking).
	// Nil means neither.
	Park *Parking
}

// Select selects the live holders of a key that Locker.ForceRelease
// removes. The zero Select selects every holder; at most one field may be
// set (ErrInvalid otherwise).
type Select struct {
	// Owner, when not empty, selects the holders of that owner id.
	Owner string
	// Token, when not zero, selects the one holder with that fencing token:
	// the holder an operator saw (Inspect), not whoever holds the key by
	// the time the operator confirms. Must not be negative.
	Token int64
	// Label, when not empty, selects the holder carrying that
	// AcquireOptions.Label, such as a reservation (see Locker.ForceRelease).
	Label string
}

// Coverage says how a Coalesce acquire's work is covered.
type Coverage int

// Coverages of a CoveredError.
const (
	CoveredBySuccess  Coverage = iota + 1 // a run that began after the acquire succeeded
	CoveredByRun                          // a run that began after the acquire holds the key
	CoveredByFollowUp                     // another Coalesce acquire waits for the key
)

var coverageNames = [...]string{"", "a run that began later succeeded", "a run that began later is running", "a follow-up run is pending"}

// String describes the coverage.
func (c Coverage) String() string {
	if c > 0 && int(c) < len(coverageNames) {
		return coverageNames[c]
	}
	return fmt.Sprintf("Coverage(%d)", int(c))
}

// CoveredError is returned by a Coalesce acquire that gave way.
type CoveredError struct {
	Key string
	By  Coverage
	// Token is the covering run's fencing token (its start, in server
	// microseconds); zero for CoveredByFollowUp.
	Token int64
	// Owner is the owner of the covering run when it holds the key.
	Owner string
}

// Error implements error.
func (e *CoveredError) Error() string {
	if e.Owner != "" {
		return fmt.Sprintf("lockkit: %q is covered: %s (token %d, owner %s)", e.Key, e.By, e.Token, e.Owner)
	}
	if e.Token != 0 {
		return fmt.Sprintf("lockkit: %q is covered: %s (token %d)", e.Key, e.By, e.Token)
	}
	return fmt.Sprintf("lockkit: %q is covered: %s", e.Key, e.By)
}

// Is reports whether target is ErrCovered.
func (e *CoveredError) Is(target error) bool { return target == ErrCovered }

// Info describes a key's state, as returned by Inspect.
type Info struct {
	Key     string
	Holders []Holder
	// Waiters is the number of live callers waiting in Acquire.
	Waiters int
	// Parked is the number of jobs parked for the key (Parking.ID)
	// that no release has started yet.
	Parked int
	// ParkedIDs are the ids (Parking.ID) of the first 20 of them,
	// oldest first.
	ParkedIDs []string
}

// Holder is one live lease on a key.
type Holder struct {
	Owner string
	// Label is the AcquireOptions.Label the holder acquired with.
	Label string
	Token int64
	TTL   time.Duration
	// Reserved is true for a reservation, which runs no work: a lease
	// acquired Reserve or turned into one by Lease.Reserve, or a release's
	// reservation for a parked job (Parking). False for a run.
	Reserved bool
	// Cancelling is true when an operator asked the holder's run to stop
	// (Locker.CancelRun): the key stays held until the run returns.
	// CancelAge is how long ago that was (server time); zero when not
	// Cancelling.
	Cancelling bool
	CancelAge  time.Duration
}

// EventKind names what happened to a lease.
type EventKind int

// Event kinds reported to the observer set with WithObserver.
const (
	LeaseAcquired    EventKind = iota + 1 // a lease was acquired (Event.Wait tells how long it waited)
	LeaseContended                        // an acquire found the key held
	LeaseReleased                         // a lease was released by its holder
	LeaseRenewed                          // a lease was renewed
	LeaseRenewFailed                      // a renewal failed but the lease is still valid (Event.Err)
	LeaseLost                             // a lease was lost (Event.Err wraps ErrLost)
)

var eventNames = [...]string{"", "acquired", "contended", "released", "renewed", "renew_failed", "lost"}

// String returns the event kind in snake case, such as "renew_failed".
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is reported to the observer for every lease transition.
type Event struct {
	Kind  EventKind
	Key   string
	Owner string
	Token int64
	// Wait is how long Acquire waited (LeaseAcquired only).
	Wait time.Duration
	// Err is the failure for LeaseRenewFailed, LeaseLost and LeaseContended.
	Err error
}

// Do acquires key on l (waiting, bounded by ctx), runs fn under the lease and
// releases it when fn returns or panics. fn's ctx is cancelled with a cause
// matching ErrLost if the lease is lost. See Lease.Run for the returned error.
func Do(ctx context.Context, l Locker, key string, opt *AcquireOptions, fn func(context.Context) error) error {
	lease, err := l.Acquire(ctx, key, opt)
	if err != nil {
		return err
	}
	return lease.Run(ctx, fn)
}
