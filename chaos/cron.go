package main

import (
	"context"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// Events of the cron replicas: a tick's run began (Task names the tick,
// "cron:<entry>@<Unix ms>"), and ended.
const (
	evCronRun = "cron-run"
	evCronEnd = "cron-end"
)

// cronTask names the tick at (Unix ms) of entry name.
func cronTask(name string, at int64) string { return fmt.Sprintf("cron:%s@%d", name, at) }

// shifted is a cron.Schedule fired by a clock offset from the wall clock:
// robfig/cron fires by time.Now, so a replica whose clock is offset ahead
// fires each activation that much earlier in real time.
type shifted struct {
	s      cron.Schedule
	offset time.Duration
}

func (x shifted) Next(t time.Time) time.Time { return x.s.Next(t.Add(x.offset)).Add(-x.offset) }

// cronParser parses the entries' specs (a seconds field).
var cronParser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// startCron starts the worker's robfig/cron with every entry of the
// workload, each job under cronguard.Wrap (none with -broken none), firing
// and naming its ticks by the wall clock plus offset, and recording each
// run and each guard decision with its tick.
func startCron(rec *recorder, locker *lockkit.Locker, w Workload, offset time.Duration, broken string) (*cron.Cron, error) {
	clock := func() time.Time { return time.Now().Add(offset) }
	c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC), cron.WithLogger(cron.DiscardLogger))
	for _, e := range w.Crons {
		sched, err := cronParser.Parse(e.Spec)
		if err != nil {
			return nil, err
		}
		observe := func(ctx context.Context, ev middleware.Event) {
			r := Record{Ev: evDecision, Kind: ev.Kind.String(), Fam: "cron:" + e.Name}
			if t, ok := cronguard.Tick(ctx); ok {
				r.Task = cronTask(e.Name, t.UnixMilli())
			}
			r.Token = ev.Token
			if ev.Err != nil {
				r.Reason, r.Err = reasonOf(ev.Err), ev.Err.Error()
			}
			rec.add(r)
		}
		run := func(ctx context.Context) error {
			t, ok := cronguard.Tick(ctx)
			if !ok { // unguarded (-broken none): the latest activation by the replica's clock
				now := clock()
				t = now.Truncate(e.Every)
			}
			r := Record{Ev: evCronRun, Task: cronTask(e.Name, t.UnixMilli()), Fam: "cron:" + e.Name}
			r.Run = rec.add(r).Seq
			timer := time.NewTimer(e.Dur)
			defer timer.Stop()
			r.Ev, r.Outcome = evCronEnd, "ok"
			select {
			case <-timer.C:
			case <-ctx.Done():
				r.Outcome, r.Cause = "cancelled", causeOf(ctx)
			}
			rec.add(r)
			return nil
		}
		var job cron.Job = cronguard.Func(run)
		if broken != brokenNone {
			wrap, err := cronguard.Wrap(locker, e.Name, e.Spec, cronguard.WithSeconds(), cronguard.WithLocation(time.UTC),
				cronguard.WithClock(clock), cronguard.WithTTL(w.TTL), cronguard.WithObserver(observe), cronguard.WithLogger(cron.DiscardLogger))
			if err != nil {
				return nil, err
			}
			job = wrap(job)
		} else {
			job = cron.FuncJob(func() { _ = run(context.Background()) })
		}
		c.Schedule(shifted{sched, offset}, job)
	}
	c.Start()
	return c, nil
}
