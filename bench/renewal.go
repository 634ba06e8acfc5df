package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
)

// tickEnd is recorded by the observer when the number of renewals reaches a
// multiple of the number of leases. The observer runs on the renewer
// goroutine before it sends the next batch.
type tickEnd struct {
	at    time.Time
	cpu   time.Duration
	c     counts
	redis redisStats // read after the tick, well before the next one
}

// renewalResult is one Locker holding many leases.
type renewalResult struct {
	leases, batch int
	ttl, interval time.Duration
	acquireWall   time.Duration
	acquireCPU    time.Duration
	// Goroutines of the process before the Locker took a lease, and once it
	// holds all of them (no renewal in flight).
	goroutinesBefore, goroutinesHolding int
	ticks                               int
	period                              time.Duration // between tick ends
	cmdsPerTick, rtsPerTick             float64
	cpuPerTick                          time.Duration
	redis                               redisStats // per tick
	// Pipelines sent in the measured ticks, split into batches: a batch is a
	// run of pipelines each sent less than batchGap after the previous reply.
	pipes   []pipeline
	batches [][]pipeline
	failed  int64
	lost    int64
	// Uncontended cycles on the same Locker before and while it holds the leases.
	emptyCycle, fullCycle cycleCost
	closeWall             time.Duration
	closeRts              int64
}

// batchGap separates renewal batches: the renewer sends a batch's pipelines
// back to back.
const batchGap = 10 * time.Millisecond

// cycleCost is the wall and process CPU time of one acquire+release cycle.
type cycleCost struct{ wall, cpu time.Duration }

// renewal measures one lockkit Locker holding b.leases leases with TTL
// b.leaseTTL (renewed every TTL/3, DefaultRenewBatch leases per pipeline).
func (b *bench) renewal(ctx context.Context) (renewalResult, error) {
	res := renewalResult{leases: b.leases, batch: lockcore.DefaultRenewBatch, ttl: b.leaseTTL, interval: b.leaseTTL / 3}
	client, ctr := b.client()
	prefix := b.prefix + "renewal:"

	// Cache the renewal script with one short lease on a throwaway Locker.
	renewedOnce := make(chan struct{}, 1)
	warm, err := lockkit.NewRedis(client, lockkit.WithPrefix(prefix), lockkit.WithObserver(func(e lockkit.Event) {
		if e.Kind == lockkit.LeaseRenewed {
			select {
			case renewedOnce <- struct{}{}:
			default:
			}
		}
	}))
	if err != nil {
		return res, err
	}
	if _, err := warm.TryAcquire(ctx, "warm", &lockkit.AcquireOptions{TTL: 300 * time.Millisecond}); err != nil {
		return res, err
	}
	select {
	case <-renewedOnce:
	case <-time.After(5 * time.Second):
		return res, errors.New("renewal: warm-up lease was not renewed")
	}
	if err := warm.Close(ctx); err != nil {
		return res, err
	}
	// Let the throwaway Locker's goroutines finish exiting before counting.
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	res.goroutinesBefore = runtime.NumGoroutine()

	var renewed, failed, lost atomic.Int64
	ends := make(chan tickEnd, 64)
	n := int64(b.leases)
	l, err := lockkit.NewRedis(client, lockkit.WithPrefix(prefix), lockkit.WithObserver(func(e lockkit.Event) {
		switch e.Kind {
		case lockkit.LeaseRenewed:
			if renewed.Add(1)%n == 0 {
				select {
				case ends <- tickEnd{at: time.Now(), cpu: cpuTime(), c: ctr.counts()}:
				default:
				}
			}
		case lockkit.LeaseRenewFailed:
			failed.Add(1)
		case lockkit.LeaseLost:
			lost.Add(1)
		}
	}))
	if err != nil {
		return res, err
	}
	defer func() { _ = l.Close(context.Background()) }()

	cycles := func() (cycleCost, error) {
		const m = 1000
		cpu0, t0 := cpuTime(), time.Now()
		for range m {
			lease, err := l.TryAcquire(ctx, "extra", nil)
			if err != nil {
				return cycleCost{}, err
			}
			if err := lease.Release(ctx); err != nil {
				return cycleCost{}, err
			}
		}
		return cycleCost{wall: time.Since(t0) / m, cpu: (cpuTime() - cpu0) / m}, nil
	}
	if res.emptyCycle, err = cycles(); err != nil {
		return res, err
	}

	opt := &lockkit.AcquireOptions{TTL: b.leaseTTL}
	const workers = 16
	errs := make([]error, workers)
	var wg sync.WaitGroup
	cpu0, t0 := cpuTime(), time.Now()
	for w := range workers {
		wg.Go(func() {
			for i := w; i < b.leases; i += workers {
				if _, err := l.TryAcquire(ctx, fmt.Sprintf("lease:%d", i), opt); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	res.acquireWall, res.acquireCPU = time.Since(t0), cpuTime()-cpu0
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.goroutinesHolding = runtime.NumGoroutine()
	ctr.record()
	names := ctr.commandNames()

	var first, last tickEnd
	timeout := time.After(time.Duration(b.warmTicks+b.ticks+3) * 2 * res.interval)
	for i := 0; i <= b.warmTicks+b.ticks; i++ {
		select {
		case te := <-ends:
			if i == b.warmTicks || i == b.warmTicks+b.ticks {
				if te.redis, err = b.redisStats(ctx, names); err != nil {
					return res, err
				}
			}
			if i == b.warmTicks {
				first = te
			}
			last = te
		case <-timeout:
			return res, fmt.Errorf("renewal: saw %d of %d ticks", i, b.warmTicks+b.ticks+1)
		}
	}
	// The next tick is most of an interval away: measure cycles on the loaded
	// Locker now.
	if res.fullCycle, err = cycles(); err != nil {
		return res, err
	}

	k := b.ticks
	res.ticks = k
	d := last.c.sub(first.c)
	res.cmdsPerTick = float64(d.cmds) / float64(k)
	res.rtsPerTick = float64(d.rts) / float64(k)
	res.cpuPerTick = (last.cpu - first.cpu) / time.Duration(k)
	res.redis = redisStats{
		cpu: (last.redis.cpu - first.redis.cpu) / time.Duration(k),
		cmd: (last.redis.cmd - first.redis.cmd) / time.Duration(k),
	}
	res.period = last.at.Sub(first.at) / time.Duration(k)
	res.failed, res.lost = failed.Load(), lost.Load()
	for _, p := range ctr.pipelines() {
		if p.start.After(first.at) && p.start.Before(last.at) {
			res.pipes = append(res.pipes, p)
		}
	}
	for i, p := range res.pipes {
		if i == 0 || p.start.Sub(res.pipes[i-1].end()) >= batchGap {
			res.batches = append(res.batches, nil)
		}
		res.batches[len(res.batches)-1] = append(res.batches[len(res.batches)-1], p)
	}

	c0 := ctr.counts()
	t0 = time.Now()
	if err := l.Close(ctx); err != nil {
		return res, err
	}
	res.closeWall = time.Since(t0)
	res.closeRts = ctr.counts().sub(c0).rts
	return res, nil
}
