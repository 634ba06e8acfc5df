package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// cycleResult is one library's uncontended acquire+release cycle at one
// concurrency.
type cycleResult struct {
	lib        string
	goroutines int
	cycles     int64 // measured cycles over all rounds
	// opsPerSec is the median over the rounds of cycles per second.
	opsPerSec float64
	per       counts // commands and round trips over all rounds
	clientCPU time.Duration
	redisCPU  time.Duration
	redisCmd  time.Duration // Redis's execution time of the library's commands
}

func (r cycleResult) perCycle(n int64) float64 { return float64(n) / float64(r.cycles) }

func (r cycleResult) cpuPerCycle(d time.Duration) time.Duration {
	return d / time.Duration(r.cycles)
}

// uncontended measures acquire+release cycles for every library: first one
// cycle on a cold script cache, then warm-up cycles, then, for each
// concurrency, b.rounds rounds in which every library runs b.cycles cycles
// (each goroutine on its own key). It returns the results and the counts of
// each library's first cycle.
func (b *bench) uncontended(ctx context.Context) ([]cycleResult, map[string]counts, error) {
	type entry struct {
		l   *lib
		ctr *counter
	}
	var libs []entry
	for _, name := range libNames {
		client, ctr := b.client()
		l, err := newLib(name, client, b.prefix+name+":")
		if err != nil {
			return nil, nil, err
		}
		defer l.close()
		libs = append(libs, entry{l, ctr})
	}
	cold := make(map[string]counts)
	for _, e := range libs {
		// Connect first: a new connection's handshake also passes the hook.
		if err := e.l.client.Ping(ctx).Err(); err != nil {
			return nil, nil, err
		}
		before := e.ctr.counts()
		if err := e.l.cycle(ctx, "cold"); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", e.l.name, err)
		}
		cold[e.l.name] = e.ctr.counts().sub(before)
	}
	for _, e := range libs {
		if _, err := runCycles(ctx, e.l, b.goroutines, 50*b.goroutines); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", e.l.name, err)
		}
	}

	var out []cycleResult
	for _, g := range []int{1, b.goroutines} {
		res := make([]cycleResult, len(libs))
		rates := make([][]float64, len(libs))
		for round := range b.rounds {
			for j := range libs {
				i := (j + round) % len(libs) // rotate the order between rounds
				e := libs[i]
				names := e.ctr.commandNames()
				rs0, err := b.redisStats(ctx, names)
				if err != nil {
					return nil, nil, err
				}
				c0, cpu0 := e.ctr.counts(), cpuTime()
				elapsed, err := runCycles(ctx, e.l, g, b.cycles)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: %w", e.l.name, err)
				}
				cpu, c := cpuTime()-cpu0, e.ctr.counts().sub(c0)
				rs1, err := b.redisStats(ctx, names)
				if err != nil {
					return nil, nil, err
				}
				n := int64(b.cycles / g * g)
				r := &res[i]
				r.lib, r.goroutines = e.l.name, g
				r.cycles += n
				r.per.cmds += c.cmds
				r.per.rts += c.rts
				r.clientCPU += cpu
				r.redisCPU += rs1.cpu - rs0.cpu
				r.redisCmd += rs1.cmd - rs0.cmd
				rates[i] = append(rates[i], float64(n)/elapsed.Seconds())
			}
		}
		for i := range res {
			res[i].opsPerSec = median(rates[i])
		}
		out = append(out, res...)
	}
	return out, cold, nil
}

// runCycles runs n acquire+release cycles split over g goroutines, each on its
// own key, and returns the wall time.
func runCycles(ctx context.Context, l *lib, g, n int) (time.Duration, error) {
	return runTimedCycles(ctx, l, g, n, nil)
}

// runTimedCycles is runCycles that, when acquires is not nil, also appends
// to it the duration of every acquire call (l.try alone).
func runTimedCycles(ctx context.Context, l *lib, g, n int, acquires *[]time.Duration) (time.Duration, error) {
	per := n / g
	errs := make([]error, g)
	took := make([][]time.Duration, g)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range g {
		wg.Go(func() {
			key := fmt.Sprintf("cycle:%d", w)
			if acquires == nil {
				for range per {
					if err := l.cycle(ctx, key); err != nil {
						errs[w] = err
						return
					}
				}
				return
			}
			took[w] = make([]time.Duration, 0, per)
			for range per {
				t0 := time.Now()
				release, err := l.try(ctx, key)
				took[w] = append(took[w], time.Since(t0))
				if err == nil {
					err = release(ctx)
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	if acquires != nil {
		for _, t := range took {
			*acquires = append(*acquires, t...)
		}
	}
	return elapsed, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
