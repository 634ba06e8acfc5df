package lockcore

// The background releaser: releases queued by Lease.Run with
// AcquireOptions.AsyncRelease, sent in batches off the work's path.

import (
	"context"
	"sync"
	"time"
)

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
					e.orphanRelease(l, ends[l])
				case held[i] && l.Err() == nil:
					e.emit(Event{Kind: LeaseReleased, Key: l.key, Owner: l.owner, Token: l.token})
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

// handOver is a held release's hand-over, due at its hold's end.
type handOver struct {
	l     *Lease
	at    time.Time
	tries int // sent before, each failed
}

// handOverTries is how many times a hand-over is sent when sending it
// fails (it is safe to send again: a repeat finds its reservation).
const handOverTries = 4

// handOverAt has the renewer hand l's key over at the end of its release's
// hold: a release held at least a while (HoldAtLeast) frees the key then,
// and the key's oldest job parked by then (release_park.lua) is reserved it
// and passed to OnParked, as by a release that frees the key at once. A
// hand-over early by the server's clock is told the time left and sent
// again then. After Close, no hand-over is sent: the parked jobs are left
// to their own backstop.
func (e *engine) handOverAt(l *Lease, at time.Time) {
	e.queueHandOver(handOver{l: l, at: at})
}

// queueHandOver queues h, replacing the lease's queued one.
func (e *engine) queueHandOver(h handOver) {
	l := h.l
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	for i := range e.handOvers {
		if e.handOvers[i].l == l { // one hand-over per lease
			e.handOvers[i] = h
			e.mu.Unlock()
			e.poke()
			return
		}
	}
	e.handOvers = append(e.handOvers, h)
	e.startLocked()
	e.mu.Unlock()
	e.poke()
}

// dueHandOvers takes the hand-overs due at now, and lowers *next to the
// next one's time.
func (e *engine) dueHandOvers(now time.Time, next *time.Time) []handOver {
	e.mu.Lock()
	defer e.mu.Unlock()
	var due []handOver
	left := e.handOvers[:0]
	for _, h := range e.handOvers {
		if !now.Before(h.at) {
			due = append(due, h)
			continue
		}
		if h.at.Before(*next) {
			*next = h.at
		}
		left = append(left, h)
	}
	clear(e.handOvers[len(left):])
	e.handOvers = left
	return due
}

// sendHandOvers sends the hand-overs hs (release_park.lua) and passes the
// parked jobs they reserved the keys for to OnParked. One whose call failed
// (the reply lost, say) is sent again, up to handOverTries times.
func (e *engine) sendHandOvers(hs []handOver) {
	defer e.wg.Done()
	leases := make([]*Lease, len(hs))
	ends := make([]ending, len(hs))
	for i, h := range hs {
		leases[i], ends[i] = h.l, ending{nohold: true, handOver: true}
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	held, err := e.b.release(ctx, leases, ends)
	for i, l := range leases {
		// Without an error, a hand-over not held answered 0 (the record
		// of the release is gone), which sending again does not change.
		if err != nil && (i >= len(held) || !held[i]) && hs[i].tries+1 < handOverTries {
			e.queueHandOver(handOver{l: l, at: time.Now().Add(time.Duration(hs[i].tries+1) * 250 * time.Millisecond), tries: hs[i].tries + 1})
			continue
		}
		l.resumeParked()
	}
	if err != nil {
		e.cfg.logger.Warn("lockkit: hand-over at a hold's end", "count", len(leases), "err", err)
	}
}
