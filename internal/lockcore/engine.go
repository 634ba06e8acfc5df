package lockcore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// backend is the storage a Locker runs on: Redis or process memory. Every
// method is one atomic step; the engine adds waiting, renewal and events.
type backend interface {
	// ready reports whether the store can serve this Locker (RedisLocker:
	// the server's version); it is called before the first acquire.
	ready(ctx context.Context) error
	acquire(ctx context.Context, r *request) (acquireResult, error)
	// release removes each lease; held[i] reports whether lease i was still
	// held. A lease with no member is found by its acquire id. done > 0
	// records each lease's label as completed for that long.
	release(ctx context.Context, leases []*Lease, ends []ending) (held []bool, err error)
	// extend sets each lease's expiry to now + ttls[i]; a renewal (renew
	// true) never shortens one. errs[i] is nil, errNotHeld or a failure.
	extend(ctx context.Context, leases []*Lease, ttls []time.Duration, renew bool) (errs []error)
	// groups splits leases by the server that stores them, so that one slow
	// server does not hold up the renewal of the others.
	groups(leases []*Lease) [][]*Lease
	// leave removes a waiter that gave up, and gives back the key if it
	// was handed to the waiter's acquire call aid meanwhile.
	leave(ctx context.Context, key, waiter, aid string) error
	// reserve replaces l's holder by member, a reservation living for ttl.
	reserve(ctx context.Context, l *Lease, member string, ttl time.Duration) (bool, error)
	// evict removes key's live holders, of owner or all ("").
	evict(ctx context.Context, key, owner string, token int64, call string) (int, error)
	// cancel records an operator's request that key's live runs, of owner
	// or all (""), or the one of token, stop, and tells their Lockers;
	// it returns how many were selected.
	cancel(ctx context.Context, key, owner string, token int64) (int, error)
	// free removes the live holder of key that carries label.
	free(ctx context.Context, key, label string) (bool, error)
	inspect(ctx context.Context, key string) (*Info, error)
	// wakeups returns a channel that receives when key is released, and a
	// function that stops the notifications. It receives 0 for "try again",
	// or the token of the lease a release handed to waiter (see grantable).
	wakeups(key, waiter string) (<-chan int64, func())
	// watchOperators makes the store tell the engine of every ForceRelease
	// of the Locker's prefix (evicted), from then on.
	watchOperators(evicted func(key, notice string))
	// watch makes the store call l.preempt when a Preempt acquire preempts
	// l, until the returned function is called; also when one did so since
	// sent, when l's acquire was sent.
	watch(l *Lease, sent time.Time) func()
	close() error
}

type acquireResult struct {
	ok         bool
	token      int64
	conflict   *ConflictError
	lastEpoch  int64 // set (with ok false and conflict nil) when the epoch was used
	completed  bool  // the label was completed (Lease.Complete)
	abandoned  bool  // the acquire call was cleaned up already (a late run)
	covered    *CoveredError
	superseded bool  // a Supersede call was replaced by a later one
	since      int64 // a Coalesce call's start (server us), when the store set it
	// left, when set, is the TTL the holder had left when the store found
	// it (an earlier run of the call took it, or a release handed it over).
	left time.Duration
	// plain: RedisLocker took the lease in the plain form of its key
	// (plain_acquire.lua).
	plain bool
	// wasParked: the acquire had been parked (see Lease.WasParked).
	wasParked bool
	// otherTag is the EpochTag of the key's last claim when it is not the
	// call's (both not empty).
	otherTag string
}

// ending says what a release records besides freeing the holder: the label
// as completed for done, and the run's success for coalesce (both when > 0).
type ending struct {
	done, coalesce time.Duration
	nohold         bool // a failed run: released without its HoldAtLeast hold
	// handOver: the hand-over a held release left for its hold's end
	// (release_park.lua), sent then by the renewer.
	handOver bool
}

var (
	errNotHeld   = errors.New("not held")
	errPreempted = errors.New("preempted")
	errEvicted   = errors.New("released by force")
	// errCancelAsked: renewed, and an operator asked the run to stop
	// (cancel.lua).
	errCancelAsked = errors.New("renewed; asked to stop")
)

// cancelKeep is how long Redis remembers an operator's request that a run
// stop (Locker.CancelRun): Inspect shows it, and the run's renewals report
// it, for that long at most.
const cancelKeep = 24 * time.Hour

// engine is the part of a Locker shared by every backend: waiting, the one
// renewer loop, lease bookkeeping and events.
type engine struct {
	cfg config
	b   backend

	mu     sync.Mutex
	leases map[*Lease]struct{}
	// orphans are holders that an acquire or release call may have left in
	// the store when it failed: the renewer removes them by acquire id.
	orphans []*orphan
	// handOvers are held releases' hand-overs, each due at its hold's end:
	// the renewer sends them (handOverAt).
	handOvers []handOver
	closed    bool
	// calls counts acquire calls in progress; Close waits for them, so that
	// no lease is handed out after Close started.
	calls sync.WaitGroup
	// parkedCalls tracks the OnParked callbacks in flight, which Close
	// waits for; after parkedDone (set by Close, under mu) they run on the
	// releasing goroutine instead.
	parkedCalls sync.WaitGroup
	parkedDone  bool
	// readyErr is the backend's ready result once it was conclusive.
	readyDone bool

	// Releases queued by Lease.Run with AcquireOptions.AsyncRelease: relq
	// waits for the releaser, relBusy counts per key the releases queued or
	// in flight, and relDone is closed (and replaced) after each batch.
	relq    []queuedRelease
	relBusy map[string]int
	relDone chan struct{}
	relKick chan struct{}
	// relFlush cuts the releaser's gathering short (an acquire waits for
	// a queued release).
	relFlush chan struct{}

	// nextWake is when the renewer plans to look at the leases next; a new
	// lease only wakes it earlier when it needs attention before then.
	nextWake time.Time
	kick     chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
	started  bool
	stopOnce sync.Once
	opsOnce  sync.Once // the operators' channel is watched (hold)
}

func newEngine(cfg config, b backend) *engine {
	return &engine{
		cfg:      cfg,
		b:        b,
		leases:   make(map[*Lease]struct{}),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		relBusy:  make(map[string]int),
		relDone:  make(chan struct{}),
		relKick:  make(chan struct{}, 1),
		relFlush: make(chan struct{}, 1),
	}
}

// closeChunks is how many chunks of leases Close releases at once.
const closeChunks = 4

func (e *engine) emit(ev Event) {
	if e.cfg.observer != nil {
		e.cfg.observer(ev)
	}
	lvl := slog.LevelDebug
	if ev.Kind == LeaseLost || ev.Kind == LeaseRenewFailed {
		lvl = slog.LevelWarn
	}
	if e.cfg.logger.Enabled(context.Background(), lvl) {
		attrs := []any{"key", ev.Key, "owner", ev.Owner, "token", ev.Token}
		if ev.Err != nil {
			attrs = append(attrs, "err", ev.Err)
		}
		e.cfg.logger.Log(context.Background(), lvl, "lockkit: "+ev.Kind.String(), attrs...)
	}
}

// begin registers an acquire call; it fails once Close has started. The
// first call also checks that the backend can serve the Locker.
func (e *engine) begin(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.calls.Add(1)
	ready := e.readyDone
	e.mu.Unlock()
	if !ready {
		if err := e.b.ready(ctx); err != nil {
			e.calls.Done()
			return err
		}
		e.mu.Lock()
		e.readyDone = true
		e.mu.Unlock()
	}
	return nil
}

// held counts the leases the engine renews.
func (e *engine) held() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.leases)
}

func (e *engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func (e *engine) tryAcquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	r, err := e.cfg.request(key, opt)
	if err != nil {
		return nil, err
	}
	if err := e.begin(ctx); err != nil {
		return nil, err
	}
	defer e.calls.Done()
	e.awaitOwnRelease(ctx, r.key)
	sent := time.Now()
	res, err := e.b.acquire(ctx, &r)
	if err != nil {
		e.orphan(r.key, r.aid, sent.Add(r.ttl), 0)
		return nil, fmt.Errorf("lockkit: acquire %q: %w", key, err)
	}
	if res.ok {
		return e.hold(ctx, &r, res, sent, 0)
	}
	return nil, e.notAcquired(&r, res)
}

// hold registers a freshly acquired lease, res, with the renewer. sent is
// when the acquire was sent: the lease's TTL is counted from then, never
// later than Redis counts it. res.left, when positive and shorter than the
// TTL, is the TTL the holder had (it was found taken or handed over): the
// lease is valid for that long and renewed after a third of it at the
// latest. After Close has started the lease is released at once and
// ErrClosed returned: it would never be renewed.
func (e *engine) hold(ctx context.Context, r *request, res acquireResult, sent time.Time, waited time.Duration) (*Lease, error) {
	token, left := res.token, res.left
	l := &Lease{
		e:            e,
		key:          r.key,
		owner:        r.owner,
		label:        r.label,
		aid:          r.aid,
		token:        token,
		epoch:        r.epoch > 0 || r.order > 0,
		coalesce:     r.mode == modeCoalesce,
		coverFor:     r.coverFor,
		hold:         r.hold,
		async:        r.async,
		onParked:     r.onParked,
		plain:        res.plain,
		parkedBefore: res.wasParked,
		otherTag:     res.otherTag,
		ttl:          r.ttl,
		interval:     r.interval,
		lost:         make(chan struct{}),
	}
	l.member = memberOf(token, r.aid, r.owner, r.label)
	l.validUntil = validUntil(sent, r.ttl)
	l.nextRenew = sent.Add(r.interval)
	if left > 0 && left < r.ttl {
		l.validUntil = validUntil(sent, left)
		l.nextRenew = sent.Add(min(r.interval, left/3))
	}
	if r.reserved {
		// A reservation: its TTL alone bounds it; nothing here renews or
		// releases it.
		e.emit(Event{Kind: LeaseAcquired, Key: l.key, Owner: l.owner, Token: token, Wait: waited})
		return l, nil
	}
	e.mu.Lock()
	if e.closed {
		l.state, l.cause = stateReleased, ErrClosed
		l.hold = 0 // never handed out: nothing ran that a hold would space out
		e.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		_, err := e.b.release(rctx, []*Lease{l}, nil)
		cancel()
		if err != nil {
			e.orphan(l.key, l.aid, l.validUntil, 0)
		}
		l.resumeParked()
		return nil, fmt.Errorf("lockkit: acquire %q: %w", r.key, ErrClosed)
	}
	e.leases[l] = struct{}{}
	e.startLocked()
	wake := l.validUntil
	if r.interval > 0 {
		wake = l.nextRenew
	}
	early := e.nextWake.IsZero() || wake.Before(e.nextWake)
	e.mu.Unlock()
	if early {
		e.poke()
	}
	// From the first lease on, listen for operators' releases; not under
	// e.mu, since a subscribe may dial.
	e.opsOnce.Do(func() { e.b.watchOperators(e.operatorRelease) })
	if r.mode == modePreempt {
		stop := e.b.watch(l, sent)
		e.mu.Lock()
		held := l.state == stateHeld
		if held {
			l.unwatch = stop
		}
		e.mu.Unlock()
		if !held {
			stop()
		}
	}
	e.emit(Event{Kind: LeaseAcquired, Key: l.key, Owner: l.owner, Token: token, Wait: waited})
	return l, nil
}

func (e *engine) inspect(ctx context.Context, key string) (*Info, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: key is empty", ErrInvalid)
	}
	info, err := e.b.inspect(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("lockkit: inspect %q: %w", key, err)
	}
	return info, nil
}

// close stops new acquires, waits for the ones in flight (a lease they take
// is released, not handed out), stops the renewer, releases every held lease
// and every orphaned holder, and closes the backend.
func (e *engine) close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.handOvers = nil // their parked jobs are left to their backstops
	e.mu.Unlock()
	e.stopOnce.Do(func() { close(e.stop) })
	e.calls.Wait()
	e.wg.Wait()

	e.mu.Lock()
	queued := e.relq
	e.relq = nil
	e.mu.Unlock()
	if len(queued) > 0 {
		e.sendReleases(ctx, queued)
	}

	e.mu.Lock()
	held := make([]*Lease, 0, len(e.leases))
	for l := range e.leases {
		held = append(held, l)
	}
	for _, o := range e.orphans {
		if time.Now().Before(o.until) {
			held = append(held, o.l)
		}
	}
	e.orphans = nil
	e.mu.Unlock()

	cause := fmt.Errorf("%w: %w", ErrLost, ErrClosed)
	for _, l := range held {
		l.end(stateLost, cause)
	}
	// The leases go in chunks of renewBatch, closeChunks of them at a time:
	// a chunk whose release fails (a lost reply, a Cluster node down) does
	// not hold back the others, and a partition costs go-redis' retries
	// once per closeChunks chunks rather than once per chunk.
	var (
		errs  []error
		errMu sync.Mutex
		wg    sync.WaitGroup
		slots = make(chan struct{}, closeChunks)
	)
	start := 0
	for ; start < len(held) && ctx.Err() == nil; start += e.cfg.renewBatch {
		chunk := held[start:min(start+e.cfg.renewBatch, len(held))]
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			_, err := e.b.release(ctx, chunk, nil)
			// A release that freed a key may have reserved it for a parked
			// job: OnParked starts it (Close waits for those calls below).
			for _, l := range chunk {
				l.resumeParked()
			}
			if err != nil {
				errMu.Lock()
				errs = append(errs, fmt.Errorf("lockkit: close: release %d lease(s): %w", len(chunk), err))
				errMu.Unlock()
			}
		}()
	}
	wg.Wait()
	if start < len(held) {
		// ctx ended: the leases not sent expire with their TTL.
		errs = append(errs, fmt.Errorf("lockkit: close: %d lease(s) not released: %w", len(held)-start, ctx.Err()))
	}
	if err := e.b.close(); err != nil {
		errs = append(errs, err)
	}
	e.mu.Lock()
	e.parkedDone = true
	e.mu.Unlock()
	e.parkedCalls.Wait()
	return errors.Join(errs...)
}
