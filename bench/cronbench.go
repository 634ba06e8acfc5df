package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// cronSpec is the guarded entry: every second (seconds field).
const cronSpec = "* * * * * *"

// cronReplica is one replica's share of the cron section.
type cronReplica struct {
	delay time.Duration // its clock reads the tick plus this when its job runs
	won   int           // ticks it ran
	// Counts of its own client over the ticks it won and over those it lost.
	winC, loseC counts
	claimed     int // lost ticks reported as EventClaimed
	duplicate   int // lost ticks reported as EventDuplicate
}

type cronResult struct {
	ticks      int
	work       time.Duration
	replicas   []cronReplica
	ranOnce    int // ticks that ran on exactly one replica
	errors     int64
	winCold    counts // the winner's counts in the unmeasured first tick
	firstTick  time.Time
	concurrent bool
}

// cronRoundTrips runs b.cronTicks ticks of one cronguard entry on three
// replicas, each with its own client, Locker and Guard. A shared fake clock
// (cronguard.WithClock) stands at each tick in turn; each replica reads it
// with its own delay (cron fires an activation when the replica's clock reads
// it; the delay is how late the job starts). Per tick all three call the
// wrapped cron.Job's Run at once, as three processes whose cron fired. It
// counts each replica's round trips per tick, as the winner (ran the job) or
// a loser.
func (b *bench) cronRoundTrips(ctx context.Context) (cronResult, error) {
	delays := []time.Duration{0, 40 * time.Millisecond, 150 * time.Millisecond}
	res := cronResult{ticks: b.cronTicks, work: time.Millisecond, concurrent: true}
	// The fake clock: ticks from the next whole second on, one second apart.
	base := time.Now().Truncate(time.Second).Add(time.Second)
	res.firstTick = base
	var tickNo atomic.Int64
	tickAt := func() time.Time { return base.Add(time.Duration(tickNo.Load()) * time.Second) }

	type replica struct {
		ctr  *counter
		job  cron.Job
		ran  atomic.Bool
		kind atomic.Int32 // the middleware.EventKind that ended its tick
	}
	var errs atomic.Int64
	reps := make([]*replica, len(delays))
	for i, delay := range delays {
		r := &replica{}
		client, ctr := b.client()
		r.ctr = ctr
		locker, err := lockkit.NewRedis(client, lockkit.WithPrefix(b.prefix+"cron:"), lockkit.WithOwner(fmt.Sprintf("replica-%d", i)))
		if err != nil {
			return res, err
		}
		defer locker.Close(ctx)
		g, err := cronguard.New(locker,
			cronguard.WithSeconds(),
			cronguard.WithLocation(time.UTC),
			cronguard.WithClock(func() time.Time { return tickAt().Add(delay) }),
			cronguard.WithLogger(cron.DiscardLogger),
			cronguard.WithObserver(func(_ context.Context, e middleware.Event) {
				switch e.Kind {
				case middleware.EventClaimed, middleware.EventDuplicate:
					r.kind.Store(int32(e.Kind))
				case middleware.EventError, middleware.EventLost:
					errs.Add(1)
				}
			}))
		if err != nil {
			return res, err
		}
		w, err := g.Wrap("bench-entry", cronSpec)
		if err != nil {
			return res, err
		}
		r.job = cron.NewChain(w).Then(cronguard.Func(func(ctx context.Context) error {
			r.ran.Store(true)
			time.Sleep(res.work)
			return nil
		}))
		if err := client.Ping(ctx).Err(); err != nil { // connect outside the count
			return res, err
		}
		reps[i] = r
		res.replicas = append(res.replicas, cronReplica{delay: delay})
	}

	for tick := -1; tick < b.cronTicks; tick++ {
		tickNo.Store(int64(tick + 1))
		before := make([]counts, len(reps))
		for i, r := range reps {
			r.ran.Store(false)
			r.kind.Store(0)
			before[i] = r.ctr.counts()
		}
		// Start them in a random order: the goroutine started last tends to
		// run first.
		var wg sync.WaitGroup
		for _, i := range rand.Perm(len(reps)) {
			wg.Go(reps[i].job.Run)
		}
		wg.Wait()
		winners := 0
		for i, r := range reps {
			c := r.ctr.counts().sub(before[i])
			if r.ran.Load() {
				winners++
				if tick < 0 {
					res.winCold = c
					continue
				}
				res.replicas[i].won++
				res.replicas[i].winC = res.replicas[i].winC.add(c)
				continue
			}
			if tick < 0 {
				continue
			}
			res.replicas[i].loseC = res.replicas[i].loseC.add(c)
			switch middleware.EventKind(r.kind.Load()) {
			case middleware.EventClaimed:
				res.replicas[i].claimed++
			case middleware.EventDuplicate:
				res.replicas[i].duplicate++
			}
		}
		if tick >= 0 && winners == 1 {
			res.ranOnce++
		}
	}
	res.errors = errs.Load()
	return res, nil
}
