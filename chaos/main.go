// Command chaos runs jobguard's asynq middleware in real worker processes
// against a real redis-server, under a workload and faults drawn from a seed,
// records every enqueue, delivery, run and guard decision of every process,
// and checks the history against the rules that README.md and docs/rules.md state.
//
//	go run . -seed 7                # one seed
//	go run . -seeds 3 -length 15s   # three seeds from a random one
//	go run . -duration 30m          # seeds until 30 minutes have passed
//	go run . -seed 7 -cluster      # against a 3-master Redis Cluster of its own
//	go run . -seed 7 -failover     # against a master, two replicas and three sentinels of its own, failed over
//	go run . -seed 7 -broken none   # negative control: workers without the middleware
//	go run . -seed 7 -broken skip   # negative control: every family under Skip
//	go run . -seed 7 -failover -broken acks  # negative control: Lockers that wait for no replica
//	go run . -seed 7 -broken fence  # negative control: the fenced family's writes unfenced
//	go run . -seed 7 -broken extrakeys  # negative control: the ExtraKeys family's tasks hold their own keys only
//
// The Lockers of an odd seed's run batch their calls (lockkit.WithBatching),
// so that its go-redis reply faults hit pipelines of calls.
//
// A run that breaks a rule prints its seed and keeps its history
// (<out>/seed-<seed>/*.jsonl, one JSON record a line, violations.txt, the
// keys left at the check with their TTLs, keys.txt, and the entries of the
// parked queues among them, parked.txt);
// `go run . -seed <seed>` replays the same workload and fault schedule.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := workerMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "chaos worker:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(driverMain(os.Args[1:]))
}

// options of a chaos run.
type options struct {
	seed     uint64
	seeds    int
	duration time.Duration
	length   time.Duration
	broken   string // "", brokenNone, brokenSkip, brokenAcks, brokenFence or brokenExtraKeys
	noFaults bool
	out      string
	addr     string
	cluster  bool // a 3-master Redis Cluster of the run's own instead of a standalone server
	failover bool // a master with replicas behind sentinels of the run's own, failed over by the Redis faults
	keep     bool
	self     string // the executable that runs the worker processes
	// plan, when set, is the workload of every seed instead of one drawn
	// from it (a test's own).
	plan func(seed uint64) Workload
}

// topology is the Redis the run starts, or uses (-redis: a standalone one).
func (o options) topology() topology { return topologyOf(o.cluster, o.failover) }

func driverMain(args []string) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	var o options
	fs.Uint64Var(&o.seed, "seed", 0, "first seed (0: a random one)")
	fs.IntVar(&o.seeds, "seeds", 1, "number of seeds to run (seed, seed+1, ...)")
	fs.DurationVar(&o.duration, "duration", 0, "run seeds until this much time has passed (overrides -seeds)")
	fs.DurationVar(&o.length, "length", 20*time.Second, "how long each seed enqueues and injects faults")
	fs.StringVar(&o.broken, "broken", "", `negative control: "none" runs the workers without the middleware, "skip" every family under Skip, "acks" (with -failover) Lockers that wait for no replica, "fence" the fenced family's writes with plain XADD and SET, "extrakeys" the ExtraKeys family's middleware without WithExtraKeys`)
	fs.BoolVar(&o.noFaults, "nofaults", false, "inject no faults")
	fs.StringVar(&o.out, "out", "chaos-out", "directory for the histories of failing seeds")
	fs.StringVar(&o.addr, "redis", "", "use the redis-server at this address instead of starting one (its database 0 is flushed)")
	fs.BoolVar(&o.cluster, "cluster", false, "run against a 3-master Redis Cluster the run starts (one master restarted by a Redis fault)")
	fs.BoolVar(&o.failover, "failover", false, "run against a master, two replicas and three sentinels the run starts (the master killed and a replica promoted by a Redis fault)")
	check := ""
	fs.StringVar(&check, "check", "", "check the history kept in this directory again (the queue taken as drained) and print its violations")
	fs.BoolVar(&o.keep, "keep", false, "keep the history of passing seeds too")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if check != "" {
		return recheck(check)
	}
	if o.broken != "" && !slices.Contains([]string{brokenNone, brokenSkip, brokenAcks, brokenFence, brokenExtraKeys}, o.broken) {
		fmt.Fprintf(os.Stderr, "chaos: -broken %q: want %q, %q, %q, %q or %q\n", o.broken, brokenNone, brokenSkip, brokenAcks, brokenFence, brokenExtraKeys)
		return 2
	}
	switch {
	case o.cluster && o.failover:
		fmt.Fprintln(os.Stderr, "chaos: -cluster and -failover: choose one")
		return 2
	case (o.cluster || o.failover) && o.addr != "":
		fmt.Fprintln(os.Stderr, "chaos: -cluster and -failover start their own Redis: they take no -redis")
		return 2
	case o.broken == brokenAcks && !o.failover:
		fmt.Fprintln(os.Stderr, "chaos: -broken acks needs -failover (only a Sentinel run has replicas to wait for)")
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	o.self = self
	if o.seed == 0 {
		o.seed = rand.Uint64N(1 << 31)
	}
	start := time.Now()
	var failed []uint64
	total := map[string]int{}
	advised := map[string]int{}
	var sum stats
	sum.faults = map[string]int{}
	tasks := 0
	runs := 0
	for seed := o.seed; ; seed++ {
		if o.duration > 0 {
			if time.Since(start) > o.duration-o.length {
				break
			}
		} else if runs == o.seeds {
			break
		}
		runs++
		res, err := runSeed(o, seed)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: seed %d: %v\n", seed, err)
			failed = append(failed, seed)
			continue
		}
		fmt.Println(res.summary())
		fmt.Println(res.phaseTimes())
		for rule, n := range res.perRule(false) {
			total[rule] += n
		}
		for rule, n := range res.perRule(true) {
			advised[rule] += n
		}
		tasks += len(res.w.Ops)
		sum.ticks += res.stats.ticks
		sum.deliveries += res.stats.deliveries
		sum.runs += res.stats.runs
		sum.cronTicks += res.stats.cronTicks
		sum.cronRuns += res.stats.cronRuns
		sum.fenced += res.stats.fenced
		sum.stale += res.stats.stale
		for k, n := range res.stats.faults {
			sum.faults[k] += n
		}
		if n := failing(res.violations); n > 0 || (o.keep && len(res.violations) > 0) {
			if n > 0 {
				failed = append(failed, seed)
			}
			verdict := "FAIL"
			if n == 0 {
				verdict = "ADVISORY"
			}
			fmt.Printf("%s seed %d: %d violations (%d advisory); history kept in %s; replay: make chaos SEED=%d%s\n",
				verdict, seed, n, len(res.violations)-n, res.dir, seed, brokenArg(o))
			for i, v := range res.violations {
				if i == 20 {
					fmt.Printf("  ... %d more in %s/violations.txt\n", len(res.violations)-i, res.dir)
					break
				}
				fmt.Println("  " + v.String())
			}
		}
	}
	fmt.Printf("chaos: %d seeds in %s, %d failed %v; %d tasks and %d ticks, %d deliveries, %d runs, %d cron ticks (%d runs), %d fenced writes (%d refused stale); faults %v; violations per rule: %v; advisory per rule: %v\n",
		runs, time.Since(start).Round(time.Second), len(failed), failed, tasks, sum.ticks, sum.deliveries, sum.runs, sum.cronTicks, sum.cronRuns, sum.fenced, sum.stale, sum.faults, total, advised)
	if len(failed) > 0 {
		return 1
	}
	return 0
}

func brokenArg(o options) string {
	s := fmt.Sprintf(" LENGTH=%s", o.length)
	if o.cluster {
		s += " CLUSTER=1"
	}
	if o.failover {
		s += " FAILOVER=1"
	}
	if o.broken != "" {
		s += " ARGS='-broken " + o.broken + "'"
	}
	return s
}

// readKeys reads the keys.txt of a kept history (none if it has none).
func readKeys(name string) ([]keyTTL, error) {
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []keyTTL
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 && (len(f) != 5 || f[4] != "released") {
			continue
		}
		k := keyTTL{Key: f[0], Type: f[1], Released: len(f) == 5}
		if k.TTL, err = time.ParseDuration(f[2]); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		if _, err := fmt.Sscanf(f[3], "live=%d", &k.Live); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		out = append(out, k)
	}
	return out, readParked(filepath.Join(filepath.Dir(name), "parked.txt"), out)
}

// readParked reads the entries of the parked queues among keys from the
// parked.txt of a kept history (none if it has none): lines "<key>
// <entry>", an entry's own newlines (singleton's ids hold two) going on
// on the lines after.
func readParked(name string, keys []keyTTL) error {
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var cur *keyTTL
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		i := slices.IndexFunc(keys, func(k keyTTL) bool { return strings.HasPrefix(line, k.Key+" ") })
		switch {
		case i >= 0:
			cur = &keys[i]
			cur.Members = append(cur.Members, strings.TrimPrefix(line, cur.Key+" "))
		case cur != nil:
			cur.Members[len(cur.Members)-1] += "\n" + line
		}
	}
	return nil
}

// recheck runs the checkers on the history kept in dir (and the keys it
// left, keys.txt).
func recheck(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "workload.json"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	var w Workload
	if err := json.Unmarshal(b, &w); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	recs, err := readHistory(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	keys, err := readKeys(filepath.Join(dir, "keys.txt"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	vs, _ := check(w, recs, keys, true)
	for _, v := range vs {
		fmt.Println(v.String())
	}
	fmt.Printf("chaos: %s: %d violations (%d advisory)\n", dir, len(vs), len(vs)-failing(vs))
	if failing(vs) > 0 {
		return 1
	}
	return 0
}
