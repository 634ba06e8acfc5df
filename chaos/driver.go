package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/singleton"
)

// parkBackstop is the ParkAtEnqueue backstop of the park families.
const parkBackstop = 5 * time.Second

// followUpBackstop is singleton's backstop of a parked follow-up (WithRedis
// documents it).
const followUpBackstop = 30 * time.Second

// drainTimeout bounds the quiet phase: a parked follow-up whose resumer died
// comes back after followUpBackstop, and may be parked again behind a
// reservation whose task never came (archived): twice. And a task that
// asynq moved to active as Redis was killed (the dequeue's reply lost) or
// as its worker was, stays active, with no worker, until its 30 s lease
// runs out and asynq's recoverer, once a minute, gives back the tasks whose
// lease ran out 30 s before: up to 2 minutes (seeds 4027, 5112, 1631).
const drainTimeout = max(2*followUpBackstop, 2*asynqLease+asynqRecoverEvery) + 15*time.Second

// asynq's worker lease of an active task and its recoverer's interval
// (fixed in asynq v0.26).
const (
	asynqLease        = 30 * time.Second
	asynqRecoverEvery = time.Minute
)

// proc is a worker process.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// seedRun is one seed's run: its Redis, its workers, the driver's history.
type seedRun struct {
	o      options
	w      Workload
	dir    string
	addrs  []string // the Redis's address, the Cluster's masters', or the sentinels'
	prefix string
	queue  string
	rdb    redis.UniversalClient
	rec    *recorder
	nodes  []*redisServer // the standalone server, the Cluster's masters, or every server of the Sentinel topology; none when the run uses a Redis it did not start
	// sentinel is the Sentinel topology (-failover); resynced is closed once
	// the server its last failover restarted is a replica in sync.
	sentinel *sentinelSet
	resynced chan struct{}

	mu    sync.Mutex
	live  []*proc
	all   []*proc
	count int
}

// result is what a seed's run found.
type result struct {
	seed       uint64
	dir        string
	w          Workload
	stats      stats
	violations []Violation
	phases     []phase // where the run's wall time went
}

// phase is a part of a seed's run and its wall time.
type phase struct {
	name string
	d    time.Duration
	note string // what the phase waited for, if anything is known
}

// phaseTimes formats the run's phases: "redis 0.1s, workers 0.9s, ...".
func (r result) phaseTimes() string {
	var b strings.Builder
	var total time.Duration
	for i, p := range r.phases {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.1fs", p.name, p.d.Seconds())
		if p.note != "" {
			fmt.Fprintf(&b, " (last held: %s)", p.note)
		}
		total += p.d
	}
	return fmt.Sprintf("seed %d phases: %s (total %.1fs)", r.seed, b.String(), total.Seconds())
}

func (r result) summary() string {
	n := failing(r.violations)
	return fmt.Sprintf("seed %d (%s): %d tasks and %d ticks (%d accepted), %d deliveries, %d runs (%d counted short: lease lost or paused), %d cron ticks (%d runs), %d fenced writes (%d refused stale), faults %v, %d keys left; %d violations, %d advisory %v",
		r.seed, r.w.topology(), len(r.w.Ops), r.stats.ticks, r.stats.accepted, r.stats.deliveries, r.stats.runs, r.stats.excused, r.stats.cronTicks, r.stats.cronRuns, r.stats.fenced, r.stats.stale, r.stats.faults, r.stats.keysLeft, n, len(r.violations)-n, r.perRule(true))
}

// perRule counts the violations that fail the seed by rule, or with
// advisory those that do not.
func (r result) perRule(advisory bool) map[string]int {
	m := map[string]int{}
	for _, v := range r.violations {
		if v.advisory() == advisory {
			m[v.Rule]++
		}
	}
	return m
}

// quietRedisLog is a go-redis logger that drops every message.
type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}

// runSeed runs one seed end to end and checks its history.
func runSeed(o options, seed uint64) (result, error) {
	// The driver's go-redis clients say what the history does (a failover's
	// refused dials, its new master): their messages are dropped. The
	// workers' go to their logs.
	redis.SetLogger(quietRedisLog{})
	var phases []phase
	mark := time.Now()
	lap := func(name string) {
		now := time.Now()
		phases = append(phases, phase{name: name, d: now.Sub(mark)})
		mark = now
	}
	w := newWorkload(seed, o.length, !o.noFaults, o.topology())
	if o.plan != nil {
		w = o.plan(seed)
	}
	dir := filepath.Join(o.out, fmt.Sprintf("seed-%d", seed))
	if o.broken != "" {
		dir += "-broken-" + o.broken
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return result{}, err
	}
	b, _ := json.MarshalIndent(w, "", " ")
	if err := os.WriteFile(filepath.Join(dir, "workload.json"), b, 0o644); err != nil {
		return result{}, err
	}
	addrs := []string{o.addr}
	var nodes []*redisServer
	var set *sentinelSet
	if o.addr == "" {
		rdir := filepath.Join(dir, "redis") // append-only files and configs: not kept
		if err := mkdir(rdir); err != nil {
			return result{}, err
		}
		switch w.topology() {
		case topoCluster:
			var err error
			if nodes, err = startCluster(rdir); err != nil {
				return result{}, err
			}
		case topoSentinel:
			var err error
			if set, err = startSentinel(rdir); err != nil {
				return result{}, err
			}
			nodes = set.servers()
		default:
			srv, err := startRedis(rdir)
			if err != nil {
				return result{}, err
			}
			nodes = []*redisServer{srv}
		}
		defer func() {
			for _, n := range nodes {
				n.stop()
			}
			_ = os.RemoveAll(rdir)
		}()
		addrs = nil
		for _, n := range nodes {
			addrs = append(addrs, n.addr)
		}
		if set != nil {
			addrs = set.addrs()
		}
	}
	lap("redis")
	r := &seedRun{o: o, w: w, dir: dir, addrs: addrs, nodes: nodes, sentinel: set, prefix: fmt.Sprintf("jgc%d:", seed), queue: fmt.Sprintf("chaos-%d", seed)}
	r.rdb = newClient(addrs, w.topology(), "chaos-driver")
	defer r.rdb.Close()
	ctx := context.Background()
	if err := eachMaster(ctx, r.rdb, func(ctx context.Context, c *redis.Client) error { return c.FlushDB(ctx).Err() }); err != nil {
		return result{}, err
	}
	rec, err := newRecorder(filepath.Join(dir, "driver.jsonl"), "driver")
	if err != nil {
		return result{}, err
	}
	r.rec = rec
	stopWatch := func() {}
	if set != nil {
		if stopWatch, err = r.watchSwitches(); err != nil {
			rec.close()
			return result{}, err
		}
	}
	defer func() {
		r.stopAll()
		r.waitResynced()
		stopWatch()
		rec.close()
	}()
	for range w.Workers {
		if err := r.startWorker(); err != nil {
			return result{}, err
		}
	}
	lap("workers")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.runFaults() }()
	if err := r.enqueueAll(); err != nil {
		return result{}, err
	}
	wg.Wait()
	lap("enqueue+faults")
	r.stopSchedulers()
	drained, held := r.drain()
	if !drained {
		r.recordLeft()
	}
	r.waitResynced()
	lap("drain")
	if held != "" {
		phases[len(phases)-1].note = held
	}
	// Quiet for the longest TTL a key is held by a lease or a reservation.
	time.Sleep(max(w.maxTTL(), lockcore.DefaultParkHold) + time.Second)
	keys, err := r.keysLeft()
	if err != nil {
		return result{}, err
	}
	if err := r.recordEntries(); err != nil {
		return result{}, err
	}
	lap("quiet")
	r.stopAll()
	stopWatch()
	stopWatch = func() {}
	rec.close()
	lap("stop")
	recs, err := readHistory(dir)
	if err != nil {
		return result{}, err
	}
	vs, st := check(w, recs, keys, drained)
	st.keysLeft = len(keys)
	var kb, pb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&kb, "%s %s %s live=%d", k.Key, k.Type, k.TTL, k.Live)
		if k.Released {
			kb.WriteString(" released")
		}
		kb.WriteString("\n")
		for _, m := range k.Members {
			fmt.Fprintf(&pb, "%s %s\n", k.Key, m)
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "keys.txt"), []byte(kb.String()), 0o644)
	if pb.Len() > 0 {
		_ = os.WriteFile(filepath.Join(dir, "parked.txt"), []byte(pb.String()), 0o644)
	}
	lap("check")
	res := result{seed: seed, dir: dir, w: w, stats: st, violations: vs, phases: phases}
	var sb strings.Builder
	for _, v := range vs {
		sb.WriteString(v.String() + "\n")
	}
	_ = os.WriteFile(filepath.Join(dir, "violations.txt"), []byte(sb.String()), 0o644)
	if failing(vs) == 0 && !o.keep {
		_ = os.RemoveAll(dir)
	}
	return res, nil
}

// startWorker starts a worker process and waits until its server runs.
func (r *seedRun) startWorker() error {
	r.mu.Lock()
	r.count++
	name, offset := fmt.Sprintf("w%d", r.count), r.w.offset(r.count)
	r.mu.Unlock()
	args := []string{"worker", "-id", name, "-addr", strings.Join(r.addrs, ","), "-topology", string(r.w.topology()),
		"-dir", r.dir, "-prefix", r.prefix, "-queue", r.queue, "-offset", offset.String()}
	if r.o.broken != "" {
		args = append(args, "-broken", r.o.broken)
	}
	cmd := exec.Command(r.o.self, args...)
	logf, err := os.Create(filepath.Join(r.dir, name+".log"))
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if !ok && sc.Text() == "ready" {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	select {
	case ok := <-ready:
		if !ok {
			return fmt.Errorf("worker %s exited before it was ready", name)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		return fmt.Errorf("worker %s not ready after 20s", name)
	}
	r.mu.Lock()
	r.live = append(r.live, p)
	r.all = append(r.all, p)
	r.mu.Unlock()
	return nil
}

// stopAll shuts every live worker down gracefully (SIGKILL after 15s).
func (r *seedRun) stopAll() {
	r.mu.Lock()
	live := r.live
	r.live = nil
	r.mu.Unlock()
	for _, p := range live {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range live {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// enqueueAll runs the workload's enqueues at their times.
func (r *seedRun) enqueueAll() error {
	plain := asynq.NewClientFromRedisClient(r.rdb)
	stamped, err := singleton.NewClient(plain, r.rdb, singleton.KeyByFields("k"))
	if err != nil {
		return err
	}
	locker, err := lockkit.NewRedis(r.rdb, append(lockerOptions(r.w, r.o.broken), lockkit.WithPrefix(r.prefix), lockkit.WithOwner("driver"))...)
	if err != nil {
		return err
	}
	defer locker.Close(context.Background())
	park, err := singleton.NewClient(plain, r.rdb, singleton.KeyByFields("k"), singleton.ParkAtEnqueue(locker, parkBackstop))
	if err != nil {
		return err
	}
	otherKey, err := singleton.NewClient(plain, r.rdb, singleton.KeyByPayload())
	if err != nil {
		return err
	}
	unique, err := singleton.NewClient(plain, r.rdb, singleton.KeyByFields("k"), singleton.Unique(locker, singleton.UntilExecuted, 0))
	if err != nil {
		return err
	}
	debounce := map[int]*singleton.Client{}
	for i, f := range r.w.Families {
		if f.Client == cliDebounce {
			if debounce[i], err = singleton.NewClient(plain, r.rdb, singleton.KeyByFields("k"), singleton.Debounce(locker, f.Quiet, f.MaxWait)); err != nil {
				return err
			}
		}
	}
	begin := time.Now()
	for _, op := range r.w.Ops {
		time.Sleep(time.Until(begin.Add(op.At)))
		f := r.w.Families[op.Fam]
		p := payload{ID: op.ID, Fam: f.Name, K: op.Key, N: op.N, Dur: op.Dur, FailOnce: op.FailOnce, PanicOnce: op.PanicOnce, IgnoreCtx: op.IgnoreCtx,
			TakeBack: op.TakeBack, L: op.Limit, X: op.Extra}
		b, _ := json.Marshal(p)
		opts := []asynq.Option{asynq.Queue(r.queue), asynq.MaxRetry(op.MaxRetry), asynq.Timeout(time.Minute)}
		if op.TaskID {
			opts = append(opts, asynq.TaskID(op.ID))
		}
		if op.In > 0 {
			opts = append(opts, asynq.ProcessIn(op.In))
		}
		task := asynq.NewTask(f.TaskType(), b)
		var info *asynq.TaskInfo
		sent := time.Now().UnixNano()
		switch client := f.Client; {
		case op.Enq == enqNoKey:
			info, err = plain.Enqueue(task, opts...)
		case op.Enq == enqOtherKey:
			info, err = otherKey.Enqueue(task, opts...)
		case client == cliStamped:
			info, err = stamped.Enqueue(task, opts...)
		case client == cliPark:
			info, err = park.Enqueue(task, opts...)
		case client == cliUnique:
			info, err = unique.Enqueue(task, opts...)
		case client == cliDebounce:
			info, err = debounce[op.Fam].Enqueue(task, opts...)
		default:
			info, err = plain.Enqueue(task, opts...)
		}
		rec := Record{Ev: evEnqueue, Task: op.ID, Fam: f.Name, Key: op.Key, N: op.N, Accepted: err == nil, Retry: op.MaxRetry, Sent: sent}
		var dup *singleton.DuplicateTaskError
		if errors.As(err, &dup) {
			rec.Holder = dup.ID
		}
		if err != nil {
			rec.Err = err.Error()
		} else {
			rec.AID = info.ID
			_, _ = fmt.Sscan(info.Headers[asynqkey.EnqueuedAtHeader], &rec.Stamp)
		}
		r.rec.add(rec)
	}
	return nil
}

// runFaults injects the workload's faults at their times.
func (r *seedRun) runFaults() {
	begin := time.Now()
	for _, f := range r.w.Faults {
		time.Sleep(time.Until(begin.Add(f.At)))
		if f.Kind == faultStop && f.Fam != "" {
			if p := r.aimAt(f.Fam); p != nil {
				r.pause(p, f.Hold)
			}
			continue
		}
		r.mu.Lock()
		if len(r.live) == 0 {
			r.mu.Unlock()
			continue
		}
		// A worker that is running tasks, if any is: faults mid-run.
		var busy []int
		for i, p := range r.live {
			if len(r.openDeliveries(p)) > 0 {
				busy = append(busy, i)
			}
		}
		i := f.Target % len(r.live)
		if len(busy) > 0 {
			i = busy[f.Target%len(busy)]
		}
		p := r.live[i]
		if f.Kind == faultKill || f.Kind == faultTerm {
			r.live = slices.Delete(r.live, i, i+1)
		}
		r.mu.Unlock()
		switch f.Kind {
		case faultKill:
			r.rec.add(Record{Ev: evFault, Fault: faultKill, Target: p.name})
			_ = p.cmd.Process.Kill()
			<-p.done
			r.recoverLeases()
			r.replace()
		case faultTerm:
			r.rec.add(Record{Ev: evFault, Fault: faultTerm, Target: p.name})
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(15 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
			r.rec.add(Record{Ev: evFault, Fault: "exited", Target: p.name})
			r.replace()
		case faultRedis:
			if len(r.nodes) == 0 {
				continue
			}
			n := r.nodes[f.Target%len(r.nodes)]
			r.rec.add(Record{Ev: evFault, Fault: faultRedis, Target: "redis " + n.addr})
			n.stop()
			time.Sleep(f.Hold)
			if err := n.start(); err != nil {
				fmt.Fprintln(os.Stderr, "chaos: restart redis-server:", err)
			}
			r.rec.add(Record{Ev: evFault, Fault: "redis-up", Target: "redis " + n.addr})
		case faultFailover:
			r.failover(f)
		case faultPubsub:
			r.cutPubsub()
		case faultRelease:
			r.releaseHung()
		case faultStop:
			r.pause(p, f.Hold)
		}
	}
}

// pause stops p (SIGSTOP) for hold, then lets it go on (SIGCONT).
func (r *seedRun) pause(p *proc, hold time.Duration) {
	r.rec.add(Record{Ev: evFault, Fault: faultStop, Target: p.name})
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(hold)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	r.rec.add(Record{Ev: evFault, Fault: "cont", Target: p.name})
}

// aimAt returns a live worker running a task of family fam with at least
// fencedLeft of its work left, as its history says, looking for one for up
// to fencedLook; nil if there is none.
func (r *seedRun) aimAt(fam string) *proc {
	dur := map[string]time.Duration{}
	for _, op := range r.w.Ops {
		dur[op.ID] = op.Dur
	}
	for deadline := time.Now().Add(fencedLook); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		r.mu.Lock()
		live := slices.Clone(r.live)
		r.mu.Unlock()
		for _, p := range live {
			for _, rec := range r.openRuns(p, func(rec Record) bool { return rec.Fam == fam }) {
				if time.Until(time.Unix(0, rec.T).Add(dur[rec.Task])) >= fencedLeft {
					return p
				}
			}
		}
	}
	return nil
}

// openRuns returns the start records of the runs of p that its history
// shows going (no end), of the tasks keep accepts.
func (r *seedRun) openRuns(p *proc, keep func(Record) bool) []Record {
	recs, _ := readFile(filepath.Join(r.dir, p.name+".jsonl"))
	open := map[int64]Record{}
	for _, rec := range recs {
		switch {
		case rec.Ev == evStart && keep(rec):
			open[rec.Seq] = rec
		case rec.Ev == evEnd:
			delete(open, rec.Run)
		}
	}
	out := make([]Record, 0, len(open))
	for _, rec := range open {
		out = append(out, rec)
	}
	return out
}

// releaseHung is an operator's release (Locker.CancelRun by fencing token)
// of a run, on a live worker, of a task whose handler ignores its ctx: it
// looks for one for up to 5s, and records the fault with the run's key and
// task when it released one.
func (r *seedRun) releaseHung() {
	ctx := context.Background()
	op, err := lockkit.NewRedis(r.rdb, append(lockerOptions(r.w, r.o.broken), lockkit.WithPrefix(r.prefix), lockkit.WithOwner("operator"))...)
	if err != nil {
		return
	}
	defer op.Close(ctx)
	hung := map[string]bool{}
	for _, o := range r.w.Ops {
		hung[o.ID] = o.IgnoreCtx
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r.mu.Lock()
		live := slices.Clone(r.live)
		r.mu.Unlock()
		runs := map[string]Record{} // the open runs of hung handlers, by owner and asynq task ID
		for _, p := range live {
			for _, rec := range r.openRuns(p, func(rec Record) bool { return hung[rec.Task] }) {
				runs[p.name+" "+rec.AID] = rec
			}
		}
		if len(runs) == 0 {
			continue
		}
		keys, err := op.Keys(ctx, "*")
		if err != nil {
			continue
		}
		for _, k := range keys {
			info, err := op.Inspect(ctx, k)
			if err != nil {
				continue
			}
			for _, h := range info.Holders {
				rec, ok := runs[h.Owner+" "+h.Label]
				if h.Reserved || !ok {
					continue
				}
				if n, err := op.CancelRun(ctx, k, lockkit.Select{Token: h.Token}); err == nil && n == 1 {
					r.rec.add(Record{Ev: evFault, Fault: faultRelease, Target: h.Owner, Key: k, Task: rec.Task})
					return
				}
			}
		}
	}
}

// cutPubsub closes every pub/sub connection of the run's Redis, and
// records how many it closed.
func (r *seedRun) cutPubsub() Record {
	var n atomic.Int64
	err := eachMaster(context.Background(), r.rdb, func(ctx context.Context, c *redis.Client) error {
		k, err := c.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
		n.Add(k)
		return err
	})
	rec := Record{Ev: evFault, Fault: faultPubsub, Target: "redis", Killed: n.Load()}
	if err != nil {
		rec.Err = err.Error()
	}
	return r.rec.add(rec)
}

// stopSchedulers stops the Schedulers of the live workers (SIGUSR1): no
// tick is fired once the run is to go quiet.
func (r *seedRun) stopSchedulers() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.live {
		_ = p.cmd.Process.Signal(syscall.SIGUSR1)
	}
}

func (r *seedRun) replace() {
	if err := r.startWorker(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: replacement worker:", err)
	}
}

// recoverLeases does what asynq's 30s worker lease and its recoverer's 30s
// cutoff would do for a killed worker's tasks, at once: every task in the
// queue's lease set that no live worker is running gets a lease expired 60s
// ago, so the replacement server's recoverer (which runs at its start)
// re-delivers it. A task that a live worker has just dequeued may not be in
// its history yet: only tasks that no live worker runs twice 300ms apart
// are moved.
func (r *seedRun) recoverLeases() {
	ctx := context.Background()
	key := asynqkey.Lease(r.queue)
	orphans := func() map[string]float64 {
		zs, err := r.rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			return nil
		}
		open := map[string]bool{}
		r.mu.Lock()
		live := slices.Clone(r.live)
		r.mu.Unlock()
		for _, p := range live {
			for aid := range r.openDeliveries(p) {
				open[aid] = true
			}
		}
		out := map[string]float64{}
		for _, z := range zs {
			if m, _ := z.Member.(string); !open[m] {
				out[m] = z.Score
			}
		}
		return out
	}
	first := orphans()
	time.Sleep(300 * time.Millisecond)
	for m, score := range orphans() {
		if _, ok := first[m]; ok {
			r.rdb.ZAddXX(ctx, key, redis.Z{Member: m, Score: score - 60})
		}
	}
}

// openDeliveries returns the asynq IDs of the tasks p's handlers are
// running, as its history says.
func (r *seedRun) openDeliveries(p *proc) map[string]bool {
	recs, _ := readFile(filepath.Join(r.dir, p.name+".jsonl"))
	n := map[string]int{}
	for _, rec := range recs {
		switch rec.Ev {
		case evDeliver:
			n[rec.AID]++
		case evReturn:
			n[rec.AID]--
		}
	}
	open := map[string]bool{}
	for aid, c := range n {
		if c > 0 {
			open[aid] = true
		}
	}
	return open
}

// drain waits until the queue holds no pending, active, scheduled or retry
// task; it reports false if it never does within drainTimeout, and what the
// queue held last, when it held any: "active 1 at 21.3s".
func (r *seedRun) drain() (bool, string) {
	insp := asynq.NewInspectorFromRedisClient(r.rdb)
	start := time.Now()
	deadline := start.Add(drainTimeout)
	quiet := 0
	last := ""
	for time.Now().Before(deadline) {
		qi, err := insp.GetQueueInfo(r.queue)
		if err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0 {
			quiet++
			if quiet == 5 {
				return true, last
			}
		} else {
			quiet = 0
			if err == nil {
				last = fmt.Sprintf("pending %d active %d scheduled %d retry %d at %.1fs", qi.Pending, qi.Active, qi.Scheduled, qi.Retry, time.Since(start).Seconds())
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false, last
}

// recordLeft records, for the reader of a run that did not drain, every
// task still in the queue: its state, when it is next due, how often it
// was retried and its last error.
func (r *seedRun) recordLeft() {
	insp := asynq.NewInspectorFromRedisClient(r.rdb)
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		insp.ListPendingTasks, insp.ListActiveTasks, insp.ListScheduledTasks, insp.ListRetryTasks,
	} {
		infos, _ := list(r.queue)
		for _, info := range infos {
			var p payload
			_ = json.Unmarshal(info.Payload, &p)
			rec := Record{Ev: evLeft, Task: p.ID, AID: info.ID, Fam: p.Fam, Key: p.K, N: p.N, Kind: info.State.String(), Retry: info.Retried, Err: info.LastErr}
			if !info.NextProcessAt.IsZero() {
				rec.Sent = info.NextProcessAt.UnixNano()
			}
			r.rec.add(rec)
		}
	}
}

// keyTTL is a key left under the run's lock key prefix, its TTL, its type,
// and how many members of it (a sorted set) are scored after the Redis
// server's clock in milliseconds: in a holders key, live holders (a holders
// key in the plain form, a string, has one unless it is a record of
// the last token, "~<token>" or "~<token>.").
type keyTTL struct {
	Key  string
	TTL  time.Duration // -1: none
	Type string
	Live int
	// Released: a holders key in the plain form holding a plain release's
	// record, "~<token>.", kept for the client's retry window.
	Released bool
	// Members: a parked queue's entries (P{K}:k), for the reader of a
	// failing seed (parked.txt); not read by the checkers.
	Members []string
}

// keysLeft lists the keys under the run's lock key prefix.
func (r *seedRun) keysLeft() ([]keyTTL, error) {
	ctx := context.Background()
	now, err := r.rdb.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var out []keyTTL
	err = eachMaster(ctx, r.rdb, func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, r.prefix+"*", 200).Iterator()
		for iter.Next(ctx) {
			k := keyTTL{Key: iter.Val()}
			var err error
			if k.TTL, err = c.PTTL(ctx, k.Key).Result(); err != nil {
				return err
			}
			if k.TTL == -2*time.Nanosecond || k.TTL == -2*time.Millisecond {
				continue // it expired between SCAN and PTTL: gone
			}
			if k.Type, err = c.Type(ctx, k.Key).Result(); err != nil {
				return err
			}
			switch {
			case k.Type == "zset":
				live, err := c.ZCount(ctx, k.Key, fmt.Sprintf("(%d", now.UnixMilli()), "+inf").Result()
				if err != nil {
					return err
				}
				k.Live = int(live)
				if strings.HasSuffix(k.Key, "}:k") {
					if k.Members, err = c.ZRange(ctx, k.Key, 0, -1).Result(); err != nil {
						return err
					}
				}
			case k.Type == "string" && strings.HasSuffix(k.Key, ":h"):
				v, err := c.Get(ctx, k.Key).Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					return err
				}
				if err == nil && !strings.HasPrefix(v, "~") {
					k.Live = 1
				}
				k.Released = err == nil && strings.HasPrefix(v, "~") && strings.HasSuffix(v, ".")
			}
			mu.Lock()
			out = append(out, k)
			mu.Unlock()
		}
		return iter.Err()
	})
	slices.SortFunc(out, func(a, b keyTTL) int { return strings.Compare(a.Key, b.Key) })
	return out, err
}

// readFile reads one history file.
func readFile(name string) ([]Record, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec Record
		if json.Unmarshal(sc.Bytes(), &rec) == nil {
			out = append(out, rec)
		}
	}
	return out, sc.Err()
}
