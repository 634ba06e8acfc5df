package lockkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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
	// detach replaces l's holder by member, a reservation living for ttl.
	detach(ctx context.Context, l *Lease, member string, ttl time.Duration) (bool, error)
	// throttle takes or reserves the start call from key's budget, or, for
	// call "", only tells when fewer than n starts began (see
	// Locker.Throttle and Locker.NextStart).
	throttle(ctx context.Context, key string, n int, period time.Duration, call string, reserve bool) (time.Duration, error)
	returnStart(ctx context.Context, key, call string) error
	// debounce and claim implement Locker.Debounce and Locker.Claim.
	debounce(ctx context.Context, key, id string, quiet, maxWait time.Duration) (Request, error)
	claim(ctx context.Context, key string, gen int64, force bool) (Request, bool, error)
	// evict removes key's live holders, of owner or all ("").
	evict(ctx context.Context, key, owner string, token int64, call string) (int, error)
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
}

// ending says what a release records besides freeing the holder: the label
// as completed for done, and the run's success for cover (both when > 0).
type ending struct {
	done, cover time.Duration
	nohold      bool // a failed run: released without its HoldAtLeast hold
}

var (
	errNotHeld   = errors.New("not held")
	errPreempted = errors.New("preempted")
	errEvicted   = errors.New("released by force")
)

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
	closed  bool
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
}

// orphan is a holder that may exist without a Lease: its acquire id and how
// long to keep trying to remove it.
type orphan struct {
	l        *Lease // key, aid and ttl; no member
	until    time.Time
	next     time.Time
	inflight bool
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

// queuedRelease is a lease whose release waits for the background releaser.
type queuedRelease struct {
	l   *Lease
	end ending
}

// queueRelease hands the release of l, which has ended, to the background
// releaser. After Close has started it is sent at once.
func (e *engine) queueRelease(l *Lease, end ending) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		e.sendReleases(ctx, []queuedRelease{{l, end}})
		return
	}
	e.relq = append(e.relq, queuedRelease{l, end})
	e.relBusy[l.key]++
	full := len(e.relq) >= releaseGather
	e.startLocked()
	e.mu.Unlock()
	kick := e.relKick
	if full {
		kick = e.relFlush
	}
	select {
	case kick <- struct{}{}:
	default:
	}
}

// releaseLinger is how long the releaser gathers releases before it sends
// them, unless releaseGather are queued or an acquire waits for one: one
// pipeline carries many releases instead of one each.
const (
	releaseLinger = time.Millisecond
	releaseGather = 64
)

// closeChunks is how many chunks of leases Close releases at once.
const closeChunks = 4

// releaseLoop sends the queued releases: it gathers them for up to
// releaseLinger after the first, then sends them in pipelines per server,
// and those queued meanwhile the same way.
func (e *engine) releaseLoop() {
	defer e.wg.Done()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	for {
		flush := false
		select {
		case <-e.stop:
			return
		case <-e.relKick:
		case <-e.relFlush:
			flush = true // 64 queued, or an acquire waits: no gathering
		}
		if !flush {
			linger.Reset(releaseLinger)
			select {
			case <-e.stop:
				return
			case <-e.relFlush:
				linger.Stop()
			case <-linger.C:
			}
		}
		for {
			e.mu.Lock()
			batch := e.relq
			e.relq = nil
			e.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			e.sendReleases(ctx, batch)
			cancel()
		}
	}
}

// sendReleases releases batch, one pipeline per server; a release whose
// outcome is unknown is retried in the background (orphan). It then tells
// the acquires waiting for these keys.
func (e *engine) sendReleases(ctx context.Context, batch []queuedRelease) {
	ends := make(map[*Lease]ending, len(batch))
	leases := make([]*Lease, len(batch))
	for i, q := range batch {
		leases[i] = q.l
		ends[q.l] = q.end
	}
	groups := e.b.groups(leases)
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		send := func() {
			defer wg.Done()
			gends := make([]ending, len(g))
			for i, l := range g {
				gends[i] = ends[l]
			}
			held, err := e.b.release(ctx, g, gends)
			for i, l := range g {
				switch {
				case err != nil && (i >= len(held) || !held[i]):
					e.orphan(l.key, l.aid, l.validUntilLocked(), l.holdFor(ends[l]))
				case held[i] && l.Err() == nil:
					e.emit(Event{Kind: EventReleased, Key: l.key, Owner: l.owner, Token: l.token})
				}
				l.resumeParked()
			}
			if err != nil {
				e.cfg.logger.Warn("lockkit: background release", "count", len(g), "err", err)
			}
		}
		if len(groups) == 1 {
			send()
		} else {
			go send()
		}
	}
	wg.Wait()
	e.mu.Lock()
	for _, q := range batch {
		if e.relBusy[q.l.key]--; e.relBusy[q.l.key] <= 0 {
			delete(e.relBusy, q.l.key)
		}
	}
	close(e.relDone)
	e.relDone = make(chan struct{})
	e.mu.Unlock()
}

// awaitOwnRelease waits, bounded by ctx, until no release of key by this
// Locker is queued or in flight, so that work one process runs one after
// another never meets its own release. It returns once Close has begun:
// Close sends the queued releases only after the calls in progress ended.
func (e *engine) awaitOwnRelease(ctx context.Context, key string) {
	for {
		e.mu.Lock()
		busy, done := e.relBusy[key] > 0, e.relDone
		e.mu.Unlock()
		if !busy {
			return
		}
		select {
		case e.relFlush <- struct{}{}:
		default:
		}
		select {
		case <-done:
		case <-ctx.Done():
			return
		case <-e.stop:
			return
		}
	}
}

func (e *engine) emit(ev Event) {
	if e.cfg.observer != nil {
		e.cfg.observer(ev)
	}
	lvl := slog.LevelDebug
	if ev.Kind == EventLost || ev.Kind == EventRenewFailed {
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

func (e *engine) throttle(ctx context.Context, key string, n int, period time.Duration) (time.Duration, error) {
	return e.throttleCall(ctx, key, n, period, randomID(8), false)
}

func (e *engine) throttleStart(ctx context.Context, key string, n int, period time.Duration, id string, reserve bool) (time.Duration, error) {
	if id == "" {
		op := "ThrottleStart"
		if reserve {
			op = "ReserveStart"
		}
		return 0, fmt.Errorf("%w: %s(%q): id is empty", ErrInvalid, op, key)
	}
	return e.throttleCall(ctx, key, n, period, id, reserve)
}

func (e *engine) nextStart(ctx context.Context, key string, n int, period time.Duration) (time.Duration, error) {
	return e.throttleCall(ctx, key, n, period, "", false)
}

func (e *engine) returnStart(ctx context.Context, key, id string) error {
	if key == "" || id == "" {
		return fmt.Errorf("%w: ReturnStart(%q, %q): key and id must not be empty", ErrInvalid, key, id)
	}
	if err := e.b.returnStart(ctx, key, id); err != nil {
		return fmt.Errorf("lockkit: return start %q: %w", key, err)
	}
	return nil
}

// throttleCall takes or reserves a start logged as call, or only tells
// when fewer than n starts began for call "".
func (e *engine) throttleCall(ctx context.Context, key string, n int, period time.Duration, call string, reserve bool) (time.Duration, error) {
	switch {
	case key == "":
		return 0, fmt.Errorf("%w: Throttle: key is empty", ErrInvalid)
	case n < 1:
		return 0, fmt.Errorf("%w: Throttle(%q): n %d must be at least 1", ErrInvalid, key, n)
	case period < time.Millisecond || period > MaxTTL:
		return 0, fmt.Errorf("%w: Throttle(%q): period %s must be between 1ms and %s", ErrInvalid, key, period, MaxTTL)
	}
	wait, err := e.b.throttle(ctx, key, n, period, call, reserve)
	if err != nil {
		return 0, fmt.Errorf("lockkit: throttle %q: %w", key, err)
	}
	return wait, nil
}

func (e *engine) debounce(ctx context.Context, key, id string, quiet, maxWait time.Duration) (Request, error) {
	switch {
	case key == "" || id == "":
		return Request{}, fmt.Errorf("%w: Debounce(%q, %q): key and id must not be empty", ErrInvalid, key, id)
	case quiet < time.Millisecond || quiet > MaxTTL:
		return Request{}, fmt.Errorf("%w: Debounce(%q): quiet %s must be between 1ms and %s", ErrInvalid, key, quiet, MaxTTL)
	case maxWait != 0 && (maxWait < quiet || maxWait > MaxTTL):
		return Request{}, fmt.Errorf("%w: Debounce(%q): maxWait %s must be zero or between quiet (%s) and %s", ErrInvalid, key, maxWait, quiet, MaxTTL)
	}
	r, err := e.b.debounce(ctx, key, id, quiet, maxWait)
	if err != nil {
		return Request{}, fmt.Errorf("lockkit: debounce %q: %w", key, err)
	}
	return r, nil
}

func (e *engine) claim(ctx context.Context, key string, gen int64, force bool) (Request, bool, error) {
	if key == "" || gen <= 0 {
		return Request{}, false, fmt.Errorf("%w: Claim(%q, %d): key must not be empty and gen must be positive", ErrInvalid, key, gen)
	}
	r, ok, err := e.b.claim(ctx, key, gen, force)
	if err != nil {
		return Request{}, false, fmt.Errorf("lockkit: claim %q: %w", key, err)
	}
	return r, ok, nil
}

func (e *engine) forceRelease(ctx context.Context, key, owner string) (int, error) {
	if key == "" {
		return 0, fmt.Errorf("%w: ForceRelease: key is empty", ErrInvalid)
	}
	n, err := e.b.evict(ctx, key, owner, 0, randomID(8))
	if err != nil {
		return 0, fmt.Errorf("lockkit: force-release %q: %w", key, err)
	}
	return n, nil
}

func (e *engine) forceReleaseToken(ctx context.Context, key string, token int64) error {
	if key == "" || token <= 0 {
		return fmt.Errorf("%w: ForceReleaseToken(%q, %d): key must not be empty and token must be positive", ErrInvalid, key, token)
	}
	n, err := e.b.evict(ctx, key, "", token, randomID(8))
	if err != nil {
		return fmt.Errorf("lockkit: force-release %q token %d: %w", key, token, err)
	}
	if n > 0 {
		return nil
	}
	now := "the key has no holder now"
	if info, err := e.b.inspect(ctx, key); err != nil {
		now = "the holders now are unknown: " + err.Error()
	} else if len(info.Holders) > 0 {
		hs := make([]string, len(info.Holders))
		for i, h := range info.Holders {
			hs[i] = fmt.Sprintf("owner %q label %q token %d", h.Owner, h.Label, h.Token)
		}
		now = "it is held now by " + strings.Join(hs, ", ")
	}
	return fmt.Errorf("%w: force-release %q: the holder of token %d no longer holds it (it ended or was released); %s", ErrNotHeld, key, token, now)
}

func (e *engine) free(ctx context.Context, key, label string) (bool, error) {
	if key == "" || label == "" {
		return false, fmt.Errorf("%w: Free(%q, %q): key and label must not be empty", ErrInvalid, key, label)
	}
	ok, err := e.b.free(ctx, key, label)
	if err != nil {
		return false, fmt.Errorf("lockkit: free %q label %q: %w", key, label, err)
	}
	return ok, nil
}

// notAcquired reports a failed attempt and returns its error.
func (e *engine) notAcquired(r *request, res acquireResult) error {
	switch {
	case res.completed:
		return fmt.Errorf("%w: %q label %q", ErrCompleted, r.key, r.label)
	case res.abandoned:
		return fmt.Errorf("lockkit: acquire %q: the call was abandoned", r.key)
	case res.covered != nil:
		return res.covered
	case res.superseded:
		return fmt.Errorf("%w: %q", ErrSuperseded, r.key)
	case res.conflict == nil:
		return fmt.Errorf("%w: %q epoch %d is not after %d", ErrEpochUsed, r.key, r.epoch, res.lastEpoch)
	}
	e.emit(Event{Kind: EventContended, Key: r.key, Owner: res.conflict.Owner, Token: res.conflict.Token, Err: res.conflict})
	return res.conflict
}

func (e *engine) acquireWait(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	r, err := e.cfg.request(key, opt)
	if err != nil {
		return nil, err
	}
	if err := e.begin(ctx); err != nil {
		return nil, err
	}
	defer e.calls.Done()
	e.awaitOwnRelease(ctx, r.key)
	r.waiter = randomID(8)
	if r.coalesce && !r.final {
		r.waiter = "y" + r.waiter // a Coalesce follow-up, which others may fold into ("y" is no hex digit)
	}
	handTTL := handOverTTL(&r)
	if handTTL > 0 {
		// A release may hand the key to this call (release.lua): the waiter
		// id says how.
		r.waiter = handOverID(r.waiter, handTTL, &r)
	}
	start := time.Now()
	var (
		lastSent time.Time
		wake     <-chan int64
		timer    *time.Timer
		conflict *ConflictError
		tried    bool
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	// giveUp ends the wait. Only a wait that ended (between attempts, or
	// by ctx during one) with the key held by someone else is reported as
	// not acquired (ErrNotAcquired); an attempt that failed otherwise is an
	// error whatever the earlier ones found.
	giveUp := func(cause error, held bool) error {
		if tried {
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = e.b.leave(lctx, key, r.waiter, r.aid)
			cancel()
		}
		if held && conflict != nil {
			return fmt.Errorf("lockkit: acquire %q: %w: %w", key, cause, conflict)
		}
		return fmt.Errorf("lockkit: acquire %q: %w", key, cause)
	}
	for {
		if e.isClosed() {
			return nil, giveUp(ErrClosed, true)
		}
		if err := ctx.Err(); err != nil {
			return nil, giveUp(err, true)
		}
		sent := time.Now()
		tried, lastSent = true, sent
		res, err := e.b.acquire(ctx, &r)
		if res.since > 0 {
			r.since = res.since
		}
		if r.supersede == "1" {
			r.supersede = "2" // claimed on the first attempt
			if c := res.conflict; c != nil && r.label != "" && c.Label == r.label {
				// Its own earlier delivery holds the key: this call claimed
				// nothing and waits for the key as a plain call does.
				r.supersede = "0"
			}
		}
		if r.preempt == "1" {
			r.preempt = "2" // the holders it found are preempted
		}
		if err != nil {
			// The script may have run: make sure what it took is given back.
			e.orphan(r.key, r.aid, sent.Add(r.ttl), 0)
			if ctx.Err() != nil {
				// The wait ran out during an attempt: as between attempts.
				return nil, giveUp(ctx.Err(), true)
			}
			return nil, giveUp(err, false)
		}
		if res.ok {
			return e.hold(ctx, &r, res, sent, time.Since(start))
		}
		if res.conflict == nil {
			return nil, e.notAcquired(&r, res)
		}
		if wake == nil {
			// Subscribe before the next attempt so a release between the two is seen.
			var stop func()
			wake, stop = e.b.wakeups(key, r.waiter)
			defer stop()
			conflict = res.conflict
			e.emit(Event{Kind: EventContended, Key: key, Owner: conflict.Owner, Token: conflict.Token, Err: conflict})
			continue
		}
		conflict = res.conflict
		d := e.cfg.poll
		if c := res.conflict; c.Holders >= r.limit && c.Ahead == 0 && c.TTL > 0 && c.TTL+time.Millisecond < d {
			d = c.TTL + time.Millisecond // the holder's lease runs out first
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, giveUp(ctx.Err(), true)
		case <-e.stop:
			return nil, giveUp(ErrClosed, true)
		case token := <-wake:
			// A release that handed the key over did so after this call's
			// last attempt was sent, for handTTL: unless that leaves too
			// little, the lease is held without another round trip (and
			// renewed to its TTL soon). The next attempt finds it otherwise.
			if token > 0 && time.Until(validUntil(lastSent, handTTL)) > handTTL/2 {
				return e.hold(ctx, &r, acquireResult{token: token, left: handTTL}, lastSent, time.Since(start))
			}
		case <-timer.C:
		}
	}
}

// handOverID is the waiter id of r that lets a release hand it the key for
// ttl (release.lua).
func handOverID(id string, ttl time.Duration, r *request) string {
	return "g" + id + ":" + strconv.FormatInt(ms(ttl), 10) + ":" + r.aid + ":" + escapeLabel(r.label) + ":" + r.owner
}

// handOverTTL is the TTL with which a release may hand the key to the
// waiting call r, or 0 when it may not: only a plain acquire (one holder, no
// epoch, Coalesce, Supersede, Preempt or Adopt, renewed) is handed the key. The TTL is short, so that a waiter that died leaves the key free soon
// (a live waiter's Locker renews it within a third of it): its waiter TTL,
// at least 200ms, at most its TTL.
func handOverTTL(r *request) time.Duration {
	if r.limit != 1 || r.epoch != 0 || r.coalesce || r.supersede != "0" || r.preempt != "0" ||
		r.adopt || r.detached || r.interval <= 0 {
		return 0
	}
	return min(max(r.waiterTTL, 200*time.Millisecond), r.ttl)
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
		coalesce:     r.coalesce,
		coverFor:     r.coverFor,
		hold:         r.hold,
		async:        r.async,
		onParked:     r.onParked,
		plain:        res.plain,
		parkedBefore: res.wasParked,
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
	if r.detached {
		// A reservation: its TTL alone bounds it; nothing here renews or
		// releases it.
		e.emit(Event{Kind: EventAcquired, Key: l.key, Owner: l.owner, Token: token, Wait: waited})
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
	if r.preempt != "0" {
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
	e.emit(Event{Kind: EventAcquired, Key: l.key, Owner: l.owner, Token: token, Wait: waited})
	return l, nil
}

// startLocked starts the renewer if it is not running. e.mu is held.
func (e *engine) startLocked() {
	if !e.started && !e.closed {
		e.started = true
		e.b.watchOperators(e.operatorRelease)
		e.wg.Add(2)
		go e.renewLoop()
		go e.releaseLoop()
	}
}

// orphan makes the renewer remove the holder that acquire call aid on key may
// have left, until it succeeds or until, when the holder would have expired
// anyway. After Close it is attempted once by Close.
// orphan makes the renewer remove, in the background, the holder that the
// acquire call aid may have left on key; hold is the HoldAtLeast of a lease
// whose run happened (its release failed), zero otherwise.
func (e *engine) orphan(key, aid string, until time.Time, hold time.Duration) {
	ttl := max(time.Until(until), MinTTL)
	o := &orphan{l: &Lease{e: e, key: key, aid: aid, ttl: ttl, hold: hold, state: stateReleased}, until: until}
	e.mu.Lock()
	e.orphans = append(e.orphans, o)
	e.startLocked()
	e.mu.Unlock()
	e.poke()
}

// validUntil is when a lease whose TTL started at sent must be treated as gone:
// a little before Redis expires it, so that work stops before another owner
// can start.
func validUntil(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - ttl/20)
}

// renewNow makes l's renewal due now.
func (e *engine) renewNow(l *Lease) {
	e.mu.Lock()
	due := l.state == stateHeld && l.interval > 0
	if due {
		l.nextRenew = time.Now()
	}
	e.mu.Unlock()
	if due {
		e.poke()
	}
}

func (e *engine) poke() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// renewLoop is the Locker's single renewer: it renews every held lease in
// pipelined batches, one per Redis server, and marks leases lost when their
// validity runs out. A lease is in at most one batch at a time and each batch
// ends by the validity of its leases, so a hung server cannot pile up
// goroutines, and loss is detected on time even while a batch hangs. It also
// removes orphaned holders.
func (e *engine) renewLoop() {
	defer e.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	results := make(chan []renewed, 4)
	var next time.Time
	rescan := true
	for {
		if rescan {
			var due []*Lease
			var orphans []*orphan
			due, orphans, next = e.scan(time.Now())
			if len(due) > 0 {
				for _, g := range e.b.groups(due) {
					e.wg.Add(1)
					go e.renewBatch(g, results)
				}
			}
			if len(orphans) > 0 {
				e.wg.Add(1)
				go e.releaseOrphans(orphans)
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Until(next))
		rescan = true
		select {
		case <-e.stop:
			return
		case <-e.kick:
		case rs := <-results:
			// Only the batch's leases changed: the next look is the
			// earlier of the scan's and theirs, without another scan of
			// every lease. Leases acquired or extended meanwhile poke.
			if then := e.applyRenewals(rs); then.Before(next) {
				next = then
				e.mu.Lock()
				if next.Before(e.nextWake) {
					e.nextWake = next
				}
				e.mu.Unlock()
			}
			rescan = false
		case <-timer.C:
		}
	}
}

type renewed struct {
	l    *Lease
	sent time.Time
	ttl  time.Duration // the TTL the renewal carried
	gen  int           // the lease's Extend count when it was sent
	err  error
	ok   bool // set by applyRenewals: the lease was held and renewed
}

// scan marks expired leases lost and returns the leases due for renewal and
// the orphans due for removal, marking them in flight. next is when the loop
// must look again.
func (e *engine) scan(now time.Time) (due []*Lease, orphans []*orphan, next time.Time) {
	next = now.Add(time.Hour)
	var lost []*Lease
	e.mu.Lock()
	for l := range e.leases {
		if !now.Before(l.validUntil) {
			lost = append(lost, l)
			continue
		}
		if l.validUntil.Before(next) {
			next = l.validUntil
		}
		if l.renewing || l.interval == 0 {
			continue
		}
		// Renew a little early so that leases acquired close together share a batch.
		if l.nextRenew.Sub(now) <= l.interval/4 {
			l.renewing = true
			due = append(due, l)
		} else if l.nextRenew.Before(next) {
			next = l.nextRenew
		}
	}
	live := e.orphans[:0]
	for _, o := range e.orphans {
		switch {
		case o.inflight:
		case !now.Before(o.until):
			continue // the holder, if any, has expired
		case !now.Before(o.next):
			o.inflight = true
			orphans = append(orphans, o)
		case o.next.Before(next):
			next = o.next
		}
		live = append(live, o)
	}
	clear(e.orphans[len(live):])
	e.orphans = live
	e.nextWake = next
	e.mu.Unlock()
	for _, l := range lost {
		cause := l.lastRenewErr
		if cause == nil {
			cause = errors.New("not renewed in time")
		}
		l.markLost(fmt.Errorf("%w: %q: validity ran out: %w", ErrLost, l.key, cause))
	}
	return due, orphans, next
}

// renewBatch renews leases stored on one server, in pipelines of at most
// WithRenewBatch, each bounded by the validity of its leases.
func (e *engine) renewBatch(due []*Lease, out chan<- []renewed) {
	defer e.wg.Done()
	rs := make([]renewed, 0, len(due))
	for start := 0; start < len(due); start += e.cfg.renewBatch {
		chunk := due[start:min(start+e.cfg.renewBatch, len(due))]
		ttls := make([]time.Duration, len(chunk))
		gens := make([]int, len(chunk))
		e.mu.Lock()
		deadline := chunk[0].validUntil
		for i, l := range chunk {
			ttls[i], gens[i] = l.ttl, l.gen
			if l.validUntil.Before(deadline) {
				deadline = l.validUntil
			}
		}
		e.mu.Unlock()
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		sent := time.Now()
		errs := e.b.extend(ctx, chunk, ttls, true)
		cancel()
		for i, l := range chunk {
			rs = append(rs, renewed{l: l, sent: sent, ttl: ttls[i], gen: gens[i], err: errs[i]})
		}
	}
	select {
	case out <- rs:
	case <-e.stop:
	}
}

// applyRenewals records a batch's results on its leases, reports the lost,
// preempted and failed ones, and emits EventRenewed. It returns when the
// renewer must look at these leases next: the earliest of their renewals
// and validity ends (an hour from now when none is held).
func (e *engine) applyRenewals(rs []renewed) time.Time {
	now := time.Now()
	var (
		events                   []Event
		gone, preempted, evicted []*Lease
	)
	next := now.Add(time.Hour)
	e.mu.Lock()
	for i := range rs {
		r := &rs[i]
		l := r.l
		l.renewing = false
		if l.state != stateHeld {
			continue
		}
		switch {
		case r.err == nil:
			// A renewal never shortens the lease in Redis, so it can only add
			// validity; one sent before an Extend says nothing of the TTL now.
			if l.gen == r.gen {
				if v := validUntil(r.sent, r.ttl); v.After(l.validUntil) {
					l.validUntil = v
				}
				l.nextRenew = r.sent.Add(l.interval)
				l.lastRenewErr, l.renewFails = nil, 0
			} else if !l.nextRenew.After(now) {
				l.nextRenew = now.Add(max(l.interval/4, 10*time.Millisecond))
			}
			r.ok = true
			if l.nextRenew.Before(next) {
				next = l.nextRenew
			}
		case errors.Is(r.err, errNotHeld):
			gone = append(gone, l)
		case errors.Is(r.err, errPreempted):
			preempted = append(preempted, l)
		case errors.Is(r.err, errEvicted):
			evicted = append(evicted, l)
		default:
			l.lastRenewErr = r.err
			l.renewFails++
			l.nextRenew = now.Add(renewRetry(l.interval, l.renewFails, l.validUntil.Sub(now)))
			if l.nextRenew.Before(next) {
				next = l.nextRenew
			}
			events = append(events, Event{Kind: EventRenewFailed, Key: l.key, Owner: l.owner, Token: l.token, Err: r.err})
		}
		if l.validUntil.Before(next) {
			next = l.validUntil
		}
	}
	e.mu.Unlock()
	for _, l := range gone {
		l.markLost(fmt.Errorf("%w: %q: the key expired or was taken over", ErrLost, l.key))
	}
	for _, l := range preempted {
		l.preempt()
	}
	for _, l := range evicted {
		l.evicted()
	}
	for _, ev := range events {
		e.emit(ev)
	}
	// EventRenewed, one per lease and tick, only when someone takes it, and
	// built here rather than gathered: a tick may renew many thousands.
	if e.cfg.observer != nil || e.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		for i := range rs {
			if r := &rs[i]; r.ok {
				e.emit(Event{Kind: EventRenewed, Key: r.l.key, Owner: r.l.owner, Token: r.l.token})
			}
		}
	}
	return next
}

// renewRetry is how long after its fails-th failure in a row a renewal is
// tried again: a quarter of the renew interval (at least 10ms), doubling
// with each failure, but at most half the validity left (so that a few more
// tries fit before the lease counts as lost), and never under 10ms.
func renewRetry(interval time.Duration, fails int, left time.Duration) time.Duration {
	d := max(interval/4, 10*time.Millisecond) << min(max(fails-1, 0), 8)
	return max(min(d, left/2), 10*time.Millisecond)
}

// releaseOrphans removes orphaned holders; the ones that fail are retried
// with a growing delay.
func (e *engine) releaseOrphans(os []*orphan) {
	defer e.wg.Done()
	leases := make([]*Lease, len(os))
	for i, o := range os {
		leases[i] = o.l
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	_, err := e.b.release(ctx, leases, nil)
	cancel()
	e.mu.Lock()
	now := time.Now()
	for _, o := range os {
		o.inflight = false
		if err == nil {
			o.until = now // done
			continue
		}
		o.next = now.Add(min(max(time.Until(o.until)/8, 10*time.Millisecond), time.Second))
	}
	e.mu.Unlock()
	if err != nil {
		e.cfg.logger.Warn("lockkit: removing holders of failed calls", "count", len(os), "err", err)
	}
	e.poke()
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

// operatorRelease ends, with a cause that says an operator released them,
// the leases of key that a ForceRelease removed: notice is "t<token>" for
// the one of that token, or "f<top>:<owner>" for those up to top of owner
// (of any owner for ""). It comes from the store's operators' channel, so a
// lease hears of it in milliseconds, not at its next renewal.
func (e *engine) operatorRelease(key, notice string) {
	var token, top int64
	owner, any := "", false
	switch {
	case strings.HasPrefix(notice, "t"):
		token, _ = strconv.ParseInt(notice[1:], 10, 64)
	case strings.HasPrefix(notice, "f"):
		n, o, _ := strings.Cut(notice[1:], ":")
		top, _ = strconv.ParseInt(n, 10, 64)
		owner, any = o, true
	default:
		return
	}
	var ended []*Lease
	e.mu.Lock()
	for l := range e.leases {
		if l.key != key {
			continue
		}
		if (!any && l.token == token) || (any && l.token <= top && (owner == "" || owner == l.owner)) {
			ended = append(ended, l)
		}
	}
	e.mu.Unlock()
	for _, l := range ended {
		l.evicted()
	}
}
