// Command bench compares lockkit with github.com/bsm/redislock and
// github.com/go-redsync/redsync/v4 against one Redis in one run, measures
// lockkit's renewal of many leases, and measures the adapters end to end:
// asynq servers with and without singleton.Middleware (throughput, round
// trips per task, a burst of duplicates) and cronguard's round trips per tick.
// It prints markdown tables to stdout and, with -out, writes them with the
// environment and the method to a file.
//
// It is a separate module so that users of jobguard never download the
// libraries it compares. Run it with `make bench`, which starts a throwaway
// redis-server and writes BENCHMARKS.md, or:
//
//	REDIS_ADDR=127.0.0.1:6379 go run . -out ../BENCHMARKS.md
//
// Every key it writes starts with "jobguard-bench:<random>:" and is deleted
// at the end; the asynq queues it uses are named "jobguard-bench-<random>-..."
// and deleted with asynq's Inspector, then the counters asynq keeps for them
// (its server bookkeeping is removed at shutdown). -only runs some sections,
// for iteration.
//
// One section runs only when -only names it: replicas, which measures
// lockkit.WithReplicaAcks against a master with one replica that it starts
// itself (two more redis-server processes, stopped at its end). From the
// repository's root:
//
//	tools/with-redis.sh sh -c 'cd bench && go run . -only replicas -out /tmp/replicas.md'
//
// Another, batching, compares lockkit used directly by 1, 8 and 20
// goroutines on one Locker with and without lockkit.WithBatching:
//
//	tools/with-redis.sh sh -c 'cd bench && go run . -only batching'
//
// A third, extrakeys, measures middleware.Guard.Run of a job that holds its
// own key only, or one or two extra keys besides (middleware.WithExtraKeys),
// lockkit used directly:
//
//	tools/with-redis.sh sh -c 'cd bench && go run . -only extrakeys'
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"github.com/jobguard/jobguard/lockkit"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

type bench struct {
	addr       string
	batched    bool // throughput: the guarded servers' Locker WithBatching
	cycles     int
	goroutines int
	rounds     int
	handoffs   int
	spread     time.Duration
	leases     int
	leaseTTL   time.Duration
	ticks      int
	warmTicks  int

	// replicaRounds is the rounds of the replicas section's cycles.
	replicaRounds int

	// End to end.
	sections       []string
	concurrency    int
	tputTasks      int
	tputSleepTasks int
	e2eRounds      int
	e2eTimeout     time.Duration
	burstTasks     int
	burstKeys      int
	burstWork      time.Duration
	requeueDelay   time.Duration
	burstTimeout   time.Duration
	burstVariants  string // a substring of the burst variants to run; empty runs every one
	cronTicks      int
	streamTasks    int
	flowTasks      int
	followWork     time.Duration
	preemptRounds  int
	streamInterval time.Duration
	streamWork     time.Duration
	scaleKeys      []int
	scaleParked    []int
	scaleHeld      []int
	scaleRenewed   []int

	runID   string
	prefix  string
	admin   *redis.Client // INFO and cleanup; not counted
	clients []*redis.Client
}

// client returns a new client of the Redis under test with a counting hook.
func (b *bench) client() (*redis.Client, *counter) { return b.clientAt(b.addr) }

// clientAt returns a new client of the Redis at addr with a counting hook.
func (b *bench) clientAt(addr string) (*redis.Client, *counter) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	ctr := &counter{}
	c.AddHook(ctr)
	b.clients = append(b.clients, c)
	return c, ctr
}

func main() {
	b := &bench{}
	out := flag.String("out", "", "also write the report (markdown) to this file")
	flag.StringVar(&b.addr, "addr", os.Getenv("REDIS_ADDR"), "Redis address (default $REDIS_ADDR)")
	flag.IntVar(&b.cycles, "cycles", 10000, "uncontended: acquire+release cycles per library per round")
	flag.IntVar(&b.goroutines, "goroutines", 8, "uncontended: goroutines of the concurrent run, each on its own key")
	flag.IntVar(&b.rounds, "rounds", 3, "uncontended: rounds; the table shows the median rate")
	flag.IntVar(&b.handoffs, "handoffs", 200, "contended: measured handoffs per library")
	flag.DurationVar(&b.spread, "handoff-spread", 100*time.Millisecond, "contended: the holder releases a uniformly random time in [0, spread) after the waiter's first attempt")
	flag.IntVar(&b.replicaRounds, "replica-rounds", 6, "replicas: rounds of each setting's cycles, the order swapped every round (an even count runs each order as often)")
	flag.IntVar(&b.leases, "leases", 10000, "renewal: leases held by one Locker")
	flag.DurationVar(&b.leaseTTL, "lease-ttl", 3*time.Second, "renewal: lease TTL (renewed every TTL/3)")
	flag.IntVar(&b.ticks, "ticks", 5, "renewal: measured renewal ticks")
	flag.IntVar(&b.warmTicks, "warm-ticks", 3, "renewal: ticks skipped before measuring")
	only := flag.String("only", "", "comma-separated sections to run: "+strings.Join(allSections, ", ")+
		"; or the groups locks ("+strings.Join(lockSections, ", ")+") and e2e ("+strings.Join(e2eSections, ", ")+"); "+
		"and, only when named, "+strings.Join(extraSections, ", ")+". Default: all but those")
	flag.IntVar(&b.concurrency, "concurrency", 10, "e2e: asynq.Config.Concurrency of every server")
	flag.BoolVar(&b.batched, "batching", false, "throughput: give the guarded servers' Locker lockkit.WithBatching()")
	flag.IntVar(&b.tputTasks, "tput-tasks", 10000, "throughput: tasks per run with the no-op handler")
	flag.IntVar(&b.tputSleepTasks, "tput-sleep-tasks", 3000, "throughput: tasks per run with the 5 ms handler")
	flag.IntVar(&b.e2eRounds, "e2e-rounds", 5, "throughput: rounds of bare and guarded runs; the table shows medians")
	flag.DurationVar(&b.e2eTimeout, "e2e-timeout", 60*time.Second, "throughput: the most one run may take")
	flag.IntVar(&b.burstTasks, "burst-tasks", 10000, "burst: tasks")
	flag.IntVar(&b.burstKeys, "burst-keys", 10, "burst: distinct keys")
	flag.DurationVar(&b.burstWork, "burst-work", time.Millisecond, "burst: handler time")
	flag.DurationVar(&b.requeueDelay, "requeue-delay", 50*time.Millisecond, "burst: the Requeue policy's delay")
	flag.StringVar(&b.burstVariants, "burst-variants", "", "burst: run only the variants whose name contains this (case-insensitive), such as \"parked at enqueue\"")
	flag.DurationVar(&b.burstTimeout, "burst-timeout", 60*time.Second, "burst: the most one policy's run may take; a run cut off is reported as such")
	flag.IntVar(&b.flowTasks, "flow-tasks", 1000, "flow: tasks of the flow-control burst (and of followup)")
	flag.DurationVar(&b.followWork, "followup-work", 20*time.Millisecond, "followup: handler time")
	flag.IntVar(&b.preemptRounds, "preempt-rounds", 200, "flow: rounds of the preemption latency measurement")
	flag.IntVar(&b.streamTasks, "stream-tasks", 2000, "stream: tasks enqueued while processing")
	flag.DurationVar(&b.streamInterval, "stream-interval", time.Millisecond, "stream: time between two enqueues")
	flag.DurationVar(&b.streamWork, "stream-work", 20*time.Millisecond, "stream: handler time (one run window)")
	flag.IntVar(&b.cronTicks, "cron-ticks", 200, "cron: measured ticks")
	scaleKeys := flag.String("scale-keys", "10000,100000,1000000", "scale: acquire+release cycles on distinct keys, one run per size")
	scaleParked := flag.String("scale-parked", "100,1000,10000", "scale: parked jobs on one key, one run per size")
	scaleHeld := flag.String("scale-held", "1000,10000,100000", "scale: held leases listed by Keys, one run per size")
	scaleRenewed := flag.String("scale-renewed", "1000,10000,100000", "scale: leases renewed by one Locker, one run per size")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	var err error
	if b.sections, err = parseSections(*only); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	for _, f := range []struct {
		s   string
		out *[]int
	}{{*scaleKeys, &b.scaleKeys}, {*scaleParked, &b.scaleParked}, {*scaleHeld, &b.scaleHeld}, {*scaleRenewed, &b.scaleRenewed}} {
		if *f.out, err = parseSizes(f.s); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
	}
	if b.addr == "" {
		fmt.Fprintln(os.Stderr, "bench: set REDIS_ADDR or -addr (`make bench` starts a redis-server and sets it)")
		os.Exit(2)
	}
	if b.cycles < b.goroutines || b.goroutines < 1 || b.rounds < 1 || b.replicaRounds < 1 || b.handoffs < 1 || b.spread <= 0 ||
		b.leases < 1 || b.ticks < 1 || b.warmTicks < 0 || b.leaseTTL < 300*time.Millisecond ||
		b.concurrency < 1 || b.tputTasks < 1 || b.tputSleepTasks < 1 || b.e2eRounds < 1 || b.e2eTimeout <= 0 ||
		b.burstTasks < 1 || b.burstKeys < 1 || b.burstWork < 0 || b.requeueDelay <= 0 || b.burstTimeout <= 0 || b.cronTicks < 1 {
		fmt.Fprintln(os.Stderr, "bench: invalid flag value")
		flag.Usage()
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	if err := b.run(*out); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func (b *bench) run(out string) error {
	ctx := context.Background()
	start := time.Now()
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	b.runID = hex.EncodeToString(id)
	b.prefix = "jobguard-bench:" + b.runID + ":"
	b.admin = redis.NewClient(&redis.Options{Addr: b.addr})
	defer b.admin.Close()
	defer func() {
		for _, c := range b.clients {
			_ = c.Close()
		}
	}()
	defer b.cleanup()
	if err := b.admin.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", b.addr, err)
	}

	r := &report{bench: b, env: environment(ctx, b.admin, b.addr)}
	loadStart := loadAvg()
	var err error
	if b.runs("uncontended") {
		progress("uncontended acquire+release: %d cycles × %d rounds per library, 1 and %d goroutines", b.cycles, b.rounds, b.goroutines)
		if r.cycleRes, r.cold, err = b.uncontended(ctx); err != nil {
			return err
		}
	}
	if b.runs("handoff") {
		for _, name := range libNames {
			progress("contended handoff: %s, %d handoffs", name, b.handoffs)
			h, err := b.handoff(ctx, name)
			if err != nil {
				return err
			}
			r.handoffRes = append(r.handoffRes, h)
		}
	}
	if b.runs("renewal") {
		progress("renewal: %d leases, TTL %s", b.leases, b.leaseTTL)
		if r.renewalRes, err = b.renewal(ctx); err != nil {
			return err
		}
	}
	if b.runs("scale") {
		if r.scaleRes, err = b.scale(ctx); err != nil {
			return err
		}
	}
	if b.runs("throughput") || b.runs("burst") || b.runs("stream") || b.runs("flow") || b.runs("followup") || b.runs("profile") {
		env := b.asynqEnv()
		defer env.cleanup()
		if b.runs("throughput") {
			progress("asynq throughput: bare and guarded, %d rounds, concurrency %d", b.e2eRounds, b.concurrency)
			if r.tputRes, r.renewRun, err = b.throughput(ctx, env); err != nil {
				return err
			}
			progress("round-trip floor: %d PINGs and %d no-op scripts", floorCalls, floorCalls)
			if r.floor, err = b.roundTripFloor(ctx); err != nil {
				return err
			}
		}
		if b.runs("burst") {
			progress("asynq duplicate burst: %d tasks over %d keys", b.burstTasks, b.burstKeys)
			if r.burstRes, r.burstEnq, err = b.burst(ctx, env); err != nil {
				return err
			}
		}
		if b.runs("flow") {
			progress("asynq flow control: %d tasks over %d keys", b.flowTasks, b.burstKeys)
			if r.flowRes, _, err = b.flow(ctx, env); err != nil {
				return err
			}
			progress("asynq preemption latency: %d rounds", b.preemptRounds)
			if r.preemptRes, err = b.preemptLatency(ctx, env); err != nil {
				return err
			}
		}
		if b.runs("followup") {
			progress("asynq follow-ups waiting and parked: %d tasks over %d keys, %s handler", b.flowTasks, b.burstKeys, b.followWork)
			if r.followRes, _, err = b.followUps(ctx, env); err != nil {
				return err
			}
		}
		if b.runs("stream") {
			progress("asynq Coalesce under a steady stream: %d tasks over %d keys", b.streamTasks, b.burstKeys)
			if r.streamRes, err = b.stream(ctx, env); err != nil {
				return err
			}
		}
		if b.runs("profile") {
			progress("CPU profiles: the uncontended cycle and the guarded no-op task")
			p, err := b.profileCycles(ctx)
			if err != nil {
				return err
			}
			r.profiles = append(r.profiles, p)
			if p, err = b.profileGuarded(ctx, env); err != nil {
				return err
			}
			r.profiles = append(r.profiles, p)
		}
	}
	if b.runs("cron") {
		progress("cronguard: %d ticks on 3 replicas", b.cronTicks)
		if r.cronRes, err = b.cronRoundTrips(ctx); err != nil {
			return err
		}
		progress("periodic: about %d ticks on 3 replicas", b.cronTicks)
		env := b.asynqEnv()
		defer env.cleanup()
		if r.periodicRes, err = b.periodicRoundTrips(ctx, env); err != nil {
			return err
		}
	}
	if b.runs("replicas") {
		progress("replicas: a master with one replica; %d cycles × %d rounds per setting, 1 and %d goroutines; %d handoffs per setting",
			b.cycles, b.replicaRounds, b.goroutines, b.handoffs)
		if r.replicasRes, err = b.replicas(ctx); err != nil {
			return err
		}
		r.env = append(r.env, []string{"Redis of the replicas section", r.replicasRes.servers})
	}
	if b.runs("batching") {
		progress("batching: %d cycles × %d rounds per setting, %v goroutines", b.cycles, b.rounds, batchGoroutines)
		if r.batchingRes, err = b.batching(ctx); err != nil {
			return err
		}
	}
	if b.runs("extrakeys") {
		progress("extrakeys: %d jobs × %d rounds per setting: own key only, +1 and +2 extra keys", b.cycles, b.rounds)
		if r.extraRes, err = b.extraKeys(ctx); err != nil {
			return err
		}
	}
	r.elapsed = time.Since(start)
	r.env = append(r.env, []string{"load average (1, 5, 15 min) at the start → the end of the run",
		loadStart + " → " + loadAvg() + " (other processes on this machine were not stopped)"})

	doc := r.markdown()
	fmt.Print(doc)
	if out != "" {
		if err := os.WriteFile(out, []byte(doc), 0o644); err != nil {
			return err
		}
		progress("wrote %s", out)
	}
	return nil
}

// Sections of the report, in order. allSections is the default run;
// extraSections run only when -only names them.
var (
	lockSections  = []string{"uncontended", "handoff", "renewal", "scale"}
	e2eSections   = []string{"throughput", "burst", "stream", "flow", "followup", "cron", "profile"}
	allSections   = append(slices.Clone(lockSections), e2eSections...)
	extraSections = []string{"replicas", "batching", "extrakeys"}
)

// parseSections parses -only.
func parseSections(only string) ([]string, error) {
	if strings.TrimSpace(only) == "" {
		return allSections, nil
	}
	var out []string
	for _, s := range strings.Split(only, ",") {
		switch s = strings.TrimSpace(s); {
		case s == "locks":
			out = append(out, lockSections...)
		case s == "e2e":
			out = append(out, e2eSections...)
		case slices.Contains(allSections, s) || slices.Contains(extraSections, s):
			out = append(out, s)
		default:
			return nil, fmt.Errorf("-only: unknown section %q (known: %s, %s, locks, e2e)", s,
				strings.Join(allSections, ", "), strings.Join(extraSections, ", "))
		}
	}
	return out, nil
}

// runs reports whether section is to run.
func (b *bench) runs(section string) bool { return slices.Contains(b.sections, section) }

// cleanup deletes every key of this run.
func (b *bench) cleanup() {
	ctx := context.Background()
	iter := b.admin.Scan(ctx, 0, b.prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for start := 0; start < len(keys); start += 1000 {
		b.admin.Del(ctx, keys[start:min(start+1000, len(keys))]...)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// e2eLockerOptions are opts and, with -batching, lockkit.WithBatching().
func (b *bench) e2eLockerOptions(opts ...lockkit.Option) []lockkit.Option {
	if b.batched {
		opts = append(opts, lockkit.WithBatching())
	}
	return opts
}
