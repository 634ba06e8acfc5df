package main

import (
	"fmt"
	"strings"
	"time"
)

func perTask(n int64, tasks int) string { return fmt.Sprintf("%.2f", float64(n)/float64(tasks)) }

func rateStr(x float64) string { return fmt.Sprintf("%.0f", x) }

func joinRatios(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(s, ", ")
}

func verdict(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func (r *report) throughputSection() string {
	var w strings.Builder
	fmt.Fprintf(&w, "Each run: a batch of distinct tasks (payload `{\"n\":i}`), enqueued to a fresh queue, then processed "+
		"by one server with `Concurrency: %d`. Guarded: `singleton.Middleware(locker, singleton.KeyByPayload())`, "+
		"so every task has its own key (no duplicates; the default Skip policy never applies) and each pays "+
		"one acquire and one release; with `singleton.WithAsyncRelease()` the release leaves the task's path: "+
		"the Locker's background releaser pipelines it. The handler is a no-op, or `time.Sleep(5 * time.Millisecond)`. "+
		"%d rounds, each one bare run and one guarded run (bare first in odd rounds, guarded first in even rounds); "+
		"the rate is tasks ÷ (srv.Start → last task returned), and the table shows the median of the rounds.\n\n",
		r.concurrency, r.e2eRounds)
	if r.batched {
		w.WriteString("The guarded servers' Locker has `lockkit.WithBatching()` (`-batching`).\n\n")
	}
	var rows [][]string
	for _, x := range r.tputRes {
		bare, guarded := median(x.rates(false)), median(x.rates(true))
		ratio := guarded / bare
		br, gr := x.rates(false), x.rates(true)
		var perRound []float64
		for i := range min(len(br), len(gr)) {
			perRound = append(perRound, gr[i]/br[i])
		}
		rows = append(rows, []string{
			x.name, fmt.Sprint(x.tasks), rateStr(bare), rateStr(guarded),
			fmt.Sprintf("%.2f", ratio), fmt.Sprintf("%.2f (%s)", median(perRound), joinRatios(perRound)),
			fmt.Sprintf("≥ %.2f", x.goal), verdict(ratio >= x.goal),
		})
	}
	table(&w, []string{"handler", "tasks per run", "bare tasks/s (median)", "guarded tasks/s (median)",
		"guarded ÷ bare (of the medians)", "median of the rounds' ratios (each round)", "goal", "met"}, rows)

	w.WriteString("Every run, in the order they ran (CPU per task: this process, which holds the server, the " +
		"middleware and the Locker; Redis: the server's `INFO cpu`; both share the machine's CPUs):\n\n")
	rows = nil
	for _, x := range r.tputRes {
		pair := map[bool]float64{}
		round := 0
		for i, run := range x.runs {
			kind := "bare"
			if run.guarded {
				kind = "guarded"
			}
			pair[run.guarded] = run.rate(x.tasks)
			ratio := ""
			if i%2 == 1 {
				round++
				ratio = fmt.Sprintf("%.2f", pair[true]/pair[false])
			}
			rows = append(rows, []string{
				x.name, fmt.Sprint(i/2 + 1), kind, rateStr(run.rate(x.tasks)), msec(run.wall),
				us(run.cpu / time.Duration(x.tasks)), us(run.redisCPU / time.Duration(x.tasks)),
				perTask(run.srv.rts+run.lock.rts, x.tasks), ratio, run.left,
			})
		}
	}
	table(&w, []string{"handler", "round", "run", "tasks/s", "wall", "process CPU/task", "Redis CPU/task",
		"round trips/task (server + Locker)", "guarded ÷ bare (round)", "queue after"}, rows)
	w.WriteString(r.floorText())
	return w.String()
}

func (r *report) roundTripSection() string {
	var w strings.Builder
	w.WriteString("Counted on the client of each part during the throughput runs above (all rounds): the Locker " +
		"has its own client, so what the middleware adds is exactly that client's traffic; asynq's server has " +
		"another (dequeue, done, heartbeats, forwarder polls). A command sent alone is one round trip, a pipeline " +
		"one round trip.\n\n")
	var rows [][]string
	for _, x := range r.tputRes {
		g, bare := x.total(true), x.total(false)
		n := x.tasks * len(x.of(true))
		nb := x.tasks * len(x.of(false))
		slot := func(guarded bool) time.Duration {
			return time.Duration(float64(r.concurrency) / median(x.rates(guarded)) * float64(time.Second))
		}
		sb, sg := slot(false), slot(true)
		rows = append(rows, []string{
			x.name + " (default TTL 30s)", fmt.Sprint(n),
			perTask(g.lock.rts, n), perTask(g.lock.cmds, n), perTask(g.lock.pipes, n),
			fmt.Sprintf("%s (%s per round trip)", us(g.lock.wait/time.Duration(n)), us(meanRT(g.lock))),
			fmt.Sprintf("%s → %s (%+.1f µs, %+.1f%%)", us(sb), us(sg), float64(sg-sb)/float64(time.Microsecond), 100*float64(sg-sb)/float64(sb)),
			perTask(bare.srv.rts, nb), perTask(g.srv.rts, n),
			fmt.Sprintf("%s / %s", us(meanRT(bare.srv)), us(meanRT(g.srv))),
		})
	}
	rr := r.renewRun
	if rr.tasks > 0 {
		rows = append(rows, []string{
			fmt.Sprintf("%s (`WithTTL(%s)`: renewed every %s)", rr.work, rr.ttl, rr.ttl/3), fmt.Sprint(rr.tasks),
			perTask(rr.lock.rts, rr.tasks), perTask(rr.lock.cmds, rr.tasks), perTask(rr.lock.pipes, rr.tasks),
			fmt.Sprintf("%s (%s per round trip)", us(rr.lock.wait/time.Duration(rr.tasks)), us(meanRT(rr.lock))),
			"", "", perTask(rr.srv.rts, rr.tasks), "",
		})
	}
	table(&w, []string{"handler", "guarded tasks", "Locker round trips/task (goal 2)", "Locker commands/task",
		"of the round trips, renewal pipelines/task", "time in Locker round trips/task",
		"worker time per task (Concurrency ÷ median tasks/s), bare → guarded",
		"asynq server round trips/task, bare", "asynq server round trips/task, guarded",
		"asynq server time per round trip, bare / guarded"}, rows)
	w.WriteString("Time in Locker round trips is measured in the hook around each call (sent → reply read), summed " +
		"and divided by the tasks: the acquire and the release are on each task's path, before and after the " +
		"handler, and a worker slot is busy until both are done. Worker time per task is what each of the " +
		"Concurrency slots spends per task, on average, derived from the median rates. The asynq server's " +
		"own round trips (dequeue, done) are timed the same way, for comparison.\n\n")
	for _, x := range r.tputRes {
		if x.work == 0 {
			continue
		}
		g := x.total(true)
		n := x.tasks * len(x.of(true))
		lockPerTask := g.lock.wait / time.Duration(n)
		slot := time.Duration(float64(r.concurrency) / median(x.rates(false)) * float64(time.Second))
		fmt.Fprintf(&w, "With the %s handler, the Locker's two round trips take %s per task, %.1f%% of a worker's time per "+
			"task in the bare runs (%s); a guarded ÷ bare ratio of at least %.2f leaves room for %.1f%%.\n\n",
			x.name, us(lockPerTask), 100*float64(lockPerTask)/float64(slot), us(slot), x.goal, 100*(1/x.goal-1))
	}
	var los []string
	for _, x := range r.tputRes {
		var counts []string
		var sample leftover
		for _, run := range x.of(true) {
			counts = append(counts, fmt.Sprint(run.leftover.keys))
			sample = run.leftover
		}
		types := make([]string, 0, len(sample.types))
		for t, n := range sample.types {
			types = append(types, fmt.Sprintf("%s %d", t, n))
		}
		los = append(los, fmt.Sprintf("%s handler, %d tasks per run: %s keys after the guarded runs (types of the first 100 scanned: %s); e.g. `%s`: "+
			"%d bytes (`MEMORY USAGE`), expires in %s", x.name, x.tasks, strings.Join(counts, ", "),
			strings.Join(types, ", "), sample.sampleKey, sample.sampleMem, sample.sampleTTL.Round(time.Second)))
	}
	if len(los) > 0 {
		w.WriteString("What stays in Redis under the Locker's prefix right after a guarded run, with every lease " +
			"released (the harness then deletes it, so that runs start alike):\n\n- " + strings.Join(los, "\n- ") +
			"\n\nA plain lock's release leaves one string: the holders key (`{key}:h`) keeps `~<token>.` for the " +
			"client's retry window: the released token, so that the next acquire's token is greater, and the record " +
			"of the release, so that a release that go-redis sends again gives the same answer (an acquire that takes " +
			"the key again within the window moves the record to `{key}:d:<token>`). " +
			"A release from the sorted-set form of the holders key (waiters, limits, parked jobs) leaves `{key}:d`, a sorted " +
			"set of released holders, and `{key}:f`, its last fencing token, instead.\n\n")
	}
	if rr.tasks > 0 {
		renewRTs := rr.lock.pipes
		fmt.Fprintf(&w, "The last row holds each lease longer than its renew interval: %d tasks of %s with "+
			"`singleton.WithTTL(%s)`, %d at a time. The Locker renewed %d times (%.1f per task, `EventRenewed`) "+
			"in %d pipelines, %.1f leases per pipeline: one renewer per Locker sends the leases due together "+
			"in one pipeline, so a renewal costs a fraction of a round trip per lease. The asynq server's round trips "+
			"beyond dequeue and done in that row are its background polls (the forwarder every %s, heartbeats) over "+
			"the run's %s. Queue after: %s.\n\n",
			rr.tasks, rr.work, rr.ttl, r.concurrency, rr.renewals, float64(rr.renewals)/float64(rr.tasks),
			renewRTs, float64(rr.renewals)/float64(max(renewRTs, 1)), delayedCheckInterval, msec(rr.wall), rr.left)
	}
	return w.String()
}

func (r *report) burstSection() string {
	var w strings.Builder
	plain := fmt.Sprintf("%d commands on the enqueuer's client for a plain enqueue: one script per task, plus connection set-up", r.burstEnq.cmds)
	if r.burstEnq.cmds == 0 {
		plain = "a plain enqueue's commands are counted when the bare variant runs; `-burst-variants` left it out"
	}
	fmt.Fprintf(&w, "%d tasks of one type whose payload field `k` takes one of %d values, drawn uniformly at "+
		"random (a fixed seed: every policy gets the same sequence), enqueued at once (%s), then one server with `Concurrency: %d` and a %s handler "+
		"(`time.Sleep`). Guarded: `singleton.Middleware(locker, singleton.KeyByFields(\"k\"), "+
		"singleton.WithPolicy(p), singleton.WithRedis(srvClient))`. The tasks have asynq's default MaxRetry (25), "+
		"so a requeued duplicate goes back as a retry that the `IsFailure` of `singleton.ServerConfig` reports as no "+
		"failure (it never uses up "+
		"its retries); it is parked for its key (retry scheduled 30 s ahead as a backstop) and moved to pending by the "+
		"run that frees the key, which reserves the key for it, so parked duplicates run in arrival order. \"key idle "+
		"between runs\" is, per key, the time from one run's handler return to the next run's handler start (the "+
		"release, for Requeue the `Inspector.RunTask` and asynq's next dequeue, and the next acquire). \"parked at enqueue\" enqueues with `singleton.Client` and "+
		"`singleton.ParkAtEnqueue`: the first task of a free key reserves it and is pending, every later one is parked "+
		"for its key at enqueue and scheduled 30 s ahead as a backstop, so a task is delivered when the run before it "+
		"ends and moves it to pending (one more command per enqueue: the reservation or park). Coalesce runs once with a plain enqueue and once with `singleton.Client` (\"stamped\"); "+
		"\"asynq Unique\" enqueues with `asynq.Unique(time.Hour)` and no middleware, \"Unique\" with `singleton.Client` "+
		"and `singleton.Unique`: their refused enqueues are not tasks. Wall time is from `srv.Start` to the moment every "+
		"enqueued task is accounted for: it ran, or completed without running. Redis counts are the server's and the "+
		"Locker's clients over that time. Each run is bounded by %s (`-burst-timeout`).\n\n",
		r.burstTasks, r.burstKeys, plain, r.concurrency, r.burstWork, r.burstTimeout)
	w.WriteString(r.runsTable(r.burstRes, r.burstTasks))
	return w.String()
}

func (r *report) flowSection() string {
	var w strings.Builder
	fmt.Fprintf(&w, "%d tasks of one type over %d keys (field `k`, drawn at random with a fixed seed), enqueued at once, then "+
		"one server with `Concurrency: %d` and a %s handler, behind `singleton.Middleware(locker, singleton.KeyByFields(\"k\"), ...)` "+
		"with each feature. The handler returns early, with its ctx's cause, when its ctx is cancelled. \"skipped or covered\" "+
		"counts the tasks that completed without running (superseded, throttled, or held); \"preempted\" the runs a newer "+
		"task cancelled (revoked, not retried), which are not in \"ran\".\n\n", r.flowTasks, r.burstKeys, r.concurrency, r.burstWork)
	w.WriteString(r.runsTable(r.flowRes, r.flowTasks))
	w.WriteString(r.preemptTable())
	return w.String()
}

func (r *report) followSection() string {
	var w strings.Builder
	fmt.Fprintf(&w, "%d tasks of one type over %d keys (field `k`, the same draw as above), enqueued at once, then one server "+
		"with `Concurrency: %d` and a %s handler (`-followup-work`), behind `singleton.Middleware(locker, singleton.KeyByFields(\"k\"), "+
		"singleton.WithPolicy(p), ...)`. Without `WithRedis` a key's follow-up waits for the key on a worker; with it, the "+
		"follow-up is parked for its key (\"requeued\", a retry 30 s ahead as the backstop) and started by the run that frees "+
		"the key, and a KeepNewest follow-up that a newer one replaces is started at once to complete without running. "+
		"\"skipped or covered\" counts the tasks that completed without running.\n\n", r.flowTasks, r.burstKeys, r.concurrency, r.followWork)
	w.WriteString(r.runsTable(r.followRes, r.flowTasks))
	return w.String()
}

func (r *report) cronSection() string {
	var w strings.Builder
	x := r.cronRes
	fmt.Fprintf(&w, "Three replicas of one entry (`%s`, seconds field), each with its own counted client, "+
		"`lockkit.NewRedis` Locker and `cronguard.New(locker, WithSeconds(), WithClock(...))` Guard (other options "+
		"default: Skip, TTL 30s), wrapping a %s `cronguard.Func` with `cron.NewChain(w).Then(job)`. "+
		"A shared fake clock stands at each tick in turn (one second apart); each replica reads it plus its own "+
		"delay, as a job that starts that long after its cron fired (cron fires when the replica's own clock reads "+
		"the activation). Per tick the three call the wrapped job's `Run()` at once (three goroutines started in "+
		"a random order), as three processes whose cron fired; whichever claims the tick first runs it. After one "+
		"unmeasured tick, %d ticks are measured; each replica's round trips over a tick count as a winner's (it "+
		"ran the job) or a loser's.\n\n", cronSpec, x.work, x.ticks)
	var rows [][]string
	var win, lose counts
	won, lost := 0, 0
	for i, rep := range x.replicas {
		l := x.ticks - rep.won
		rows = append(rows, []string{
			fmt.Sprintf("replica-%d", i), "tick + " + rep.delay.String(), fmt.Sprint(rep.won),
			ratioOrDash(rep.winC.rts, rep.won), ratioOrDash(rep.winC.cmds, rep.won),
			fmt.Sprint(l), fmt.Sprintf("%d / %d", rep.claimed, rep.duplicate),
			ratioOrDash(rep.loseC.rts, l), ratioOrDash(rep.loseC.cmds, l),
		})
		win, lose = win.add(rep.winC), lose.add(rep.loseC)
		won += rep.won
		lost += l
	}
	rows = append(rows, []string{"all", "", fmt.Sprint(won), ratioOrDash(win.rts, won), ratioOrDash(win.cmds, won),
		fmt.Sprint(lost), "", ratioOrDash(lose.rts, lost), ratioOrDash(lose.cmds, lost)})
	table(&w, []string{"replica", "clock read by its job", "ticks won (ran the job)", "round trips per won tick (goal ≤ 2)",
		"commands per won tick", "ticks lost", "lost as EventClaimed / EventDuplicate", "round trips per lost tick (goal ≤ 2)",
		"commands per lost tick"}, rows)
	fmt.Fprintf(&w, "Ticks that ran on exactly one replica: %d of %d. Guard errors (EventError, EventLost): %d. "+
		"Per tick, the three replicas together: %.2f round trips. The unmeasured first tick cost its winner %d round "+
		"trips (%d commands).\n\n", x.ranOnce, x.ticks, x.errors,
		float64(win.rts+lose.rts)/float64(x.ticks), x.winCold.rts, x.winCold.cmds)
	return w.String()
}

// meanRT is the mean time callers waited per round trip.
func meanRT(c counts) time.Duration {
	if c.rts == 0 {
		return 0
	}
	return c.wait / time.Duration(c.rts)
}

func ratioOrDash(n int64, d int) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", float64(n)/float64(d))
}

// gapCell is the p50 and p99 of the sorted gaps, "–" without any.
func gapCell(gaps []time.Duration) string {
	if len(gaps) == 0 {
		return "–"
	}
	return msec(nearestRank(gaps, 0.50)) + " / " + msec(nearestRank(gaps, 0.99))
}

// runsTable is the table of a burst's runs of tasks tasks.
func (r *report) runsTable(runs []burstRun, tasks int) string {
	var w strings.Builder
	var rows [][]string
	for _, x := range runs {
		total := x.srv.add(x.lock)
		wall := msec(x.wall)
		if !x.finished {
			wall = fmt.Sprintf("**not finished** in %s: %d of %d accounted for", msec(x.wall), x.ran+x.skipped+x.preempted, tasks)
		}
		rows = append(rows, []string{
			x.name, fmt.Sprint(x.enqueued), wall, fmt.Sprint(x.ran), fmt.Sprint(x.skipped), fmt.Sprint(x.requeued), fmt.Sprint(x.preempted),
			fmt.Sprint(x.ran + x.skipped + x.requeued + x.preempted), fmt.Sprint(x.maxOverlap), gapCell(x.gaps),
			fmt.Sprintf("%d (server %d + Locker %d)", total.cmds, x.srv.cmds, x.lock.cmds),
			fmt.Sprint(total.rts), perTask(total.cmds, tasks), fmt.Sprint(total.cmds + x.enq.cmds),
			msec(x.cpu), msec(x.redisCPU), x.left,
		})
	}
	table(&w, []string{"policy", "tasks enqueued", "wall until all accounted for", "ran", "skipped or covered", "requeued", "preempted", "deliveries (ran + skipped + requeued + preempted)",
		"most runs of one key at once", "key idle between runs p50 / p99", "Redis commands while processing (server + Locker)", "round trips", "commands per task",
		"Redis commands with the enqueue", "process CPU", "Redis CPU", "queue after"}, rows)
	return w.String()
}
