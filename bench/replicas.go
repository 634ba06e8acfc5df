package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/redis/go-redis/v9"
)

// replicaAckTimeout is the timeout of the measured WithReplicaAcks.
const replicaAckTimeout = 100 * time.Millisecond

// completeKeep is how long the Complete row's releases record their labels;
// the report calls it time.Minute.
const completeKeep = time.Minute

// ackSetting is one of the two Lockers the replicas section compares.
type ackSetting struct {
	name string // as the report shows it
	opt  lockkit.Option
}

var ackSettings = []ackSetting{
	{"WithReplicaAcks(0)", lockkit.WithReplicaAcks(0, 0)},
	{fmt.Sprintf("WithReplicaAcks(1, %s)", replicaAckTimeout), lockkit.WithReplicaAcks(1, replicaAckTimeout)},
}

// ackCycleResult is one setting's uncontended cycles with one kind of
// release at one concurrency.
type ackCycleResult struct {
	release    string
	goroutines int
	setting    string
	cycles     int64     // measured cycles over all rounds
	rates      []float64 // cycles per second, per round
	// ratios is, per round, this setting's rate ÷ the first setting's in the
	// same round (set on the second setting's row).
	ratios     []float64
	acquires   []time.Duration // every measured acquire call, sorted
	per        counts          // commands and round trips over all rounds
	masterCPU  time.Duration
	replicaCPU time.Duration
	notAcked   int64 // writes not acknowledged within the timeout
}

func (r ackCycleResult) perCycle(n int64) float64 { return float64(n) / float64(r.cycles) }

// ackHandoffResult is one setting's contended hand-overs.
type ackHandoffResult struct {
	setting   string
	latencies []time.Duration // sorted
	waited    counts          // what the waiter sent over all measured hand-overs
	notAcked  int             // hand-overs not measured: a write was not acknowledged in time
}

// replicasResult is what the replicas section measured.
type replicasResult struct {
	servers  string // the master and replica, for the environment table
	cycles   []ackCycleResult
	handoffs []ackHandoffResult
}

// redisProc is a redis-server process started by the replicas section.
type redisProc struct {
	port int
	dir  string
	cmd  *exec.Cmd
}

func (p *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// startRedis starts a redis-server without persistence on a free loopback
// port, its files under dir, and waits until it answers.
func startRedis(ctx context.Context, dir string) (*redisProc, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &redisProc{port: l.Addr().(*net.TCPAddr).Port}
	_ = l.Close()
	p.dir = filepath.Join(dir, strconv.Itoa(p.port))
	if err := os.Mkdir(p.dir, 0o700); err != nil {
		return nil, err
	}
	p.cmd = exec.Command("redis-server", "--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
		"--dir", p.dir, "--logfile", filepath.Join(p.dir, "redis.log"))
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server (the replicas section starts its own): %w", err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			p.stop()
			log, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
			return nil, fmt.Errorf("redis-server on port %d did not start:\n%s", p.port, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p, nil
}

func (p *redisProc) stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// replicaPair is a master and one replica of it.
type replicaPair struct {
	dir             string
	master, replica *redisProc
}

// startReplicaPair starts two redis-servers, makes the second a replica of
// the first (REPLICAOF) and waits until the master lists it online.
func startReplicaPair(ctx context.Context) (_ *replicaPair, err error) {
	dir, err := os.MkdirTemp("", "jobguard-bench-replicas-")
	if err != nil {
		return nil, err
	}
	p := &replicaPair{dir: dir}
	defer func() {
		if err != nil {
			p.stop()
		}
	}()
	if p.master, err = startRedis(ctx, dir); err != nil {
		return nil, err
	}
	if p.replica, err = startRedis(ctx, dir); err != nil {
		return nil, err
	}
	rc := redis.NewClient(&redis.Options{Addr: p.replica.addr()})
	defer rc.Close()
	if err := rc.ReplicaOf(ctx, "127.0.0.1", strconv.Itoa(p.master.port)).Err(); err != nil {
		return nil, fmt.Errorf("REPLICAOF: %w", err)
	}
	mc := redis.NewClient(&redis.Options{Addr: p.master.addr()})
	defer mc.Close()
	online := "port=" + strconv.Itoa(p.replica.port) + ",state=online"
	deadline := time.Now().Add(10 * time.Second)
	for {
		repl, err := mc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(repl, online) {
			return p, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the replica on port %d did not come online:\n%s", p.replica.port, repl)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *replicaPair) stop() {
	for _, s := range []*redisProc{p.replica, p.master} {
		if s != nil {
			s.stop()
		}
	}
	_ = os.RemoveAll(p.dir)
}

// ackLocker is a Locker on the master with one ackSetting, its counted
// client, and the two kinds of cycle measured.
type ackLocker struct {
	setting ackSetting
	ctr     *counter
	locker  *lib // the Locker: TryAcquire, Acquire, Release
	// plain and complete are the cycles measured: TryAcquire then Release,
	// and TryAcquire with a Label of its own then Complete(completeKeep).
	// A write that was not acknowledged in time is counted in notAcked, not
	// returned: the acquire gave the key back (the cycle's release is
	// skipped), the completing release happened.
	plain, complete *lib
	notAcked        atomic.Int64
}

// newAckLocker makes a Locker with setting s on a new counted client of addr;
// its keys start with prefix.
func (b *bench) newAckLocker(addr, prefix string, s ackSetting) (*ackLocker, error) {
	client, ctr := b.clientAt(addr)
	l, err := lockkit.NewRedis(client, lockkit.WithPrefix(prefix), s.opt)
	if err != nil {
		return nil, err
	}
	core, err := lockcore.Of("bench", l)
	if err != nil {
		return nil, err
	}
	a := &ackLocker{setting: s, ctr: ctr, locker: lockkitLib(l)}
	a.locker.name, a.locker.client = s.name, client
	var seq atomic.Int64
	completing := func(ctx context.Context, key string) (releaseFunc, error) {
		l, err := core.TryAcquire(ctx, key, &lockcore.AcquireOptions{Label: "run-" + strconv.FormatInt(seq.Add(1), 10)})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return l.Complete(ctx, completeKeep) }, nil
	}
	a.plain = &lib{name: s.name, client: client, try: a.countNotAcked(a.locker.try)}
	a.complete = &lib{name: s.name, client: client, try: a.countNotAcked(completing)}
	return a, nil
}

// countNotAcked returns try, and the releases it returns, counting an error
// matching ErrNotReplicated in a.notAcked instead of returning it.
func (a *ackLocker) countNotAcked(try func(context.Context, string) (releaseFunc, error)) func(context.Context, string) (releaseFunc, error) {
	return func(ctx context.Context, key string) (releaseFunc, error) {
		release, err := try(ctx, key)
		if errors.Is(err, lockkit.ErrNotReplicated) {
			a.notAcked.Add(1)
			return func(context.Context) error { return nil }, nil
		}
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			err := release(ctx)
			if errors.Is(err, lockkit.ErrNotReplicated) {
				a.notAcked.Add(1)
				return nil
			}
			return err
		}, nil
	}
}

// replicas measures what WithReplicaAcks costs, against a master with one
// replica that it starts and stops itself: uncontended cycles (a plain
// release, and a release that records a completion) and contended
// hand-overs, with and without waiting for the replica, the two settings
// alternating.
func (b *bench) replicas(ctx context.Context) (replicasResult, error) {
	var res replicasResult
	if _, err := exec.LookPath("redis-server"); err != nil {
		return res, fmt.Errorf("replicas: the section starts its own redis-servers: %w", err)
	}
	pair, err := startReplicaPair(ctx)
	if err != nil {
		return res, fmt.Errorf("replicas: %w", err)
	}
	defer pair.stop()
	madmin := redis.NewClient(&redis.Options{Addr: pair.master.addr()})
	defer madmin.Close()
	radmin := redis.NewClient(&redis.Options{Addr: pair.replica.addr()})
	defer radmin.Close()
	version := "?"
	if m, err := info(ctx, madmin, "server"); err == nil {
		version = m["redis_version"]
	}
	res.servers = fmt.Sprintf("redis-server %s: a master (%s) and one replica of it (%s), loopback, started by the section",
		version, pair.master.addr(), pair.replica.addr())

	prefix := b.prefix + "replicas:"
	lockers := make([]*ackLocker, len(ackSettings))
	for i, s := range ackSettings {
		if lockers[i], err = b.newAckLocker(pair.master.addr(), fmt.Sprintf("%scycle%d:", prefix, i), s); err != nil {
			return res, err
		}
		defer lockers[i].locker.close()
	}
	kinds := []struct {
		name string
		lib  func(*ackLocker) *lib
	}{
		{"`Release`", func(a *ackLocker) *lib { return a.plain }},
		{"`Complete(ctx, time.Minute)`, a `Label` per cycle", func(a *ackLocker) *lib { return a.complete }},
	}
	for _, a := range lockers {
		if err := a.locker.client.Ping(ctx).Err(); err != nil {
			return res, err
		}
		for _, k := range kinds {
			if _, err := runCycles(ctx, k.lib(a), b.goroutines, 50*b.goroutines); err != nil {
				return res, fmt.Errorf("%s: %w", a.setting.name, err)
			}
		}
	}
	for _, k := range kinds {
		for _, g := range []int{1, b.goroutines} {
			progress("replicas: %s, %d goroutines, %d rounds", k.name, g, b.replicaRounds)
			rows, err := b.ackCycles(ctx, lockers, k.lib, g, madmin, radmin)
			if err != nil {
				return res, err
			}
			for i := range rows {
				rows[i].release = k.name
			}
			res.cycles = append(res.cycles, rows...)
		}
	}
	progress("replicas: contended hand-over, %d per setting", b.handoffs)
	if res.handoffs, err = b.ackHandoffs(ctx, pair.master.addr(), prefix); err != nil {
		return res, err
	}
	return res, nil
}

// ackCycles runs, for each setting, b.replicaRounds rounds of b.cycles cycles
// on g goroutines, the settings one after the other in an order rotated
// every round.
func (b *bench) ackCycles(ctx context.Context, lockers []*ackLocker, kind func(*ackLocker) *lib, g int, madmin, radmin *redis.Client) ([]ackCycleResult, error) {
	res := make([]ackCycleResult, len(lockers))
	for i, a := range lockers {
		res[i].setting, res[i].goroutines = a.setting.name, g
	}
	n := int64(b.cycles / g * g)
	for round := range b.replicaRounds {
		rates := make([]float64, len(lockers))
		for j := range lockers {
			i := (j + round) % len(lockers)
			a, r := lockers[i], &res[i]
			m0, r0, err := serversCPU(ctx, madmin, radmin)
			if err != nil {
				return nil, err
			}
			c0, na0 := a.ctr.counts(), a.notAcked.Load()
			elapsed, err := runTimedCycles(ctx, kind(a), g, b.cycles, &r.acquires)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", a.setting.name, err)
			}
			c := a.ctr.counts().sub(c0)
			r.notAcked += a.notAcked.Load() - na0
			m1, r1, err := serversCPU(ctx, madmin, radmin)
			if err != nil {
				return nil, err
			}
			r.cycles += n
			r.per = r.per.add(c)
			r.masterCPU += m1 - m0
			r.replicaCPU += r1 - r0
			rates[i] = float64(n) / elapsed.Seconds()
			r.rates = append(r.rates, rates[i])
		}
		for i := 1; i < len(lockers); i++ {
			res[i].ratios = append(res[i].ratios, rates[i]/rates[0])
		}
	}
	for i := range res {
		slices.Sort(res[i].acquires)
	}
	return res, nil
}

// serversCPU returns the CPU time the master and the replica have used.
func serversCPU(ctx context.Context, master, replica *redis.Client) (m, r time.Duration, err error) {
	if m, err = redisCPU(ctx, master); err != nil {
		return 0, 0, err
	}
	r, err = redisCPU(ctx, replica)
	return m, r, err
}

// ackHandoffs measures b.handoffs hand-overs per setting (after one
// unmeasured each), the settings alternating hand-over by hand-over in an
// order rotated every time; holder and waiter of each setting are Lockers
// of their own on clients of their own. A hand-over in which a write was
// not acknowledged in time is counted and not measured.
func (b *bench) ackHandoffs(ctx context.Context, addr, prefix string) ([]ackHandoffResult, error) {
	type pair struct{ holder, waiter *ackLocker }
	pairs := make([]pair, len(ackSettings))
	res := make([]ackHandoffResult, len(ackSettings))
	for i, s := range ackSettings {
		p := fmt.Sprintf("%shandoff%d:", prefix, i)
		h, err := b.newAckLocker(addr, p, s)
		if err != nil {
			return nil, err
		}
		defer h.locker.close()
		w, err := b.newAckLocker(addr, p, s)
		if err != nil {
			return nil, err
		}
		defer w.locker.close()
		pairs[i] = pair{h, w}
		res[i].setting = s.name
	}
	const key = "handoff"
	for n := -1; n < b.handoffs; n++ {
		for j := range pairs {
			i := (j + n + 1) % len(pairs)
			p := pairs[i]
			latency, waited, err := handover(ctx, p.holder.locker, p.waiter.locker, p.waiter.ctr, key, b.spread)
			switch {
			case errors.Is(err, lockkit.ErrNotReplicated):
				res[i].notAcked++
			case err != nil:
				return nil, fmt.Errorf("%s: %w", ackSettings[i].name, err)
			case n >= 0:
				res[i].latencies = append(res[i].latencies, latency)
				res[i].waited = res[i].waited.add(waited)
			}
		}
	}
	for i := range res {
		slices.Sort(res[i].latencies)
	}
	return res, nil
}

// replicasSection renders the replicas section's tables and notes.
func (r *report) replicasSection() string {
	var w strings.Builder
	x := r.replicasRes
	base := func(c ackCycleResult) ackCycleResult {
		for _, o := range x.cycles {
			if o.release == c.release && o.goroutines == c.goroutines && o.setting == ackSettings[0].name {
				return o
			}
		}
		return c
	}
	ratio := func(a, b float64) string { return fmt.Sprintf("%.2f", a/b) }
	var rows [][]string
	for _, c := range x.cycles {
		p50, p99 := nearestRank(c.acquires, 0.5), nearestRank(c.acquires, 0.99)
		cpu := time.Duration(c.perCycle(int64(c.masterCPU)))
		rateRatio, latRatio, cpuRatio := "–", "–", "–"
		if o := base(c); o.setting != c.setting {
			rateRatio = ratio(median(c.ratios), 1)
			latRatio = ratio(float64(p50), float64(nearestRank(o.acquires, 0.5))) + " / " +
				ratio(float64(p99), float64(nearestRank(o.acquires, 0.99)))
			cpuRatio = ratio(float64(cpu), o.perCycle(int64(o.masterCPU)))
		}
		rows = append(rows, []string{
			c.release,
			fmt.Sprint(c.goroutines),
			"`" + c.setting + "`",
			fmt.Sprintf("%.0f", median(c.rates)),
			rateRatio,
			us(p50),
			us(p99),
			latRatio,
			fmt.Sprintf("%.2f", c.perCycle(c.per.rts)),
			fmt.Sprintf("%.2f", c.perCycle(c.per.cmds)),
			us(cpu),
			us(time.Duration(c.perCycle(int64(c.replicaCPU)))),
			cpuRatio,
			fmt.Sprint(c.notAcked),
		})
	}
	table(&w, []string{"release", "goroutines", "Locker", "cycles/s", "with ÷ without (cycles/s)", "acquire p50", "acquire p99",
		"with ÷ without (acquire p50 / p99)", "round trips/cycle", "commands/cycle", "master CPU/cycle", "replica CPU/cycle",
		"with ÷ without (master CPU)", "writes not acknowledged in time"}, rows)

	rows = nil
	for _, h := range x.handoffs {
		n := float64(len(h.latencies))
		p50, p99 := nearestRank(h.latencies, 0.5), nearestRank(h.latencies, 0.99)
		lat := "–"
		if o := x.handoffs[0]; o.setting != h.setting {
			lat = ratio(float64(p50), float64(nearestRank(o.latencies, 0.5))) + " / " +
				ratio(float64(p99), float64(nearestRank(o.latencies, 0.99)))
		}
		rows = append(rows, []string{
			"`" + h.setting + "`",
			fmt.Sprint(len(h.latencies)),
			msec(p50),
			msec(nearestRank(h.latencies, 0.9)),
			msec(p99),
			msec(nearestRank(h.latencies, 1)),
			lat,
			fmt.Sprintf("%.1f", float64(h.waited.rts)/n),
			fmt.Sprintf("%.1f", float64(h.waited.cmds)/n),
			fmt.Sprint(h.notAcked),
		})
	}
	table(&w, []string{"Locker", "hand-overs", "p50", "p90", "p99", "max", "with ÷ without (p50 / p99)",
		"waiter round trips/hand-over", "waiter commands/hand-over", "hand-overs not acknowledged in time"}, rows)
	fmt.Fprintf(&w, "With `%s` each write of a lease is sent with `WAIT 1 %d` after it in the same pipeline, on the "+
		"master: one round trip still, one command more, and the reply comes once the replica has acknowledged the "+
		"write. The acquire always waits; a plain `Release` records nothing and does not; `Complete` records the label's "+
		"completion and waits. In a hand-over the waiter confirms the lease the release gave it with a write of its "+
		"own, acknowledged (the extend script and `WAIT`): one round trip more before its `Acquire` returns. The "+
		"`Complete` row's labels are remembered for a minute each in their key's sorted set, so each goroutine's key "+
		"carries the completions of its last minute of cycles (the acquire's check of its own label is one ZSCORE).\n\n",
		ackSettings[1].name, replicaAckTimeout.Milliseconds())
	w.WriteString("This section runs only when named (it starts two redis-servers of its own; `make bench` leaves it out): " +
		"`tools/with-redis.sh sh -c 'cd bench && go run . -only replicas -out /tmp/replicas.md'` from the repository's root.\n\n")
	return w.String()
}
