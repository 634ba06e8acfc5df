package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// extraSetting is one of the guards the extrakeys section compares: a job
// holds its own key and these extra keys (each with limit 1).
type extraSetting struct {
	name  string // as the report shows it
	extra []string
}

var extraSettings = []extraSetting{
	{"own key only", nil},
	{"+1 extra key", []string{"x1"}},
	{"+2 extra keys", []string{"x1", "x2"}},
}

// extraResult is one setting's jobs over every round.
type extraResult struct {
	setting   string
	jobs      int64         // measured jobs over all rounds
	rates     []float64     // jobs per second, per round
	ratios    []float64     // per round, this setting's rate ÷ the own-key-only one's in the same round
	per       counts        // commands and round trips over all rounds
	clientCPU time.Duration // this process's, over all rounds
	redisCPU  time.Duration
	redisCmd  time.Duration // Redis's execution time of the commands the Locker sent
}

func (r extraResult) perJob(n int64) float64 { return float64(n) / float64(r.jobs) }

// extraKeys measures middleware.Guard.Run (Skip, lockkit directly, no
// contention) of a no-op job holding its own key only, one extra key, or
// two: one goroutine, b.cycles jobs per setting and round, b.rounds rounds,
// the order rotated every round.
func (b *bench) extraKeys(ctx context.Context) ([]extraResult, error) {
	type guard struct {
		g   *middleware.Guard
		ctr *counter
		res *extraResult
	}
	gs := make([]guard, len(extraSettings))
	for i, s := range extraSettings {
		c, ctr := b.client()
		l, err := lockkit.NewRedis(c, lockkit.WithPrefix(fmt.Sprintf("%sextrakeys:%d:", b.prefix, i)))
		if err != nil {
			return nil, err
		}
		defer l.Close(context.Background())
		extra := map[string]int{}
		for _, k := range s.extra {
			extra[k] = 1
		}
		opts := []middleware.Option{middleware.WithPolicy(middleware.Skip())}
		if len(extra) > 0 {
			opts = append(opts, middleware.WithExtraKeys(func(context.Context, middleware.Job) map[string]int { return extra }))
		}
		g, err := middleware.New(l, opts...)
		if err != nil {
			return nil, err
		}
		gs[i] = guard{g, ctr, &extraResult{setting: s.name}}
	}
	job := middleware.Job{Key: "job", Name: "report"}
	run := func(g guard, n int) (time.Duration, error) {
		start := time.Now()
		for range n {
			out := g.g.Run(ctx, job, func(context.Context) error { return nil })
			if !out.Ran || out.Err != nil {
				return 0, fmt.Errorf("extrakeys: %s: the job did not run: %v", g.res.setting, out.Err)
			}
		}
		return time.Since(start), nil
	}
	for _, g := range gs { // warm-up: connections, scripts, the version check
		if _, err := run(g, min(b.cycles, 500)); err != nil {
			return nil, err
		}
	}
	for round := range b.rounds {
		rates := make([]float64, len(gs))
		for j := range gs {
			i := (j + round) % len(gs)
			g := gs[i]
			names := g.ctr.commandNames()
			rs0, err := b.redisStats(ctx, names)
			if err != nil {
				return nil, err
			}
			c0, cpu0 := g.ctr.counts(), cpuTime()
			d, err := run(g, b.cycles)
			g.res.clientCPU += cpuTime() - cpu0
			if err != nil {
				return nil, err
			}
			rs1, err := b.redisStats(ctx, names)
			if err != nil {
				return nil, err
			}
			g.res.per = g.res.per.add(g.ctr.counts().sub(c0))
			g.res.redisCPU += rs1.cpu - rs0.cpu
			g.res.redisCmd += rs1.cmd - rs0.cmd
			g.res.jobs += int64(b.cycles)
			rates[i] = float64(b.cycles) / d.Seconds()
			g.res.rates = append(g.res.rates, rates[i])
		}
		for i, g := range gs {
			g.res.ratios = append(g.res.ratios, rates[i]/rates[0])
		}
	}
	out := make([]extraResult, len(gs))
	for i, g := range gs {
		out[i] = *g.res
	}
	return out, nil
}

// extraKeysSection is the extrakeys section's table and method.
func (r *report) extraKeysSection() string {
	var w strings.Builder
	var rows [][]string
	base := r.extraRes[0]
	for _, x := range r.extraRes {
		ratio, cpuRatio := "–", "–"
		if x.setting != base.setting {
			ratio = fmt.Sprintf("%.2f", median(x.ratios))
			cpuRatio = fmt.Sprintf("%.2f", x.perJob(int64(x.redisCPU))/base.perJob(int64(base.redisCPU)))
		}
		rows = append(rows, []string{
			x.setting,
			fmt.Sprintf("%.0f", median(x.rates)),
			ratio,
			fmt.Sprintf("%.2f", x.perJob(x.per.rts)),
			fmt.Sprintf("%.2f", x.perJob(x.per.cmds)),
			us(time.Duration(x.perJob(int64(x.redisCPU)))),
			cpuRatio,
			us(time.Duration(x.perJob(int64(x.redisCmd)))),
			us(time.Duration(x.perJob(int64(x.clientCPU)))),
		})
	}
	table(&w, []string{"job holds", "jobs/s", "÷ own key only (jobs/s)", "round trips per job", "commands per job",
		"Redis CPU per job", "÷ own key only (Redis CPU)", "Redis command time per job", "client CPU per job"}, rows)
	fmt.Fprintf(&w, "\n`middleware.Guard.Run` of a no-op job under `Skip`, lockkit used directly (no asynq), one goroutine, "+
		"no contention: the job's own key, then none, one or two extra keys (`WithExtraKeys`, limit 1 each). Three "+
		"guards, each on its own Locker (default options) with its own counted client and key prefix; after a "+
		"warm-up, %d rounds in which each runs %d jobs, the order rotated every round. jobs/s is the median of the "+
		"rounds, its ÷ own key only the median of each round's ratio; Redis CPU is the server's `INFO cpu` "+
		"(used_cpu_user+used_cpu_sys) read before and after each run, and command time `INFO commandstats` for "+
		"the commands the Locker sent, and client CPU this process's user+system time (getrusage), each over "+
		"every job of the rounds; round trips and commands are the client hook's counts.\n", r.rounds, r.cycles)
	return w.String()
}
