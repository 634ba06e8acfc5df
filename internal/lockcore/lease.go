package lockcore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	stateHeld = iota
	stateReleased
	stateLost
)

// errReleased is the cause of a lease context's cancellation by Release.
var errReleased = fmt.Errorf("%w: released", ErrNotHeld)

// releaseTimeout bounds the release that Run performs after fn returns, when
// the caller's ctx is already done.
const releaseTimeout = 5 * time.Second

// Lease is a held claim on a key, returned by a Locker. It is renewed
// automatically until Release (unless AcquireOptions.NoRenew). When it can no longer
// be renewed it is lost: Lost() closes and contexts from Context are cancelled
// with a cause matching ErrLost. A Lease is safe for concurrent use.
type Lease struct {
	e      *engine
	key    string
	owner  string
	label  string
	aid    string // the acquire call's id
	token  int64
	member string // "" for a holder no Lease was handed out for (see engine.orphan)
	plain  bool   // taken in the plain form of its key (see acquireResult)
	// parkedBefore: the acquire had been parked (WasParked).
	parkedBefore bool
	otherTag     string // OtherEpochTag
	// completeKeep is CompleteOnSuccess's keep; guarded by e.mu.
	completeKeep time.Duration
	// renewArgs caches, for RedisLocker's renewals, the lease's holders and
	// meta keys and its member as a script argument; set and read only by
	// the renewal of the batch the lease is in.
	renewArgs *renewArgs
	epoch     bool // the acquire claimed an epoch or recorded its order: renewals keep them
	// coalesce: the acquire was a Coalesce one; a success is remembered for
	// coverFor.
	coalesce bool
	coverFor time.Duration
	hold     time.Duration        // AcquireOptions.HoldAtLeast
	async    bool                 // AcquireOptions.AsyncRelease: Run releases in the background
	onParked func(key, id string) // Parking.OnParked
	// parked is the id of the parked job the lease's release reserved the
	// key for; set by the store's release and taken once by resumeParked,
	// possibly on another goroutine (a Close beside the lease's own release).
	parked atomic.Pointer[string]
	// holdLeft (ns), set by the store's release, is how long a release held
	// at least a while (HoldAtLeast) keeps the key: resumeParked has the
	// renewer hand the key over then.
	holdLeft atomic.Int64

	// extendMu orders the Extend calls of one lease, so that the TTL the
	// holder believes in is the one Redis applied last.
	extendMu sync.Mutex

	// Guarded by e.mu.
	ttl          time.Duration
	interval     time.Duration
	validUntil   time.Time
	nextRenew    time.Time
	lastRenewErr error
	renewFails   int // renewals failed in a row (not "not held"), under e.mu
	// gen counts Extend calls: a renewal sent before the latest Extend says
	// nothing about the TTL in force.
	gen        int
	renewing   bool // a renewal of the lease is in flight
	state      int
	cause      error
	lost       chan struct{}
	cancels    map[int]context.CancelCauseFunc
	nextCancel int
	unwatch    func() // stops the preemption notices of a Preempt lease
	// cancelled is the cause (matching ErrCancelled) once an operator asked
	// the run to stop (cancelRun): the lease is still held.
	cancelled error
}

// memberOf is how a lease is stored among a key's holders: its fencing token
// (unique per key), the acquire call's id (so that a repeated script finds its
// own holder), the owner id, and the label, escaped so that it is the text
// after the last ':'.
func memberOf(token int64, aid, owner, label string) string {
	return strconv.FormatInt(token, 10) + ":" + aid + ":" + owner + ":" + escapeLabel(label)
}

func parseMember(m string) (token int64, owner, label string) {
	t, rest, _ := strings.Cut(m, ":")
	token, _ = strconv.ParseInt(t, 10, 64)
	_, rest, _ = strings.Cut(rest, ":") // the acquire id (reservedMember)
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		return token, rest[:i], unescape(rest[i+1:])
	}
	return token, rest, ""
}

// The acquire id of a holder that is a reservation (a reserving acquire,
// Lease.Reserve, a parked job's reservation) starts with reservedMark, and
// that of a final Coalesce call's holder with finalMark: the state a
// holder carries in its member, which the scripts of every version read
// (is_reservation and is_final in promote.lua). The acquire id of a call
// with a Limit above 1 ends with limitMark and the limit in decimal: while
// the holder lives, no acquire of its key is admitted past that limit
// (acquire.lua); a holder without it keeps a limit of 1. Any other acquire
// id is hex.
const (
	reservedMark = "r"
	finalMark    = "z"
	limitMark    = "n"
)

// reservedMember reports whether member m is a reservation (reservedMark).
func reservedMember(m string) bool {
	_, rest, _ := strings.Cut(m, ":")
	return strings.HasPrefix(rest, reservedMark)
}

// Key returns the key the lease holds.
func (l *Lease) Key() string { return l.key }

// Owner returns the owner id of the Locker that acquired the lease.
func (l *Lease) Owner() string { return l.owner }

// Token returns the fencing token: it is greater than the token of every
// earlier lease on the same key, whoever held it. Pass it to the resource the
// lease protects so that the resource can reject writes from a stale holder.
func (l *Lease) Token() int64 { return l.token }

// WasParked reports whether the lease's acquire had been parked before
// (Parking.ID): it took over the reservation a release made for its
// label, or found its entry still in the key's parked queue. Its job was put
// back once already, so a runtime's late write of that (asynq's retry, sent
// again after a lost reply) may still arrive while this lease's work runs.
// A repeat of the acquire that go-redis sent again reports false.
func (l *Lease) WasParked() bool { return l.parkedBefore }

// OtherEpochTag returns the AcquireOptions.EpochTag of the claim that the
// lease's epoch followed when it is not the lease's own (both not empty):
// another caller claims the key's epochs with another tag. Empty otherwise,
// and for a repeat of the acquire that go-redis sent again.
func (l *Lease) OtherEpochTag() string { return l.otherTag }

// Lost returns a channel that is closed when the lease is lost (not when it is
// released).
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err returns nil while the lease is held or after a normal release, and the
// loss cause (matching ErrLost) once it is lost, or once its validity ran
// out (its last TTL, less a safety margin, counted from when the command
// that set it was sent) even before the Locker has marked it lost: a
// reservation (AcquireOptions.Reserve), which nothing renews, reports
// ErrLost from then on.
func (l *Lease) Err() error {
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	switch {
	case l.state == stateLost:
		return l.cause
	case l.state == stateHeld && !time.Now().Before(l.validUntil):
		return fmt.Errorf("%w: %q: validity ran out", ErrLost, l.key)
	}
	return nil
}

func (l *Lease) validUntilLocked() time.Time {
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	return l.validUntil
}

// ttlLocked returns the lease's TTL, which Extend may change meanwhile.
func (l *Lease) ttlLocked() time.Duration {
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	return l.ttl
}

// holdFor is the hold the lease is released with under end.
func (l *Lease) holdFor(end ending) time.Duration {
	if end.nohold {
		return 0
	}
	return l.hold
}

type leaseKey struct{}

// LeaseFromContext returns the lease whose Context (or Run, or Do) made ctx, to
// read its fencing token inside the work.
func LeaseFromContext(ctx context.Context) (*Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*Lease)
	return l, ok
}

// Context returns a context derived from parent that is also cancelled when the
// lease is lost (context.Cause matches ErrLost) or released (the cause matches
// ErrNotHeld), and that carries the lease (see LeaseFromContext). Call the
// returned cancel function when done with it.
func (l *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithValue(parent, leaseKey{}, l))
	l.e.mu.Lock()
	if l.state != stateHeld || l.cancelled != nil {
		cause := l.cause
		if l.state == stateHeld {
			cause = l.cancelled
		}
		l.e.mu.Unlock()
		cancel(cause)
		return ctx, func() { cancel(context.Canceled) }
	}
	id := l.nextCancel
	l.nextCancel++
	if l.cancels == nil {
		l.cancels = make(map[int]context.CancelCauseFunc)
	}
	l.cancels[id] = cancel
	l.e.mu.Unlock()
	return ctx, func() {
		l.e.mu.Lock()
		delete(l.cancels, id)
		l.e.mu.Unlock()
		cancel(context.Canceled)
	}
}

// end moves a held lease to state and cancels its contexts with cause. It
// reports whether the lease was held.
func (l *Lease) end(state int, cause error) bool {
	l.e.mu.Lock()
	if l.state != stateHeld {
		l.e.mu.Unlock()
		return false
	}
	l.state = state
	l.cause = cause
	delete(l.e.leases, l)
	cancels := l.cancels
	l.cancels = nil
	if state == stateLost {
		close(l.lost)
	}
	unwatch := l.unwatch
	l.unwatch = nil
	l.e.mu.Unlock()
	if unwatch != nil {
		unwatch()
	}
	for _, c := range cancels {
		c(cause)
	}
	return true
}

// preempt marks the lease lost because a Preempt acquire preempted it.
func (l *Lease) preempt() {
	l.markLost(fmt.Errorf("%w: %q: token %d was preempted by a newer acquire", ErrPreempted, l.key, l.token))
}

// cancelRun cancels the lease's contexts because an operator asked its run
// to stop (Locker.CancelRun). The lease stays held and renewed: its release,
// when the run returns, hands the key on. Only the first call acts.
func (l *Lease) cancelRun() {
	l.e.mu.Lock()
	if l.state != stateHeld || l.cancelled != nil {
		l.e.mu.Unlock()
		return
	}
	l.cancelled = fmt.Errorf("%w: %q: token %d: an operator asked the run to stop; the key stays held until it returns", ErrCancelled, l.key, l.token)
	cancels := make([]context.CancelCauseFunc, 0, len(l.cancels))
	for _, c := range l.cancels {
		cancels = append(cancels, c)
	}
	cause := l.cancelled
	l.e.mu.Unlock()
	l.e.cfg.logger.Info("lockkit: an operator asked a run to stop", "key", l.key, "token", l.token, "owner", l.owner, "label", l.label)
	for _, c := range cancels {
		c(cause)
	}
}

// evicted marks the lease lost because ForceRelease removed it.
func (l *Lease) evicted() {
	l.markLost(fmt.Errorf("%w: %q: token %d was released by an operator (ForceRelease)", ErrLost, l.key, l.token))
}

func (l *Lease) markLost(cause error) {
	if l.end(stateLost, cause) {
		l.e.emit(Event{Kind: LeaseLost, Key: l.key, Owner: l.owner, Token: l.token, Err: cause})
	}
}

// Release gives the lease up and wakes waiters. It stops renewal first, so the
// lease is no longer renewed even if the call fails. It returns an error
// matching ErrNotHeld if the lease was already released, expired or lost; in
// that case no other owner's lease is touched. A release that Redis ran but
// whose reply was lost and retried still returns nil.
func (l *Lease) Release(ctx context.Context) error { return l.release(ctx, ending{}) }

// Succeed releases the lease like Release and, for a lease acquired with
// a Coalesce FollowUp, records that its run succeeded: until its CoverFor
// has passed, a Coalesce acquire of the key that began before this lease was
// acquired fails with a *CoveredError. Run calls it when fn succeeds.
func (l *Lease) Succeed(ctx context.Context) error { return l.release(ctx, l.success(0)) }

// success is the ending of a lease whose run succeeded, with done for a
// completed label.
func (l *Lease) success(done time.Duration) ending {
	end := ending{done: done}
	if l.coalesce {
		end.coalesce = l.coverFor
	}
	return end
}

// Reserve turns the lease into a reservation (as if acquired with
// AcquireOptions.Reserve) that lives for ttl: it is no longer renewed and
// its holder stays on the key, with the same token and label, until ttl
// passes, another acquire Adopts it, or a ForceRelease by its label ends it. It returns ErrInvalid
// for a ttl outside MinTTL..MaxTTL or a lease without a label, and an error
// matching ErrNotHeld if the lease was no longer held. After an error other
// than ErrInvalid the lease is no longer renewed: it ends with its TTL.
func (l *Lease) Reserve(ctx context.Context, ttl time.Duration) error {
	switch {
	case l.label == "":
		return fmt.Errorf("%w: Reserve: the lease of %q has no Label", ErrInvalid, l.key)
	case ttl < MinTTL || ttl > MaxTTL:
		return fmt.Errorf("%w: Reserve(%s): ttl must be between %s and %s", ErrInvalid, ttl, MinTTL, MaxTTL)
	}
	if !l.end(stateReleased, errReleased) {
		return fmt.Errorf("%w: %q token %d was released or lost already", ErrNotHeld, l.key, l.token)
	}
	member := memberOf(l.token, reservedMark+l.aid, l.owner, l.label)
	held, err := l.e.b.reserve(ctx, l, member, ttl)
	if err != nil {
		return fmt.Errorf("lockkit: detach %q: %w", l.key, err)
	}
	if !held {
		return fmt.Errorf("%w: %q token %d expired or was taken over", ErrNotHeld, l.key, l.token)
	}
	return nil
}

// CompleteOnSuccess makes Run, when fn returns nil, record the lease's
// AcquireOptions.Label as completed for keep, as Complete does: the caller
// learned while fn ran that its runtime will deliver the work again
// although it is done. It has no effect without a label, outside Run, or
// after fn failed; zero (the default) records nothing, and keep is capped at
// MaxTTL.
func (l *Lease) CompleteOnSuccess(keep time.Duration) {
	l.e.mu.Lock()
	l.completeKeep = min(max(keep, 0), MaxTTL)
	l.e.mu.Unlock()
}

func (l *Lease) completeFor() time.Duration {
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	return l.completeKeep
}

// Complete releases the lease like Release and records its AcquireOptions.Label as
// completed on the key for keep: until then an acquire of the key with the
// same label fails with ErrCompleted. Use it when the work is done but the
// runtime that runs it may deliver it again (a task queue that gave up on the
// run). keep must be positive and at most MaxTTL, and the lease must have a
// label (ErrInvalid otherwise). Nothing is recorded if the lease was no
// longer held (ErrNotHeld).
func (l *Lease) Complete(ctx context.Context, keep time.Duration) error {
	switch {
	case l.label == "":
		return fmt.Errorf("%w: Complete: the lease of %q has no Label", ErrInvalid, l.key)
	case keep <= 0 || keep > MaxTTL:
		return fmt.Errorf("%w: Complete(%s): keep must be positive and at most %s", ErrInvalid, keep, MaxTTL)
	}
	return l.release(ctx, ending{done: keep})
}

// releaseLater ends the lease at once and hands its release to the
// background releaser (AcquireOptions.AsyncRelease). It returns what release
// would for a lease no longer held.
func (l *Lease) releaseLater(end ending) error {
	if !l.end(stateReleased, errReleased) {
		l.e.mu.Lock()
		state, cause := l.state, l.cause
		l.e.mu.Unlock()
		if state == stateLost {
			l.e.queueRelease(l, ending{}) // best effort, as release does
			return fmt.Errorf("%w: %w", ErrNotHeld, cause)
		}
		return fmt.Errorf("%w: %q token %d was released already", ErrNotHeld, l.key, l.token)
	}
	l.e.queueRelease(l, end)
	return nil
}

func (l *Lease) release(ctx context.Context, end ending) error {
	if !l.end(stateReleased, errReleased) {
		l.e.mu.Lock()
		state, cause := l.state, l.cause
		l.e.mu.Unlock()
		if state == stateLost {
			// Best effort: the lease may still be stored if renewal failed for
			// network reasons; removing our own entry is always safe.
			_, _ = l.e.b.release(ctx, []*Lease{l}, nil)
			l.resumeParked()
			return fmt.Errorf("%w: %w", ErrNotHeld, cause)
		}
		return fmt.Errorf("%w: %q token %d was released already", ErrNotHeld, l.key, l.token)
	}
	held, err := l.e.b.release(ctx, []*Lease{l}, []ending{end})
	if err != nil {
		// The release may not have run: make sure it does, in the background
		// (and that the parked job it may have reserved the key for starts).
		l.e.orphanRelease(l, end)
		return fmt.Errorf("lockkit: release %q: %w", l.key, err)
	}
	if !held[0] {
		return fmt.Errorf("%w: %q token %d expired or was taken over", ErrNotHeld, l.key, l.token)
	}
	l.e.emit(Event{Kind: LeaseReleased, Key: l.key, Owner: l.owner, Token: l.token})
	l.resumeParked()
	return nil
}

// resumeParked passes the parked job the lease's release reserved the key
// for, if any, to OnParked, on a goroutine of its own that Close waits for.
func (l *Lease) resumeParked() {
	fn := l.onParked
	if left := l.holdLeft.Swap(0); left != 0 && fn != nil {
		l.e.handOverAt(l, time.Now().Add(time.Duration(left)))
	}
	p := l.parked.Swap(nil)
	if p == nil || *p == "" || fn == nil {
		return
	}
	id := *p
	e := l.e
	e.mu.Lock()
	if e.parkedDone {
		e.mu.Unlock()
		fn(l.key, id)
		return
	}
	e.parkedCalls.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.parkedCalls.Done()
		fn(l.key, id)
	}()
}

// Extend resets the lease's TTL to ttl (zero keeps the current TTL) in one
// owner-checked call; later renewals use the new TTL, every ttl/3 unless the
// lease was acquired with NoRenew. It returns an error matching ErrNotHeld
// (and marks the lease lost) if the lease is no longer held, or ErrInvalid for
// a ttl below MinTTL or above MaxTTL. Calls on one lease are serialized.
//
// The lease counts as valid until the TTL that Redis applied last runs out,
// measured from when it was sent: a renewal in flight when Extend is called
// never makes the holder believe in a longer TTL than Redis keeps.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	l.extendMu.Lock()
	defer l.extendMu.Unlock()
	l.e.mu.Lock()
	if ttl == 0 {
		ttl = l.ttl
	}
	if ttl < MinTTL || ttl > MaxTTL {
		l.e.mu.Unlock()
		return fmt.Errorf("%w: Extend(%s): TTL must be at least %s and at most %s", ErrInvalid, ttl, MinTTL, MaxTTL)
	}
	if l.state != stateHeld {
		cause := l.cause
		l.e.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrNotHeld, cause)
	}
	old, oldInterval := l.ttl, l.interval
	l.ttl = ttl
	if l.interval > 0 {
		l.interval = ttl / 3
	}
	l.gen++
	l.e.mu.Unlock()
	sent := time.Now()
	err := l.e.b.extend(ctx, []*Lease{l}, []time.Duration{ttl}, false)[0]
	l.e.mu.Lock()
	if err != nil && err != errCancelAsked {
		l.ttl, l.interval = old, oldInterval
		// The call may have run: if it shortened the lease, believe it.
		if v := validUntil(sent, ttl); v.Before(l.validUntil) {
			l.validUntil = v
		}
	} else if l.state == stateHeld {
		// Renewals never shorten a lease, so whatever ran after this call,
		// Redis keeps it at least this long.
		l.validUntil = validUntil(sent, ttl)
		l.nextRenew = sent.Add(l.interval)
	}
	l.e.mu.Unlock()
	if err == errPreempted {
		l.preempt()
		return fmt.Errorf("%w: %w", ErrNotHeld, l.Err())
	}
	if err == errEvicted {
		l.evicted()
		return fmt.Errorf("%w: %w", ErrNotHeld, l.Err())
	}
	if err == errCancelAsked {
		l.cancelRun()
		err = nil
	}
	if err == errNotHeld {
		cause := fmt.Errorf("%w: %q: the key expired or was taken over", ErrLost, l.key)
		l.markLost(cause)
		return fmt.Errorf("%w: %w", ErrNotHeld, cause)
	}
	if err != nil {
		return fmt.Errorf("lockkit: extend %q: %w", l.key, err)
	}
	l.e.poke()
	return nil
}

// Run calls fn with a context from Context(ctx), then releases the lease, also
// when fn panics (the panic is re-raised after the release). The lease stays
// renewed until fn returns, even after ctx is cancelled. Run returns fn's error
// if it is not nil; otherwise the release error, which matches ErrLost (and
// ErrNotHeld) if the lease was lost while fn ran. The release uses a context
// that survives ctx's cancellation, bounded to 5 seconds. A lease whose
// validity ran out before Run (Err is not nil: its process was paused
// between the acquire and Run, say) does not call fn: Run returns Err's
// error, which matches ErrLost.
//
// With AcquireOptions.AsyncRelease, the release is sent in the background
// and Run returns once fn has (see AsyncRelease).
//
// When fn succeeds, Run ends the lease with Succeed (a Coalesce lease's
// success is recorded). When the lease also has a label (AcquireOptions.Label)
// and ctx had ended, the caller gave up on the work although it is done: Run
// then also records the label as completed for CompletedRetention, as
// Complete does, so an acquire of the same label fails with ErrCompleted
// while that record lasts.
func (l *Lease) Run(ctx context.Context, fn func(context.Context) error) (err error) {
	wctx, cancel := l.Context(ctx)
	defer func() {
		cancel()
		p := recover()
		var end ending
		switch {
		case p != nil || err != nil:
			end.nohold = true // nothing done that a hold would space out
		case l.label != "" && ctx.Err() != nil:
			end = l.success(CompletedRetention)
		case l.label != "" && l.completeFor() > 0:
			end = l.success(l.completeFor())
		default:
			end = l.success(0)
		}
		var rerr error
		if l.async {
			rerr = l.releaseLater(end)
		} else {
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			rerr = l.release(rctx, end)
			rcancel()
		}
		if p != nil {
			panic(p)
		}
		if err == nil {
			err = rerr
		}
	}()
	if err := l.Err(); err != nil {
		// Its validity ran out before the work began (a pause between the
		// acquire and here): another holder may have the key by now.
		return err
	}
	return fn(wctx)
}

// ReleaseAll releases leases of one Locker together, as Release does each:
// in one pipeline (one round trip per server), except those taken with
// AsyncRelease, which go to the background releaser. It returns the errors
// of those not released, joined (errors.Is ErrNotHeld for one released,
// expired or lost already); a release whose reply was lost is retried in
// the background.
func ReleaseAll(ctx context.Context, leases []*Lease) error {
	var now []*Lease
	var errs []error
	for _, l := range leases {
		switch {
		case l.async:
			errs = append(errs, l.releaseLater(ending{}))
		case l.end(stateReleased, errReleased):
			now = append(now, l)
		default:
			errs = append(errs, l.release(ctx, ending{})) // lost or released: as Release
		}
	}
	if len(now) == 0 {
		return errors.Join(errs...)
	}
	e := now[0].e
	held, err := e.b.release(ctx, now, nil)
	for i, l := range now {
		switch {
		case err != nil && !held[i]: // its call may not have run
			e.orphanRelease(l, ending{})
		case !held[i]:
			errs = append(errs, fmt.Errorf("%w: %q token %d expired or was taken over", ErrNotHeld, l.key, l.token))
		default:
			e.emit(Event{Kind: LeaseReleased, Key: l.key, Owner: l.owner, Token: l.token})
		}
		l.resumeParked()
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("lockkit: release: %w", err))
	}
	return errors.Join(errs...)
}
