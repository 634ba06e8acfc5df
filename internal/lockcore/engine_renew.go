package lockcore

// The renewer: one loop renews every lease of the Locker, one pipeline per
// server, and removes the holders that failed calls may have left.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// orphan is a holder that may exist without a Lease, or a lease whose
// release failed: its acquire id (and a release's member and OnParked),
// the release's ending, and how long to keep trying to remove it.
type orphan struct {
	l        *Lease // key, aid and ttl; a release's member and onParked too
	end      ending // the failed release's ending; zero for an acquire's holder
	until    time.Time
	next     time.Time
	inflight bool
}

// startLocked starts the renewer if it is not running. e.mu is held.
func (e *engine) startLocked() {
	if !e.started && !e.closed {
		e.started = true
		e.wg.Add(2)
		go e.renewLoop()
		go e.releaseLoop()
	}
}

// orphan makes the renewer remove, in the background, the holder that the
// acquire call aid may have left on key. With onParked (the call's
// Parking.OnParked), the removal of a holder it finds frees the key as that
// lease's release would: it reserves the key for the oldest parked job and
// passes the job to onParked.
func (e *engine) orphan(key, aid string, until time.Time, onParked func(key, id string)) {
	l := &Lease{e: e, key: key, aid: aid, ttl: max(time.Until(until), MinTTL), onParked: onParked, state: stateReleased}
	e.addOrphan(&orphan{l: l, until: until})
}

// orphanRelease makes the renewer send the release of l under end again, in
// the background: its call failed, and may or may not have run (a lost or
// late reply). A repeat of a release that ran reports what the first run did
// (release.lua), so the parked job that run reserved the key for is passed
// to OnParked all the same, as the release would have: a lost reply does not
// leave the job to its backstop.
func (e *engine) orphanRelease(l *Lease, end ending) {
	until := l.validUntilLocked()
	r := &Lease{e: e, key: l.key, aid: l.aid, member: l.member, label: l.label, plain: l.plain, ttl: max(time.Until(until), MinTTL),
		hold: l.hold, onParked: l.onParked, state: stateReleased}
	e.addOrphan(&orphan{l: r, end: end, until: until})
}

func (e *engine) addOrphan(o *orphan) {
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
			if hs := e.dueHandOvers(time.Now(), &next); len(hs) > 0 {
				e.wg.Add(1)
				go e.sendHandOvers(hs)
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
// preempted and failed ones, and emits LeaseRenewed. It returns when the
// renewer must look at these leases next: the earliest of their renewals
// and validity ends (an hour from now when none is held).
func (e *engine) applyRenewals(rs []renewed) time.Time {
	now := time.Now()
	var (
		events                          []Event
		gone, preempted, evicted, asked []*Lease
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
		if r.err == errCancelAsked {
			asked = append(asked, l)
			r.err = nil
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
			events = append(events, Event{Kind: LeaseRenewFailed, Key: l.key, Owner: l.owner, Token: l.token, Err: r.err})
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
	for _, l := range asked {
		l.cancelRun()
	}
	for _, ev := range events {
		e.emit(ev)
	}
	// LeaseRenewed, one per lease and tick, only when someone takes it, and
	// built here rather than gathered: a tick may renew many thousands.
	if e.cfg.observer != nil || e.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		for i := range rs {
			if r := &rs[i]; r.ok {
				e.emit(Event{Kind: LeaseRenewed, Key: r.l.key, Owner: r.l.owner, Token: r.l.token})
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

// releaseOrphans removes orphaned holders and sends failed releases again;
// the ones that fail are retried with a growing delay. A release that
// reserved its key for a parked job passes the job to OnParked.
func (e *engine) releaseOrphans(os []*orphan) {
	defer e.wg.Done()
	leases := make([]*Lease, len(os))
	ends := make([]ending, len(os))
	for i, o := range os {
		leases[i], ends[i] = o.l, o.end
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	_, err := e.b.release(ctx, leases, ends)
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
	} else {
		for _, l := range leases {
			l.resumeParked()
		}
	}
	e.poke()
}
