package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/cronkey"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/periodickey"
)

// Rules the checkers enforce, as named in violations.
const (
	ruleOverlap     = "overlap"      // runs of one key never overlap beyond the limit: the smallest of a run's own and those of the runs holding the key when it began (WithLimitFunc)
	ruleRuns        = "runs"         // Requeue / Wait / ParkAtEnqueue: every accepted task completes, once
	ruleCover       = "cover"        // Coalesce: a task that did not run was covered by a later run that succeeded
	ruleNewest      = "newest"       // KeepNewest / Preempt, singleton.Client: the last run of a key is of its newest task, and succeeded
	rulePreempt     = "preempt"      // Preempt: the old run's ctx is cancelled within the bound
	ruleUnique      = "unique"       // Unique: never two accepted tasks of a key needed at once; a refusal names a task that still needs it
	ruleThrottle    = "throttle"     // WithThrottle(n, period): never more than n run starts of a key in any window of one period
	ruleHold        = "hold"         // WithHoldAtLeast(d): a run that succeeded keeps its key d after its start
	ruleDebounce    = "debounce"     // Debounce: the last run of a key is of its newest task, and succeeded; an older task that did not run gave way to a newer one that did
	ruleStranded    = "stranded"     // the queue drains once enqueues and faults stop
	rulePeriodic    = "periodic"     // a Scheduler's tick is enqueued once: never twice, none missed
	ruleLeak        = "leak"         // once quiet, only documented records are left, none longer than its retention
	ruleNewestPlain = "newest-plain" // ruleNewest for tasks of a plain asynq.Client (advisory: placed by arrival)
	ruleShadow      = "shadow"       // WithShadow: every delivery runs, under its lease or reported; of two overlapping runs of a key, one was reported
	ruleCron        = "cron"         // cronguard: each tick of an entry runs once across the replicas: never twice, none missed unless a fault explains it
	ruleReserved    = "reserved"     // a key reserved for a parked task that is done is passed on at once, not held until the reservation lapses
	ruleFenced      = "fenced"       // fenced writes: no write with an older token lands after a newer one; a write refused as stale had a newer one before it
	ruleExtraKeys   = "extrakeys"    // WithExtraKeys: runs holding an extra key never overlap beyond its limit, each run holding it as long as its own key
)

// advisory rules are reported but do not fail a seed: behaviour the README
// does not rule out, worth a look. A violation of another rule is advisory
// when it says why it does not fail the seed (Violation.Advisory).
var advisory = map[string]bool{ruleNewestPlain: true}

// failing counts the violations that fail a seed.
func failing(vs []Violation) int {
	n := 0
	for _, v := range vs {
		if !v.advisory() {
			n++
		}
	}
	return n
}

// preemptBound is how soon a preempted run's ctx must be cancelled after the
// newer task's delivery: within milliseconds through pub/sub (README), at
// the latest at the old lease's next renewal (TTL/3).
func (h *history) preemptBound() time.Duration { return h.w.TTL/3 + 100*time.Millisecond }

// Violation is a broken rule: the task it concerns and the events that
// show it.
type Violation struct {
	Rule   string
	Task   string
	Msg    string
	Events []Record
	// Advisory, when not empty, is why the violation does not fail the seed:
	// a write of asynq's own that a failover may have lost explains it.
	Advisory string
	base     int64
}

func (v Violation) advisory() bool { return advisory[v.Rule] || v.Advisory != "" }

func (v Violation) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "[%s] %s: %s", v.Rule, v.Task, v.Msg)
	if v.Advisory != "" {
		fmt.Fprintf(&sb, " (advisory: %s)", v.Advisory)
	}
	for _, e := range v.Events {
		sb.WriteString("\n      " + v.event(e))
	}
	return sb.String()
}

func (v Violation) event(e Record) string {
	at := time.Duration(e.T - v.base)
	s := fmt.Sprintf("+%8.3fs %-6s %-8s", at.Seconds(), e.Proc, e.Ev)
	for _, kv := range [][2]string{{"task", e.Task}, {"aid", e.AID}, {"kind", e.Kind}, {"reason", e.Reason}, {"action", e.Action},
		{"outcome", e.Outcome}, {"cause", e.Cause}, {"lost", e.Lost}, {"fault", e.Fault}, {"target", e.Target}, {"err", e.Err}} {
		if kv[1] != "" {
			s += " " + kv[0] + "=" + kv[1]
		}
	}
	if e.Run != 0 {
		s += fmt.Sprintf(" run=%d", e.Run)
	}
	if e.Stamp != 0 {
		s += fmt.Sprintf(" stamp=+%.3fs", time.Duration(e.Stamp*1000-v.base).Seconds())
	}
	return s
}

// run is one call of the guarded handler, from its start record to its end.
type run struct {
	proc, task, key string
	fam             Family
	n               int
	limit           int            // the limit it took the key with: its family's, or its own (Record.Limit)
	extra           map[string]int // the extra keys it holds besides its own, with their limits (Record.Extra)
	seq             int64
	deliv           int64 // the delivery the run belongs to: when it began
	start, end      int64 // end: the end record's time, or the process's death
	effEnd          int64 // end for the overlap rule: see overlapEnd
	outcome, cause  string
	cancelAt        int64
	cancelCause     string
	lost            string // the end record's Lost: its lease was preempted after another cause cancelled its ctx
	died            bool   // the process died or exited while the run went on
	killedBefore    bool   // the process was killed after the run began and before its delivery returned to asynq
	excused         string // why the run counts only until effEnd
	recs            []Record
}

// taskHist is what the history says about one task.
type taskHist struct {
	name     string
	fam      Family
	key      string
	n        int
	enq      *Record
	delivs   []Record
	runs     []*run
	decs     []Record
	maxRetry int
}

func (t *taskHist) oks() []*run {
	var out []*run
	for _, r := range t.runs {
		if r.outcome == "ok" {
			out = append(out, r)
		}
	}
	return out
}

// pausedRepeat reports whether all but one of a task's runs that completed
// ran in a process paused past the lease TTL while it went (SIGSTOP), or
// could not record its success (unrecorded). A paused run's lease ran out and another
// delivery took the key and did the work, and only a fencing token protects
// what the paused one does when it resumes (README: a paused holder); a run
// whose success could not be recorded (a Redis error, reported) for the
// delivery asynq made of its task meanwhile lets that one run (docs/rules.md
// case 6: a second run is better than a lost one).
func (h *history) pausedRepeat(oks []*run) bool {
	clean := 0
	for _, r := range oks {
		if !h.paused(r.proc, r.start, r.end) && !h.unrecorded(r) {
			clean++
		}
	}
	return clean <= 1
}

// unrecorded reports whether r's worker reported, after r ended, that a Redis
// error kept it from recording r's success (singleton's EventError
// "recording its run's success").
func (h *history) unrecorded(r *run) bool {
	for _, d := range h.tasks[r.task].decs {
		if d.Proc == r.proc && d.Kind == "error" && d.T >= r.end && strings.Contains(d.Err, "recording its run's success") && redisError(d.Err) {
			return true
		}
	}
	return false
}

// stoppedByOperator reports whether an operator asked a run of t to stop
// (the fault kind faultRelease: its ctx cancelled with ErrCancelled) and
// that run failed: singleton revokes such a task.
func (t *taskHist) stoppedByOperator() bool {
	return slices.ContainsFunc(t.runs, func(r *run) bool { return r.cancelCause == "cancelled" && r.outcome != "ok" })
}

// revokedByOperator reports whether an operator asked t's last run to stop
// (the fault kind faultRelease: its ctx cancelled with ErrCancelled), that
// run failed, and t was not delivered again after it: singleton revoked t
// (docs: an operator cancelled the run, the task is done, neither retried
// nor archived). A run that failed with no operator's stop does not count.
func (t *taskHist) revokedByOperator() bool {
	if len(t.runs) == 0 {
		return false
	}
	last := t.runs[len(t.runs)-1]
	for _, r := range t.runs {
		if r.start > last.start {
			last = r
		}
	}
	if last.cancelCause != "cancelled" || last.outcome == "ok" {
		return false
	}
	return !slices.ContainsFunc(t.delivs, func(d Record) bool { return d.T > last.start })
}

// died reports whether a worker died while running t, or was killed after
// a run of t began and before its delivery returned to asynq (its release
// in flight, say): asynq's recoverer then delivers t again, and its work
// may run twice (README: a worker killed mid-task is re-delivered).
func (t *taskHist) died() bool {
	return slices.ContainsFunc(t.runs, func(r *run) bool { return r.died || r.killedBefore })
}

func (t *taskHist) events() []Record {
	var out []Record
	if t.enq != nil {
		out = append(out, *t.enq)
	}
	out = append(out, t.delivs...)
	for _, r := range t.runs {
		out = append(out, r.recs...)
	}
	out = append(out, t.decs...)
	slices.SortStableFunc(out, func(a, b Record) int { return cmpInt(a.T, b.T) })
	return out
}

// stats are a run's figures.
type stats struct {
	accepted, refused, ticks, deliveries, runs, excused, keysLeft int
	cronTicks, cronRuns                                           int
	fenced, stale                                                 int // writes of the fenced family, and those the fence refused
	decisions                                                     map[string]int
	faults                                                        map[string]int // injected faults by kind, as the history records them
}

type interval struct{ from, to int64 }

// history is a run's merged history, indexed.
type history struct {
	w     Workload
	base  int64
	fams  map[string]Family
	tasks map[string]*taskHist
	order []string
	runs  []*run
	death map[string]int64 // process → when it died (kill) or exited
	stops map[string][]interval
	kills map[string]Record
	// returned: proc/asynq ID → when its deliveries returned to asynq
	returned  map[string][]int64
	lastT     int64
	records   []Record
	failovers []failover // in order (indexFailovers)
}

func index(w Workload, recs []Record) *history {
	h := &history{w: w, fams: map[string]Family{}, tasks: map[string]*taskHist{}, death: map[string]int64{},
		stops: map[string][]interval{}, kills: map[string]Record{}, records: recs}
	if len(recs) > 0 {
		h.base, h.lastT = recs[0].T, recs[len(recs)-1].T
	}
	for _, f := range w.Families {
		h.fams[f.Name] = f
	}
	for _, op := range w.Ops {
		f := w.Families[op.Fam]
		h.tasks[op.ID] = &taskHist{name: op.ID, fam: f, key: op.Key, n: op.N, maxRetry: op.MaxRetry}
		h.order = append(h.order, op.ID)
	}
	open := map[string]*run{}       // proc/seq → run
	delivered := map[string]int64{} // proc/asynq ID → its latest delivery
	stopAt := map[string]int64{}
	for i := range recs {
		r := recs[i]
		t := h.tasks[r.Task]
		if t == nil && r.Task != "" && h.fams[r.Fam].Client == cliPeriodic && (r.Ev == evEnqueue || r.Ev == evDeliver) {
			// A Scheduler's tick, named by its task ID.
			t = &taskHist{name: r.Task, fam: h.fams[r.Fam], key: r.Key, maxRetry: periodicMaxRetry}
			h.tasks[r.Task] = t
			h.order = append(h.order, r.Task)
		}
		switch r.Ev {
		case evEnqueue:
			if t != nil && (t.enq == nil || !t.enq.Accepted) {
				t.enq = &recs[i]
			}
		case evDeliver:
			if t != nil {
				t.delivs = append(t.delivs, r)
			}
			delivered[r.Proc+"/"+r.AID] = r.T
		case evStart:
			if t == nil {
				continue
			}
			d, ok := delivered[r.Proc+"/"+r.AID]
			if !ok {
				d = r.T
			}
			ru := &run{proc: r.Proc, task: r.Task, key: t.fam.Name + "/" + t.key, fam: t.fam, n: t.n, limit: t.fam.Limit, seq: r.Seq, deliv: d, start: r.T, recs: []Record{r}}
			if r.Limit > 0 {
				ru.limit = r.Limit
			}
			ru.extra = r.Extra
			open[fmt.Sprint(r.Proc, "/", r.Seq)] = ru
			t.runs = append(t.runs, ru)
			h.runs = append(h.runs, ru)
		case evEnd, evCancel:
			ru := open[fmt.Sprint(r.Proc, "/", r.Run)]
			if ru == nil {
				continue
			}
			ru.recs = append(ru.recs, r)
			if r.Ev == evCancel {
				if ru.cancelAt == 0 {
					ru.cancelAt, ru.cancelCause = r.T, r.Cause
				}
			} else {
				ru.end, ru.outcome, ru.cause, ru.lost = r.T, r.Outcome, r.Cause, r.Lost
			}
		case evDecision:
			if t != nil {
				t.decs = append(t.decs, r)
			}
		case evExit:
			h.death[r.Proc] = r.T
		case evFault:
			switch r.Fault {
			case faultKill:
				h.death[r.Target] = r.T
				h.kills[r.Target] = r
			case faultStop:
				stopAt[r.Target] = r.T
			case "cont":
				h.stops[r.Target] = append(h.stops[r.Target], interval{stopAt[r.Target], r.T})
			}
		}
	}
	for _, ru := range h.runs {
		if ru.end == 0 {
			ru.died = true
			ru.end = h.lastT
			if d, ok := h.death[ru.proc]; ok {
				ru.end = d
			}
		}
		ru.effEnd = h.overlapEnd(ru)
	}
	h.returned = map[string][]int64{}
	for _, r := range recs {
		if r.Ev == evReturn {
			h.returned[r.Proc+"/"+r.AID] = append(h.returned[r.Proc+"/"+r.AID], r.T)
		}
	}
	for _, ru := range h.runs {
		k, ok := h.kills[ru.proc]
		ru.killedBefore = ok && k.T > ru.start && !slices.ContainsFunc(h.returned[ru.proc+"/"+ru.recs[0].AID], func(t int64) bool { return t >= ru.start && t < k.T })
	}
	h.indexFailovers()
	return h
}

// overlapEnd is when a run stops counting for the overlap rule: its end,
// unless it was told its lease was lost (ctx cancelled with ErrLost: then
// its handler's work after that is its own, as the README says; a
// preempted run may keep the key for the policy's Grace, and so may one
// whose lease was preempted after an operator's release cancelled its ctx:
// the release alone is no excuse, as the key stays held until the run
// returns), or its process was paused past the lease TTL while it ran (only
// a fencing token protects the work of a paused holder).
func (h *history) overlapEnd(ru *run) int64 {
	e := ru.end
	switch {
	case ru.cancelCause == "lost":
		if ru.cancelAt < e {
			e, ru.excused = ru.cancelAt, "told its lease was lost"
		}
	case ru.cancelCause == "preempted":
		if g := h.preemptedAt(ru) + int64(preemptGrace); g < e {
			e, ru.excused = g, "preempted, past its grace"
		}
	case ru.lost == "preempted":
		if g := h.preemptedAt(ru) + int64(preemptGrace); g < e {
			e, ru.excused = g, "preempted after its ctx was cancelled ("+ru.cancelCause+"), past its grace"
		}
	}
	for _, s := range h.stops[ru.proc] {
		if s.from < e && s.to > ru.start && time.Duration(s.to-s.from) >= h.w.ttl(ru.fam) {
			e, ru.excused = max(ru.start, s.from), "its process was paused past the lease TTL"
		}
	}
	return e
}

// preemptedAt is the earliest time the preemption of ru may have ended its
// lease's renewals, which the grace counts from: the preempting acquire
// follows its task's delivery, which may come before ru's start, and ru
// hears of it a little later. So it is the latest delivery of a newer task
// of its key up to ru's start, or else the first one after it before ru was
// told (in a burst the first newer task's acquire preempts ru; the later
// ones only take the follow-up's place: seed 402 on the Cluster), or else
// when ru was told. A run whose ctx another cause cancelled first (Lost)
// was never told: the preempting delivery came before its end (seed 2202
// on the Cluster, preempted 156 ms after an operator's release).
func (h *history) preemptedAt(ru *run) int64 {
	told := ru.cancelAt
	if ru.cancelCause != "preempted" {
		told = ru.end
	}
	before, after := int64(0), int64(0)
	for _, t := range h.tasks {
		if t.fam.Name+"/"+t.key != ru.key || t.n <= ru.n {
			continue
		}
		for _, d := range t.delivs {
			switch {
			case d.T <= ru.start:
				before = max(before, d.T)
			case d.T <= told && (after == 0 || d.T < after):
				after = d.T
			}
		}
	}
	switch {
	case before != 0:
		return before
	case after != 0:
		return after
	}
	return told
}

// tickCopies returns recs with every record of a Requeue copy of a
// periodic tick's task named by that task (Record.Task), as a copy of any
// other family's task is: a worker names a tick's task by its asynq ID
// (deliver), and singleton names the copy it enqueues for a task with no
// retries left "<task ID>~<suffix>" (singleton's newCopyID; "~a" and "~b" by
// earlier versions), so the tick's work done by the copy is that tick's,
// for every rule (checkRuns, checkPeriodic). Its AID keeps the copy's ID.
// A name with an empty suffix, more than one "~", or before its "~" no
// tick's task ID (periodickey.Tick) is left as it is, for checkPeriodic to
// report. recs itself is not changed.
func tickCopies(w Workload, recs []Record) []Record {
	periodicFam := map[string]bool{}
	for _, f := range w.Families {
		periodicFam[f.Name] = f.Client == cliPeriodic
	}
	var out []Record
	for i, r := range recs {
		if !periodicFam[r.Fam] {
			continue
		}
		tick, suffix, ok := strings.Cut(r.Task, "~")
		if !ok || suffix == "" || strings.Contains(suffix, "~") {
			continue
		}
		if _, ok := periodickey.Tick(tick); !ok {
			continue
		}
		if out == nil {
			out = slices.Clone(recs)
		}
		if out[i].AID == "" {
			out[i].AID = r.Task
		}
		out[i].Task = tick
	}
	if out == nil {
		return recs
	}
	return out
}

func (h *history) violation(rule, task, msg string, events ...Record) Violation {
	return Violation{Rule: rule, Task: task, Msg: msg, Events: events, base: h.base}
}

// check runs every checker on a run's history. keys are the keys left under
// the lock key prefix once the run was quiet; drained says whether the queue
// drained.
func check(w Workload, recs []Record, keys []keyTTL, drained bool) ([]Violation, stats) {
	recs = tickCopies(w, recs)
	h := index(w, recs)
	st := stats{decisions: map[string]int{}, faults: map[string]int{}}
	cronTicks := map[string]bool{}
	for _, f := range h.failovers {
		if !f.planned {
			st.faults["failover-unplanned"]++
		}
	}
	for _, r := range recs {
		switch {
		case r.Ev == evFault && !slices.Contains([]string{"exited", "cont", "redis-up", stepMasterKilled, stepPromoted, stepRestarted, stepResynced, stepSwitch}, r.Fault):
			st.faults[r.Fault]++
		case r.Ev == evCronRun:
			st.cronRuns++
			cronTicks[r.Task] = true
		case r.Ev == evWrite:
			st.fenced++
			if r.Outcome == "stale" {
				st.stale++
			}
		}
	}
	st.cronTicks = len(cronTicks)
	for _, t := range h.tasks {
		if t.fam.Client == cliPeriodic {
			st.ticks++
		}
		if t.enq != nil && t.enq.Accepted {
			st.accepted++
		} else if t.enq != nil {
			st.refused++
		}
		st.deliveries += len(t.delivs)
		for _, d := range t.decs {
			st.decisions[d.Kind+"/"+d.Reason]++
		}
	}
	st.runs = len(h.runs)
	for _, ru := range h.runs {
		if ru.excused != "" {
			st.excused++
		}
	}
	var vs []Violation
	vs = append(vs, h.checkOverlap()...)
	vs = append(vs, h.checkRuns()...)
	vs = append(vs, h.checkCover()...)
	vs = append(vs, h.checkNewest()...)
	vs = append(vs, h.checkPreempt()...)
	vs = append(vs, h.checkUnique()...)
	vs = append(vs, h.checkThrottle()...)
	vs = append(vs, h.checkHold()...)
	vs = append(vs, h.checkDebounce()...)
	vs = append(vs, h.checkPeriodic()...)
	vs = append(vs, h.checkCron()...)
	vs = append(vs, h.checkShadow()...)
	vs = append(vs, h.checkReserved()...)
	vs = append(vs, h.checkFenced()...)
	if !drained {
		vs = append(vs, h.violation(ruleStranded, "-", fmt.Sprintf("the queue did not drain within %s of the last enqueue", drainTimeout)))
	}
	vs = append(vs, h.checkLeak(keys)...)
	return vs, st
}

// checkOverlap: a run of a key begins only while fewer runs of the key
// count than its limit and than the limit of each of them (the family's,
// or under WithLimitFunc each run's own: docs/rules.md), and two runs of
// one task never overlap (whatever the limit). Under WithExtraKeys
// (ruleExtraKeys) the same holds of each extra key, a run holding it with
// the limit its task gave it for as long as the run counts for its own key
// (overlapEnd): all its keys or none.
func (h *history) checkOverlap() []Violation {
	var vs []Violation
	// holding is a run holding a key with limit.
	type holding struct {
		ru    *run
		limit int
	}
	byKey := map[string][]holding{}
	byExtra := map[string][]holding{}
	byTask := map[string][]holding{}
	for _, ru := range h.runs {
		if ru.fam.Shadow { // every task runs: checkShadow's
			continue
		}
		byKey[ru.key] = append(byKey[ru.key], holding{ru, ru.limit})
		byTask[ru.task] = append(byTask[ru.task], holding{ru, 1})
		for k, n := range ru.extra {
			byExtra[k] = append(byExtra[k], holding{ru, n})
		}
	}
	over := func(hs []holding, rule, what string) {
		slices.SortFunc(hs, func(a, b holding) int { return cmpInt(a.ru.start, b.ru.start) })
		for i, x := range hs {
			ru, limit := x.ru, x.limit
			var with []*run
			for _, o := range hs[:i] {
				if o.ru.effEnd > ru.start {
					with = append(with, o.ru)
					limit = min(limit, o.limit)
				}
			}
			if len(with) >= limit {
				evs := slices.Clone(ru.recs)
				var names []string
				for _, o := range with {
					evs = append(evs, o.recs...)
					names = append(names, fmt.Sprintf("%s on %s (%s)", o.task, o.proc, o.excusedOr()))
				}
				slices.SortStableFunc(evs, func(a, b Record) int { return cmpInt(a.T, b.T) })
				vs = append(vs, h.violation(rule, ru.task, fmt.Sprintf("%s: run on %s began while %d runs held it (limit %d): %s",
					what, ru.proc, len(with), limit, strings.Join(names, ", ")), evs...))
			}
		}
	}
	for key, hs := range byKey {
		over(hs, ruleOverlap, "key "+key)
	}
	for key, hs := range byExtra {
		over(hs, ruleExtraKeys, "extra key "+key)
	}
	for task, hs := range byTask {
		over(hs, ruleOverlap, "task "+task)
	}
	return vs
}

func (r *run) excusedOr() string {
	if r.excused != "" {
		return "counted until " + r.excused
	}
	if r.died {
		return "until its process died"
	}
	return "running"
}

// exempt reports whether a task need not have run: asynq archived it
// because Redis errors spent its retries (a task is never completed unrun
// because of a Redis error: it fails, and asynq retries it while it has
// retries left, docs/rules.md), so that its last delivery failed with no
// retry left; or because it had no retries left when its worker was killed
// under it (asynq's recoverer archives it, README); or because its last
// allowed delivery lost its lease while its worker was paused past the
// lease TTL (pausedLast).
func (t *taskHist) exempt(h *history) bool {
	var last, deliv *Record
	redisFailed := false
	for i, r := range h.records {
		if r.Task == t.name && (r.Ev == evReturn || r.Ev == evDeliver) {
			last = &h.records[i]
			redisFailed = redisFailed || r.Ev == evReturn && redisError(r.Err)
			if r.Ev == evDeliver {
				deliv = last
			}
		}
	}
	// Its last delivery failed (a requeue, or a throttled or parked task put
	// back, is no failure: asynq retries it whatever its retries).
	// A put back whose own Redis call failed (a copy's enqueue, for a task
	// with no retries left) is a failure.
	failed := last != nil && last.Ev == evReturn && last.Err != "" &&
		(last.Reason == "" && !strings.Contains(last.Err, ", requeue") || last.Reason != "" && redisError(last.Err))
	if failed && redisFailed {
		return true
	}
	if h.pausedLast(t, deliv, last) {
		return true
	}
	if t.maxRetry > 0 {
		return false
	}
	for _, d := range t.delivs {
		if _, killed := h.kills[d.Proc]; killed {
			return true
		}
	}
	return false
}

// pausedLast reports whether task t's last delivery deliv, which returned
// with ret, was its last allowed one (asynq archives a task whose last
// allowed delivery fails, whatever the cause) and failed because its lease
// was lost while its worker was paused past the lease TTL (SIGSTOP): its
// run was cancelled (seed 1729), or, its lease's validity having run out
// during the pause before the work could start, none began (Lease.Run
// starts no work past validity; the guard fails the delivery with
// lockkit.ErrLost, docs/rules.md; seed 2606).
func (h *history) pausedLast(t *taskHist, deliv, ret *Record) bool {
	if deliv == nil || ret == nil || ret.Ev != evReturn || ret.Proc != deliv.Proc || deliv.Retry < t.maxRetry ||
		ret.Reason != "lost" || !strings.Contains(ret.Err, "lease lost") {
		return false
	}
	from := deliv.T // no run began: paused while it waited
	for _, ru := range t.runs {
		if ru.proc == deliv.Proc && ru.deliv == deliv.T {
			from = ru.start // paused while its run went on
		}
	}
	ttl := h.w.ttl(t.fam)
	return slices.ContainsFunc(h.stops[deliv.Proc], func(s interval) bool {
		return s.from <= ret.T && s.to >= from && time.Duration(s.to-s.from) >= ttl
	})
}

// redisError reports whether a delivery's error is a Redis error (an
// injected reply fault, a restarted server or Cluster node), not one of the
// handler's or of a policy.
func redisError(err string) bool {
	for _, m := range []string{"testredis: injected fault", "connection refused", "EOF", "i/o timeout", "connection reset",
		"broken pipe", "LOADING", "CLUSTERDOWN", "TRYAGAIN", "context deadline exceeded"} {
		if strings.Contains(err, m) {
			return true
		}
	}
	return false
}

// checkRuns: under Requeue and Wait, and for tasks enqueued with
// ParkAtEnqueue, every accepted task runs to completion at least once, and
// exactly once unless a process died while running it.
func (h *history) checkRuns() []Violation {
	var vs []Violation
	for _, name := range h.order {
		t := h.tasks[name]
		if t.enq == nil || !t.enq.Accepted {
			continue
		}
		if t.fam.Policy != polRequeue && t.fam.Policy != polWait && t.fam.Client != cliPark && t.fam.Client != cliPeriodic || t.fam.Shadow {
			continue // under WithShadow nothing is requeued: checkShadow's
		}
		oks := t.oks()
		switch {
		case len(oks) == 0 && t.stoppedByOperator():
			// An operator stopped its run (Locker.CancelRun), which then
			// failed: the task is revoked, as docs/operations.md says.
		case len(oks) == 0 && !t.exempt(h):
			vs = append(vs, advise(h.violation(ruleRuns, name, fmt.Sprintf("accepted (%s, %s) but never ran to completion", t.fam.Policy, t.fam.Client), t.events()...), h.asynqLoss(t)))
		case len(oks) > 1 && !t.died() && !h.pausedRepeat(oks):
			vs = append(vs, advise(h.violation(ruleRuns, name, fmt.Sprintf("ran to completion %d times, and no worker died while running it", len(oks)), t.events()...), h.asynqLoss(t)))
		}
	}
	return vs
}

// checkCover: under Coalesce, a task that never ran to completion was
// covered: a decision says so, and a run of its key (another task's) that
// began after its enqueue call began succeeded. A task whose run an
// operator stopped, and which then failed, is revoked (docs/rules.md), as
// under every policy.
func (h *history) checkCover() []Violation {
	var vs []Violation
	for _, name := range h.order {
		t := h.tasks[name]
		if t.enq == nil || !t.enq.Accepted || t.fam.Policy != polCoalesce || t.fam.Shadow || len(t.oks()) > 0 || t.exempt(h) || t.stoppedByOperator() {
			continue
		}
		var covered *Record
		for i, d := range t.decs {
			if d.Reason == "covered" {
				covered = &t.decs[i]
				break
			}
		}
		if covered == nil {
			vs = append(vs, advise(h.violation(ruleCover, name, "neither ran to completion nor was covered", t.events()...), h.asynqLoss(t)))
			continue
		}
		// The run must have begun after the enqueue for sure: after the
		// moment the enqueue call began (Sent). The stamp is an upper bound
		// of Redis's clock at the enqueue (the Client's clock reading plus
		// the time since), so after a slow TIME read, such as one across a
		// Redis restart, it can be later than the enqueue by that read's
		// latency: a run that began between the two covers the task.
		anchor := int64(0)
		switch {
		case t.enq.Sent > 0:
			anchor = t.enq.Sent
		case t.enq.Stamp > 0:
			anchor = t.enq.Stamp * 1000
		case len(t.delivs) > 0:
			anchor = t.delivs[0].T
		}
		ok := false
		for _, ru := range h.runs {
			if ru.key == t.fam.Name+"/"+t.key && ru.task != name && ru.outcome == "ok" && ru.start >= anchor {
				ok = true
				break
			}
		}
		if !ok {
			vs = append(vs, h.violation(ruleCover, name, "covered, but no run of its key that began after its enqueue succeeded", t.events()...))
		}
	}
	return vs
}

// exists reports whether the history shows that task t was enqueued: its
// enqueue was accepted, or (its reply lost to a fault) it was delivered.
func (t *taskHist) exists() bool {
	return t.enq != nil && t.enq.Accepted || len(t.delivs) > 0
}

// checkNewest: under KeepNewest and Preempt, and for tasks enqueued with
// Debounce (ruleDebounce), the last run of each key is of its newest
// accepted task, and succeeded. A Debounce task whose enqueue reply was lost
// but that was delivered counts as accepted: the middleware found it in the
// queue.
func (h *history) checkNewest() []Violation {
	var vs []Violation
	newest := map[string]*taskHist{}
	for _, name := range h.order {
		t := h.tasks[name]
		if t.fam.Policy != polKeepNewest && t.fam.Policy != polPreempt {
			continue
		}
		if t.fam.Client == cliDebounce && !t.exists() || t.fam.Client != cliDebounce && (t.enq == nil || !t.enq.Accepted) {
			continue
		}
		k := t.fam.Name + "/" + t.key
		if n := newest[k]; n == nil || t.n > n.n {
			newest[k] = t
		}
	}
	for k, t := range newest {
		if t.exempt(h) {
			continue
		}
		var last *run
		for _, ru := range h.runs {
			if ru.key == k && (last == nil || ru.start > last.start) {
				last = ru
			}
		}
		// Tasks of a plain asynq.Client have no order: the README places
		// them by their arrival at Redis, which the history does not see.
		rule := ruleNewest
		switch t.fam.Client {
		case cliPlain:
			rule = ruleNewestPlain
		case cliDebounce:
			rule = ruleDebounce
		}
		// The newest task lost with a failover, or the last run's task
		// delivered again because its completion was.
		loss := h.asynqLoss(t)
		if loss == "" && last != nil && last.task != t.name {
			loss = h.asynqLoss(h.tasks[last.task])
		}
		switch {
		case last == nil:
			vs = append(vs, advise(h.violation(rule, t.name, "key "+k+": no run at all", t.events()...), loss))
		case last.task != t.name:
			evs := append(t.events(), last.recs...)
			slices.SortStableFunc(evs, func(a, b Record) int { return cmpInt(a.T, b.T) })
			vs = append(vs, advise(h.violation(rule, t.name, fmt.Sprintf("key %s: its last run is of %s (#%d), not of the newest task (#%d)", k, last.task, last.n, t.n), evs...), loss))
		case last.outcome != "ok" && t.fam.Client == cliDebounce && last.cancelCause == "cancelled" && t.revokedByOperator():
			// An operator stopped the newest task's run, which then
			// failed: singleton revoked it, ending its work by design.
		case last.outcome != "ok":
			vs = append(vs, advise(h.violation(rule, t.name, fmt.Sprintf("key %s: the newest task's last run ended %s", k, last.outcome), t.events()...), loss))
		}
	}
	return vs
}

// checkPreempt: under Preempt, a run of a key still going when a newer task
// of the key is delivered has its ctx cancelled (or ends) within
// preemptBound of that delivery, unless its process was paused then.
func (h *history) checkPreempt() []Violation {
	var vs []Violation
	for _, ru := range h.runs {
		if ru.fam.Policy != polPreempt {
			continue
		}
		for _, name := range h.order {
			t := h.tasks[name]
			if t.fam.Name != ru.fam.Name || t.fam.Name+"/"+t.key != ru.key || t.n <= ru.n {
				continue
			}
			for _, d := range t.delivs {
				if d.T <= ru.start || d.T >= ru.end {
					continue
				}
				by := d.T + int64(h.preemptBound())
				told := (ru.cancelAt != 0 && ru.cancelAt <= by) || ru.end <= by
				if told || h.paused(ru.proc, d.T, by) || (ru.died && ru.end <= by) {
					continue
				}
				evs := append(slices.Clone(ru.recs), d)
				slices.SortStableFunc(evs, func(a, b Record) int { return cmpInt(a.T, b.T) })
				vs = append(vs, h.violation(rulePreempt, ru.task, fmt.Sprintf("its run on %s was not cancelled within %s of the delivery of newer task %s on %s", ru.proc, h.preemptBound(), t.name, d.Proc), evs...))
				break
			}
		}
	}
	return vs
}

// paused reports whether proc was stopped at some time in [from, to].
func (h *history) paused(proc string, from, to int64) bool {
	return slices.ContainsFunc(h.stops[proc], func(s interval) bool { return s.from <= to && s.to >= from })
}

// doneAt is when the middleware first returned nil to asynq for task t (its
// work done or skipped: the task needs its key no more), or 0.
// doneUnsure reports whether t's worker saw a Redis error between its last
// run's end and its delivery's return (giving its reservation back, say):
// asynq's own write that marks the task done comes after the return and may
// have failed the same way, and then asynq keeps the task active until its
// recoverer delivers it again, so a refusal naming it as active is true.
func (t *taskHist) doneUnsure(h *history) bool {
	done := t.doneAt(h)
	var end int64
	for _, r := range t.runs {
		if r.end <= done {
			end = max(end, r.end)
		}
	}
	return slices.ContainsFunc(t.decs, func(r Record) bool {
		return r.Kind == "error" && r.T >= end && r.T <= done && redisError(r.Err)
	})
}

func (t *taskHist) doneAt(h *history) int64 {
	for _, r := range h.records {
		if r.Ev == evReturn && r.Task == t.name && r.Err == "" {
			return r.T
		}
	}
	return 0
}

// checkUnique: under Unique(UntilExecuted), an enqueue is accepted only
// when no earlier accepted task of its key still needs it (has not
// completed), and a refusal names a task of the key that still needed it
// when the enqueue call began.
func (h *history) checkUnique() []Violation {
	var vs []Violation
	byAID := map[string]*taskHist{}
	var accepted []*taskHist
	for _, name := range h.order {
		t := h.tasks[name]
		if t.enq == nil || t.fam.Client != cliUnique {
			continue
		}
		if t.enq.Accepted {
			byAID[t.enq.AID] = t
			accepted = append(accepted, t)
		}
	}
	for _, name := range h.order {
		t := h.tasks[name]
		if t.enq == nil || t.fam.Client != cliUnique {
			continue
		}
		at := t.enq.T // the enqueue call returned: it was accepted by then
		if !t.enq.Accepted {
			if t.enq.Holder == "" {
				continue // refused for another reason (Redis down)
			}
			hold := byAID[t.enq.Holder]
			switch {
			case hold == nil && h.failedUnique(t.key, t.enq.Sent, strings.Contains(t.enq.Err, "(enqueuing)")):
				// It names a task whose enqueue failed, its outcome unknown
				// to the Client: the reservation stays (singleton's giveBack).
			case hold == nil:
				vs = append(vs, h.violation(ruleUnique, name, "refused, naming "+t.enq.Holder+", which no accepted enqueue returned", *t.enq))
			case hold.key != t.key:
				vs = append(vs, h.violation(ruleUnique, name, "refused, naming "+hold.name+" of another key", *t.enq))
			case hold.doneAt(h) != 0 && hold.doneAt(h) < t.enq.Sent && !hold.doneUnsure(h):
				evs := append(hold.events(), *t.enq)
				vs = append(vs, advise(h.violation(ruleUnique, name, "refused, naming "+hold.name+", which had completed before", evs...), h.asynqLoss(hold)))
			}
			continue
		}
		for _, a := range accepted {
			if a == t || a.key != t.key || a.enq.T >= at {
				continue
			}
			if d := a.doneAt(h); d == 0 || d > at {
				evs := append(a.events(), *t.enq)
				slices.SortStableFunc(evs, func(x, y Record) int { return cmpInt(x.T, y.T) })
				// a never completed: lost with a failover, say
				vs = append(vs, advise(h.violation(ruleUnique, name, "accepted while "+a.name+" of its key still needed it", evs...), h.asynqLoss(a)))
				break
			}
		}
	}
	return vs
}

// enqueueGrace is how long singleton.Client counts a reservation whose task
// is not found as an enqueue in flight (singleton's enqueueGrace), plus a
// second of slack between the clocks.
const enqueueGrace = 6 * time.Second

// failedUnique reports whether an enqueue of a Unique task of key failed
// before at (not a refusal: Redis failed, so the Client could not tell
// whether the task was enqueued, and kept its reservation); within
// enqueueGrace before at if inFlight (the refusal took the task for an
// enqueue in flight).
func (h *history) failedUnique(key string, at int64, inFlight bool) bool {
	for _, name := range h.order {
		t := h.tasks[name]
		if t.fam.Client != cliUnique || t.key != key || t.enq == nil || t.enq.Accepted || t.enq.Holder != "" || t.enq.Sent >= at {
			continue
		}
		if !inFlight || at-t.enq.Sent <= int64(enqueueGrace) {
			return true
		}
	}
	return false
}

// throttleSlack is how much later than the throttle dates a start (on the
// Redis server's clock, when the run takes its key) the run's start record
// may be: the checker counts starts in windows that much shorter than the
// period.
const throttleSlack = 100 * time.Millisecond

// checkThrottle: under WithThrottle(n, period), no window of one period
// holds more than n run starts of a key. As docs/rules.md states, a run
// that waited for its task's own earlier run (a re-delivery while that run
// went on) is that run's retry and spends no start; and a run whose process
// was paused between its delivery and its start record is not counted (its
// record may be any time after the throttle dated it). Nor is such a
// re-delivery throttled: it waits for its own run, whose start may have
// been the budget's last.
func (h *history) checkThrottle() []Violation {
	var vs []Violation
	for _, t := range h.tasks {
		if t.fam.Throttle == 0 {
			continue
		}
		for _, d := range t.decs {
			if d.Reason != "throttled" {
				continue
			}
			for _, o := range t.runs {
				held := o.end
				if o.died {
					held += int64(h.w.ttl(t.fam))
				}
				if o.start < d.T && held > d.T {
					vs = append(vs, h.violation(ruleThrottle, t.name, fmt.Sprintf("a delivery on %s was throttled while the task's own run on %s held the key", d.Proc, o.proc), o.recs[0], d))
					break
				}
			}
		}
	}
	byKey := map[string][]*run{}
	for _, ru := range h.runs {
		if ru.fam.Throttle == 0 || h.ownRetry(ru) || h.paused(ru.proc, ru.deliv, ru.start) {
			continue
		}
		byKey[ru.key] = append(byKey[ru.key], ru)
	}
	for key, runs := range byKey {
		slices.SortFunc(runs, func(a, b *run) int { return cmpInt(a.start, b.start) })
		f := runs[0].fam
		window := int64(f.Period - throttleSlack)
		for i := f.Throttle; i < len(runs); i++ {
			in := runs[i-f.Throttle : i+1]
			if runs[i].start-in[0].start >= window {
				continue
			}
			var evs []Record
			var names []string
			for _, o := range in {
				evs = append(evs, o.recs[0])
				names = append(names, fmt.Sprintf("%s on %s", o.task, o.proc))
			}
			vs = append(vs, h.violation(ruleThrottle, runs[i].task, fmt.Sprintf("key %s: %d runs began within %s (throttle %d per %s): %s",
				key, len(in), time.Duration(runs[i].start-in[0].start).Round(time.Millisecond), f.Throttle, f.Period, strings.Join(names, ", ")), evs...))
		}
	}
	return vs
}

// checkHold: under WithHoldAtLeast(d) a run that succeeded keeps its key
// for d after it began (docs/rules.md item 1): the next run of the key
// starts d after it at the earliest (less throttleSlack: a start record
// comes a little after the acquire that dates the hold). A run that failed
// holds nothing back; one that lost its lease (its process paused or dead,
// its renewals failing: counted short) holds it no longer.
func (h *history) checkHold() []Violation {
	var vs []Violation
	byKey := map[string][]*run{}
	for _, ru := range h.runs {
		if ru.fam.HoldAtLeast > 0 {
			byKey[ru.key] = append(byKey[ru.key], ru)
		}
	}
	for key, runs := range byKey {
		slices.SortFunc(runs, func(a, b *run) int { return cmpInt(a.start, b.start) })
		for i := 1; i < len(runs); i++ {
			a, b := runs[i-1], runs[i]
			if a.outcome != "ok" || a.excused != "" || a.died || h.paused(a.proc, a.start, a.end) {
				continue
			}
			// The hold counts from the acquire on the server, whose clock
			// the fencing tokens carry (µs): a reply that came late (a
			// Redis restart, a reply sent again) starts the run after it.
			if ta, tb := h.acquiredToken(a), h.acquiredToken(b); ta > 0 && tb > 0 && time.Duration(tb-ta)*time.Microsecond >= a.fam.HoldAtLeast {
				continue
			}
			if gap := time.Duration(b.start - a.start); gap < a.fam.HoldAtLeast-throttleSlack {
				vs = append(vs, h.violation(ruleHold, b.task, fmt.Sprintf("key %s: %s on %s began %s after %s on %s, which succeeded (hold at least %s)",
					key, b.task, b.proc, gap.Round(time.Millisecond), a.task, a.proc, a.fam.HoldAtLeast), a.recs[0], b.recs[0]))
			}
		}
	}
	return vs
}

// ownRetry reports whether ru's delivery began while another run of its
// task still held the key (it went on, or its process had died less than a
// lease TTL before, so its lease had not expired yet): the delivery waited
// for that run, and is its retry.
func (h *history) ownRetry(ru *run) bool {
	t := h.tasks[ru.task]
	for _, o := range t.runs {
		held := o.end
		if o.died {
			held += int64(h.w.ttl(t.fam))
		}
		if o != ru && o.start < ru.deliv && held > ru.deliv {
			return true
		}
	}
	// An earlier delivery on a process that died before it returned may
	// have taken the key and not lived to record its start: its lease,
	// labelled with the task, holds the key until its TTL.
	for _, d := range t.delivs {
		died, ok := h.death[d.Proc]
		if !ok || d.Proc == ru.proc && d.AID == ru.recs[0].AID && d.T == ru.deliv || d.T >= ru.deliv || died < d.T {
			continue
		}
		returned := slices.ContainsFunc(h.returned[d.Proc+"/"+d.AID], func(at int64) bool { return at >= d.T && at <= died })
		if !returned && died+int64(h.w.ttl(t.fam)) > ru.deliv {
			return true
		}
	}
	return false
}

// behindLingeringLease reports whether ru's delivery began less than a
// lease TTL after an earlier run of its task returned, with Redis down
// between that run's start and its return: its release may not have reached
// the master that kept its lease, which then held the key until its TTL, so
// that the delivery found the key held by its own task (a WithShadow run
// then runs at once, without a lease, unreported: docs/operations.md).
func (h *history) behindLingeringLease(ru *run) bool {
	for _, o := range h.tasks[ru.task].runs {
		if o != ru && !o.died && o.start < ru.deliv && h.releaseUnsure(o) && h.returnedAfter(o)+int64(h.w.ttl(o.fam)) > ru.deliv {
			return true
		}
	}
	return false
}

// returnedAfter is when o's delivery returned to asynq after the run (its
// release was sent before), or the history's end if it never did.
func (h *history) returnedAfter(o *run) int64 {
	at := h.lastT
	for _, r := range h.returned[o.proc+"/"+o.recs[0].AID] {
		if r >= o.end && r < at {
			at = r
		}
	}
	return at
}

// releaseUnsure reports whether Redis was down (a restart, a failover) at
// some moment between o's start and its delivery's return: its release, or
// a renewal before it, may have failed or gone to a master that a failover
// then replaced, and its lease may have lived on until its TTL.
func (h *history) releaseUnsure(o *run) bool {
	until := h.returnedAfter(o)
	return slices.ContainsFunc(h.redisDown(), func(d interval) bool { return d.from <= until && d.to >= o.start })
}

// acquiredToken is the fencing token of ru's lease (the last acquire its
// process recorded for its task before it began), 0 when none was recorded.
func (h *history) acquiredToken(ru *run) int64 {
	var tok int64
	for _, r := range h.records {
		if r.T <= ru.start && r.Proc == ru.proc && r.Task == ru.task && r.Ev == evDecision && r.Kind == "acquired" {
			tok = r.Token
		}
	}
	return tok
}

// checkDebounce: a task enqueued with Debounce that never ran to completion
// gave way to a newer task of its key (docs/rules.md item 5): one that
// exists and ran to completion, that asynq archived when its worker was
// killed under it with no retries left, or whose last run an operator
// stopped (Locker.CancelRun) and that singleton then revoked: an
// operator's decision ends the key's work. The last run of each key is checked
// by checkNewest.
func (h *history) checkDebounce() []Violation {
	var vs []Violation
	byKey := map[string][]*taskHist{}
	for _, name := range h.order {
		if t := h.tasks[name]; t.fam.Client == cliDebounce && t.exists() {
			byKey[t.fam.Name+"/"+t.key] = append(byKey[t.fam.Name+"/"+t.key], t)
		}
	}
	for _, ts := range byKey {
		for i, t := range ts {
			if len(t.oks()) > 0 || t.exempt(h) || t.revokedByOperator() {
				continue
			}
			if !slices.ContainsFunc(ts[i+1:], func(u *taskHist) bool { return len(u.oks()) > 0 || u.exempt(h) || u.revokedByOperator() }) {
				// It, or a newer task it gave way to, lost with a failover.
				loss := h.asynqLoss(t)
				for _, u := range ts[i+1:] {
					if loss == "" {
						loss = h.asynqLoss(u)
					}
				}
				vs = append(vs, advise(h.violation(ruleDebounce, t.name, "never ran to completion, and no newer task of its key did", t.events()...), loss))
			}
		}
	}
	return vs
}

// Retentions of the records a quiet run may leave under the lock key prefix,
// as lockkit's scripts and docs state them.
const (
	// parkKeep: the key's order and epoch (P{K}:m) and its follow-up record
	// (P{K}:u) are kept 10 minutes after a run with an order, a park or a
	// waiting follow-up's attempt.
	parkKeep = 10 * time.Minute
	// fenceKeep: the last fencing token (P{K}:f), and the plain form's
	// record of it after a release in the sorted set ("~<token>" in P{K}:h),
	// are kept for a second.
	fenceKeep = time.Second
)

// releasedKeep is how long a released holder is remembered (P{K}:d,
// P{K}:d:<token>, the plain form's "~<token>." in P{K}:h): the client's
// retry window, (MaxRetries+1) × (ReadTimeout + MaxRetryBackoff), between a
// second and a minute (NewRedis), for the go-redis options of every chaos
// process (the defaults; a Cluster client's MaxRedirects+1 attempts are as
// many).
func releasedKeep() time.Duration {
	c := redis.NewClient(&redis.Options{})
	defer c.Close()
	o := c.Options()
	return min(max(time.Duration(o.MaxRetries+1)*(o.ReadTimeout+o.MaxRetryBackoff), time.Second), time.Minute)
}

// checkLeak: once the run was quiet for the longest lease TTL and park
// hold, the state of every key is back to its baseline (nothing: the run
// began on an empty database). What may remain are records, each for at most
// its documented retention:
//   - P{K}:h, the holders, only as records of ended holders (scored
//     negative: completions, kept lockkit.CompletedRetention, and shorter
//     ones), no live holder; or in the plain form "~<token>", for fenceKeep,
//     and "~<token>." (a plain release's record), for releasedKeep;
//   - P{K}:d and P{K}:d:<token>, released holders, for releasedKeep;
//   - P{K}:m (last epoch, latest run's order) and P{K}:u (follow-up), for
//     parkKeep plus a lease TTL;
//   - P{K}:c, the last Coalesce success, for lockkit.DefaultCoverFor;
//   - P{K}:b, Debounce's newest request, for 24 hours (lockkit/debounce's
//     retention) after it was due;
//   - P{K}:t and P{K}:tr, a throttle's starts and reservations, for its period;
//   - P{K}:tq, a throttle's booked turns, for a minute (lockkit/throttle's
//     turnKept) past the last booked slot (a period after the run went
//     quiet at most);
//   - P{K}:f, the last fencing token, for fenceKeep.
//
// Waiters (P{K}:w, P{K}:q) and parked jobs (P{K}:k) are state, not records:
// none may remain.
func (h *history) checkLeak(keys []keyTTL) []Violation {
	var period time.Duration
	for _, f := range h.w.Families {
		period = max(period, f.Period)
	}
	released := releasedKeep()
	var vs []Violation
	for _, k := range keys {
		if k.TTL == -2*time.Nanosecond || k.TTL == -2*time.Millisecond {
			continue // it expired between the listing's SCAN and its PTTL: gone
		}
		kind := ""
		if i := strings.LastIndex(k.Key, "}:"); i >= 0 {
			kind = k.Key[i+2:]
		}
		if strings.HasPrefix(kind, "d:") {
			kind = "d"
		}
		var keep time.Duration
		switch kind {
		case "h":
			keep = lockcore.CompletedRetention
			if k.Type == "string" {
				keep = fenceKeep
			}
			if k.Released {
				keep = released
			}
			if r := h.keptReservation(k.Key); k.Live > 0 && r > 0 {
				keep = r
			} else if k.Live > 0 {
				vs = append(vs, h.violation(ruleLeak, "-", fmt.Sprintf("key %s holds %d live holders", k.Key, k.Live)))
				continue
			}
		case "d":
			keep = released
		case "m", "u":
			keep = parkKeep + h.w.TTL
		case "c":
			keep = lockcore.DefaultCoverFor
		case "b":
			keep = 24*time.Hour + time.Minute // lockkit/debounce's retention, plus a margin
		case "t", "tr":
			keep = period
		case "tq":
			keep = time.Minute + period // lockkit/throttle's turnKept, plus a period
		case "f":
			keep = fenceKeep
		}
		if kind == "k" && (h.archivedOn(k.Key) || h.refusedOn(k.Key) || h.giveUpFailedOn(k.Key) || h.beyondReach(k)) {
			// The parked id of a task asynq archived (it never took the
			// key), of a task parked at enqueue whose enqueue asynq
			// then refused (ParkAtEnqueue: "a parked entry stays"), of
			// a task asynq may have lost or whose last delivery failed
			// on Redis (beyondReach): kept ten minutes after its last
			// park (lockkit's Park). A task a middleware with
			// WithLimit(n > 1) refused gives its entry up, with or
			// without WithShadow.
			keep = parkKeep + h.w.TTL
		}
		switch {
		case keep == 0:
			vs = append(vs, h.violation(ruleLeak, "-", fmt.Sprintf("key %s is left (TTL %s): no record of this kind may remain%s", k.Key, k.TTL, h.parkedTasks(k))))
		case k.TTL < 0:
			vs = append(vs, h.violation(ruleLeak, "-", fmt.Sprintf("key %s has no TTL", k.Key)))
		case k.TTL > keep:
			vs = append(vs, h.violation(ruleLeak, "-", fmt.Sprintf("key %s is kept %s more, longer than its retention (%s)", k.Key, k.TTL.Round(time.Second), keep)))
		}
	}
	return vs
}

// redisDown is when Redis did not serve: from a second before each Redis
// fault to a second after it was up again, and on a Cluster a second past
// the last CLUSTERDOWN an error named (a Cluster serves again only once its
// nodes agree that the restarted master is back, a while after it is up);
// in a Sentinel run, from a second before each failover's kill to a second
// after the clients reached the new master (failover.down).
func (h *history) redisDown() []interval {
	var down []interval
	for _, r := range h.records {
		switch {
		case r.Ev == evFault && r.Fault == faultRedis:
			down = append(down, interval{r.T - int64(time.Second), h.lastT})
		case r.Ev == evFault && r.Fault == "redis-up" && len(down) > 0:
			down[len(down)-1].to = r.T + int64(time.Second)
		case strings.Contains(r.Err, "CLUSTERDOWN") && len(down) > 0:
			down[len(down)-1].to = max(down[len(down)-1].to, r.T+int64(time.Second))
		}
	}
	for _, f := range h.failovers {
		down = append(down, f.down())
	}
	return down
}

// checkPeriodic: the Schedulers of the worker processes, each firing by a
// clock of its own (Workload.Offsets), enqueue every tick of a periodic
// family once (periodic's package doc): no two enqueues of one tick (its
// task ID) are accepted, and no tick between the first and the last is
// missing (neither an accepted enqueue nor a delivery of it), but those due
// while Redis was down (from a second before its kill to a second after it
// was up again, or on a Cluster after the last CLUSTERDOWN error any process
// saw: every replica's enqueue failed). That each accepted tick
// runs to completion once is checkRuns'.
func (h *history) checkPeriodic() []Violation {
	var vs []Violation
	type tick struct {
		fam string
		at  int64 // ms
	}
	seen := map[tick]bool{}
	accepted := map[string][]Record{}
	down := h.redisDown()
	for _, r := range h.records {
		switch {
		case (r.Ev == evEnqueue && r.Accepted || r.Ev == evDeliver) && h.fams[r.Fam].Client == cliPeriodic:
			ms, ok := periodickey.Tick(r.Task)
			if !ok {
				vs = append(vs, h.violation(rulePeriodic, r.Task, "a tick's task ID that names no tick", r))
				continue
			}
			seen[tick{r.Fam, ms}] = true
			if r.Ev == evEnqueue {
				accepted[r.Task] = append(accepted[r.Task], r)
			}
		}
	}
	for _, name := range h.order {
		if a := accepted[name]; len(a) > 1 {
			// The first enqueue and the Scheduler's mark of the tick lost
			// with a failover: another replica enqueues the tick again.
			vs = append(vs, advise(h.violation(rulePeriodic, name, fmt.Sprintf("enqueued %d times (by %s and %s)", len(a), a[0].Proc, a[1].Proc), a...), h.asynqLoss(h.tasks[name])))
		}
	}
	first, last := map[string]int64{}, map[string]int64{}
	for t := range seen {
		if f, ok := first[t.fam]; !ok || t.at < f {
			first[t.fam] = t.at
		}
		last[t.fam] = max(last[t.fam], t.at)
	}
	for fam, from := range first {
		for at := from; at <= last[fam]; at += 1000 {
			ns := at * int64(time.Millisecond)
			if seen[tick{fam, at}] || slices.ContainsFunc(down, func(d interval) bool { return d.from <= ns && ns <= d.to }) {
				continue
			}
			vs = append(vs, h.violation(rulePeriodic, fmt.Sprintf("%s@%d", fam, at), fmt.Sprintf("the tick due at +%.3fs was never enqueued", time.Duration(ns-h.base).Seconds())))
		}
	}
	return vs
}

// checkCron: each tick of a cron entry, which every worker runs under
// cronguard.Wrap on a clock of its own, runs once across the replicas
// (cronguard's package doc, docs/cron.md): never twice; and no tick between
// the entry's first and last run is missing, but one the docs let go
// unrun: due while a fault hit a process or Redis, from a second before the
// fault to a lease TTL and a second after it ended (a killed or paused
// holder blocks later ticks for up to the TTL; a failover, from its down
// time's start to a lease TTL after its end); a reply fault on the entry's
// key explains only the tick fired within a second of the faulted call (a
// claim whose reply was lost leaves its tick taken and unrun, "at most
// once"); or one a replica reported an error for.
func (h *history) checkCron() []Violation {
	var vs []Violation
	runs := map[string][]Record{}
	errs := map[string]bool{}
	type window struct {
		interval
		key string // a reply fault's key; "" for a fault of a process or of Redis
	}
	var wins []window
	open := map[string]int64{}
	pad, ttl := int64(time.Second), int64(h.w.TTL)
	for _, r := range h.records {
		switch r.Ev {
		case evCronRun:
			runs[r.Task] = append(runs[r.Task], r)
		case evDecision:
			if strings.HasPrefix(r.Task, "cron:") && r.Kind == "error" {
				errs[r.Task] = true
			}
		case evFault:
			switch r.Fault {
			case faultKill:
				wins = append(wins, window{interval{r.T - pad, r.T + ttl + pad}, ""})
			case faultTerm, faultStop, faultRedis:
				open[r.Target] = r.T
			case "exited", "cont", "redis-up":
				from, ok := open[r.Target]
				if !ok {
					from = r.T
				}
				delete(open, r.Target)
				wins = append(wins, window{interval{from - pad, r.T + ttl + pad}, ""})
			case faultReplyRepeat, faultReplyDrop, faultReplyLate:
				// The faulted call ran in Redis: it can only have failed the
				// claim of the tick being fired, at most ReplyDelay before
				// the fault was recorded (a release's holder is removed at once).
				wins = append(wins, window{interval{r.T - pad - int64(h.w.ReplyDelay), r.T + pad}, r.Key})
			}
		}
	}
	for _, from := range open {
		wins = append(wins, window{interval{from - pad, h.lastT}, ""})
	}
	for _, f := range h.failovers {
		d := f.down()
		wins = append(wins, window{interval{d.from, d.to + ttl}, ""})
	}
	for _, e := range h.w.Crons {
		first, last := int64(-1), int64(-1)
		for task, rs := range runs {
			var at int64
			if _, err := fmt.Sscanf(task, "cron:"+e.Name+"@%d", &at); err != nil {
				continue
			}
			if first < 0 || at < first {
				first = at
			}
			last = max(last, at)
			if len(rs) > 1 {
				var procs []string
				for _, r := range rs {
					procs = append(procs, r.Proc)
				}
				vs = append(vs, h.violation(ruleCron, task, fmt.Sprintf("the tick ran %d times (on %s)", len(rs), strings.Join(procs, ", ")), rs...))
			}
		}
		if first < 0 {
			continue
		}
		step := e.Every.Milliseconds()
		for at := first; at <= last; at += step {
			task := cronTask(e.Name, at)
			ns := at * int64(time.Millisecond)
			explained := errs[task] || slices.ContainsFunc(wins, func(w window) bool {
				return w.from <= ns && ns <= w.to && (w.key == "" || strings.Contains(w.key, cronkey.Key(e.Name)))
			})
			if len(runs[task]) == 0 && !explained {
				vs = append(vs, h.violation(ruleCron, task, fmt.Sprintf("the tick due at +%.3fs ran on no replica", time.Duration(ns-h.base).Seconds())))
			}
		}
	}
	return vs
}

// checkShadow: under WithShadow (singleton's doc, docs/operations.md) every
// delivery runs: a conflict, a Redis error, or a task the middleware would
// refuse (its key cannot be derived, its Client keyed it otherwise, it was
// parked at enqueue under WithLimit(n > 1)) is reported and the task runs
// anyway, unless its process died (was killed or exited) before the
// delivery returned. Every run took its lease (an
// EventAcquired between its delivery and its start: a task parked at
// enqueue takes its reservation over) or was reported between its delivery
// and its start: an EventShadowed (what the policy, or the refusal, would
// have done), or an EventError (the decision could not be taken); or is a
// re-delivery that found its own task's earlier run holding the key, which
// is no duplicate and is not reported (middleware.WithShadow). So of two
// runs of a key that overlap (each counted as checkOverlap counts it), at
// least one was reported.
func (h *history) checkShadow() []Violation {
	var vs []Violation
	during := func(ru *run, kinds ...string) bool {
		return slices.ContainsFunc(h.tasks[ru.task].decs, func(d Record) bool {
			return slices.Contains(kinds, d.Kind) && d.Proc == ru.proc && d.AID == ru.recs[0].AID && d.T >= ru.deliv && d.T <= ru.start
		})
	}
	reported := func(ru *run) bool {
		// its own task's earlier run held the key: no duplicate, not
		// reported (WithShadow)
		return h.ownRetry(ru) || h.behindLingeringLease(ru) || during(ru, "shadowed", "error")
	}
	byKey := map[string][]*run{}
	for _, name := range h.order {
		t := h.tasks[name]
		if !t.fam.Shadow {
			continue
		}
		for _, d := range t.delivs {
			ran := slices.ContainsFunc(t.runs, func(ru *run) bool { return ru.proc == d.Proc && ru.recs[0].AID == d.AID && ru.start >= d.T })
			returned := slices.ContainsFunc(h.returned[d.Proc+"/"+d.AID], func(at int64) bool { return at >= d.T })
			if died, ok := h.death[d.Proc]; !ran && (returned || !ok || died < d.T) {
				vs = append(vs, h.violation(ruleShadow, name, "delivered on "+d.Proc+" but did not run", t.events()...))
			}
		}
		for _, ru := range t.runs {
			byKey[ru.key] = append(byKey[ru.key], ru)
			if !reported(ru) && !during(ru, "acquired") {
				vs = append(vs, h.violation(ruleShadow, name, "its run on "+ru.proc+" took no lease and was not reported", ru.recs...))
			}
		}
	}
	for key, runs := range byKey {
		slices.SortFunc(runs, func(a, b *run) int { return cmpInt(a.start, b.start) })
		for j, ru := range runs {
			for _, o := range runs[:j] {
				if o.effEnd <= ru.start || reported(o) || reported(ru) {
					continue
				}
				evs := append(slices.Clone(o.recs), ru.recs...)
				slices.SortStableFunc(evs, func(a, b Record) int { return cmpInt(a.T, b.T) })
				vs = append(vs, h.violation(ruleShadow, ru.task, fmt.Sprintf("key %s: its run on %s began while %s ran on %s (%s), and neither was reported", key, ru.proc, o.task, o.proc, o.excusedOr()), evs...))
			}
		}
	}
	return vs
}

// uniqueTTL is the TTL of the Unique family's reservations: Unique's when
// given none (singleton.Unique documents it).
const uniqueTTL = 24 * time.Hour

// keptReservation returns how long a live holder may be left on lock key
// k, the reservation key of a Unique family's key (0: not at all): the
// reservation of a task whose enqueue failed, its outcome unknown (see
// failedUnique), kept for its TTL or until an enqueue of its key takes it
// over (uniqueTTL); or one that a task adopted on a worker
// that was killed while it ran, which frees within the worker Locker's TTL
// (docs/asynq.md; the chaos workers' Lockers have 30s, lockkit.WithTTL's default).
func (h *history) keptReservation(k string) time.Duration {
	for _, f := range h.w.Families {
		if f.Client != cliUnique {
			continue
		}
		for i := range f.Keys {
			key := fmt.Sprintf("k%d", i)
			if !strings.Contains(k, "{"+asynqkey.Reservation(famKey(f, key))+"}") {
				continue
			}
			if h.failedUnique(key, h.lastT+1, false) {
				return uniqueTTL
			}
			if slices.ContainsFunc(h.runs, func(ru *run) bool { return ru.key == f.Name+"/"+key && (ru.died || ru.killedBefore) }) {
				return lockcore.DefaultTTL
			}
		}
	}
	return 0
}

// famKey is the key of the tasks of family f with key field key
// (singleton.KeyByFields("k"), a value without quotes or escapes), which
// lockkit's Redis keys of it hold in their hash tag.
func famKey(f Family, key string) string {
	return asynqkey.TypeKey(f.TaskType()) + ":k=" + strconv.Quote(key)
}

// refusedOn reports whether a task of parked-queue key k was enqueued with
// ParkAtEnqueue and refused: its parking acquire may have parked it before
// asynq refused the enqueue (seed 6115: a Cluster master restarting).
func (h *history) refusedOn(k string) bool {
	for _, name := range h.order {
		t := h.tasks[name]
		if t.fam.Client == cliPark && t.enq != nil && !t.enq.Accepted && t.enq.Err != "" &&
			strings.Contains(k, "{"+famKey(t.fam, t.key)+"}") {
			return true
		}
	}
	return false
}

// giveUpFailedOn reports whether a task of the family key whose lock key
// is k could not give its parked place up (a Redis error, reported as an
// EventError: "giving up the place kept for"): one that ran under
// WithShadow without a lease, or a delivery that completed without running
// after its wait for its own earlier run failed. Its entry stays for the
// parked queue's retention (lockkit's Park), as a refused task's does.
func (h *history) giveUpFailedOn(k string) bool {
	for _, name := range h.order {
		t := h.tasks[name]
		if !strings.Contains(k, "{"+famKey(t.fam, t.key)+"}") {
			continue
		}
		if slices.ContainsFunc(t.decs, func(d Record) bool {
			return d.Kind == "error" && strings.Contains(d.Err, "giving up the place kept for")
		}) {
			return true
		}
	}
	return false
}

// beyondReach reports whether every entry of the parked queue k is of a
// task beyond jobguard's reach (keepsParked), or, its entries unknown (a
// kept history without parked.txt), whether a task of its key is.
func (h *history) beyondReach(k keyTTL) bool {
	if len(k.Members) == 0 {
		return slices.ContainsFunc(h.order, func(name string) bool {
			t := h.tasks[name]
			return strings.Contains(k.Key, "{"+famKey(t.fam, t.key)+"}") && h.keepsParked(t)
		})
	}
	byLabel := h.tasksByAID()
	return !slices.ContainsFunc(k.Members, func(m string) bool {
		t := byLabel[parkedLabel(m)]
		return t == nil || !h.keepsParked(t)
	})
}

// keepsParked reports whether task t's parked entry may stay for the
// parked queue's retention, no delivery of t coming to take the key or to
// give its place up: asynq may have lost t (a write of its own a failover
// lost, asynqLoss) before it ran to completion (seed 820: a Coalesce
// follow-up's retry write lost, its parking write kept on the new master);
// or t's last delivery failed on a Redis error (exempt: asynq archives a
// task whose retries such errors spent), which gave up nothing, even if an
// earlier delivery ran the work (seed 818: a delivery parked behind its own
// run, whose wait and retries failed in a failover).
func (h *history) keepsParked(t *taskHist) bool {
	return len(t.oks()) == 0 && h.asynqLoss(t) != "" || t.exempt(h)
}

// tasksByAID maps each asynq ID in the history (a parked entry's label is
// its task's first) to its task.
func (h *history) tasksByAID() map[string]*taskHist {
	by := map[string]*taskHist{}
	for _, r := range h.records {
		if t := h.tasks[r.Task]; t != nil && r.AID != "" {
			by[r.AID] = t
		}
	}
	return by
}

// parkedLabel is the label of a parked-queue entry, "<hold ms>:<label>:<id>"
// (lockkit's Park): the first asynq ID of the entry's task.
func parkedLabel(entry string) string {
	f := strings.SplitN(entry, ":", 3)
	if len(f) < 3 {
		return ""
	}
	return f[1]
}

// parkedTasks names the tasks of the parked queue k's entries that are not
// beyond reach (keepsParked), for its leak violation ("" for another key,
// or entries unknown).
func (h *history) parkedTasks(k keyTTL) string {
	byLabel := h.tasksByAID()
	var names []string
	for _, m := range k.Members {
		name := parkedLabel(m)
		if t := byLabel[name]; t != nil && h.keepsParked(t) {
			continue
		} else if t != nil {
			name = t.name
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return ""
	}
	return " (entries of " + strings.Join(names, ", ") + ")"
}

// archivedOn reports whether a task of the family key whose lock key is k
// (its parked ids, say) was archived by asynq: exempt, never run.
func (h *history) archivedOn(k string) bool {
	for _, name := range h.order {
		t := h.tasks[name]
		if strings.Contains(k, "{"+famKey(t.fam, t.key)+"}") && len(t.oks()) == 0 && t.exempt(h) {
			return true
		}
	}
	return false
}

// passOnWithin bounds how long a key stays reserved for a parked task that
// was done when the reservation was made: the releasing worker's resume
// finds the task gone or done (within resumeMissing, 100 ms, or, for a
// delivery still active, resumeTimeout, 1 s) and passes the key on at once
// (docs/asynq.md), a lost reply notwithstanding (docs/rules.md, Redis
// faults); plus a margin.
const passOnWithin = 3 * time.Second

// reservedFor matches a conflict with a parked task's reservation, as a
// decision's error names it: the holder "parked:<entry>", the task's label
// (its first asynq ID) and the reservation's fencing token (the Redis
// server's time in microseconds when the release made it).
var reservedFor = regexp.MustCompile(`is held by parked:(?s:.*?) for "([^"]*)" \(token (\d+),`)

// checkReserved: a delivery that finds its key reserved for a parked task
// that was done before the reservation was made (its last delivery had
// returned without error, and none came after) finds it at most
// passOnWithin after the release made it, unless the worker that released
// the key (the resume runs there; any worker when no run's release matches)
// was killed, shut down or paused, or Redis was down, around the release.
func (h *history) checkReserved() []Violation {
	task := map[string]string{} // asynq ID → task
	done := map[string]Record{} // task → its last delivery's return without error, if none came after
	for _, r := range h.records {
		if r.AID != "" && r.Task != "" {
			task[r.AID] = r.Task
		}
		switch {
		case r.Ev == evDeliver:
			delete(done, r.Task)
		case r.Ev == evReturn && r.Err == "":
			done[r.Task] = r
		case r.Ev == evReturn:
			delete(done, r.Task)
		}
	}
	procs, down := h.faultSpans()
	var vs []Violation
	seen := map[string]bool{}
	for _, r := range h.records {
		m := reservedFor.FindStringSubmatch(r.Err)
		if r.Ev != evDecision || m == nil || seen[m[2]] {
			continue
		}
		name := task[m[1]]
		at, _ := strconv.ParseInt(m[2], 10, 64)
		at *= int64(time.Microsecond)
		ret, ok := done[name]
		if !ok || ret.T > at || r.T-at <= int64(passOnWithin) {
			continue
		}
		around := func(f interval) bool { return f.from <= at+int64(passOnWithin) && f.to >= at-int64(time.Second) }
		excused := slices.ContainsFunc(down, around)
		rel := h.releaser(r, at)
		for p, spans := range procs {
			if (rel == "" || rel == p) && slices.ContainsFunc(spans, around) {
				excused = true
			}
		}
		if excused {
			continue
		}
		seen[m[2]] = true
		vs = append(vs, h.violation(ruleReserved, name, fmt.Sprintf("its key was reserved for it %s after it was done, and still was %s later",
			time.Duration(at-ret.T).Round(time.Millisecond), time.Duration(r.T-at).Round(time.Millisecond)), ret, r))
	}
	return vs
}

// releaser is the process whose run's release on the key of decision d
// made a reservation at at (Redis server time, ns): the first to record
// the release of a run of that key from at to a second plus the reply
// delay later (a release whose reply was late records it then); "" when
// none did (a release that is no run's: a pass-on, a hand-over).
func (h *history) releaser(d Record, at int64) string {
	for _, r := range h.records {
		if r.T >= at && r.T <= at+int64(time.Second+h.w.ReplyDelay) && r.Ev == evDecision && r.Kind == "released" && r.Fam == d.Fam && r.Key == d.Key {
			return r.Proc
		}
	}
	return ""
}

// faultSpans are the spans during which each worker was being killed, shut
// down or paused (by process), and Redis was down (redisDown).
func (h *history) faultSpans() (map[string][]interval, []interval) {
	procs := map[string][]interval{}
	open := map[string]int64{}
	for _, r := range h.records {
		switch {
		case r.Ev != evFault:
		case r.Fault == faultKill:
			procs[r.Target] = append(procs[r.Target], interval{r.T, r.T})
		case r.Fault == faultTerm || r.Fault == faultStop:
			open[r.Target] = r.T
		case r.Fault == "exited" || r.Fault == "cont":
			if from, ok := open[r.Target]; ok {
				procs[r.Target] = append(procs[r.Target], interval{from, r.T})
				delete(open, r.Target)
			}
		}
	}
	for p, from := range open {
		procs[p] = append(procs[p], interval{from, h.lastT})
	}
	return procs, h.redisDown()
}
