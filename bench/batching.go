package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jobguard/jobguard/lockkit"
)

// batchGoroutines are the concurrencies the batching section measures.
var batchGoroutines = []int{1, 8, 20}

// batchSetting is one of the two Lockers the batching section compares.
type batchSetting struct {
	name string // as the report shows it
	opts []lockkit.Option
}

var batchSettings = []batchSetting{
	{"default", nil},
	{"WithBatching()", []lockkit.Option{lockkit.WithBatching()}},
}

// batchResult is one setting's cycles at one concurrency.
type batchResult struct {
	goroutines int
	setting    string
	calls      int64     // measured calls (an acquire and a release per cycle) over all rounds
	rates      []float64 // calls per second, per round
	ratios     []float64 // per round, this setting's rate ÷ the default's in the same round
	per        counts    // commands and round trips over all rounds
	cpu        time.Duration
}

func (r batchResult) perCall(n int64) float64 { return float64(n) / float64(r.calls) }

// batching measures lockkit used directly by 1, 8 and 20 goroutines on one
// Locker, each on its own key, TryAcquire then Release, with and without
// WithBatching: paired rounds, the order swapped every round.
func (b *bench) batching(ctx context.Context) ([]batchResult, error) {
	var out []batchResult
	for _, g := range batchGoroutines {
		type locker struct {
			l   *lockkit.Locker
			ctr *counter
			res *batchResult
		}
		ls := make([]locker, len(batchSettings))
		for i, s := range batchSettings {
			c, ctr := b.client()
			l, err := lockkit.NewRedis(c, append([]lockkit.Option{lockkit.WithPrefix(fmt.Sprintf("%sbatching:%d:%d:", b.prefix, g, i))}, s.opts...)...)
			if err != nil {
				return nil, err
			}
			defer l.Close(context.Background())
			ls[i] = locker{l, ctr, &batchResult{goroutines: g, setting: s.name}}
		}
		cycles := max(b.cycles/g, 1) * g
		run := func(lk locker, n int) (time.Duration, error) {
			var wg sync.WaitGroup
			errs := make(chan error, g)
			start := time.Now()
			for w := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprint("k", w)
					for range n / g {
						lease, err := lk.l.TryAcquire(ctx, key, nil)
						if err == nil {
							err = lease.Release(ctx)
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			return time.Since(start), <-errs
		}
		for _, lk := range ls { // warm-up: connections, scripts, the version check
			if _, err := run(lk, min(cycles, 200*g)); err != nil {
				return nil, err
			}
		}
		for round := range b.rounds {
			rates := make([]float64, len(ls))
			for j := range ls {
				i := j
				if round%2 == 1 {
					i = len(ls) - 1 - j
				}
				lk := ls[i]
				c0 := lk.ctr.counts()
				cpu0, err := redisCPU(ctx, b.admin)
				if err != nil {
					return nil, err
				}
				d, err := run(lk, cycles)
				if err != nil {
					return nil, err
				}
				cpu1, err := redisCPU(ctx, b.admin)
				if err != nil {
					return nil, err
				}
				lk.res.per = lk.res.per.add(lk.ctr.counts().sub(c0))
				lk.res.cpu += cpu1 - cpu0
				lk.res.calls += int64(2 * cycles)
				rates[i] = float64(2*cycles) / d.Seconds()
				lk.res.rates = append(lk.res.rates, rates[i])
			}
			for i, lk := range ls {
				lk.res.ratios = append(lk.res.ratios, rates[i]/rates[0])
			}
		}
		for _, lk := range ls {
			out = append(out, *lk.res)
		}
	}
	return out, nil
}

// batchingSection is the batching section's table and method.
func (r *report) batchingSection() string {
	var w strings.Builder
	var rows [][]string
	for _, x := range r.batchingRes {
		ratio := "–"
		if x.setting != batchSettings[0].name {
			ratio = fmt.Sprintf("%.2f", median(x.ratios))
		}
		rows = append(rows, []string{
			fmt.Sprint(x.goroutines),
			"`" + x.setting + "`",
			fmt.Sprintf("%.0f", median(x.rates)),
			ratio,
			us(time.Duration(x.perCall(int64(x.cpu)))),
			fmt.Sprintf("%.2f", x.perCall(x.per.rts)),
			fmt.Sprintf("%.2f", float64(x.per.cmds)/float64(max(x.per.rts, 1))),
		})
	}
	table(&w, []string{"goroutines", "Locker", "calls/s", "÷ default (calls/s)", "Redis CPU per call", "round trips per call", "commands per round trip"}, rows)
	fmt.Fprintf(&w, "\nlockkit used directly: goroutines on one Locker, each on its own key, `TryAcquire` then `Release` "+
		"(two calls a cycle), %d cycles per round split among them, after a warm-up. Two Lockers, each with its own "+
		"counted client and key prefix, differ in one option: the default and `lockkit.WithBatching()`; %d paired "+
		"rounds, the order swapped every round. calls/s is the median of the rounds, its ÷ default the median of "+
		"each round's ratio; Redis CPU is the server's `INFO cpu` (used_cpu_user+used_cpu_sys) read before and after "+
		"each run, over every call of the rounds; round trips and commands are the client hook's counts.\n",
		r.cycles, r.rounds)
	return w.String()
}
