package lockkit

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
	acquire(ctx context.Context, r *request) (acquireResult, error)
	// release removes each lease; held[i] reports whether lease i was still held.
	release(ctx context.Context, leases []*Lease) (held []bool, err error)
	// extend renews each lease for its TTL; errs[i] is nil, errNotHeld or a failure.
	extend(ctx context.Context, leases []*Lease) (errs []error)
	// leave removes a waiter that gave up.
	leave(ctx context.Context, key, waiter string) error
	inspect(ctx context.Context, key string) (*Info, error)
	// wakeups returns a channel that receives when key is released, and a
	// function that stops the notifications.
	wakeups(key string) (<-chan struct{}, func())
	close() error
}

type acquireResult struct {
	ok        bool
	token     int64
	conflict  *ConflictError
	lastEpoch int64 // set (with ok false and conflict nil) when the epoch was used
}

var errNotHeld = errors.New("not held")

// engine is the part of a Locker shared by every backend: waiting, the one
// renewer loop, lease bookkeeping and events.
type engine struct {
	cfg config
	b   backend

	mu     sync.Mutex
	leases map[*Lease]struct{}
	closed bool

	// nextWake is when the renewer plans to look at the leases next; a new
	// lease only wakes it earlier when it needs attention before then.
	nextWake time.Time
	kick     chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
	started  bool
	stopOnce sync.Once
}

func newEngine(cfg config, b backend) *engine {
	return &engine{
		cfg:    cfg,
		b:      b,
		leases: make(map[*Lease]struct{}),
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
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

func (e *engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func (e *engine) tryAcquire(ctx context.Context, key string, opt *Options) (*Lease, error) {
	r, err := e.cfg.request(key, opt)
	if err != nil {
		return nil, err
	}
	if e.isClosed() {
		return nil, ErrClosed
	}
	sent := time.Now()
	res, err := e.b.acquire(ctx, &r)
	if err != nil {
		return nil, fmt.Errorf("lockkit: acquire %q: %w", key, err)
	}
	if res.ok {
		return e.hold(&r, res.token, sent, 0), nil
	}
	return nil, e.notAcquired(key, r.epoch, res)
}

// notAcquired reports a failed attempt and returns its error.
func (e *engine) notAcquired(key string, epoch int64, res acquireResult) error {
	if res.conflict == nil {
		return epochErr(key, epoch, res.lastEpoch)
	}
	e.emit(Event{Kind: EventContended, Key: key, Owner: res.conflict.Owner, Token: res.conflict.Token, Err: res.conflict})
	return res.conflict
}

func epochErr(key string, epoch, last int64) error {
	return fmt.Errorf("%w: %q epoch %d is not after %d", ErrEpochUsed, key, epoch, last)
}

func (e *engine) acquireWait(ctx context.Context, key string, opt *Options) (*Lease, error) {
	r, err := e.cfg.request(key, opt)
	if err != nil {
		return nil, err
	}
	r.waiter = randomID(8)
	start := time.Now()
	var (
		wake     <-chan struct{}
		timer    *time.Timer
		conflict *ConflictError
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	giveUp := func(cause error) error {
		if conflict != nil {
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = e.b.leave(lctx, key, r.waiter)
			cancel()
			return fmt.Errorf("lockkit: acquire %q: %w: %w", key, cause, conflict)
		}
		return fmt.Errorf("lockkit: acquire %q: %w", key, cause)
	}
	for {
		if e.isClosed() {
			return nil, giveUp(ErrClosed)
		}
		if err := ctx.Err(); err != nil {
			return nil, giveUp(err)
		}
		sent := time.Now()
		res, err := e.b.acquire(ctx, &r)
		if err != nil {
			if ctx.Err() != nil {
				return nil, giveUp(ctx.Err())
			}
			return nil, giveUp(err)
		}
		if res.ok {
			return e.hold(&r, res.token, sent, time.Since(start)), nil
		}
		if res.conflict == nil {
			return nil, epochErr(key, r.epoch, res.lastEpoch)
		}
		if wake == nil {
			// Subscribe before the next attempt so a release between the two is seen.
			var stop func()
			wake, stop = e.b.wakeups(key)
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
			return nil, giveUp(ctx.Err())
		case <-e.stop:
			return nil, giveUp(ErrClosed)
		case <-wake:
		case <-timer.C:
		}
	}
}

// hold registers a freshly acquired lease with the renewer. sent is when the
// acquire was sent: the lease's TTL is counted from then, never later than
// Redis counts it.
func (e *engine) hold(r *request, token int64, sent time.Time, waited time.Duration) *Lease {
	l := &Lease{
		e:        e,
		key:      r.key,
		owner:    r.owner,
		token:    token,
		epoch:    r.epoch > 0,
		ttl:      r.ttl,
		interval: r.interval,
		lost:     make(chan struct{}),
	}
	l.member = memberOf(token, r.owner)
	l.validUntil = validUntil(sent, r.ttl)
	l.nextRenew = sent.Add(r.interval)
	e.mu.Lock()
	e.leases[l] = struct{}{}
	start := !e.started && !e.closed
	if start {
		e.started = true
		e.wg.Add(1)
		go e.renewLoop()
	}
	wake := l.validUntil
	if r.interval > 0 {
		wake = l.nextRenew
	}
	early := e.nextWake.IsZero() || wake.Before(e.nextWake)
	e.mu.Unlock()
	if early {
		e.poke()
	}
	e.emit(Event{Kind: EventAcquired, Key: l.key, Owner: l.owner, Token: token, Wait: waited})
	return l
}

// validUntil is when a lease whose TTL started at sent must be treated as gone:
// a little before Redis expires it, so that work stops before another owner
// can start.
func validUntil(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - ttl/20)
}

func (e *engine) poke() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// renewLoop is the Locker's single renewer: it renews every held lease in
// pipelined batches and marks leases lost when their validity runs out. At
// most one batch is in flight, so a hung Redis cannot pile up goroutines, and
// loss is detected on time even while a batch hangs.
func (e *engine) renewLoop() {
	defer e.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	results := make(chan []renewed, 1)
	inflight := false
	for {
		now := time.Now()
		due, next := e.scan(now, inflight)
		if len(due) > 0 {
			inflight = true
			e.wg.Add(1)
			go e.renewBatch(due, results)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Until(next))
		select {
		case <-e.stop:
			return
		case <-e.kick:
		case rs := <-results:
			inflight = false
			e.applyRenewals(rs)
		case <-timer.C:
		}
	}
}

type renewed struct {
	l    *Lease
	sent time.Time
	err  error
}

// scan marks expired leases lost and, unless a batch is in flight, returns the
// leases due for renewal. next is when the loop must look again.
func (e *engine) scan(now time.Time, inflight bool) (due []*Lease, next time.Time) {
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
		if inflight || l.interval == 0 {
			continue
		}
		// Renew a little early so that leases acquired close together share a batch.
		if l.nextRenew.Sub(now) <= l.interval/4 {
			due = append(due, l)
			if t := now.Add(l.interval); t.Before(next) {
				next = t
			}
		} else if l.nextRenew.Before(next) {
			next = l.nextRenew
		}
	}
	e.nextWake = next
	e.mu.Unlock()
	for _, l := range lost {
		cause := l.lastRenewErr
		if cause == nil {
			cause = errors.New("not renewed in time")
		}
		l.markLost(fmt.Errorf("%w: %q: validity ran out: %w", ErrLost, l.key, cause))
	}
	return due, next
}

func (e *engine) renewBatch(due []*Lease, out chan<- []renewed) {
	defer e.wg.Done()
	rs := make([]renewed, 0, len(due))
	for start := 0; start < len(due); start += e.cfg.renewBatch {
		chunk := due[start:min(start+e.cfg.renewBatch, len(due))]
		deadline := chunk[0].validUntilLocked()
		for _, l := range chunk[1:] {
			if v := l.validUntilLocked(); v.Before(deadline) {
				deadline = v
			}
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		sent := time.Now()
		errs := e.b.extend(ctx, chunk)
		cancel()
		for i, l := range chunk {
			rs = append(rs, renewed{l: l, sent: sent, err: errs[i]})
		}
	}
	out <- rs
}

func (e *engine) applyRenewals(rs []renewed) {
	now := time.Now()
	for _, r := range rs {
		l := r.l
		switch {
		case r.err == nil:
			e.mu.Lock()
			held := l.state == stateHeld
			if held {
				l.validUntil = validUntil(r.sent, l.ttl)
				l.nextRenew = r.sent.Add(l.interval)
				l.lastRenewErr = nil
			}
			e.mu.Unlock()
			if held {
				e.emit(Event{Kind: EventRenewed, Key: l.key, Owner: l.owner, Token: l.token})
			}
		case errors.Is(r.err, errNotHeld):
			l.markLost(fmt.Errorf("%w: %q: the key expired or was taken over", ErrLost, l.key))
		default:
			e.mu.Lock()
			held := l.state == stateHeld
			if held {
				l.lastRenewErr = r.err
				l.nextRenew = now.Add(max(l.interval/4, 10*time.Millisecond))
			}
			e.mu.Unlock()
			if held {
				e.emit(Event{Kind: EventRenewFailed, Key: l.key, Owner: l.owner, Token: l.token, Err: r.err})
			}
		}
	}
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

// close stops the renewer, releases every held lease and closes the backend.
func (e *engine) close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	held := make([]*Lease, 0, len(e.leases))
	for l := range e.leases {
		held = append(held, l)
	}
	e.mu.Unlock()
	e.stopOnce.Do(func() { close(e.stop) })
	e.wg.Wait()

	cause := fmt.Errorf("%w: %w", ErrLost, ErrClosed)
	for _, l := range held {
		l.end(stateLost, cause)
	}
	var errs []error
	for start := 0; start < len(held); start += e.cfg.renewBatch {
		chunk := held[start:min(start+e.cfg.renewBatch, len(held))]
		if _, err := e.b.release(ctx, chunk); err != nil {
			errs = append(errs, fmt.Errorf("lockkit: close: release %d lease(s): %w", len(chunk), err))
			break
		}
	}
	if err := e.b.close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
