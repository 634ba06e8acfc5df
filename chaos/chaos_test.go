package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestMain runs the worker processes the driver starts from this test
// binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := workerMain(os.Args[2:]); err != nil {
			os.Stderr.WriteString("chaos worker: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testOptions are short runs of the test binary's own workers on a
// redis-server of their own.
func testOptions(t *testing.T, broken string) options {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server binary")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return options{length: 6 * time.Second, broken: broken, noFaults: true, out: t.TempDir(), self: self, keep: true}
}

func rules(vs []Violation) map[string]int {
	m := map[string]int{}
	for _, v := range vs {
		m[v.Rule]++
	}
	return m
}

// Workers without the middleware run tasks of one key at once, a
// throttled key's burst all at once, a held key's tasks within its hold,
// every cron tick on every replica, and the shadow family's overlapping runs
// unreported: the checker reports all five, naming the runs.
func TestNegativeControlWithoutMiddlewareReportsOverlaps(t *testing.T) {
	t.Parallel() // each run has its own redis-server and workers
	res, err := runSeed(testOptions(t, brokenNone), 2)
	if err != nil {
		t.Fatal(err)
	}
	got := rules(res.violations)
	t.Logf("%s; per rule %v", res.summary(), got)
	if got[ruleOverlap] == 0 || got[ruleThrottle] == 0 || got[ruleHold] == 0 || got[ruleCron] == 0 || got[ruleShadow] == 0 {
		t.Fatalf("no overlap, throttle, hold, cron or shadow violation reported for workers without the middleware: %v", got)
	}
}

// Workers that skip every duplicate, whatever the family's policy, lose
// Coalesce tasks that no later run covered: the checker reports them.
func TestNegativeControlSkipEverywhereReportsUncoveredTasks(t *testing.T) {
	t.Parallel() // each run has its own redis-server and workers
	res, err := runSeed(testOptions(t, brokenSkip), 2)
	if err != nil {
		t.Fatal(err)
	}
	got := rules(res.violations)
	t.Logf("%s; per rule %v", res.summary(), got)
	if got[ruleCover] == 0 {
		t.Fatalf("no cover violation reported for workers that skip every duplicate: %v", got)
	}
	if got[ruleOverlap] != 0 || got[ruleCron] != 0 || got[ruleShadow] != 0 {
		t.Fatalf("overlaps or cron violations reported for workers under the middleware: %v", res.violations)
	}
}

// runPlan runs seed in parallel with the other tests (each run has its own
// servers and workers) with testOptions(t, broken) as set changes them, and
// returns the result and its violations by rule.
func runPlan(t *testing.T, broken string, seed uint64, set func(*options)) (result, map[string]int) {
	t.Helper()
	t.Parallel()
	o := testOptions(t, broken)
	set(&o)
	res, err := runSeed(o, seed)
	if err != nil {
		t.Fatal(err)
	}
	got := rules(res.violations)
	t.Logf("%s; per rule %v", res.summary(), got)
	return res, got
}

// lossyFailoverPlan is a Sentinel run's workload in which a lossy failover
// cuts the replicas off just before four tasks of four free keys are due
// (seedRun.awaitLongDue), and kills the master once their workers took the
// keys. Each run lasts longer than the failover, and its lease's first
// renewal comes after it.
func lossyFailoverPlan(seed uint64) Workload {
	w := Workload{Seed: seed, TTL: failoverTTL, Workers: 3, Length: 2 * time.Second, Failover: true, Offsets: []time.Duration{0},
		Families: []Family{{Name: "f0long", Policy: polSkip, Limit: 1, Keys: 4, Client: cliPlain, TTL: longTTL}},
		Faults:   []Fault{{At: time.Second, Kind: faultFailover, Lossy: true, Hold: 400 * time.Millisecond}}}
	for i := range 4 {
		w.Ops = append(w.Ops, Op{At: 100 * time.Millisecond, Key: fmt.Sprintf("k%d", i), ID: fmt.Sprintf("s%d-f0long-k%d-1", seed, i), N: 1,
			Dur: 8 * time.Second, MaxRetry: 3, In: 3 * time.Second})
	}
	return w
}

// Lockers that wait for no replica (-broken acks) take keys after a lossy
// failover cut the replicas off: the replica promoted has the keys free and
// the tasks still due, and asynq runs them again while their first runs
// go on, which the checker reports. Lockers that wait for one replica
// (WithReplicaAcks) fail those acquires, and each task runs once.
func TestNegativeControlWithoutReplicaAcksReportsOverlaps(t *testing.T) {
	for _, broken := range []string{brokenAcks, ""} {
		t.Run("broken="+broken, func(t *testing.T) {
			res, got := runPlan(t, broken, 7, func(o *options) { o.failover, o.plan = true, lossyFailoverPlan })
			if res.stats.faults[faultFailoverLossy] != 1 {
				t.Fatalf("want one lossy failover in the history, got faults %v", res.stats.faults)
			}
			switch {
			case broken == brokenAcks && got[ruleOverlap] == 0:
				t.Fatalf("no overlap reported for Lockers that wait for no replica: %v", res.violations)
			case broken == "" && failing(res.violations) > 0:
				t.Fatalf("violations with Lockers that wait for a replica: %v", res.violations)
			}
		})
	}
}

// fencedPausePlan is a workload of one fenced family under Skip: a long
// run of its key, a stop of its worker that outlasts the lease, and a
// stream of tasks of the key through the stop, one of which takes the key
// and writes while the paused run waits to write.
func fencedPausePlan(seed uint64) Workload {
	w := Workload{Seed: seed, TTL: leaseTTL, Workers: 2, Length: 5 * time.Second, Offsets: []time.Duration{0},
		Families: []Family{{Name: "f0fenced", Policy: polSkip, Limit: 1, Keys: 1, Client: cliPlain, Fenced: true}},
		Faults:   []Fault{{At: 500 * time.Millisecond, Kind: faultStop, Hold: leaseTTL + time.Second, Fam: "f0fenced"}}}
	w.Ops = append(w.Ops, Op{At: 100 * time.Millisecond, Key: "k0", Dur: 2 * time.Second, MaxRetry: 3})
	for at := 400 * time.Millisecond; at < 4500*time.Millisecond; at += 300 * time.Millisecond {
		w.Ops = append(w.Ops, Op{At: at, Key: "k0", Dur: 300 * time.Millisecond, MaxRetry: 3})
	}
	for i := range w.Ops {
		w.Ops[i].N, w.Ops[i].ID = i+1, fmt.Sprintf("s%d-f0fenced-k0-%d", seed, i+1)
	}
	return w
}

// A worker paused past its lease writes once a newer run of its key has
// written: through the fence its writes are refused, and the key's stream
// holds the entries in the order of their tokens; with plain writes
// (-broken fence) its entry lands after the newer run's, which the checker
// reports.
func TestNegativeControlUnfencedWritesReportsStaleEntries(t *testing.T) {
	for _, broken := range []string{brokenFence, ""} {
		t.Run("broken="+broken, func(t *testing.T) {
			res, got := runPlan(t, broken, 11, func(o *options) { o.plan = fencedPausePlan })
			if res.stats.faults[faultStop] != 1 {
				t.Fatalf("want the stop in the history, got faults %v", res.stats.faults)
			}
			switch {
			case broken == brokenFence && got[ruleFenced] == 0:
				t.Fatalf("no fenced violation reported for unfenced writes: %v", res.violations)
			case broken == "" && (failing(res.violations) > 0 || res.stats.stale == 0):
				t.Fatalf("want no violation and a stale write refused, got %d refused: %v", res.stats.stale, res.violations)
			}
		})
	}
}

// extraKeysPlan is a workload of one ExtraKeys family under Skip: a task
// of each of three tenants' keys at once, each naming the shared extra key
// under a limit of 1, each run longer than the three deliveries take.
func extraKeysPlan(seed uint64) Workload {
	w := Workload{Seed: seed, TTL: leaseTTL, Workers: 2, Length: 2 * time.Second, Offsets: []time.Duration{0},
		Families: []Family{{Name: "f0extrakeys", Policy: polSkip, Limit: 1, Keys: 3, Client: cliPlain, ExtraKeys: true}}}
	for i := range 3 {
		key := fmt.Sprintf("k%d", i)
		w.Ops = append(w.Ops, Op{At: 100 * time.Millisecond, Key: key, ID: fmt.Sprintf("s%d-f0extrakeys-%s-1", seed, key), N: 1,
			Dur: 1200 * time.Millisecond, MaxRetry: 3, Extra: map[string]int{extraShared: 1}})
	}
	return w
}

// Three tenants' tasks that share an extra key of limit 1 arrive at once:
// under WithExtraKeys one runs and the others are skipped; without it
// (-broken extrakeys) they hold their own keys only and run at once, which
// the checker reports.
func TestNegativeControlWithoutExtraKeysReportsSharedKeyOverlaps(t *testing.T) {
	for _, broken := range []string{brokenExtraKeys, ""} {
		t.Run("broken="+broken, func(t *testing.T) {
			res, got := runPlan(t, broken, 13, func(o *options) { o.plan = extraKeysPlan })
			switch {
			case broken == brokenExtraKeys && got[ruleExtraKeys] == 0:
				t.Fatalf("no extrakeys violation reported for tasks that hold their own keys only: %v", res.violations)
			case broken == "" && (failing(res.violations) > 0 || res.stats.runs == 3):
				t.Fatalf("want no violation and a task skipped, got %d runs: %v", res.stats.runs, res.violations)
			}
		})
	}
}

// The pub/sub fault closes the subscribers' connections, and only those,
// and the history records it.
func TestPubsubCutClosesSubscriptionsAndIsRecorded(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server binary")
	}
	dir := t.TempDir()
	srv, err := startRedis(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr})
	defer rdb.Close()
	rec, err := newRecorder(filepath.Join(dir, "driver.jsonl"), "driver")
	if err != nil {
		t.Fatal(err)
	}
	defer rec.close()
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, "chaos")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	r := &seedRun{rdb: rdb, rec: rec}
	// The fault's own command runs on a plain connection: one cut, no error.
	if got := r.cutPubsub(); got.Killed != 1 || got.Fault != faultPubsub || got.Err != "" {
		t.Fatalf("want one pub/sub connection cut, recorded; got %v", got)
	}
	recs, err := readHistory(dir)
	if err != nil || len(recs) != 1 || recs[0].Fault != faultPubsub {
		t.Fatalf("want the cut in the history, got %v, %v", recs, err)
	}
}

// The Lockers of odd seeds batch their calls, and the draws of a seed do
// not depend on it.
func TestOddSeedsBatch(t *testing.T) {
	odd, even := newWorkload(7, 10*time.Second, true, topoStandalone), newWorkload(8, 10*time.Second, true, topoStandalone)
	if !odd.Batching || even.Batching {
		t.Fatalf("seed 7 batching %v, seed 8 batching %v", odd.Batching, even.Batching)
	}
	if len(lockerOptions(odd, "")) != 1 || len(lockerOptions(even, "")) != 0 {
		t.Fatal("an odd seed's Lockers take WithBatching, an even seed's nothing")
	}
}
