package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// handoffResult is one library's contended handoff latencies.
type handoffResult struct {
	lib       string
	latencies []time.Duration // sorted
	// waiterCmds is the commands the waiter sent over all measured handoffs.
	waiterCmds int64
}

// percentile returns the nearest-rank q-quantile (0 < q <= 1).
func (r handoffResult) percentile(q float64) time.Duration { return nearestRank(r.latencies, q) }

// handoff measures, for library name, how long after the holder starts its
// release the waiter holds the lock. Holder and waiter use separate clients,
// as two processes would. In each of b.handoffs rounds (after one unmeasured
// round) the holder takes the key, the waiter enters its waiting acquire, and
// once the waiter's first attempt has returned the holder waits a uniformly
// random time in [0, b.spread) before releasing, so that the release falls at
// a random point of a polling waiter's cycle.
func (b *bench) handoff(ctx context.Context, name string) (handoffResult, error) {
	hc, _ := b.client()
	wc, wctr := b.client()
	prefix := b.prefix + "handoff:" + name + ":"
	holder, err := newLib(name, hc, prefix)
	if err != nil {
		return handoffResult{}, err
	}
	defer holder.close()
	waiter, err := newLib(name, wc, prefix)
	if err != nil {
		return handoffResult{}, err
	}
	defer waiter.close()

	res := handoffResult{lib: name}
	const key = "handoff"
	for i := -1; i < b.handoffs; i++ {
		latency, waited, err := handover(ctx, holder, waiter, wctr, key, b.spread)
		if err != nil {
			return res, fmt.Errorf("%s: %w", name, err)
		}
		if i >= 0 {
			res.latencies = append(res.latencies, latency)
			res.waiterCmds += waited.cmds
		}
	}
	slices.Sort(res.latencies)
	return res, nil
}

// handover measures one hand-over of key from holder to waiter (wctr counts
// the waiter's client): the holder takes the key, the waiter enters its
// waiting acquire, and once the waiter's first attempt has returned the
// holder waits a uniformly random time in [0, spread) and releases. It
// returns the time from the start of the holder's release to the return of
// the waiter's acquire, and what the waiter sent until then; the waiter then
// releases the key.
func handover(ctx context.Context, holder, waiter *lib, wctr *counter, key string, spread time.Duration) (time.Duration, counts, error) {
	type acquired struct {
		at      time.Time
		release releaseFunc
		err     error
	}
	release, err := holder.try(ctx, key)
	if err != nil {
		return 0, counts{}, fmt.Errorf("holder: %w", err)
	}
	attempted := wctr.afterNext()
	c0 := wctr.counts()
	got := make(chan acquired, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		rel, err := waiter.wait(wctx, key)
		got <- acquired{time.Now(), rel, err}
	}()
	select {
	case <-attempted:
	case g := <-got:
		return 0, counts{}, fmt.Errorf("waiter returned while the key was held: %v", g.err)
	}
	time.Sleep(rand.N(spread))
	start := time.Now()
	if err := release(ctx); err != nil {
		return 0, counts{}, fmt.Errorf("holder release: %w", err)
	}
	g := <-got
	if g.err != nil {
		return 0, counts{}, fmt.Errorf("waiter: %w", g.err)
	}
	waited := wctr.counts().sub(c0)
	if err := g.release(ctx); err != nil {
		return 0, counts{}, fmt.Errorf("waiter release: %w", err)
	}
	return g.at.Sub(start), waited, nil
}
