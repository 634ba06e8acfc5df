package lockcore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/glob"
)

// backend is the storage a Locker runs on (Redis). Every
// method is one atomic step; the engine adds waiting, renewal and events.
type backend interface {
	// ready reports whether the store can serve this Locker (RedisLocker:
	// the server's version); it is called before the first acquire.
	ready(ctx context.Context) error
	acquire(ctx context.Context, r *request) (acquireResult, error)
	// confirm makes r's lease of token, found taken for r without a
	// write of its own (a hand-over), acknowledged by the replicas that
	// WithReplicaAcks asks for, or fails.
	confirm(ctx context.Context, r *request, token int64) error
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
	// unpark removes entry from key's parked queue.
	unpark(ctx context.Context, key, entry string) error
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
		e.orphan(r.key, r.aid, sent.Add(r.ttl), r.onParked)
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
			e.orphanRelease(l, ending{})
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

// RedisLocker is a Locker backed by Redis, shared by every process that uses
// the same Redis and prefix. All keys of one lock share a {hash tag}, so it
// works on Redis Cluster as well as standalone and Sentinel deployments.
//
// Redis layout for key K under prefix P: P{K}:h holds the holders. A plain
// lock (limit 1, no waiting, queue, epoch, Coalesce, Supersede, Preempt,
// TakeReservation or Park) that no other kind of acquire touched keeps its one holder
// there as a STRING; its release leaves "~<token>." there for the client's
// retry window: the last token and the record of the release, moved into
// P{K}:d:<token> when the key is taken again within the window. Any
// other operation first turns the STRING into a sorted set scored by expiry,
// with records of completed labels and cleaned-up calls, which the key keeps
// while waiters, a queue or parked jobs may live; its released holders are
// then kept in P{K}:d for the retry window, or, by a release that leaves the
// key empty, in P{K}:h as a plain release leaves it. P{K}:b holds the newest request
// recorded by Debounce, P{K}:k the parked jobs (Parking.ID), P{K}:c
// the start of the last Coalesce run that succeeded, P{K}:f the last fencing
// token (for a second), P{K}:m the last epoch and the order of the latest Supersede run, P{K}:q and P{K}:w the
// waiters; releases are published on P{K}:r. In P and K, the characters
// '{', '}' and '%' are written %7B, %7D and %25, so that {K} is always the
// hash tag: any key and any prefix work on Redis Cluster. Every key expires
// on its own; nothing a released lock leaves outlives the retry window (see
// NewRedis).
//
// Every script is safe to run twice, as go-redis does when a reply is late:
// a repeated acquire returns the lease its first run took, a repeated release
// reports the same success.
type RedisLocker struct {
	e *engine
	r *redisBackend
}

var _ Locker = (*RedisLocker)(nil)

// NewRedis returns a RedisLocker using client, which it does not close. It
// returns an error matching ErrInvalid for a nil client (also a typed nil) or
// an invalid option. The Locker starts no goroutine until a lease is acquired
// or a waiter waits; call Close to stop them. Its first acquire checks the
// server's version and fails with ErrUnsupported below MinRedisVersion.
//
// A released lock's holders key is kept for the client's retry window,
// (MaxRetries+1) × (ReadTimeout + MaxRetryBackoff) (a ClusterClient:
// (MaxRedirects+1) × (MaxRetries+1) attempts), between a second and a
// minute: 14s with go-redis v9.17's defaults, 24s with v9.23's; so that a
// release that go-redis sends again reports the same.
func NewRedis(client redis.UniversalClient, opts ...Option) (*RedisLocker, error) {
	cfg, err := clientConfig("NewRedis", client, opts)
	if err != nil {
		return nil, err
	}
	if err := acksFit(client, cfg.acks); err != nil {
		return nil, err
	}
	b := &redisBackend{c: client, prefix: escapeKey(cfg.prefix), grace: retryWindow(client), acks: cfg.acks, subs: make(map[string]*subscribers)}
	if cfg.batching {
		b.lanes = &lanes{b: b}
	}
	return &RedisLocker{e: newEngine(cfg, b), r: b}, nil
}

// clientConfig is the config of opts for op on client: it refuses a nil
// client, also a typed nil, and an invalid option.
func clientConfig(op string, client redis.UniversalClient, opts []Option) (config, error) {
	if client == nil {
		return config{}, fmt.Errorf("%w: %s: client is nil", ErrInvalid, op)
	}
	if v := reflect.ValueOf(client); v.Kind() == reflect.Pointer && v.IsNil() {
		return config{}, fmt.Errorf("%w: %s: client is a nil %T", ErrInvalid, op, client)
	}
	return newConfig(opts)
}

// retryWindow is how long after a command's first run go-redis may run it
// again: every attempt waits for a read timeout and a backoff. A Client and
// a Ring make 1 + MaxRetries attempts; a ClusterClient makes 1 +
// MaxRedirects (default 3) attempts, on a node whose client makes 1 +
// MaxRetries each (MaxRetries defaults to none for a cluster).
func retryWindow(client redis.UniversalClient) time.Duration {
	attempts, read, backoff := 4, 3*time.Second, 512*time.Millisecond
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		attempts, read, backoff = max(o.MaxRetries, 0)+1, o.ReadTimeout, o.MaxRetryBackoff
	case *redis.ClusterClient:
		o := c.Options()
		attempts, read, backoff = (max(o.MaxRedirects, 0)+1)*(max(o.MaxRetries, 0)+1), o.ReadTimeout, o.MaxRetryBackoff
	case *redis.Ring:
		o := c.Options()
		attempts, read, backoff = max(o.MaxRetries, 0)+1, o.ReadTimeout, o.MaxRetryBackoff
	}
	if read <= 0 {
		read = 3 * time.Second
	}
	w := time.Duration(attempts) * (read + max(backoff, 0))
	return min(max(w, time.Second), time.Minute)
}

// Owner returns the owner id recorded with this Locker's leases.
func (l *RedisLocker) Owner() string { return l.e.cfg.owner }

// TryAcquire implements Locker.
func (l *RedisLocker) TryAcquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return l.e.tryAcquire(ctx, key, opt)
}

// Acquire implements Locker.
func (l *RedisLocker) Acquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return l.e.acquireWait(ctx, key, opt)
}

// Inspect implements Locker.
func (l *RedisLocker) Inspect(ctx context.Context, key string) (*Info, error) {
	return l.e.inspect(ctx, key)
}

// ForceRelease implements Locker.
func (l *RedisLocker) ForceRelease(ctx context.Context, key string, which Select) (int, error) {
	return l.e.forceRelease(ctx, key, which)
}

// Unpark takes out of key's parked queue the entry that an acquire with
// opt parks (its Park.ID, under its Label and Park.Hold), for a job whose
// work is done without its running (the work's earlier run did it): no
// release is to reserve the key for it, and its entry does not stay for the
// ten minutes a parked id is kept. It does nothing for an opt that does not
// park, nor when the entry is not queued; safe to call twice. It returns an
// error matching ErrInvalid for an opt that TryAcquire refuses, and
// otherwise the Redis call's error (with WithReplicaAcks, also when too few
// replicas acknowledged the removal).
func (l *RedisLocker) Unpark(ctx context.Context, key string, opt *AcquireOptions) error {
	return l.e.unpark(ctx, key, opt)
}

// CancelRun implements Locker.
func (l *RedisLocker) CancelRun(ctx context.Context, key string, which Select) (int, error) {
	return l.e.cancelRun(ctx, key, which)
}

// Redis returns the client the Locker was built on and its key prefix
// (WithPrefix; DefaultPrefix without it), for what keeps its own state
// beside the Locker's leases on the same Redis and prefix: a
// throttle.Throttle or a debounce.Debouncer built with them shares the
// budgets and requests of every process on that Redis and prefix.
func (l *RedisLocker) Redis() (client redis.UniversalClient, prefix string) {
	return l.r.c, l.e.cfg.prefix
}

// Held returns how many leases the Locker holds and renews now (not
// reservations, which nothing renews).
func (l *RedisLocker) Held() int { return l.e.held() }

// Logger returns the logger set with WithLogger (slog.Default() without
// it). The layers above lockkit log through it, when the Locker they are
// given is a *RedisLocker, unless they are given their own.
func (l *RedisLocker) Logger() *slog.Logger { return l.e.cfg.logger }

// Close implements Locker. It does not close the Redis client.
func (l *RedisLocker) Close(ctx context.Context) error { return l.e.close(ctx) }

// Keys implements Locker. It uses SCAN on every master, never KEYS, then
// checks each key's holders; a key may be missed or reported after it was
// released, as SCAN guarantees. It walks the whole keyspace: ScanKeys reads
// one bounded page.
func (l *RedisLocker) Keys(ctx context.Context, pattern string) ([]string, error) {
	match := glob.Escape(l.r.prefix) + "{" + serverGlob(pattern) + "}:h"
	var (
		mu  sync.Mutex
		out []string
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var found []string
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			found = append(found, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return err
		}
		live, err := l.r.liveKeys(ctx, c, l.matching(found, pattern))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		out = append(out, live...)
		return nil
	}
	var err error
	if cc, ok := l.r.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, l.r.c)
	}
	if err != nil {
		return nil, fmt.Errorf("lockkit: keys %q: %w", pattern, err)
	}
	sort.Strings(out)
	return out, nil
}

// request is a validated acquire with every default filled in.
type request struct {
	key   string
	owner string
	// aid identifies one acquire call: a repeated script of the same call
	// returns the lease the first run took instead of a conflict with it.
	aid      string
	label    string
	ttl      time.Duration
	interval time.Duration // 0 when renewal is off
	limit    int
	fair     bool
	epoch    int64
	epochTTL time.Duration
	epochTag string
	// waiter is set when the caller waits: it registers in the key's waiter set.
	waiter    string
	waiterTTL time.Duration
	// mode is the FollowUp's mode, modeNone without one.
	mode followUpMode
	// later: the call's first attempt reached the store (the later attempts
	// of a waiting call). On its first, a KeepNewest or Preempt call takes
	// the key's follow-up place and a Preempt call preempts the holders.
	later bool
	// behindOwnRun: a KeepNewest or Preempt call whose own earlier delivery
	// holds the key waits for it as a plain call: it is no follow-up.
	behindOwnRun bool
	// final: a Coalesce call that covers no other (modeFinal); its acquire
	// id starts with finalMark, which marks its holder for the Coalesce
	// calls that find it (acquire_coalesce.lua)
	final bool
	// since is when a Coalesce call's first attempt reached the store
	// (server microseconds), -1 before it did.
	since    int64
	coverFor time.Duration
	// reserved: the holder is a reservation from the start
	// (AcquireOptions.Reserve); takeReserved: it replaces a live
	// reservation carrying its label (AcquireOptions.TakeReservation).
	reserved     bool
	takeReserved bool
	hold         time.Duration
	order        int64 // the Order of a KeepNewest or Preempt FollowUp
	async        bool  // AcquireOptions.AsyncRelease
	grace        time.Duration
	// park, parkHold and onParked are AcquireOptions.Park's ID, Hold
	// (DefaultParkHold when zero) and OnParked.
	park     string
	parkHold time.Duration
	onParked func(key, id string)
}

func (c *config) request(key string, o *AcquireOptions) (request, error) {
	if o == nil {
		o = &AcquireOptions{}
	}
	r := request{key: key, owner: c.owner, label: o.Label, ttl: o.TTL, limit: o.Limit, fair: o.Fair, epoch: o.Epoch, epochTTL: o.EpochTTL, epochTag: o.EpochTag,
		since: -1, coverFor: DefaultCoverFor, reserved: o.Reserve}
	if key == "" {
		return r, fmt.Errorf("%w: key is empty", ErrInvalid)
	}
	if r.ttl == 0 {
		r.ttl = c.ttl
	}
	if r.ttl < MinTTL {
		return r, fmt.Errorf("%w: key %q: TTL %s is shorter than MinTTL (%s)", ErrInvalid, key, r.ttl, MinTTL)
	}
	if r.ttl > MaxTTL {
		return r, fmt.Errorf("%w: key %q: TTL %s is longer than MaxTTL (%s)", ErrInvalid, key, r.ttl, MaxTTL)
	}
	if !o.NoRenew && !o.Reserve {
		r.interval = o.RenewInterval
		if r.interval == 0 {
			r.interval = r.ttl / 3
		}
		if r.interval < 0 || r.interval >= r.ttl {
			return r, fmt.Errorf("%w: key %q: RenewInterval %s must be positive and shorter than TTL %s", ErrInvalid, key, o.RenewInterval, r.ttl)
		}
	}
	if r.limit == 0 {
		r.limit = 1
	}
	if r.limit < 1 || r.limit > MaxLimit {
		return r, fmt.Errorf("%w: key %q: Limit %d must be between 1 and MaxLimit (%d)", ErrInvalid, key, o.Limit, MaxLimit)
	}
	if r.epoch < 0 {
		return r, fmt.Errorf("%w: key %q: Epoch %d must not be negative", ErrInvalid, key, r.epoch)
	}
	if r.epochTTL < 0 || r.epochTTL > MaxTTL {
		return r, fmt.Errorf("%w: key %q: EpochTTL %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, r.epochTTL, MaxTTL)
	}
	if r.epochTTL == 0 {
		r.epochTTL = r.ttl
	}
	if r.epochTag != "" && r.epoch == 0 {
		return r, fmt.Errorf("%w: key %q: EpochTag %q needs an Epoch", ErrInvalid, key, r.epochTag)
	}
	if len(r.epochTag) > MaxEpochTag {
		return r, fmt.Errorf("%w: key %q: EpochTag is %d bytes, longer than MaxEpochTag (%d)", ErrInvalid, key, len(r.epochTag), MaxEpochTag)
	}
	if err := r.followUp(o.FollowUp); err != nil {
		return r, err
	}
	r.waiterTTL = 4 * c.poll
	r.aid = randomID(8)
	if r.reserved {
		r.aid = reservedMark + r.aid // a reservation, which TakeReservation may replace
		r.final = false              // a reservation's holder is not marked final
	} else if r.final {
		r.aid = finalMark + r.aid // the holder of a final Coalesce call, which covers no other
	}
	if r.limit > 1 {
		r.aid += limitMark + strconv.Itoa(r.limit) // the limit its holder keeps on the key
	}
	if o.TakeReservation && r.label == "" {
		return r, fmt.Errorf("%w: key %q: TakeReservation needs a Label", ErrInvalid, key)
	}
	if o.TakeReservation && r.reserved {
		return r, fmt.Errorf("%w: key %q: TakeReservation and Reserve exclude each other", ErrInvalid, key)
	}
	r.takeReserved = o.TakeReservation
	if o.HoldAtLeast < 0 || o.HoldAtLeast > MaxTTL {
		return r, fmt.Errorf("%w: key %q: HoldAtLeast %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, o.HoldAtLeast, MaxTTL)
	}
	r.hold = o.HoldAtLeast
	r.async = o.AsyncRelease
	r.parkHold = DefaultParkHold
	if p := o.Park; p != nil {
		r.park, r.onParked = p.ID, p.OnParked
		if r.park != "" && (r.label == "" || r.limit > 1) {
			return r, fmt.Errorf("%w: key %q: Park.ID %q needs a Label and Limit 1 (Label %q, Limit %d)", ErrInvalid, key, r.park, r.label, r.limit)
		}
		if p.Hold < 0 || p.Hold > MaxTTL {
			return r, fmt.Errorf("%w: key %q: Park.Hold %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, p.Hold, MaxTTL)
		}
		if p.Hold > 0 {
			r.parkHold = p.Hold
		}
	}
	return r, nil
}

// followUp fills r's follow-up fields from f, an AcquireOptions.FollowUp,
// after r's limit and fair are set. A pointer to one of the three types
// stands for its value.
func (r *request) followUp(f FollowUp) error {
	switch p := f.(type) {
	case *Coalesce:
		if p == nil {
			return fmt.Errorf("%w: key %q: FollowUp is a nil *lockcore.Coalesce", ErrInvalid, r.key)
		}
		f = *p
	case *KeepNewest:
		if p == nil {
			return fmt.Errorf("%w: key %q: FollowUp is a nil *lockcore.KeepNewest", ErrInvalid, r.key)
		}
		f = *p
	case *Preempt:
		if p == nil {
			return fmt.Errorf("%w: key %q: FollowUp is a nil *lockcore.Preempt", ErrInvalid, r.key)
		}
		f = *p
	}
	switch f := f.(type) {
	case nil:
		return nil
	case Coalesce:
		if err := r.oneHolder("Coalesce"); err != nil {
			return err
		}
		if !f.Since.IsZero() {
			if f.Since.UnixMicro() <= 0 {
				return fmt.Errorf("%w: key %q: Coalesce.Since %s is not after 1970", ErrInvalid, r.key, f.Since.Format(time.RFC3339Nano))
			}
			r.since = f.Since.UnixMicro()
		}
		if f.CoverFor < 0 || f.CoverFor > MaxTTL {
			return fmt.Errorf("%w: key %q: Coalesce.CoverFor %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, r.key, f.CoverFor, MaxTTL)
		}
		if f.CoverFor > 0 {
			r.coverFor = f.CoverFor
		}
		r.mode, r.final = modeCoalesce, f.Final
		return nil
	case KeepNewest:
		return r.keepNewest("KeepNewest", f.Order)
	case Preempt:
		if err := r.oneHolder("Preempt"); err != nil {
			return err
		}
		if f.Grace < 0 || f.Grace > MaxTTL {
			return fmt.Errorf("%w: key %q: Preempt.Grace %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, r.key, f.Grace, MaxTTL)
		}
		r.grace = f.Grace
		if err := r.keepNewest("Preempt", f.Order); err != nil {
			return err
		}
		r.mode = modePreempt
		return nil
	}
	return fmt.Errorf("%w: key %q: FollowUp %T is not a Coalesce, KeepNewest or Preempt value", ErrInvalid, r.key, f)
}

// oneHolder checks that r, with the follow-up named mode, has a Limit of 1
// and no Fair.
func (r *request) oneHolder(mode string) error {
	if r.limit > 1 || r.fair {
		return fmt.Errorf("%w: key %q: %s works with one holder and no Fair queue (Limit %d, Fair %t)", ErrInvalid, r.key, mode, r.limit, r.fair)
	}
	return nil
}

// keepNewest makes r the key's pending follow-up with order, the Order of
// the follow-up named mode.
func (r *request) keepNewest(mode string, order int64) error {
	if order < 0 {
		return fmt.Errorf("%w: key %q: %s.Order %d must not be negative", ErrInvalid, r.key, mode, order)
	}
	r.mode, r.order = modeKeepNewest, order
	return nil
}
