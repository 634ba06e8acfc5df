package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

type report struct {
	*bench
	env         [][]string
	cycleRes    []cycleResult
	cold        map[string]counts
	handoffRes  []handoffResult
	renewalRes  renewalResult
	tputRes     []tputResult
	floor       rtFloor
	renewRun    renewRun
	burstRes    []burstRun
	burstEnq    counts // the enqueue of one burst
	streamRes   streamResult
	flowRes     []burstRun
	followRes   []burstRun
	preemptRes  preemptResult
	cronRes     cronResult
	periodicRes periodicResult
	profiles    []profile
	scaleRes    scaleResult
	replicasRes replicasResult
	batchingRes []batchResult
	extraRes    []extraResult
	elapsed     time.Duration
	sectionNo   int
}

// heading writes the next numbered section heading.
func (r *report) heading(w *strings.Builder, title string) {
	r.sectionNo++
	fmt.Fprintf(w, "## %d. %s\n\n", r.sectionNo, title)
}

func table(w *strings.Builder, header []string, rows [][]string) {
	w.WriteString("| " + strings.Join(header, " | ") + " |\n|")
	for range header {
		w.WriteString(" --- |")
	}
	w.WriteString("\n")
	for _, r := range rows {
		w.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	w.WriteString("\n")
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

func msec(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

func (r *report) markdown() string {
	var w strings.Builder
	w.WriteString("# Benchmarks\n\n")
	fmt.Fprintf(&w, "Written by the `bench/` module (`make bench` runs `go run . -out ../BENCHMARKS.md`) in %s. "+
		"lockkit, bsm/redislock and go-redsync/redsync run against the same Redis in the same run, and so do the "+
		"end-to-end measurements of the asynq and cron adapters.\n\n", r.elapsed.Round(time.Second))
	if len(r.sections) < len(allSections) {
		fmt.Fprintf(&w, "This run was limited to: %s (`-only`).\n\n", strings.Join(r.sections, ", "))
	}

	w.WriteString("## Environment\n\n")
	table(&w, []string{"", ""}, r.env)

	w.WriteString("## Method\n\n")
	fmt.Fprintf(&w, "- Each library gets its own go-redis client (default options) with a hook that counts "+
		"commands and round trips: a command sent alone is 1 round trip, a pipeline is 1 round trip for all its "+
		"commands. Pub/sub connections bypass go-redis hooks, so lockkit's SUBSCRIBE/UNSUBSCRIBE are not counted "+
		"(they are written without waiting for a reply).\n")
	fmt.Fprintf(&w, "- Options: lockkit `Options{}` defaults (TTL %s, renewed every TTL/3); redislock TTL %s, and "+
		"no retry (nil options) for a single attempt; redsync defaults (expiry 8s) with one pool, the goredis/v9 "+
		"adapter on the shared Redis.\n", lockcore.DefaultTTL, lockTTL)
	fmt.Fprintf(&w, "- CPU: the benchmark process's user+system time (getrusage) and the Redis server's "+
		"(`INFO cpu` used_cpu_user+used_cpu_sys). Client and server share this machine's CPUs. Redis command "+
		"time is the execution time `INFO commandstats` reports for the commands the library sent (a script's "+
		"time includes the commands it calls; network I/O is not included).\n")
	if r.runs("uncontended") {
		fmt.Fprintf(&w, "- Uncontended: each library first runs one cycle on a cold script cache (counted below), then "+
			"%d warm-up cycles. Then, per concurrency, %d rounds in which each library in turn (order rotated) runs "+
			"%d acquire+release cycles; each goroutine uses its own key, sequentially. The rate is the median "+
			"of the rounds; counts and CPU are over all rounds.\n", 50*r.goroutines, r.rounds, r.cycles)
	}
	if r.runs("handoff") {
		fmt.Fprintf(&w, "- Contended handoff: a holder and a waiter, each with its own client and locker. Per handoff "+
			"the holder takes the key, the waiter enters its waiting acquire, and once the waiter's first attempt has "+
			"returned the holder waits a uniformly random time in [0, %s) and releases (so the release falls at a "+
			"random point of a polling waiter's cycle). Latency is from the start of the holder's release call to "+
			"the return of the waiter's acquire. %d handoffs per library after one unmeasured.\n", r.spread, r.handoffs)
	}
	if r.runs("renewal") {
		fmt.Fprintf(&w, "- Renewal: one Locker takes %d leases (TTL %s, so renewed every %s; %d renewals per "+
			"pipeline, the default) with 16 goroutines. A renewal tick is counted each time the number of "+
			"`EventRenewed` events reaches a multiple of %d (observed with `WithObserver`, on the renewer goroutine). "+
			"The first %d ticks are skipped, the next %d measured. The hook records every pipeline; a renewal batch "+
			"is a run of pipelines each sent less than %s after the previous reply. lockkit's renewer renews together "+
			"the leases due within a quarter of the renew interval, so leases taken over a longer span may be "+
			"renewed in more than one batch per tick until their renewal times draw together.\n",
			r.leases, r.leaseTTL, r.leaseTTL/3, lockcore.DefaultRenewBatch, r.leases, r.warmTicks, r.ticks, batchGap)
	}
	if r.runs("throughput") || r.runs("burst") {
		fmt.Fprintf(&w, "- asynq (sections on throughput, round trips and the burst): every run starts an "+
			"`asynq.Server` (`NewServerFromRedisClient`) on a fresh queue, with the same `asynq.Config` guarded or "+
			"bare: `Concurrency: %d`, `TaskCheckInterval: %s`, `DelayedTaskCheckInterval: %s`, "+
			"`LogLevel: ErrorLevel`, made by `singleton.ServerConfig`. "+
			"The server, the Locker and the enqueuer each have their own counted client; guarded runs use a new "+
			"`lockkit.NewRedis` Locker (default options) and `singleton.Middleware` with its default observer "+
			"(a `slog` logger at Info: the Debug events are not formatted). The batch is enqueued first (8 "+
			"goroutines, one `Enqueue` each per task); the clock starts when `srv.Start` is called and stops when "+
			"the last task has returned from the outermost handler (skipped duplicates: when the middleware "+
			"reports them), so the asynq `Done` of the last few tasks and the shutdown are not timed. Counts and "+
			"CPU are taken at that moment too. Afterwards the queue is checked with the Inspector (all tasks done, "+
			"none left in any state) and deleted.\n", r.concurrency, taskCheckInterval, delayedCheckInterval)
	}
	if r.runs("replicas") {
		fmt.Fprintf(&w, "- Replicas (`lockkit.WithReplicaAcks`): the section starts two redis-server processes of its own on "+
			"free loopback ports (no persistence, `--repl-diskless-sync-delay 0`), makes the second a replica of the first "+
			"(`REPLICAOF`), waits until the master lists it online, and stops both at its end. Two Lockers on the master, "+
			"each with its own counted client and key prefix and otherwise default options, differ in one option: `%s` "+
			"(the default) and `%s`. Cycles: `TryAcquire` then `Release`, or `TryAcquire` with a `Label` of its own (one "+
			"per cycle) then `Complete(ctx, time.Minute)`; each goroutine on its own key. After %d warm-up cycles of each kind per "+
			"Locker, per kind and concurrency, %d rounds in which the two Lockers run %d cycles each, one after the other, "+
			"the order swapped every round (paired rounds on one master, in one process). cycles/s is the median of the "+
			"rounds; its with ÷ without is the median of each round's ratio. Acquire latency is the time of the "+
			"`TryAcquire` call alone, p50 and p99 over every call of the rounds. Round trips and commands are the hook's "+
			"counts; master and replica CPU are each server's `INFO cpu` (used_cpu_user+used_cpu_sys) read before and "+
			"after each run; all three are over all rounds. A write that the replica did not acknowledge within the "+
			"timeout (`ErrNotReplicated`) is counted, not fatal. Hand-over: the contended handoff's method, with a "+
			"holder and a waiter Locker of each setting, the two settings alternating hand-over by hand-over (order "+
			"swapped every time), %d each after one unmeasured.\n",
			ackSettings[0].name, ackSettings[1].name, 50*r.goroutines, r.replicaRounds, r.cycles, r.handoffs)
	}
	w.WriteString("\n")

	if r.runs("uncontended") {
		r.heading(&w, "Uncontended acquire + release")
		w.WriteString(r.cycleTable())
		var cold []string
		for _, name := range libNames {
			c := r.cold[name]
			cold = append(cold, fmt.Sprintf("%s %d round trips (%d commands)", name, c.rts, c.cmds))
		}
		fmt.Fprintf(&w, "First cycle of the run, before the warm-up: %s. When Redis does not have a script cached yet, "+
			"EVALSHA fails with NOSCRIPT and the script is sent with EVAL, one extra round trip per script, once per "+
			"Redis (again after a restart or SCRIPT FLUSH). The rows above exclude it.\n\n", strings.Join(cold, "; "))
		w.WriteString("A plain lock (limit 1, no waiting, queue, epoch or other option) that no other kind of acquire " +
			"touched is one STRING key: the acquire script writes it once; the release script leaves the last token in it " +
			"for go-redis' retry window, as the record of the release, so that a release that go-redis sends again " +
			"reports the same (an acquire that takes the key again within the window moves the record into a key of its own). redislock's release deletes its key and keeps no record; " +
			"redsync's likewise. Neither has fencing tokens.\n\n")
	}

	if r.runs("handoff") {
		r.heading(&w, "Contended handoff")
		w.WriteString(r.handoffTable())
		w.WriteString("lockkit's release script makes the waiter the holder and tells it with a PUBLISH, so the waiter " +
			"holds the key without another round trip (it renews the short TTL it was handed a third of the way " +
			"through); redislock and redsync waiters find the key free at their next poll.\n\n")
	}

	if r.runs("renewal") {
		r.heading(&w, "Renewal at scale (lockkit)")
		w.WriteString(r.renewalTable())
	}
	if r.runs("scale") {
		r.heading(&w, "How cost grows: distinct keys, parked jobs, listing (lockkit)")
		w.WriteString(r.scaleSection())
	}
	if r.runs("throughput") {
		r.heading(&w, "asynq throughput: singleton.Middleware vs the bare handler")
		w.WriteString(r.throughputSection())
		r.heading(&w, "Redis round trips per asynq task")
		w.WriteString(r.roundTripSection())
	}
	if r.runs("burst") {
		r.heading(&w, "A burst of duplicates: every policy, and uniqueness at enqueue")
		w.WriteString(r.burstSection())
	}
	if r.runs("flow") {
		r.heading(&w, "Flow control per key: keep the newest, preempt, throttle, hold at least")
		w.WriteString(r.flowSection())
	}
	if r.runs("followup") {
		r.heading(&w, "Follow-ups of Coalesce and KeepNewest: waiting on a worker or parked")
		w.WriteString(r.followSection())
	}
	if r.runs("stream") {
		r.heading(&w, "Coalesce under a steady stream of enqueues")
		w.WriteString(r.streamSection())
	}
	if r.runs("cron") {
		r.heading(&w, "cronguard and periodic: Redis round trips per tick and replica")
		w.WriteString(r.cronSection())
		w.WriteString(r.periodicTable())
	}
	if r.runs("profile") {
		r.heading(&w, "Where the time goes: CPU profiles")
		w.WriteString(r.profileSection())
	}
	if r.runs("replicas") {
		r.heading(&w, "Waiting for a replica: what WithReplicaAcks costs (lockkit)")
		w.WriteString(r.replicasSection())
	}
	if r.runs("batching") {
		r.heading(&w, "Calls in flight at once share their round trips: WithBatching (lockkit)")
		w.WriteString(r.batchingSection())
	}
	if r.runs("extrakeys") {
		r.heading(&w, "Several keys per job: what WithExtraKeys costs (middleware, lockkit)")
		w.WriteString(r.extraKeysSection())
	}
	return w.String()
}

func (r *report) cycleTable() string {
	var w strings.Builder
	var rows [][]string
	lockkitRate := make(map[int]float64)
	lockkitCmd := make(map[int]time.Duration)
	for _, c := range r.cycleRes {
		if c.lib == "lockkit" {
			lockkitRate[c.goroutines] = c.opsPerSec
			lockkitCmd[c.goroutines] = c.cpuPerCycle(c.redisCmd)
		}
	}
	for _, c := range r.cycleRes {
		rows = append(rows, []string{
			c.lib,
			fmt.Sprint(c.goroutines),
			fmt.Sprintf("%.0f", c.opsPerSec),
			us(time.Duration(float64(time.Second) * float64(c.goroutines) / c.opsPerSec)),
			fmt.Sprintf("%.2f", c.perCycle(c.per.rts)),
			fmt.Sprintf("%.2f", c.perCycle(c.per.cmds)),
			us(c.cpuPerCycle(c.clientCPU)),
			us(c.cpuPerCycle(c.redisCPU)),
			us(c.cpuPerCycle(c.redisCmd)),
			fmt.Sprintf("%.2f", lockkitRate[c.goroutines]/c.opsPerSec),
			fmt.Sprintf("%.2f", float64(lockkitCmd[c.goroutines])/float64(c.cpuPerCycle(c.redisCmd))),
		})
	}
	table(&w, []string{"library", "goroutines", "cycles/s", "mean cycle time", "round trips/cycle",
		"commands/cycle", "client CPU/cycle", "Redis CPU/cycle", "Redis command time/cycle", "lockkit ÷ library (cycles/s)",
		"lockkit ÷ library (Redis command time)"}, rows)
	return w.String()
}

func (r *report) handoffTable() string {
	var w strings.Builder
	var rows [][]string
	for _, h := range r.handoffRes {
		rows = append(rows, []string{
			h.lib,
			waitDesc[h.lib],
			msec(h.percentile(0.5)),
			msec(h.percentile(0.9)),
			msec(h.percentile(0.99)),
			msec(h.latencies[len(h.latencies)-1]),
			fmt.Sprintf("%.1f", float64(h.waiterCmds)/float64(len(h.latencies))),
		})
	}
	table(&w, []string{"library", "waiting acquire", "p50", "p90", "p99", "max", "waiter commands/handoff"}, rows)
	return w.String()
}

func (r *report) renewalTable() string {
	var w strings.Builder
	x := r.renewalRes
	k := time.Duration(x.ticks)
	perLease := func(d time.Duration) string { return us(d / time.Duration(x.leases)) }
	var inPipes time.Duration
	sizes := make(map[int]int)
	for _, p := range x.pipes {
		inPipes += p.dur
		sizes[p.cmds]++
	}
	var sizeList []string
	for _, n := range slices.Sorted(maps.Keys(sizes)) {
		sizeList = append(sizeList, fmt.Sprintf("%d × %.1f", n, float64(sizes[n])/float64(x.ticks)))
	}
	slices.Reverse(sizeList)
	var batchLeases []int
	var batchWall []time.Duration
	for _, bt := range x.batches {
		n := 0
		for _, p := range bt {
			n += p.cmds
		}
		batchLeases = append(batchLeases, n)
		batchWall = append(batchWall, bt[len(bt)-1].end().Sub(bt[0].start))
	}
	rows := [][]string{
		{"leases held by one Locker", fmt.Sprintf("%d (TTL %s, renewed every %s, up to %d per pipeline)", x.leases, x.ttl, x.interval, x.batch)},
		{"taking them (16 goroutines)", fmt.Sprintf("%s wall, %s process CPU (%s per lease)", msec(x.acquireWall), msec(x.acquireCPU), perLease(x.acquireCPU))},
		{"goroutines of the process", fmt.Sprintf("%d before the Locker took its first lease, %d while it holds them all (+%d)",
			x.goroutinesBefore, x.goroutinesHolding, x.goroutinesHolding-x.goroutinesBefore)},
		{"measured ticks", fmt.Sprintf("%d, one every %s on average", x.ticks, msec(x.period))},
		{"Redis round trips per tick", fmt.Sprintf("%.1f", x.rtsPerTick)},
		{"Redis commands per tick", fmt.Sprintf("%.0f (EVALSHA of the renew script, up to 100 leases each)", x.cmdsPerTick)},
		{"pipeline sizes per tick (commands × pipelines)", strings.Join(sizeList, ", ")},
		{"renewal batches per tick", fmt.Sprintf("%.1f; leases per batch: %s", float64(len(x.batches))/float64(x.ticks), joinInts(batchLeases))},
		{"wall time per batch (first pipeline sent → last reply)", joinDurations(batchWall)},
		{"time waiting on renewal pipelines per tick", msec(inPipes / k)},
		{"process CPU per tick", fmt.Sprintf("%s (%s per lease)", msec(x.cpuPerTick), perLease(x.cpuPerTick))},
		{"Redis CPU per tick", fmt.Sprintf("%s (%s per lease)", msec(x.redis.cpu), perLease(x.redis.cpu))},
		{"Redis command time per tick (commandstats)", fmt.Sprintf("%s (%s per lease)", msec(x.redis.cmd), perLease(x.redis.cmd))},
		{"renewals failed / leases lost", fmt.Sprintf("%d / %d", x.failed, x.lost)},
		{"acquire+release cycle on the same Locker, holding no lease", fmt.Sprintf("%s wall, %s process CPU", us(x.emptyCycle.wall), us(x.emptyCycle.cpu))},
		{fmt.Sprintf("acquire+release cycle on the same Locker, holding %d leases", x.leases), fmt.Sprintf("%s wall, %s process CPU", us(x.fullCycle.wall), us(x.fullCycle.cpu))},
		{"Close (releases every lease)", fmt.Sprintf("%s, %d round trips", msec(x.closeWall), x.closeRts)},
	}
	table(&w, []string{"", ""}, rows)
	return w.String()
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

func joinDurations(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = msec(d)
	}
	return strings.Join(s, ", ")
}
