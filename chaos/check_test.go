package main

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// hist builds a history for the checkers from a workload of one family
// (policy pol, limit 1, plain) and one key, with tasks "a", "b", "c"
// numbered 1, 2, 3.
type hist struct {
	w    Workload
	recs []Record
	seq  int64
}

func newHist(pol string) *hist {
	h := &hist{w: Workload{TTL: leaseTTL, Families: []Family{{Name: "f", Policy: pol, Limit: 1, Keys: 1, Client: cliPlain}}}}
	for i, id := range []string{"a", "b", "c"} {
		h.w.Ops = append(h.w.Ops, Op{Fam: 0, Key: "k0", ID: id, N: i + 1, MaxRetry: 3})
	}
	return h
}

func (h *hist) add(ms int, proc, ev, task string, set func(*Record)) int64 {
	h.seq++
	r := Record{Proc: proc, Seq: h.seq, T: int64(time.Duration(ms) * time.Millisecond), Ev: ev, Task: task, Fam: "f", Key: "k0"}
	if set != nil {
		set(&r)
	}
	h.recs = append(h.recs, r)
	return r.Seq
}

func (h *hist) enqueue(ms int, task string) {
	h.add(ms, "driver", evEnqueue, task, func(r *Record) { r.Accepted = true })
}

// run records a delivery and a run of task from ms to end with outcome.
func (h *hist) run(ms, end int, proc, task, outcome string) int64 {
	h.add(ms, proc, evDeliver, task, nil)
	s := h.add(ms, proc, evStart, task, nil)
	h.add(end, proc, evEnd, task, func(r *Record) { r.Outcome, r.Run = outcome, s })
	return s
}

// runTold records a delivery and a run of task from ms to end whose ctx
// was cancelled with cause at told; the handler ran on and returned ok.
func (h *hist) runTold(ms, told, end int, proc, task, cause string) {
	h.add(ms, proc, evDeliver, task, nil)
	s := h.add(ms, proc, evStart, task, nil)
	h.add(told, proc, evCancel, task, func(r *Record) { r.Cause, r.Run = cause, s })
	h.add(end, proc, evEnd, task, func(r *Record) { r.Outcome, r.Cause, r.Run = "ok", cause, s })
}

func (h *hist) check() map[string]int {
	vs, _ := check(h.w, h.recs, nil, true)
	return rules(vs)
}

func TestOverlapIsReported(t *testing.T) {
	h := newHist(polSkip)
	h.enqueue(0, "a")
	h.enqueue(0, "b")
	h.run(10, 100, "w1", "a", "ok")
	h.run(50, 150, "w2", "b", "ok")
	if got := h.check(); got[ruleOverlap] != 1 {
		t.Fatalf("want one overlap, got %v", got)
	}
}

// Under WithLimitFunc each run brings its own limit: a run of a key may
// begin only while the runs holding it are fewer than its limit and than
// each of theirs. Two runs of limit 3 may overlap; a run of limit 1 may
// neither join one of limit 3 nor be joined by one, nor may a third run
// join two when one of them has limit 2.
func TestPerTaskLimitOverlapIsReported(t *testing.T) {
	cases := []struct {
		name   string
		limits []int // of a, b, c, each run beginning while the ones before run
		want   int
	}{
		{"3 and 3", []int{3, 3}, 0},
		{"3, 3 and 3", []int{3, 3, 3}, 0},
		{"3 joined by 1", []int{3, 1}, 1},
		{"1 joined by 3", []int{1, 3}, 1},
		{"3 and 2 joined by 3", []int{3, 2, 3}, 1},
		{"2 and 3 joined by 3", []int{2, 3, 3}, 1},
		{"3 and 3 joined by 2", []int{3, 3, 2}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHist(polSkip)
			h.w.Families[0].LimitFunc, h.w.Families[0].Limit = true, 3 // a family limit the runs' own must override
			for i, limit := range c.limits {
				task := []string{"a", "b", "c"}[i]
				h.w.Ops[i].Limit = limit
				h.enqueue(0, task)
				proc := fmt.Sprintf("w%d", i)
				h.add(10+10*i, proc, evDeliver, task, nil)
				s := h.add(10+10*i, proc, evStart, task, func(r *Record) { r.Limit = limit })
				h.add(200, proc, evEnd, task, func(r *Record) { r.Outcome, r.Run = "ok", s })
			}
			if got := h.check(); got[ruleOverlap] != c.want || len(got) != c.want {
				t.Fatalf("want %d overlap, got %v", c.want, got)
			}
		})
	}
}

// A run told that its lease was lost counts only until then; a run whose
// process was paused past the TTL counts until the pause.
func TestOverlapAfterALossTheRunWasToldOfIsExcused(t *testing.T) {
	h := newHist(polSkip)
	h.enqueue(0, "a")
	h.enqueue(0, "b")
	h.runTold(10, 40, 200, "w1", "a", "lost")
	h.run(50, 150, "w2", "b", "ok")
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}

	h = newHist(polSkip)
	h.enqueue(0, "a")
	h.enqueue(0, "b")
	h.add(20, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultStop, "w1" })
	h.add(20+int(leaseTTL/time.Millisecond)+100, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = "cont", "w1" })
	h.run(10, 3000, "w1", "a", "ok")
	h.run(1700, 1800, "w2", "b", "ok")
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}
}

// An operator's release of a hung handler (lockkit's Locker.CancelRun) is
// no excuse: the released run keeps its key until it returns, so a run of
// the key that starts before then overlaps it.
func TestOverlapWithARunAnOperatorReleasedIsReported(t *testing.T) {
	for next, want := range map[int]int{50: 1, 210: 0} { // b starts while a runs on, or after it returned
		h := newHist(polSkip)
		h.enqueue(0, "a")
		h.enqueue(0, "b")
		h.add(30, "driver", evFault, "a", func(r *Record) { r.Fault, r.Target = faultRelease, "w1" })
		h.runTold(10, 40, 200, "w1", "a", "cancelled")
		h.run(next, next+100, "w2", "b", "ok")
		if got := h.check(); got[ruleOverlap] != want || len(got) != want {
			t.Fatalf("b at %dms: want %d overlap, got %v", next, want, got)
		}
	}
}

func TestRequeueTaskThatNeverRanOrRanTwiceIsReported(t *testing.T) {
	h := newHist(polRequeue)
	h.enqueue(0, "a")
	h.enqueue(0, "b")
	h.run(10, 20, "w1", "a", "ok")
	h.run(30, 40, "w1", "a", "ok")
	h.add(15, "w2", evDeliver, "b", nil)
	if got := h.check(); got[ruleRuns] != 2 {
		t.Fatalf("want two runs violations, got %v", got)
	}
}

// A task that ran twice because its worker was killed under it is fine.
func TestRequeueTaskRerunAfterAKillIsFine(t *testing.T) {
	h := newHist(polRequeue)
	h.enqueue(0, "a")
	h.add(10, "w1", evDeliver, "a", nil)
	h.add(10, "w1", evStart, "a", nil)
	h.add(20, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultKill, "w1" })
	h.run(2000, 2010, "w2", "a", "ok")
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}
}

func TestCoalesceTaskCoveredByAnEarlierRunIsReported(t *testing.T) {
	h := newHist(polCoalesce)
	h.enqueue(0, "a")
	h.run(10, 100, "w1", "a", "ok")
	h.enqueue(20, "b")
	h.add(30, "w2", evDeliver, "b", nil)
	h.add(30, "w2", evDecision, "b", func(r *Record) { r.Kind, r.Reason = "duplicate", "covered" })
	if got := h.check(); got[ruleCover] != 1 {
		t.Fatalf("want one cover violation, got %v", got)
	}
	// Covered by a later run: fine.
	h.run(120, 130, "w1", "c", "ok")
	h.enqueue(110, "c")
	if got := h.check(); got[ruleCover] != 0 {
		t.Fatalf("want no cover violation, got %v", got)
	}
}

func TestKeepNewestLastRunOfAnOlderTaskIsReported(t *testing.T) {
	h := newHist(polKeepNewest)
	h.w.Families[0].Client = cliStamped
	h.enqueue(0, "a")
	h.enqueue(1, "b")
	h.run(10, 20, "w1", "b", "ok")
	h.run(30, 40, "w1", "a", "ok")
	if got := h.check(); got[ruleNewest] != 1 {
		t.Fatalf("want one newest violation, got %v", got)
	}
	// Plain tasks are placed by their arrival, which the history does not
	// see: the same is advisory.
	h.w.Families[0].Client = cliPlain
	vs, _ := check(h.w, h.recs, nil, true)
	if got := rules(vs); got[ruleNewestPlain] != 1 || failing(vs) != 0 {
		t.Fatalf("want one advisory violation, got %v", got)
	}
}

// gunzipDir writes the gzipped files of testdata/<name> uncompressed to a
// temporary directory and returns it.
func gunzipDir(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join("testdata", name, "*.gz"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/%s: %v", name, err)
	}
	for _, f := range files {
		in, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(in)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(zr)
		in.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, strings.TrimSuffix(filepath.Base(f), ".gz")), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkTestdata runs the checkers on the history kept in testdata/<name>.
func checkTestdata(t *testing.T, name string) []Violation {
	t.Helper()
	w, recs, _ := loadTestdata(t, name)
	vs, _ := check(w, recs, nil, true)
	return vs
}

// loadTestdata reads the workload and the history kept in testdata/<name>,
// and returns them with the directory they were written to.
func loadTestdata(t *testing.T, name string) (Workload, []Record, string) {
	t.Helper()
	dir := gunzipDir(t, name)
	b, err := os.ReadFile(filepath.Join(dir, "workload.json"))
	if err != nil {
		t.Fatal(err)
	}
	var w Workload
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	recs, err := readHistory(dir)
	if err != nil {
		t.Fatal(err)
	}
	return w, recs, dir
}

// The history of seed 301 (a worker paused, Redis restarted, the worker
// shut down): a Wait task that its worker requeued just before Redis went
// down was resumed and ran to completion on another worker, then was
// delivered and ran again (asynq's retry write, sent again after Redis came
// back, took the resumed delivery back; singleton now records such a
// success, TestLateRetryWriteDoesNotRunTheTaskTwice). The checker names it.
func TestSeed301HistoryReportsATaskRunTwice(t *testing.T) {
	vs := checkTestdata(t, "seed-301")
	if len(vs) != 1 || vs[0].Rule != ruleRuns || vs[0].Task != "s301-f2wait-k1-28" {
		t.Fatalf("want one runs violation of s301-f2wait-k1-28, got %v", vs)
	}
}

// The history of seed 425 (no fault before it): a throttled Requeue task
// enqueued with MaxRetry(0) is re-enqueued as a copy on every throttled
// delivery, the copies alternating between the IDs <id>~a and <id>~b and
// delivered at once rather than when the next start opens; a copy delivered
// while the copy that made it was still active could not take that one's
// ID for its own re-enqueue, returned an error and, with no retries left,
// was archived: the task never ran (singleton now waits for that copy to go,
// TestCopyWaitsForTheCopyThatMadeIt). The checker names it.
func TestSeed425HistoryReportsAThrottledTaskLost(t *testing.T) {
	vs := checkTestdata(t, "seed-425")
	if len(vs) != 1 || vs[0].Rule != ruleRuns || vs[0].Task != "s425-f7throttle-k0-4" {
		t.Fatalf("want one runs violation of s425-f7throttle-k0-4, got %v", vs)
	}
}

func TestUniqueAcceptedWhileAnotherNeedsTheKeyIsReported(t *testing.T) {
	h := newHist(polSkip)
	h.w.Families[0].Client = cliUnique
	h.add(0, "driver", evEnqueue, "a", func(r *Record) { r.Accepted, r.AID = true, "A" })
	h.add(5, "driver", evEnqueue, "b", func(r *Record) { r.Accepted, r.AID = true, "B" })
	h.run(10, 20, "w1", "a", "ok")
	h.add(21, "w1", evReturn, "a", nil)
	// Refused at 30, naming a, which completed at 21.
	h.add(30, "driver", evEnqueue, "c", func(r *Record) { r.Holder, r.Err, r.Sent = "A", "duplicate", r.T })
	vs, _ := check(h.w, h.recs, nil, true)
	if got := rules(vs); got[ruleUnique] != 2 {
		t.Fatalf("want two unique violations, got %v", vs)
	}
}

// Under WithThrottle(1, 1s), a second run of the key that began 490ms after
// the first is reported, naming it; a re-delivery that waited for its own
// earlier run, and a run a period after it, are not.
func TestThrottleStartsOverTheBudgetAreReported(t *testing.T) {
	h := newHist(polSkip)
	h.w.Families[0].Throttle, h.w.Families[0].Period = 1, time.Second
	h.enqueue(0, "a")
	h.enqueue(0, "b")
	h.enqueue(0, "c")
	h.run(10, 400, "w1", "a", "error")
	h.add(300, "w2", evDeliver, "a", nil) // a's re-delivery, waiting for its run
	s := h.add(400, "w2", evStart, "a", nil)
	h.add(450, "w2", evEnd, "a", func(r *Record) { r.Outcome, r.Run = "ok", s })
	h.run(1600, 1700, "w1", "c", "ok")
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}
	h.run(500, 600, "w3", "b", "ok")
	h.wantOne(t, ruleThrottle, "b")
}

// Under WithThrottle(1, 1s), a re-delivery throttled while its task's own
// run held the key is reported (it waits for that run, whose start was the
// budget's one); one throttled after that run ended is not.
func TestThrottledRedeliveryOfARunningTaskIsReported(t *testing.T) {
	for _, c := range []struct {
		at   int
		want int
	}{{300, 1}, {500, 0}} {
		h := newHist(polSkip)
		h.w.Families[0].Throttle, h.w.Families[0].Period = 1, time.Second
		h.enqueue(0, "a")
		h.run(10, 400, "w1", "a", "error")
		h.add(c.at, "w2", evDeliver, "a", nil)
		h.add(c.at, "w2", evDecision, "a", func(r *Record) { r.Kind, r.Reason, r.Action = "duplicate", "throttled", "skip" })
		h.add(c.at, "w2", evReturn, "a", nil)
		if got := h.check(); got[ruleThrottle] != c.want {
			t.Errorf("throttled at %dms (its run ended at 400ms): want %d throttle violations, got %v", c.at, c.want, got)
		}
	}
}

// Under WithHoldAtLeast(500ms), a run that began 300ms after the start of
// one that succeeded is reported, naming it; runs after a failed run, and a
// hold's length after a run that succeeded, are not.
func TestRunsWithinAHoldAreReported(t *testing.T) {
	h := newHist(polSkip)
	h.w.Families[0].HoldAtLeast = 500 * time.Millisecond
	h.w.Ops = append(h.w.Ops, Op{Fam: 0, Key: "k0", ID: "d", N: 4, MaxRetry: 3})
	for _, task := range []string{"a", "b", "c", "d"} {
		h.enqueue(0, task)
	}
	h.run(10, 50, "w1", "a", "error") // failed: holds nothing back
	h.run(60, 100, "w2", "b", "ok")
	h.run(600, 650, "w1", "c", "ok") // 540ms after b's start
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}
	h.run(900, 950, "w3", "d", "ok") // 300ms after c's start
	h.wantOne(t, ruleHold, "d")
}

// wantOne fails t unless the history breaks exactly one rule, once, and
// the violation names task.
func (h *hist) wantOne(t *testing.T, rule, task string) {
	t.Helper()
	vs, _ := check(h.w, h.recs, nil, true)
	if len(vs) != 1 || vs[0].Rule != rule || vs[0].Task != task {
		t.Fatalf("want one %s violation of %s, got %v", rule, task, vs)
	}
}

// Under Debounce, an older task that gave way to a newer one that never ran
// is reported, and so is a key whose last run is of an older task.
func TestDebounceTaskLostOrOlderLastRunIsReported(t *testing.T) {
	h := newHist(polKeepNewest)
	h.w.Families[0].Client = cliDebounce
	h.enqueue(0, "a")
	h.enqueue(1, "b")
	h.enqueue(2, "c")
	h.add(1000, "w1", evDeliver, "a", nil)
	h.add(1001, "w1", evDecision, "a", func(r *Record) { r.Kind, r.Reason = "duplicate", "superseded" })
	h.run(1000, 1100, "w2", "c", "ok")
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}
	h.run(1200, 1300, "w1", "b", "ok")
	h.wantOne(t, ruleDebounce, "c")

	h = newHist(polKeepNewest)
	h.w.Families[0].Client = cliDebounce
	h.enqueue(0, "a")
	h.enqueue(1, "b")
	h.add(1000, "w1", evDeliver, "a", nil)
	h.add(1001, "w1", evDecision, "a", func(r *Record) { r.Kind, r.Reason = "duplicate", "superseded" })
	h.add(1000, "w2", evDeliver, "b", nil)
	s := h.add(1000, "w2", evStart, "b", nil)
	h.add(1100, "w2", evEnd, "b", func(r *Record) { r.Outcome, r.Cause, r.Run = "cancelled", "preempted", s })
	vs, _ := check(h.w, h.recs, nil, true)
	if got := rules(vs); got[ruleDebounce] != 3 {
		t.Fatalf("want three debounce violations (a lost, b lost, b's last run not ok), got %v", vs)
	}
}

// Under Debounce, a newest task whose run an operator stopped, and which
// then failed and was revoked, ends its key's work: neither it nor an older
// task that gave way to it is reported. The same failure without the
// operator's stop is reported, as is a stopped task delivered again.
func TestDebounceNewestStoppedByAnOperatorIsNoViolation(t *testing.T) {
	for _, c := range []struct {
		stopped, again bool
		want           int
	}{{true, false, 0}, {false, false, 3}, {true, true, 3}} {
		h := newHist(polKeepNewest)
		h.w.Families[0].Client = cliDebounce
		h.enqueue(0, "a")
		h.enqueue(1, "b")
		h.add(1000, "w1", evDeliver, "a", nil)
		h.add(1001, "w1", evDecision, "a", func(r *Record) { r.Kind, r.Reason, r.Action = "duplicate", "superseded", "skip" })
		h.add(1000, "w2", evDeliver, "b", nil)
		s := h.add(1000, "w2", evStart, "b", nil)
		if c.stopped {
			h.add(1050, "w2", evCancel, "b", func(r *Record) { r.Cause, r.Run = "cancelled", s })
		}
		h.add(1100, "w2", evEnd, "b", func(r *Record) { r.Outcome, r.Run = "error", s })
		h.add(1101, "w2", evReturn, "b", func(r *Record) { r.Err = "chaos: failure on the first run" })
		if c.again {
			h.add(2000, "w1", evDeliver, "b", nil)
			h.add(2001, "w1", evReturn, "b", func(r *Record) { r.Err = "chaos: lost" })
		}
		vs, _ := check(h.w, h.recs, nil, true)
		if got := rules(vs); got[ruleDebounce] != c.want || len(vs) != c.want {
			t.Errorf("stopped=%v again=%v: want %d debounce violations, got %v", c.stopped, c.again, c.want, vs)
		}
	}
}

// Once quiet, records may remain for their documented retention; a live
// holder, a waiter, a parked job, a record kept longer than its retention
// and a key without a TTL are reported.
func TestLeakReportsStateAndOverlongRecords(t *testing.T) {
	h := newHist(polSkip)
	ok := []keyTTL{
		{Key: "p:{k}:h", TTL: 23 * time.Hour, Type: "zset"}, // a completion record
		{Key: "p:{k}:h", TTL: 500 * time.Millisecond, Type: "string"},
		{Key: "p:{k}:h", TTL: 10 * time.Second, Type: "string", Released: true}, // "~<token>."
		{Key: "p:{k}:d:123", TTL: 10 * time.Second, Type: "string"},
		{Key: "p:{k}:m", TTL: 9 * time.Minute, Type: "hash"},
		{Key: "p:{k}:c", TTL: 23 * time.Hour, Type: "string"},
		{Key: "p:{k}:b", TTL: 24 * time.Hour, Type: "hash"},
		{Key: "p:{k}:tq", TTL: 54 * time.Second, Type: "zset"}, // booked turns (seed 12)
	}
	bad := []keyTTL{
		{Key: "p:{k}:tq", TTL: 2 * time.Minute, Type: "zset"},
		{Key: "p:{k}:h", TTL: time.Second, Type: "zset", Live: 1},
		{Key: "p:{k}:h", TTL: time.Hour, Type: "string"},
		{Key: "p:{k}:h", TTL: 10 * time.Second, Type: "string"}, // "~<token>": a second
		{Key: "p:{k}:h", TTL: releasedKeep() + time.Second, Type: "string", Released: true},
		{Key: "p:{k}:w", TTL: time.Second, Type: "zset"},
		{Key: "p:{k}:k", TTL: 9 * time.Minute, Type: "zset"},
		{Key: "p:{k}:d", TTL: releasedKeep() + time.Second, Type: "zset"},
		{Key: "p:{k}:c", TTL: -1, Type: "string"},
	}
	vs, _ := check(h.w, h.recs, ok, true)
	if len(vs) != 0 {
		t.Fatalf("want nothing, got %v", vs)
	}
	vs, _ = check(h.w, h.recs, append(ok, bad...), true)
	if got := rules(vs); got[ruleLeak] != len(bad) || len(vs) != len(bad) {
		t.Fatalf("want %d leak violations, got %v", len(bad), vs)
	}
}

// A tick two replicas both enqueued, and a tick nobody enqueued while Redis
// was up, are reported; a tick due while Redis was down is not.
func TestPeriodicTickEnqueuedTwiceOrMissedIsReported(t *testing.T) {
	h := newHist(polRequeue)
	h.w.Families[0].Client = cliPeriodic
	tick := func(ms int, proc string) {
		id := fmt.Sprintf("periodic:e:%d", ms)
		h.add(ms, proc, evEnqueue, id, func(r *Record) { r.Accepted, r.AID = true, id })
		h.run(ms+10, ms+40, "w1", id, "ok")
	}
	tick(1000, "w1")
	h.add(3900, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultRedis, "redis" })
	h.add(4200, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = "redis-up", "redis" })
	tick(6000, "w2")
	for _, ms := range []int{2000, 3000} {
		tick(ms, "w3")
	}
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}
	h.add(6005, "w3", evEnqueue, "periodic:e:6000", func(r *Record) { r.Accepted, r.AID = true, "periodic:e:6000" })
	h.wantOne(t, rulePeriodic, "periodic:e:6000")

	h = newHist(polRequeue)
	h.w.Families[0].Client = cliPeriodic
	tick(1000, "w1")
	tick(3000, "w2")
	h.wantOne(t, rulePeriodic, "f@2000")
}

// A Requeue copy "<tick's task ID>~<suffix>" of a tick's task, enqueued by
// singleton for the task's last allowed delivery, is that tick's task: its
// run to completion is the tick's, and its ID names the tick. The tick's
// work must still be done once and the tick enqueued once, and a copy's ID
// with no tick before its "~" still names no tick.
func TestPeriodicTickTaskRequeuedAsACopyIsThatTicksTask(t *testing.T) {
	const id = "periodic:e:1000"
	for _, c := range []struct {
		name     string
		copyID   string // "" for no copy delivered
		origOK   bool   // the original also ran to completion
		enqTwice bool
		want     map[string]int
	}{
		{"the copy ran", id + "~89c78caa1bcf99ca", false, false, map[string]int{}},
		{"a copy of an earlier version ran", id + "~a", false, false, map[string]int{}},
		{"no copy ran", "", false, false, map[string]int{ruleRuns: 1}},
		{"the copy and the original ran", id + "~89c78caa1bcf99ca", true, false, map[string]int{ruleRuns: 1}},
		{"the tick enqueued twice", id + "~89c78caa1bcf99ca", false, true, map[string]int{rulePeriodic: 1}},
		{"a copy's ID with an empty suffix", id + "~", false, false, map[string]int{ruleRuns: 1, rulePeriodic: 1}},
		{"a copy's ID naming no tick", "periodic:e:x~89c78caa1bcf99ca", false, false, map[string]int{ruleRuns: 1, rulePeriodic: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHist(polRequeue)
			h.w.Ops = nil
			h.w.Families[0].Client = cliPeriodic
			h.add(0, "w1", evEnqueue, id, func(r *Record) { r.Accepted, r.AID = true, id })
			for i := range periodicMaxRetry {
				ms := 100 * (i + 1)
				h.add(ms, "w2", evDeliver, id, func(r *Record) { r.AID, r.Retry = id, i })
				h.add(ms+5, "w2", evReturn, id, func(r *Record) { r.AID, r.Retry, r.Err = id, i, "acquire: CLUSTERDOWN The cluster is down" })
			}
			if c.origOK {
				h.run(400, 450, "w3", id, "ok")
			} else {
				h.add(400, "w3", evDeliver, id, func(r *Record) { r.AID, r.Retry = id, periodicMaxRetry })
				h.add(405, "w3", evDecision, id, func(r *Record) { r.AID, r.Kind, r.Reason, r.Action = id, "duplicate", "held", "requeue" })
				h.add(410, "w3", evReturn, id, func(r *Record) {
					r.AID, r.Retry, r.Reason = id, periodicMaxRetry, "held"
					r.Err = "middleware: duplicate f, requeue: held; re-enqueued as task " + c.copyID + " (revoke task)"
				})
			}
			if c.copyID != "" {
				h.add(500, "w1", evDeliver, c.copyID, func(r *Record) { r.AID = c.copyID })
				s := h.add(500, "w1", evStart, c.copyID, func(r *Record) { r.AID = c.copyID })
				h.add(550, "w1", evEnd, c.copyID, func(r *Record) { r.AID, r.Outcome, r.Run = c.copyID, "ok", s })
				h.add(555, "w1", evReturn, c.copyID, func(r *Record) { r.AID = c.copyID })
			}
			if c.enqTwice {
				h.add(5, "w2", evEnqueue, id, func(r *Record) { r.Accepted, r.AID = true, id })
			}
			got := h.check()
			if len(got) != len(c.want) {
				t.Fatalf("want %v, got %v", c.want, got)
			}
			for rule, n := range c.want {
				if got[rule] != n {
					t.Fatalf("want %v, got %v", c.want, got)
				}
			}
		})
	}
}

// A preempted run counts for the overlap rule until the grace after the
// preempting task's delivery (which may come before the run's start), not
// after the run heard of it: a newer run that begins when the grace ran out
// is fine, one that begins before is reported.
func TestPreemptedRunCountsUntilTheGraceAfterThePreemption(t *testing.T) {
	grace := int(preemptGrace / time.Millisecond)
	for _, c := range []struct {
		deliv, start int
		want         int
	}{{100, 100 + grace + 2, 0}, {100, 100 + grace - 20, 1}, {8, 8 + grace + 2, 0}, {8, 8 + grace - 20, 1}} {
		h := newHist(polPreempt)
		h.enqueue(0, "a")
		h.enqueue(1, "b")
		h.add(10, "w1", evDeliver, "a", nil)
		s := h.add(10, "w1", evStart, "a", nil)
		h.add(c.deliv, "w2", evDeliver, "b", nil)
		h.add(110, "w1", evCancel, "a", func(r *Record) { r.Cause, r.Run = "preempted", s })
		h.add(2000, "w1", evEnd, "a", func(r *Record) { r.Outcome, r.Cause, r.Run = "ok", "preempted", s })
		s2 := h.add(c.start, "w2", evStart, "b", nil)
		h.add(c.start+50, "w2", evEnd, "b", func(r *Record) { r.Outcome, r.Run = "ok", s2 })
		if got := h.check(); got[ruleOverlap] != c.want {
			t.Errorf("b delivered at %dms, starting %dms after: want %d overlaps, got %v", c.deliv, c.start-c.deliv, c.want, got)
		}
	}
}

// In a burst of newer tasks the first one's acquire preempts the run; the
// later ones, delivered before the run heard of it, only take the
// follow-up's place: the grace counts from the first (seed 402 on the
// Cluster, where the run was told 27 ms after the preemption).
func TestPreemptedRunsGraceCountsFromTheFirstNewerDelivery(t *testing.T) {
	grace := int(preemptGrace / time.Millisecond)
	for start, want := range map[int]int{100 + grace + 2: 0, 100 + grace - 20: 1} {
		h := newHist(polPreempt)
		h.enqueue(0, "a")
		h.enqueue(1, "b")
		h.enqueue(2, "c")
		h.add(10, "w1", evDeliver, "a", nil)
		s := h.add(10, "w1", evStart, "a", nil)
		h.add(100, "w2", evDeliver, "b", nil)
		h.add(120, "w3", evDeliver, "c", nil)
		h.add(127, "w1", evCancel, "a", func(r *Record) { r.Cause, r.Run = "preempted", s })
		h.add(2000, "w1", evEnd, "a", func(r *Record) { r.Outcome, r.Cause, r.Run = "ok", "preempted", s })
		h.add(121, "w2", evDecision, "b", func(r *Record) { r.Kind, r.Reason, r.Action = "duplicate", "superseded", "skip" })
		h.add(122, "w2", evReturn, "b", nil)
		s2 := h.add(start, "w3", evStart, "c", nil)
		h.add(start+50, "w3", evEnd, "c", func(r *Record) { r.Outcome, r.Run = "ok", s2 })
		if got := h.check(); got[ruleOverlap] != want {
			t.Errorf("c starting at %dms: want %d overlaps, got %v", start, want, got)
		}
	}
}

// A run whose ctx an operator's release cancelled (the key stays held
// until it returns) and whose lease a newer task's acquire then preempted
// counts until the grace after the preemption, as any preempted run does;
// its ctx's cause stays the operator's, and its end record says the lease
// was preempted (seed 2202 on the Cluster). Without that the release is no
// excuse, and neither is the preemption before the grace ran out.
func TestRunPreemptedAfterAnOperatorsReleaseCountsUntilTheGrace(t *testing.T) {
	grace := int(preemptGrace / time.Millisecond)
	for _, c := range []struct {
		lost  string
		start int
		want  int
	}{{"preempted", 100 + grace + 2, 0}, {"preempted", 100 + grace - 20, 1}, {"", 100 + grace + 2, 1}} {
		h := newHist(polPreempt)
		h.enqueue(0, "a")
		h.enqueue(1, "b")
		h.add(10, "w1", evDeliver, "a", nil)
		s := h.add(10, "w1", evStart, "a", nil)
		h.add(30, "driver", evFault, "a", func(r *Record) { r.Fault, r.Target = faultRelease, "w1" })
		h.add(40, "w1", evCancel, "a", func(r *Record) { r.Cause, r.Run = "cancelled", s })
		h.add(100, "w2", evDeliver, "b", nil)
		h.add(2000, "w1", evEnd, "a", func(r *Record) { r.Outcome, r.Cause, r.Lost, r.Run = "ok", "cancelled", c.lost, s })
		s2 := h.add(c.start, "w2", evStart, "b", nil)
		h.add(c.start+50, "w2", evEnd, "b", func(r *Record) { r.Outcome, r.Run = "ok", s2 })
		if got := h.check(); got[ruleOverlap] != c.want || len(got) != c.want {
			t.Errorf("lost %q, b starting %dms after its delivery: want %d overlaps, got %v", c.lost, c.start-100, c.want, got)
		}
	}
}

// A re-delivery of a task whose worker was killed under it, within a lease
// TTL of the kill, waits for the dead run's lease and is its retry: its run
// spends no start. One delivered after the lease expired spends one.
func TestThrottleRetryOfAKilledRunSpendsNoStart(t *testing.T) {
	ttl := int(leaseTTL / time.Millisecond)
	for _, c := range []struct {
		redeliver int
		want      int
	}{{300, 0}, {50 + ttl + 100, 1}} {
		h := newHist(polRequeue)
		h.w.Families[0].Throttle, h.w.Families[0].Period = 1, time.Second
		h.enqueue(0, "a")
		h.enqueue(0, "b")
		h.add(10, "w1", evDeliver, "a", nil)
		h.add(10, "w1", evStart, "a", nil)
		h.add(50, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultKill, "w1" })
		h.add(c.redeliver, "w2", evDeliver, "a", nil)
		start := max(c.redeliver, 50+ttl) + 10
		s := h.add(start, "w2", evStart, "a", nil)
		h.add(start+20, "w2", evEnd, "a", func(r *Record) { r.Outcome, r.Run = "ok", s })
		h.run(start+150, start+200, "w3", "b", "ok")
		if got := h.check(); got[ruleThrottle] != c.want || len(got) != c.want {
			t.Errorf("re-delivered %dms after the kill: want %d throttle violations, got %v", c.redeliver-50, c.want, got)
		}
	}
}

// The history of seed 3072 (Redis restarted just before a Coalesce burst):
// the Client's stamps of tasks 3 and 4 were later than their enqueues by
// the latency of a TIME read across the restart (313 ms), and the pending
// follow-up (task 2) that covered them began between their enqueue and
// their stamp. It did cover them: no cover violation.
func TestSeed3072CoveredByAFollowUpThatBeganBeforeTheStamp(t *testing.T) {
	for _, v := range checkTestdata(t, "seed-3072") {
		if v.Rule == ruleCover {
			t.Errorf("unexpected %v", v)
		}
	}
}

// A cron tick two replicas ran is reported, and so is a tick no replica ran
// while nothing hit the fleet; a tick due while a replica was killed (its
// holder may have blocked it) or that a replica reported an error for is
// not.
func TestCronTickRunTwiceOrMissedIsReported(t *testing.T) {
	newCron := func() *hist {
		h := newHist(polSkip)
		h.w.Crons = []CronEntry{{Name: "c", Spec: "* * * * * *", Every: time.Second, Dur: 10 * time.Millisecond}}
		return h
	}
	tick := func(h *hist, ms int, proc string) {
		h.add(ms, proc, evCronRun, cronTask("c", int64(ms)), func(r *Record) { r.Fam = "cron:c" })
	}
	h := newCron()
	for _, ms := range []int{1000, 2000, 3000} {
		tick(h, ms, "w1")
	}
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}
	tick(h, 2000, "w2")
	h.wantOne(t, ruleCron, cronTask("c", 2000))

	h = newCron()
	tick(h, 1000, "w1")
	tick(h, 7000, "w1")
	h.add(3500, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultKill, "w2" })
	h.add(6000, "w3", evDecision, cronTask("c", 6000), func(r *Record) { r.Kind, r.Fam = "error", "cron:c" })
	h.wantOne(t, ruleCron, cronTask("c", 2000)) // 3000-5000 are in the kill's window, 6000 reported an error
}

// Under WithShadow, two overlapping runs of a key neither of which was
// reported, and a delivery that did not run, are reported; overlapping runs
// one of which was reported shadowed are fine.
func TestShadowUnreportedOverlapOrUnrunDeliveryIsReported(t *testing.T) {
	newShadow := func() *hist {
		h := newHist(polSkip)
		h.w.Families[0].Shadow = true
		h.enqueue(0, "a")
		h.enqueue(0, "b")
		return h
	}
	h := newShadow()
	h.leased(10, 100, "w1", "a")
	h.reported(50, 150, "w2", "b", "shadowed")
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}

	h = newShadow()
	h.leased(10, 100, "w1", "a")
	h.leased(50, 150, "w2", "b")
	h.wantOne(t, ruleShadow, "b")

	h = newShadow()
	h.leased(10, 100, "w1", "a")
	h.add(120, "w2", evDeliver, "b", nil)
	h.wantOne(t, ruleShadow, "b")

	// A delivery that returned without running (the middleware refused
	// the task) is reported although its process exited later.
	h = newShadow()
	h.leased(10, 100, "w1", "a")
	h.add(120, "w2", evDeliver, "b", nil)
	h.add(121, "w2", evReturn, "b", func(r *Record) { r.Err = "singleton: cannot derive key (skip retry for the task)" })
	h.add(5000, "w2", evExit, "", nil)
	h.wantOne(t, ruleShadow, "b")
}

// leased records a delivery of task that took its lease and ran from ms
// to end.
func (h *hist) leased(ms, end int, proc, task string) {
	h.reported(ms, end, proc, task, "acquired")
}

// reported records a delivery of task, a decision of kind about it, and a
// run from ms to end.
func (h *hist) reported(ms, end int, proc, task, kind string) {
	h.add(ms, proc, evDeliver, task, nil)
	h.add(ms, proc, evDecision, task, func(r *Record) { r.Kind = kind })
	s := h.add(ms, proc, evStart, task, nil)
	h.add(end, proc, evEnd, task, func(r *Record) { r.Outcome, r.Run = "ok", s })
}

// Under WithShadow a run that took no lease and was not reported is
// reported, even with its key free (a task parked at enqueue that left its
// reservation to lapse); one that took its lease, one reported as what a
// refusal would have done (its key could not be derived), and a re-delivery
// while its own task's earlier run held the key are fine.
func TestShadowRunWithoutLeaseOrReportIsReported(t *testing.T) {
	h := newHist(polRequeue)
	h.w.Families[0].Shadow, h.w.Families[0].Client = true, cliPark
	h.enqueue(0, "a")
	h.enqueue(0, "b")
	h.enqueue(0, "c")
	h.run(10, 100, "w1", "a", "ok")
	h.leased(200, 300, "w1", "b")
	h.reported(400, 500, "w2", "c", "shadowed")
	h.wantOne(t, ruleShadow, "a")

	h = newHist(polRequeue)
	h.w.Families[0].Shadow = true
	h.enqueue(0, "a")
	h.leased(10, 1000, "w1", "a")
	h.run(500, 600, "w2", "a", "ok") // asynq delivered it again while its first run went on
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}

	// Seed 310: w1 took the key for a's delivery and was SIGKILLed before it
	// recorded the run's start; a's re-delivery on w2 found its own task's
	// lease holding the key (no duplicate, not reported), and b, run on w3
	// under its lease while that re-delivery ran, is fine. A re-delivery
	// after the dead lease's TTL is not excused (its run, and its overlap with b).
	for _, c := range []struct {
		redeliver int
		want      int
	}{{500, 0}, {30_500, 2}} {
		h = newHist(polRequeue)
		h.w.Families[0].Shadow = true
		h.enqueue(0, "a")
		h.enqueue(0, "b")
		h.add(10, "w1", evDeliver, "a", nil)
		h.add(20, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultKill, "w1" })
		h.run(c.redeliver, c.redeliver+1000, "w2", "a", "ok")
		h.leased(c.redeliver+200, c.redeliver+300, "w3", "b")
		if got := h.check(); got[ruleShadow] != c.want {
			t.Fatalf("re-delivery at %dms: want %d shadow violations, got %v", c.redeliver, c.want, got)
		}
	}
}

// The history of seed 102 (Cluster, reply faults): a Wait task ran to
// completion on w2, whose release was still waiting for its late reply when
// w2 was SIGKILLed; asynq's recoverer delivered the task again and it ran a
// second time. A worker killed before its delivery returned is killed
// mid-task (README): the checker takes it as it takes a death mid-run.
func TestSeed102KilledBeforeTheDeliveryReturnedMayRunAgain(t *testing.T) {
	if vs := checkTestdata(t, "seed-102"); len(vs) != 0 {
		t.Fatalf("want nothing, got %v", vs)
	}
}

// The history of seed 3003 (Cluster, a master restarted): the Client
// reserved a Unique key, and the enqueue that followed failed with
// CLUSTERDOWN, as did the read of the task's state, so the Client kept the
// reservation (it could not tell whether the task was enqueued); two
// enqueues of the key within 5 s were refused naming that task as
// "enqueuing", and once quiet the reservation was left for its TTL, to be
// taken over by the next enqueue of the key. Both are as documented: no
// violation.
func TestSeed3003ReservationOfAFailedEnqueueIsKept(t *testing.T) {
	w, keys := wantNoViolationWithKeys(t, "seed-3003")
	// A live holder of a reservation no failed enqueue explains is a leak.
	if vs, _ := check(w, nil, keys, true); rules(vs)[ruleLeak] != 1 {
		t.Fatalf("want one leak, got %v", vs)
	}
}

// The history of seed 4000 (standalone): w3 was SIGKILLed while it ran a
// Unique task (MaxRetry(0): asynq archived it), whose reservation it had
// adopted; once quiet, the adopted reservation was still held, as it is until
// the worker Locker's TTL (30 s) runs out (docs/asynq.md): no leak.
func TestSeed4000ReservationAdoptedByAKilledWorkerLastsTheLockersTTL(t *testing.T) {
	wantNoViolationWithKeys(t, "seed-4000")
}

// wantNoViolationWithKeys fails t unless the history kept in
// testdata/<name>, with the keys it left, breaks no rule; it returns the
// workload and the keys.
func wantNoViolationWithKeys(t *testing.T, name string) (Workload, []keyTTL) {
	t.Helper()
	w, recs, dir := loadTestdata(t, name)
	keys, err := readKeys(filepath.Join(dir, "keys.txt"))
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys.txt: %v, %v", keys, err)
	}
	if vs, _ := check(w, recs, keys, true); failing(vs) != 0 {
		t.Fatalf("want nothing but advisories, got %v", vs)
	}
	return w, keys
}

// Histories of Cluster seeds whose violations were the checkers' mistakes,
// each checked again, with the keys it left, breaking no rule.
func TestClusterSeedHistoriesBreakNoRule(t *testing.T) {
	for name, what := range map[string]string{
		// A Wait task whose retries three lost acquire replies spent, then
		// panicked on its first run: asynq archived it, as it does any task
		// failing more often than MaxRetry.
		"seed-3000": "retries spent by Redis errors",
		// Park tasks archived after CLUSTERDOWN errors spent their retries
		// (a master restarted) left their parked ids, which lockkit keeps
		// ten minutes after their last park; a Coalesce follow-up parked
		// twice behind a reservation whose task never came ran only after
		// two backstops (the drain timeout now waits for two).
		"seed-3006": "parked ids of archived tasks",
		// The Cluster answered CLUSTERDOWN for 1.7 s after the restarted
		// master was up: a Scheduler tick due then was enqueued nowhere.
		"seed-3007": "a tick due while the Cluster was still down",
		// A WithShadow task that asynq put back at shutdown ran again on
		// another worker while the first run went on: under WithShadow
		// nothing waits, so it ran twice; shadow tasks are checkShadow's.
		"seed-3009": "a shadow task run twice",
		// A WithShadow task re-delivered while its dead worker's lease
		// held the key ran without a lease and unreported (no duplicate of
		// itself), and a task of the key that came next took the key.
		"seed-3017": "a shadow re-delivery of a running task",
		// Sentinel (-failover): a WithShadow task's run began just before
		// the master was killed, its renewals and release found no master,
		// and its lease, acknowledged by a replica, lived on on the
		// promoted one until its TTL; the task's re-delivery found the key
		// held by that lease, ran without one and unreported (no duplicate
		// of itself), and a task of the key that came next took the key
		// when the lease ran out.
		"seed-603": "a shadow re-delivery behind a lease a failover kept",
		// Sentinel (-failover): the sentinels failed a just-promoted master
		// over on their own, and a lossy failover then killed the new one
		// with the replicas stopped; between that kill and the promotion
		// a server that did not stay master acknowledged asynq's enqueues,
		// lost when it resynced: tasks accepted that never ran, ticks
		// enqueued twice (asynq's writes, advisory).
		"seed-903": "asynq's writes acknowledged between a kill and the promotion",
		// A Cluster master restarting answered CLUSTERDOWN to the asynq
		// enqueues of seven park tasks of one key, whose lock slot lived on
		// another master: the first reserved the key and was refused (its
		// reservation kept: its state could not be read), five more parked
		// behind it and were refused too (the second failed its ID check first):
		// their parked ids stay, as ParkAtEnqueue documents, up to ten
		// minutes.
		"seed-6115": "parked ids of refused enqueues",
		// A Preempt run whose handler ignores its ctx was released by an
		// operator (its ctx's cause "cancelled"), then preempted by the
		// next task's acquire; the task after that took the key when the
		// grace ran out, while the run went on (Record.Lost).
		"seed-2202": "a run preempted after an operator's release",
		// An ExtraKeys Wait task's first three deliveries failed on
		// CLUSTERDOWN (a master restarted); its last allowed one waited for
		// its keys while its worker was paused past the lease TTL, and on
		// resume found its lease's validity run out before the work could
		// start: the delivery failed (lockkit.ErrLost) without a run, and
		// asynq archived the task.
		"seed-2606": "a last allowed delivery whose lease ran out in a pause before its run",
		// A Requeue tick's task (f9periodic) whose first deliveries failed
		// on CLUSTERDOWN (a master restarted) found its key held on its
		// last allowed one: singleton enqueued a copy
		// ("<tick's task ID>~<suffix>") and revoked it, and the copy ran
		// to completion: the tick's work, done once.
		"seed-3114": "a periodic tick's task requeued as a copy with no retries left",
		// The newest Debounce task of a key (f8debounce, FailOnce) was
		// stopped by an operator (Locker.CancelRun) during its first run,
		// which then failed: singleton revoked it, and the five older
		// tasks had given way to it.
		"seed-3238": "a newest Debounce task revoked after an operator's stop",
	} {
		t.Run(name+": "+what, func(t *testing.T) { wantNoViolationWithKeys(t, name) })
	}
}

// A long run taken back (f13takenback): a's run after its failure is moved
// back to retry by a late retry write, and asynq delivers a again while
// that run goes. The delivery waits for the run; when it runs a's work once
// more after the run succeeded, the checker names a. One that completes
// without running is no violation.
func TestTakenBackTaskRunTwiceIsReported(t *testing.T) {
	for _, ranAgain := range []bool{true, false} {
		h := newHist(polRequeue)
		h.w.Ops = h.w.Ops[:1]
		h.w.Ops[0].TakeBack, h.w.Ops[0].FailOnce = true, true
		h.enqueue(0, "a")
		h.run(10, 50, "w1", "a", "error")
		h.run(100, 900, "w1", "a", "ok") // taken back at 110, due at once
		h.add(300, "w2", evDeliver, "a", nil)
		if ranAgain {
			s := h.add(900, "w2", evStart, "a", nil)
			h.add(1000, "w2", evEnd, "a", func(r *Record) { r.Outcome, r.Run = "ok", s })
		} else {
			h.add(900, "w2", evDecision, "a", func(r *Record) { r.Kind, r.Reason, r.Action = "duplicate", "completed", "skip" })
		}
		h.add(1000, "w2", evReturn, "a", nil)
		if ranAgain {
			h.wantOne(t, ruleRuns, "a")
		} else if got := h.check(); len(got) != 0 {
			t.Fatalf("want nothing, got %v", got)
		}
	}
}

// A Requeue task whose run an operator stopped (Locker.CancelRun), and which
// then failed, is revoked: it never runs to completion, and that is no
// violation. The same failure without the operator's stop is one.
func TestTaskStoppedByAnOperatorNeedNotComplete(t *testing.T) {
	for _, pol := range []string{polRequeue, polCoalesce} {
		testTaskStoppedByAnOperatorNeedNotComplete(t, pol)
	}
}

// (seed 318: a Coalesce task whose stopped run failed)
func testTaskStoppedByAnOperatorNeedNotComplete(t *testing.T, pol string) {
	for _, stopped := range []bool{true, false} {
		h := newHist(pol)
		h.w.Ops = h.w.Ops[:1]
		h.w.Ops[0].MaxRetry = 3
		h.enqueue(0, "a")
		h.add(10, "w1", evDeliver, "a", nil)
		s := h.add(10, "w1", evStart, "a", nil)
		if stopped {
			h.add(20, "w1", evCancel, "a", func(r *Record) { r.Cause, r.Run = "cancelled", s })
		}
		h.add(50, "w1", evEnd, "a", func(r *Record) { r.Outcome, r.Run = "error", s })
		h.add(60, "w1", evReturn, "a", func(r *Record) { r.Err = "chaos: failure on the first run" })
		if stopped {
			if got := h.check(); len(got) != 0 {
				t.Fatalf("want nothing, got %v", got)
			}
		} else if got := h.check(); got[ruleRuns]+got[ruleCover] != 1 {
			t.Fatalf("%s: want one runs or cover violation, got %v", pol, got)
		}
	}
}

// Under WithHoldAtLeast(500ms) the hold counts from the acquire on the
// server, which the fencing tokens date: a run whose acquire's reply came
// 250ms late (a Redis restart) began 300ms before the next, yet its lease
// was taken 550ms before the next one's, and that is no violation; tokens
// 300ms apart are one.
func TestHoldCountsFromTheServersAcquire(t *testing.T) {
	for _, apart := range []int64{550_000, 300_000} {
		h := newHist(polSkip)
		h.w.Families[0].HoldAtLeast = 500 * time.Millisecond
		for _, task := range []string{"a", "b"} {
			h.enqueue(0, task)
		}
		h.add(300, "w1", evDecision, "a", func(r *Record) { r.Kind, r.Token = "acquired", 1_000_000 })
		h.run(300, 350, "w1", "a", "ok")
		h.add(600, "w2", evDecision, "b", func(r *Record) { r.Kind, r.Token = "acquired", 1_000_000+apart })
		h.run(600, 650, "w2", "b", "ok")
		if apart >= 500_000 {
			if got := h.check(); len(got) != 0 {
				t.Fatalf("tokens %dµs apart: want nothing, got %v", apart, got)
			}
		} else {
			h.wantOne(t, ruleHold, "b")
		}
	}
}

// A run paused past the lease TTL (SIGSTOP) loses its lease; the task's
// re-delivery takes the key and does the work, and the paused run completes
// when it resumes: two completions, which only a fencing token could stop,
// and no violation. The same two completions without the pause are one.
func TestPausedRunThatCompletesAgainIsExcused(t *testing.T) {
	for _, paused := range []bool{true, false} {
		h := newHist(polRequeue)
		h.w.Ops = h.w.Ops[:1]
		h.w.Ops[0].MaxRetry = 3
		h.enqueue(0, "a")
		if paused {
			h.add(20, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultStop, "w1" })
			h.add(20+int(leaseTTL/time.Millisecond)+100, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = "cont", "w1" })
		}
		h.run(10, int(leaseTTL/time.Millisecond)+200, "w1", "a", "ok")
		h.run(int(leaseTTL/time.Millisecond)+50, int(leaseTTL/time.Millisecond)+100, "w2", "a", "ok")
		if paused {
			if got := h.check(); got[ruleRuns] != 0 {
				t.Fatalf("want no runs violation, got %v", got)
			}
		} else if got := h.check(); got[ruleRuns] != 1 {
			t.Fatalf("want one runs violation, got %v", got)
		}
	}
}

// A Unique task whose worker saw a Redis error after its run ended (its
// reservation's release failed: CLUSTERDOWN while a master restarted) may
// still be active in asynq, whose own completion write came after and may
// have failed the same way: a refusal naming it is no violation. Without
// that error it is one (it had completed).
func TestUniqueRefusalNamingATaskWhoseCompletionMayHaveFailed(t *testing.T) {
	for _, redisErr := range []bool{true, false} {
		h := newHist(polSkip)
		h.w.Families[0].Client = cliUnique
		h.add(0, "driver", evEnqueue, "a", func(r *Record) { r.Accepted, r.AID = true, "A" })
		h.run(10, 20, "w1", "a", "ok")
		if redisErr {
			h.add(25, "w1", evDecision, "a", func(r *Record) {
				r.Kind, r.Err = "error", "singleton: the reservation of task a: lockkit: release: CLUSTERDOWN The cluster is down"
			})
		}
		h.add(26, "w1", evReturn, "a", nil)
		h.add(30, "driver", evEnqueue, "c", func(r *Record) { r.Holder, r.Err, r.Sent = "A", "duplicate (active)", r.T })
		vs, _ := check(h.w, h.recs, nil, true)
		if got, want := rules(vs)[ruleUnique], map[bool]int{true: 0, false: 1}[redisErr]; got != want {
			t.Fatalf("Redis error %v: want %d unique violations, got %v", redisErr, want, vs)
		}
	}
}

// A duplicate with no retries left is put back as a copy; when the copy's
// enqueue fails on a Redis error, the delivery fails and asynq archives the
// task: held to what asynq does with it, no violation. A put back that
// returned as a requeue (asynq retries it) and never ran is one.
func TestParkedTaskArchivedAfterItsCopyFailedIsExempt(t *testing.T) {
	for _, redisErr := range []bool{true, false} {
		h := newHist(polRequeue)
		h.w.Ops = h.w.Ops[:1]
		h.w.Ops[0].MaxRetry = 0
		h.enqueue(0, "a")
		h.add(10, "w1", evDeliver, "a", nil)
		err := "middleware: duplicate f (key k0), requeue: lockkit: not acquired"
		if redisErr {
			err = "singleton: re-enqueue duplicate: read task options: CLUSTERDOWN The cluster is down (" + err + ")"
		}
		h.add(20, "w1", evReturn, "a", func(r *Record) { r.Reason, r.Err = "held", err })
		if got := h.check()[ruleRuns]; got != map[bool]int{true: 0, false: 1}[redisErr] {
			t.Fatalf("Redis error %v: got %d runs violations", redisErr, got)
		}
	}
}

// A run whose worker reports that a Redis error kept it from recording its
// success (singleton's "recording its run's success") lets the delivery
// asynq made of its task meanwhile run the work again (a second run is
// better than a lost one): no violation. The same two completions without
// that report are one.
func TestRunWhoseSuccessWasNotRecordedMayRunAgain(t *testing.T) {
	for _, reported := range []bool{true, false} {
		h := newHist(polRequeue)
		h.w.Ops = h.w.Ops[:1]
		h.w.Ops[0].MaxRetry = 3
		h.enqueue(0, "a")
		h.run(10, 500, "w1", "a", "ok")
		if reported {
			h.add(501, "w1", evDecision, "a", func(r *Record) {
				r.Kind, r.Err = "error", "singleton: task a: recording its run's success: CLUSTERDOWN The cluster is down"
			})
		}
		h.add(520, "w2", evDeliver, "a", nil)
		s := h.add(2600, "w2", evStart, "a", nil)
		h.add(2700, "w2", evEnd, "a", func(r *Record) { r.Outcome, r.Run = "ok", s })
		if got, want := h.check()[ruleRuns], map[bool]int{true: 0, false: 1}[reported]; got != want {
			t.Fatalf("reported %v: want %d runs violations, got %d", reported, want, got)
		}
	}
}

// Seed 425: under WithShadow a task that ran without a lease could not give
// its parked place up (a reply fault; reported as an EventError), so its
// entry stays in the key's parked queue for that queue's retention: no
// leak. So does the entry of a delivery that completed without running
// after its wait for its own earlier run failed, when giving it up failed
// too. Without that report the entry is one.
func TestShadowParkedPlaceNotGivenUpIsKept(t *testing.T) {
	for _, shadow := range []bool{true, false} {
		for _, failed := range []bool{true, false} {
			h := newHist(polRequeue)
			h.w.Families[0].Shadow = shadow
			h.enqueue(0, "a")
			msg := `middleware: shadow: "k": giving up the place kept for "a": injected fault`
			if shadow {
				h.reported(10, 100, "w1", "a", "shadowed")
			} else {
				h.run(10, 100, "w1", "a", "ok")
				h.add(50, "w2", evDeliver, "a", nil)
				h.add(150, "w2", evDecision, "a", func(r *Record) { r.Kind, r.Reason = "duplicate", "completed" })
				h.add(150, "w2", evReturn, "a", nil)
				msg = `middleware: f: giving up the place kept for "a": lockkit: unpark: not acknowledged`
			}
			if failed {
				h.add(150, "w2", evDecision, "a", func(r *Record) { r.Kind, r.Err = "error", msg })
			}
			key := "p:{" + famKey(h.w.Families[0], "k0") + "}:k"
			vs, _ := check(h.w, h.sorted(), []keyTTL{{Key: key, TTL: 9 * time.Minute, Type: "zset", Live: 1}}, true)
			if got := rules(vs)[ruleLeak]; (got == 0) != failed {
				t.Fatalf("shadow %v, give-up failed %v: got %v", shadow, failed, vs)
			}
		}
	}
}

// Seed 820: a parked task whose retry write a failover lost (asynq lost
// the task, an advisory) while its parking write was kept on the new
// master leaves its entry in the key's parked queue, for the queue's
// retention: no leak. Without the failover it is one; so is an entry of a
// task that ran to completion beside it. With the entries unknown (a kept
// history without parked.txt) the key is judged by its tasks.
func TestParkedEntryOfATaskAsynqLostIsKept(t *testing.T) {
	entry := func(aid string) string { return "30000:" + aid + ":q\n" + aid + "\n" + aid }
	for _, c := range []struct {
		name     string
		failover bool
		members  []string
		leak     bool
	}{
		{"lost with a failover", true, []string{entry("aid-a")}, false},
		{"no failover", false, []string{entry("aid-a")}, true},
		{"beside a task that ran", true, []string{entry("aid-a"), entry("aid-b")}, true},
		{"entries unknown", true, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHist(polRequeue)
			h.w.Ops = h.w.Ops[:2]
			aid := func(id string) func(*Record) { return func(r *Record) { r.AID = id } }
			h.add(100, "driver", evEnqueue, "a", func(r *Record) { r.Accepted, r.AID = true, "aid-a" })
			h.add(100, "driver", evEnqueue, "b", func(r *Record) { r.Accepted, r.AID = true, "aid-b" })
			h.add(200, "w1", evDeliver, "b", aid("aid-b"))
			s := h.add(200, "w1", evStart, "b", aid("aid-b"))
			h.add(4300, "w1", evEnd, "b", func(r *Record) { r.AID, r.Outcome, r.Run = "aid-b", "ok", s })
			h.add(4300, "w1", evReturn, "b", aid("aid-b"))
			h.add(4200, "w2", evDeliver, "a", aid("aid-a"))
			h.add(4210, "w2", evReturn, "a", func(r *Record) {
				r.AID, r.Reason, r.Err = "aid-a", "held", `middleware: duplicate f (key "k0"), requeue: lockkit: not acquired; runs again in 30s`
			})
			if c.failover {
				h.failover(5000, 5000, 7000, false)
			}
			key := keyTTL{Key: "p:{" + famKey(h.w.Families[0], "k0") + "}:k", TTL: 9 * time.Minute, Type: "zset", Live: len(c.members), Members: c.members}
			vs, _ := check(h.w, h.sorted(), []keyTTL{key}, true)
			if got := rules(vs)[ruleLeak]; (got > 0) != c.leak {
				t.Fatalf("want leak %v, got %v", c.leak, vs)
			}
		})
	}
}

// The history of seed 820 (Sentinel, failovers that lose writes): the
// Coalesce follow-up s820-f3coalesce-k0-11 parked, and a failover lost
// asynq's retry write of it (an advisory) while its parking write was kept
// on the new master; its entry stays in the key's parked queue for the
// queue's retention. Nothing but advisories, with the keys it left.
func TestSeed820ParkedEntryOfATaskAsynqLostIsKept(t *testing.T) {
	wantNoViolationWithKeys(t, "seed-820")
}

// The history of seed 818 (Sentinel, failovers that lose writes):
// deliveries of f13takenback/k0's tasks 7, 9, 10 and 13 parked behind their
// own earlier runs; each wait failed (no replica acknowledged, a reply
// fault), the run had done the work, and the delivery completed without
// running but kept its parked entry (the guard now gives it up:
// TestDoneAfterAFailedWaitGivesUpTheParkedPlace). Task 11's entry may stay:
// its last deliveries failed on Redis. The checker names the four.
func TestSeed818ParkedEntriesOfDoneTasksAreReported(t *testing.T) {
	w, recs, dir := loadTestdata(t, "seed-818")
	keys, err := readKeys(filepath.Join(dir, "keys.txt"))
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys.txt: %v, %v", keys, err)
	}
	vs, _ := check(w, recs, keys, true)
	var failed []Violation
	for _, v := range vs {
		if !v.advisory() {
			failed = append(failed, v)
		}
	}
	want := "(entries of s818-f13takenback-k0-13, s818-f13takenback-k0-7, s818-f13takenback-k0-10, s818-f13takenback-k0-9)"
	if len(failed) != 1 || failed[0].Rule != ruleLeak || !strings.HasSuffix(failed[0].Msg, want) {
		t.Fatalf("want one leak naming four tasks, got %v", failed)
	}
}

// A key reserved for a parked task that was done is passed on at once
// (seed 415, below): a reservation left until it lapses names the task; a
// key passed on at once, a reservation of a task not yet done, or a
// releaser killed around its release is no violation.
func TestKeyReservedForADoneTaskIsPassedOn(t *testing.T) {
	for _, c := range []struct {
		name string
		seen int // when b finds the key reserved for a (ms)
		edit func(h *hist)
		want int
	}{
		{"left reserved", 5000, nil, 1},
		{"passed on at once", 1500, nil, 0},
		{"a delivered again", 5000, func(h *hist) { h.add(2000, "w2", evDeliver, "a", func(r *Record) { r.AID = "aid-a" }) }, 0},
		{"releaser killed", 5000, func(h *hist) {
			h.add(1100, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultKill, "w1" })
		}, 0},
		{"another worker paused", 5000, func(h *hist) {
			h.add(900, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultStop, "w3" })
			h.add(1200, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = "cont", "w3" })
		}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHist(polRequeue)
			h.w.Ops = h.w.Ops[:2]
			h.enqueue(0, "a")
			h.enqueue(0, "b")
			aid := func(id string) func(*Record) { return func(r *Record) { r.AID = id } }
			h.add(100, "w2", evDeliver, "a", aid("aid-a"))
			h.add(200, "w2", evReturn, "a", aid("aid-a")) // completed without running
			s := h.run(300, 1000, "w1", "c", "ok")
			h.add(1000, "w1", evDecision, "c", func(r *Record) { r.Kind, r.Run = "released", s })
			if c.edit != nil {
				c.edit(h)
			}
			h.add(c.seen, "w4", evDeliver, "b", aid("aid-b"))
			h.add(c.seen, "w4", evDecision, "b", func(r *Record) {
				r.AID, r.Kind, r.Reason, r.Action = "aid-b", "duplicate", "held", "requeue"
				r.Err = "lockkit: not acquired: \"k\" is held by parked:q\naid-a\naid-a for \"aid-a\" (token 1000000, ttl 26s, 1 holder(s))"
			})
			vs, _ := check(h.w, h.recs, nil, true)
			if got := rules(vs)[ruleReserved]; got != c.want {
				t.Fatalf("want %d reserved violations, got %v", c.want, vs)
			}
			if c.want > 0 && vs[0].Task != "a" {
				t.Fatalf("want a named, got %v", vs)
			}
		})
	}
}

// The history of seed 415 on the Cluster: f13takenback/k0's task 4 parked
// behind its own earlier delivery's run on w3, whose shutdown ended that
// wait; the run had done the work, so the delivery completed without
// running and its parked entry stayed. At 11.24 s the release of task 3's
// run on w1 lost its reply (a reply fault) after it had reserved the key
// for that entry, for singleton's 30 s hold: the Locker's cleanup released
// nothing more and resumed no one, so tasks 7, 8 and 9, parked behind, came
// back at their 30 s backstops, found the key still reserved for task 4,
// and were parked again (the Locker now sends a failed release again and
// resumes the task its repeat names: TestReleaseWhoseReplyWasLostStartsTheParkedJob).
// The checker names task 4.
func TestSeed415HistoryReportsAKeyLeftReservedForADoneTask(t *testing.T) {
	var failed []Violation
	for _, v := range checkTestdata(t, "seed-415") {
		if !advisory[v.Rule] {
			failed = append(failed, v)
		}
	}
	if len(failed) != 1 || failed[0].Rule != ruleReserved || failed[0].Task != "s415-f13takenback-k0-4" {
		t.Fatalf("want one reserved violation of s415-f13takenback-k0-4, got %v", failed)
	}
}

// failover records a failover fault at ms (lossy: the replicas cut off
// then), the master's kill at kill, the clients' reaching the new master at
// up, and the sentinels' announcement of the change a little later.
func (h *hist) failover(ms, kill, up int, lossy bool) {
	fault := faultFailover
	if lossy {
		fault = faultFailoverLossy
	}
	h.add(ms, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = fault, "redis 127.0.0.1:7000" })
	h.add(kill, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = stepMasterKilled, "redis 127.0.0.1:7000" })
	h.add(up, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = stepPromoted, "redis 127.0.0.1:7001" })
	h.add(up+500, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = stepSwitch, "chaos 127.0.0.1 7000 127.0.0.1 7001" })
}

// sorted returns the records in the order of a history read back: by time
// (its first record's is the run's +0).
func (h *hist) sorted() []Record {
	recs := slices.Clone(h.recs)
	slices.SortStableFunc(recs, func(a, b Record) int { return cmpInt(a.T, b.T) })
	return append([]Record{{Proc: "driver", Ev: evReady}}, recs...)
}

// byAdvice splits violations into those that fail the seed and those that
// are advisory, each by task.
func byAdvice(vs []Violation) (failed, advised map[string]string) {
	failed, advised = map[string]string{}, map[string]string{}
	for _, v := range vs {
		if v.advisory() {
			advised[v.Task] = v.Rule + ": " + v.Advisory
		} else {
			failed[v.Task] = v.Rule
		}
	}
	return failed, advised
}

// In a failover's history, a Requeue task whose enqueue the master
// acknowledged within a second before it was killed and that never ran,
// and one that ran twice because the write that followed its first
// delivery's return came then, are advisory, each naming its write and the
// failover; the same outside the window fail the seed, as they do in a
// history without failovers. A lossy failover's window opens at the cut of
// the replicas; a write that came after the kill reached the new master.
func TestAsynqWritesAFailoverMayHaveLostAreAdvisory(t *testing.T) {
	h := newHist(polRequeue)
	for _, id := range []string{"d", "e", "f", "g", "h"} {
		h.w.Ops = append(h.w.Ops, Op{Fam: 0, Key: "k0", ID: id, N: len(h.w.Ops) + 1, MaxRetry: 3})
	}
	sent := func(ms int, task string) {
		h.add(ms, "driver", evEnqueue, task, func(r *Record) { r.Accepted, r.Sent = true, r.T-int64(time.Millisecond) })
	}
	sent(4500, "a") // within [4000, 5000]: lost, never ran
	sent(100, "b")  // long before: never ran, no excuse
	sent(100, "c")
	h.run(3700, 4700, "w1", "c", "ok")
	h.add(4700, "w1", evReturn, "c", nil) // asynq's done write lost: ran again
	h.run(8000, 8100, "w2", "c", "ok")
	h.add(8100, "w2", evReturn, "c", nil)
	sent(100, "d")
	h.run(200, 300, "w1", "d", "ok")
	h.add(300, "w1", evReturn, "d", nil)
	h.run(400, 500, "w1", "d", "ok")
	h.add(500, "w1", evReturn, "d", nil)
	h.failover(5000, 5000, 7000, false)
	sent(12300, "e") // within [11000, 12400]: the lossy one's window
	sent(13000, "h") // after the kill, before the clients reached the new master: no master took it
	sent(14100, "f") // after the clients reached the new master: on it
	sent(20000, "g")
	h.failover(12000, 12400, 14000, true)
	vs, st := check(h.w, h.sorted(), nil, true)
	failed, advised := byAdvice(vs)
	if len(failed) != 4 || failed["b"] != ruleRuns || failed["d"] != ruleRuns || failed["f"] != ruleRuns || failed["g"] != ruleRuns {
		t.Fatalf("want b, d, f and g to fail the seed, got %v", failed)
	}
	want := map[string]string{
		"a": "runs: its enqueue, acknowledged at +4.500s may have been lost with the failover at +5.000s (master killed at +5.000s)",
		"c": "runs: the write after its delivery on w1 returned at +4.700s may have been lost with the failover at +5.000s (master killed at +5.000s)",
		"e": "runs: its enqueue, acknowledged at +12.300s may have been lost with the lossy failover at +12.000s (master killed at +12.400s)",
		"h": "runs: its enqueue, acknowledged at +13.000s may have been lost with the lossy failover at +12.000s (master killed at +12.400s)",
	}
	if len(advised) != len(want) {
		t.Fatalf("want advisories %v, got %v", want, advised)
	}
	for task, w := range want {
		if advised[task] != w {
			t.Fatalf("%s: want advisory %q, got %q", task, w, advised[task])
		}
	}
	if st.faults[faultFailover] != 1 || st.faults[faultFailoverLossy] != 1 || len(st.faults) != 2 {
		t.Fatalf("want one failover of each kind counted, got %v", st.faults)
	}
	// Without the failovers, every one of them fails the seed.
	h.recs = slices.DeleteFunc(h.recs, func(r Record) bool { return r.Ev == evFault })
	vs, _ = check(h.w, h.sorted(), nil, true)
	if failing(vs) != 8 {
		t.Fatalf("want eight failing violations without failovers, got %v", vs)
	}
}

// A failover excuses no overlap: a run that began on the new master while
// a run of its key that began before the failover went on is reported;
// one that began after that run was told its lease was lost is not.
func TestOverlapAcrossAFailoverIsReported(t *testing.T) {
	for told, want := range map[int]int{0: 1, 7050: 0} {
		h := newHist(polSkip)
		h.enqueue(0, "a")
		h.enqueue(0, "b")
		if told == 0 {
			h.run(4000, 9000, "w1", "a", "ok")
		} else {
			h.runTold(4000, told, 9000, "w1", "a", "lost")
		}
		h.failover(5000, 5300, 7000, true)
		h.run(7100, 7200, "w2", "b", "ok")
		vs, _ := check(h.w, h.sorted(), nil, true)
		if got := rules(vs); got[ruleOverlap] != want || failing(vs) != want {
			t.Fatalf("a told at %d: want %d failing overlap, got %v", told, want, vs)
		}
	}
}

// A tick a Scheduler enqueued just before a failover, and that another
// replica enqueued again once the promoted replica lacked it (and the
// Scheduler's mark of it), is advisory; ticks due while the clients could
// reach no master are not missed.
func TestPeriodicTickEnqueuedAgainAfterAFailoverIsAdvisory(t *testing.T) {
	h := newHist(polRequeue)
	h.w.Families[0].Client = cliPeriodic
	tick := func(ms int, proc string) {
		id := fmt.Sprintf("periodic:e:%d", ms)
		h.add(ms+5, proc, evEnqueue, id, func(r *Record) { r.Accepted, r.AID = true, id })
	}
	for _, ms := range []int{1000, 2000, 3000, 4000, 9000} {
		tick(ms, "w1")
		id := fmt.Sprintf("periodic:e:%d", ms)
		h.run(ms+2000, ms+2040, "w1", id, "ok")
	}
	h.failover(5000, 5000, 7000, false)
	tick(4000, "w2") // again, at 4005 + ...: once the new master was reached
	h.recs[len(h.recs)-1].T = int64(7500 * time.Millisecond)
	vs, _ := check(h.w, h.sorted(), nil, true)
	failed, advised := byAdvice(vs)
	if len(failed) != 0 || len(advised) != 1 || !strings.HasPrefix(advised["periodic:e:4000"], rulePeriodic+": its enqueue, acknowledged at +4.005s") {
		t.Fatalf("want the tick of 4000 enqueued twice, advisory, and no missed tick, got %v", vs)
	}
}

// The newest task of a KeepNewest key, a Coalesce task and the task a
// Unique enqueue was refused for, each lost with the failover that came as
// it was enqueued, are advisory.
func TestTasksLostWithAFailoverAreAdvisory(t *testing.T) {
	for _, c := range []struct {
		pol, client, rule, task string
		plan                    func(h *hist)
	}{
		{polKeepNewest, cliStamped, ruleNewest, "b", func(h *hist) {
			h.enqueue(100, "a")
			h.enqueue(4500, "b") // the newest, lost
			h.run(8000, 8100, "w1", "a", "ok")
		}},
		{polCoalesce, cliPlain, ruleCover, "a", func(h *hist) { h.enqueue(4500, "a") }},
		{polSkip, cliUnique, ruleUnique, "b", func(h *hist) {
			h.add(4500, "driver", evEnqueue, "a", func(r *Record) { r.Accepted, r.AID = true, "A" }) // lost: it never completes
			h.add(9000, "driver", evEnqueue, "b", func(r *Record) { r.Accepted, r.AID = true, "B" })
			h.run(9100, 9200, "w1", "b", "ok")
			h.add(9200, "w1", evReturn, "b", nil)
		}},
	} {
		h := newHist(c.pol)
		h.w.Families[0].Client = c.client
		c.plan(h)
		h.failover(5000, 5000, 7000, false)
		vs, _ := check(h.w, h.sorted(), nil, true)
		failed, advised := byAdvice(vs)
		if len(failed) != 0 || len(advised) != 1 || !strings.HasPrefix(advised[c.task], c.rule+": its enqueue, acknowledged at +4.500s") {
			t.Fatalf("%s: want one advisory %s violation of %s, got %v", c.pol, c.rule, c.task, vs)
		}
	}
}

// A change of master the sentinels announce that no failover fault
// explains is a failover of its own, whose window covers the writes of the
// seconds before it; the announcement of a failover fault's change is not.
func TestUnplannedFailoverHasAWindowOfItsOwn(t *testing.T) {
	h := newHist(polRequeue)
	h.add(18000, "driver", evEnqueue, "a", func(r *Record) { r.Accepted = true })
	h.add(10000, "driver", evEnqueue, "b", func(r *Record) { r.Accepted = true })
	h.failover(5000, 5000, 7000, false)
	h.add(20000, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = stepSwitch, "chaos 127.0.0.1 7001 127.0.0.1 7002" })
	vs, st := check(h.w, h.sorted(), nil, true)
	failed, advised := byAdvice(vs)
	if len(failed) != 1 || failed["b"] != ruleRuns || !strings.Contains(advised["a"], "the failover the sentinels made on their own (announced at +20.000s)") {
		t.Fatalf("want b failing and a advisory, got %v, %v", failed, advised)
	}
	if st.faults["failover-unplanned"] != 1 || st.faults[faultFailover] != 1 {
		t.Fatalf("want one planned and one unplanned failover, got %v", st.faults)
	}
}

// The WithLimitFunc family's tasks bring limits of 1 to 3, and the
// even-numbered and odd-numbered workers give every task different ones,
// so that runs of one key hold it with different limits.
func TestLimitFuncFamilyWorkersDisagree(t *testing.T) {
	w := newWorkload(7, 10*time.Second, true, topoStandalone)
	fam := slices.IndexFunc(w.Families, func(f Family) bool { return f.LimitFunc })
	if fam < 0 {
		t.Fatal("no LimitFunc family")
	}
	n := 0
	for _, op := range w.Ops {
		if op.Fam != fam {
			if op.Limit != 0 {
				t.Fatalf("%s of another family has a limit", op.ID)
			}
			continue
		}
		n++
		p := payload{L: op.Limit}
		if op.Limit < 1 || op.Limit > 3 || limitOf("w0", p) == limitOf("w1", p) || limitOf("w0", p) != limitOf("w2", p) {
			t.Fatalf("%s: limit %d, w0 %d, w1 %d, w2 %d", op.ID, op.Limit, limitOf("w0", p), limitOf("w1", p), limitOf("w2", p))
		}
	}
	if n == 0 {
		t.Fatal("the LimitFunc family has no task")
	}
}

// Under WithExtraKeys a run holds each extra key its task names, under the
// limit its task gives it, for as long as it counts for its own key: two
// runs of different keys may not hold an extra key of limit 1 at once, and
// may hold one of limit 2; a run told that its lease was lost holds none of
// its keys from then on.
func TestExtraKeyOverlapIsReported(t *testing.T) {
	cases := []struct {
		name  string
		limit int
		told  bool // a's lease is lost before b begins
		want  int
	}{
		{"limit 1", 1, false, 1},
		{"limit 2", 2, false, 0},
		{"limit 1, the first run told its lease was lost", 1, true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHist(polSkip)
			h.w.Families[0].ExtraKeys, h.w.Families[0].Keys = true, 2
			h.w.Ops[1].Key = "k1"
			extra := map[string]int{extraShared: c.limit}
			for i, task := range []string{"a", "b"} {
				h.w.Ops[i].Extra = extra
				key := h.w.Ops[i].Key
				h.enqueue(0, task)
				h.add(10+40*i, "w"+fmt.Sprint(i), evDeliver, task, func(r *Record) { r.Key = key })
				s := h.add(10+40*i, "w"+fmt.Sprint(i), evStart, task, func(r *Record) { r.Key, r.Extra = key, extra })
				if c.told && i == 0 {
					h.add(40, "w0", evCancel, task, func(r *Record) { r.Key, r.Cause, r.Run = key, "lost", s })
				}
				h.add(200, "w"+fmt.Sprint(i), evEnd, task, func(r *Record) { r.Key, r.Outcome, r.Run = key, "ok", s })
			}
			vs, _ := check(h.w, h.sorted(), nil, true)
			if got := rules(vs); got[ruleExtraKeys] != c.want || len(got) != min(c.want, 1) {
				t.Fatalf("want %d extrakeys violation, got %v", c.want, vs)
			}
			if c.want > 0 && !strings.Contains(vs[0].Msg, "extra key "+extraShared+": run on w1 began while 1 runs held it (limit 1): a on w0") {
				t.Fatalf("the violation names another key or run: %v", vs[0])
			}
		})
	}
}

// The ExtraKeys family's tasks name the shared extra key under the one
// limit of the seed, 1 or 2, or the second under 1, or both; the tenants'
// tasks arrive together, and no other family's task names extra keys.
func TestExtraKeysFamilyTenantsContendForSharedKeys(t *testing.T) {
	w := newWorkload(7, 10*time.Second, true, topoStandalone)
	fam := slices.IndexFunc(w.Families, func(f Family) bool { return f.ExtraKeys })
	if fam != len(w.Families)-1 || !slices.Contains([]string{polSkip, polRequeue, polWait}, w.Families[fam].Policy) {
		t.Fatalf("want the ExtraKeys family last, under Skip, Requeue or Wait: %+v", w.Families)
	}
	limits := map[int]bool{}
	tenants := map[time.Duration]map[string]bool{} // by the 200 ms window of their enqueue
	for _, op := range w.Ops {
		if op.Fam != fam {
			if op.Extra != nil {
				t.Fatalf("%s of another family names extra keys", op.ID)
			}
			continue
		}
		for k, n := range op.Extra {
			switch {
			case k == extraShared && (n == 1 || n == 2):
				limits[n] = true
			case k != extraSecond || n != 1:
				t.Fatalf("%s: extra key %q, limit %d", op.ID, k, n)
			}
		}
		if op.Extra[extraShared] > 0 {
			win := op.At / (200 * time.Millisecond)
			if tenants[win] == nil {
				tenants[win] = map[string]bool{}
			}
			tenants[win][op.Key] = true
		}
	}
	if len(limits) != 1 {
		t.Fatalf("want one limit for %s, got %v", extraShared, limits)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Values(tenants)), func(m map[string]bool) bool { return len(m) > 1 }) {
		t.Fatalf("no two tenants' tasks naming %s arrive together: %v", extraShared, tenants)
	}
}

// fencedHist is a history of one fenced family under Skip whose key's
// stream the driver read: task a (token 5) and b (token 7).
func fencedHist() *hist {
	h := newHist(polSkip)
	h.w.Families[0].Fenced = true
	h.enqueue(0, "a")
	h.enqueue(0, "b")
	return h
}

// entry records an entry of the key's stream, ID "<ms>-0", written by task
// with token tok.
func (h *hist) entry(ms int, task, kind string, tok int64) {
	h.add(100000, "driver", evEntry, task, func(r *Record) { r.Entry, r.Kind, r.Token, r.By = fmt.Sprintf("%d-0", ms), kind, tok, "w1" })
}

// A stale run's write that landed after a newer run's (an older token's
// entry after a newer one's in the key's stream) is reported, naming both
// entries; the same entries in the order of their tokens are fine, equal
// tokens included.
func TestFencedEntryWithAnOlderTokenAfterANewerOneIsReported(t *testing.T) {
	h := fencedHist()
	h.entry(10, "a", writeBegin, 5)
	h.entry(20, "b", writeBegin, 7)
	h.entry(30, "b", writeEnd, 7)
	h.entry(40, "a", writeEnd, 5) // a's write after the pause, unfenced
	vs, _ := check(h.w, h.recs, nil, true)
	if got := rules(vs); got[ruleFenced] != 1 || len(got) != 1 || failing(vs) != 1 {
		t.Fatalf("want one fenced violation, got %v", vs)
	}
	if msg := vs[0].Msg; !strings.Contains(msg, "entry 40-0 (end of run 0 on w1, token 5) follows entry 20-0 (begin of task b on w1, token 7)") {
		t.Fatalf("the violation does not name both entries: %s", msg)
	}

	h = fencedHist()
	h.entry(10, "a", writeBegin, 5)
	h.entry(20, "a", writeEnd, 5)
	h.entry(30, "b", writeBegin, 7)
	h.entry(40, "b", writeEnd, 7)
	if got := h.check(); len(got) != 0 {
		t.Fatalf("want nothing, got %v", got)
	}
}

// A key's last value older than the newest a worker set (a stale run's SET
// that landed after a newer run's) is reported; the newest is fine.
func TestFencedLastValueOlderThanANewerSetIsReported(t *testing.T) {
	for lastTok, want := range map[int64]int{5: 1, 7: 0} {
		h := fencedHist()
		h.add(1000, "w2", evWrite, "b", func(r *Record) { r.Kind, r.Token, r.Outcome = writeLast, 7, "ok" })
		h.add(3000, "w1", evWrite, "a", func(r *Record) { r.Kind, r.Token, r.Outcome = writeLast, 5, "ok" })
		h.add(100000, "driver", evEntry, "a", func(r *Record) { r.Kind, r.Token = writeLast, lastTok })
		if got := h.check(); got[ruleFenced] != want || len(got) != want {
			t.Fatalf("last value of token %d: want %d fenced violation, got %v", lastTok, want, got)
		}
	}
}

// A write the fence refused had a token older than the newest its refusal
// named, and than an entry of the key's stream; and the refusals are
// counted.
func TestFencedStaleWriteWithoutANewerOneIsReported(t *testing.T) {
	stale := func(h *hist, tok, newest int64) {
		h.add(3000, "w1", evWrite, "a", func(r *Record) { r.Kind, r.Token, r.Outcome, r.Newest = writeEnd, tok, "stale", newest })
	}
	h := fencedHist()
	h.entry(10, "a", writeBegin, 5)
	h.entry(20, "b", writeBegin, 7)
	stale(h, 5, 7)
	vs, st := check(h.w, h.recs, nil, true)
	if len(vs) != 0 || st.stale != 1 || st.fenced != 1 {
		t.Fatalf("want nothing and one stale write counted, got %v, %d stale of %d", vs, st.stale, st.fenced)
	}

	h = fencedHist()
	h.entry(10, "a", writeBegin, 5)
	h.entry(20, "b", writeBegin, 7)
	stale(h, 7, 7) // refused naming its own token
	if got := h.check(); got[ruleFenced] != 1 || len(got) != 1 {
		t.Fatalf("want one fenced violation for a refusal naming no newer token, got %v", got)
	}

	h = fencedHist()
	h.entry(10, "a", writeBegin, 5)
	stale(h, 5, 7) // no entry of token 7 in the stream
	if got := h.check(); got[ruleFenced] != 1 || len(got) != 1 {
		t.Fatalf("want one fenced violation for a refusal with no newer entry, got %v", got)
	}
}

// A task with no retries whose only run was cancelled because its lease was
// lost while its worker was paused past the TTL failed, and asynq archived
// it: it need not have run to completion (seed 1729). The same loss
// without a pause is reported.
func TestTaskWithNoRetriesLostToAPauseIsExempt(t *testing.T) {
	for paused, want := range map[bool]int{true: 0, false: 1} {
		h := newHist(polRequeue)
		h.w.Ops[0].MaxRetry = 0
		h.enqueue(0, "a")
		if paused {
			h.add(20, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultStop, "w1" })
			h.add(20+int(leaseTTL/time.Millisecond)+100, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = "cont", "w1" })
		}
		h.add(10, "w1", evDeliver, "a", nil)
		s := h.add(10, "w1", evStart, "a", nil)
		h.add(3000, "w1", evCancel, "a", func(r *Record) { r.Cause, r.Run = "lost", s })
		h.add(3000, "w1", evEnd, "a", func(r *Record) { r.Outcome, r.Cause, r.Run = "cancelled", "lost", s })
		h.add(3001, "w1", evReturn, "a", func(r *Record) { r.Err, r.Reason = "chaos: cancelled: lockkit: lease lost: validity ran out", "lost" })
		if got := h.check(); got[ruleRuns] != want {
			t.Fatalf("paused %v: want %d runs violations, got %v", paused, want, got)
		}
	}
}

// A Wait task whose first three deliveries failed on a Redis error, and
// whose last allowed delivery (MaxRetry 3) waited for its key while its
// worker was paused past the lease TTL and, on resume, found its lease's
// validity run out before the work could start (no run; the delivery
// failed with lockkit.ErrLost), was archived by asynq: it need not have run
// to completion (seed 2606). The same delivery with a retry left, or under
// a pause shorter than the TTL, or with no pause, is reported.
func TestLastDeliveryLostToAPauseBeforeItsRunIsExempt(t *testing.T) {
	ttlMS := int(leaseTTL / time.Millisecond)
	for _, c := range []struct {
		name    string
		retries int // failed deliveries before the last one
		pauseMS int // 0: none
		want    int
	}{
		{"last allowed, paused past the TTL", 3, ttlMS + 100, 0},
		{"a retry left", 2, ttlMS + 100, 1},
		{"paused within the TTL", 3, ttlMS / 2, 1},
		{"not paused", 3, 0, 1},
	} {
		h := newHist(polWait)
		h.enqueue(0, "a")
		ms := 10
		for i := range c.retries {
			h.add(ms, "w1", evDeliver, "a", func(r *Record) { r.Retry = i })
			h.add(ms+5, "w1", evDecision, "a", func(r *Record) { r.Kind, r.Err = "error", "lockkit: acquire: CLUSTERDOWN The cluster is down" })
			h.add(ms+5, "w1", evReturn, "a", func(r *Record) { r.Err, r.Retry = "lockkit: acquire: CLUSTERDOWN The cluster is down", i })
			ms += 100
		}
		h.add(ms, "w2", evDeliver, "a", func(r *Record) { r.Retry = c.retries })
		if c.pauseMS > 0 {
			h.add(ms+50, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = faultStop, "w2" })
			h.add(ms+50+c.pauseMS, "driver", evFault, "", func(r *Record) { r.Fault, r.Target = "cont", "w2" })
		}
		end := ms + 100 + ttlMS + 100
		h.add(end, "w2", evDecision, "a", func(r *Record) { r.Kind = "acquired" })
		lost := "lockkit: lease lost: validity ran out: not renewed in time"
		h.add(end+1, "w2", evDecision, "a", func(r *Record) { r.Kind, r.Reason, r.Err = "released", "lost", lost })
		h.add(end+2, "w2", evReturn, "a", func(r *Record) { r.Err, r.Reason, r.Retry = lost, "lost", c.retries })
		if got := h.check(); got[ruleRuns] != c.want {
			t.Errorf("%s: want %d runs violations, got %v", c.name, c.want, got)
		}
	}
}
