package lockcore

// Waiting for a key: Acquire's loop, woken by releases and hand-overs.

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

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
		return &EpochUsedError{Key: r.key, Epoch: r.epoch, Last: res.lastEpoch, OtherTag: res.otherTag}
	}
	e.emit(Event{Kind: LeaseContended, Key: r.key, Owner: res.conflict.Owner, Token: res.conflict.Token, Err: res.conflict})
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
	handTTL := handOverTTL(&r)
	if handTTL > 0 {
		// A release may hand the key to this call (release_grant.lua): the waiter
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
		if !r.later && r.mode.keepsNewest() {
			if c := res.conflict; c != nil && r.label != "" && c.Label == r.label {
				// Its own earlier delivery holds the key: this call claimed
				// nothing and waits for the key as a plain call does.
				r.behindOwnRun = true
			}
		}
		// The first attempt claimed the follow-up place and preempted the
		// holders it found.
		r.later = true
		if err != nil {
			// The script may have run: make sure what it took is given back.
			e.orphan(r.key, r.aid, sent.Add(r.ttl), r.onParked)
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
			e.emit(Event{Kind: LeaseContended, Key: key, Owner: conflict.Owner, Token: conflict.Token, Err: conflict})
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
				res := acquireResult{token: token, left: handTTL}
				if e.cfg.acks.n > 0 {
					// Waiting for replicas: the hand-over was the
					// releasing connection's write.
					sent := time.Now()
					if err := e.b.confirm(ctx, &r, token); err != nil {
						e.orphan(r.key, r.aid, sent.Add(r.ttl), r.onParked)
						return nil, giveUp(err, false)
					}
					res.left = 0 // confirm set its TTL
				}
				return e.hold(ctx, &r, res, lastSent, time.Since(start))
			}
		case <-timer.C:
		}
	}
}

// handOverID is the waiter id of r that lets a release hand it the key for
// ttl: the id, a hex string, followed by the hand-over's terms as its
// fields (release_grant.lua).
func handOverID(id string, ttl time.Duration, r *request) string {
	return id + ":" + strconv.FormatInt(ms(ttl), 10) + ":" + r.aid + ":" + escapeLabel(r.label) + ":" + r.owner
}

// handOverTTL is the TTL with which a release may hand the key to the
// waiting call r, or 0 when it may not: only a plain acquire (one holder, no
// epoch, Coalesce, Supersede, Preempt or TakeReservation, renewed) is handed the key. The TTL is short, so that a waiter that died leaves the key free soon
// (a live waiter's Locker renews it within a third of it): its waiter TTL,
// at least 200ms, at most its TTL.
func handOverTTL(r *request) time.Duration {
	if r.limit != 1 || r.epoch != 0 || r.mode != modeNone || r.takeReserved || r.reserved || r.interval <= 0 {
		return 0
	}
	return min(max(r.waiterTTL, 200*time.Millisecond), r.ttl)
}
