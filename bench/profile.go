package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/singleton"
)

// profile is where one measured run spent its time: the benchmark process's
// CPU by category (from a CPU profile) and Redis's command time by command.
type profile struct {
	what  string // what ran, for the report
	units int    // cycles or tasks it ran
	unit  string // "cycle", "task"
	// cats is the process's sampled CPU per category, largest first.
	cats []share
	// total is the process's sampled CPU time.
	total time.Duration
	// cmds is Redis's execution time per command over the run, largest
	// first ("evalsha" includes the commands the scripts call, listed too).
	cmds []share
}

type share struct {
	name string
	d    time.Duration
	n    int64 // calls, for commands
}

// profiled runs fn under the CPU profiler and with Redis's command
// statistics reset around it, and summarizes both.
func (b *bench) profiled(ctx context.Context, what, unit string, units int, fn func() error) (profile, error) {
	p := profile{what: what, unit: unit, units: units}
	before, err := commandStats(ctx, b.admin)
	if err != nil {
		return p, err
	}
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return p, err
	}
	err = fn()
	pprof.StopCPUProfile()
	if err != nil {
		return p, err
	}
	after, err := commandStats(ctx, b.admin)
	if err != nil {
		return p, err
	}
	for name, a := range after {
		c := a.sub(before[name])
		if c.n > 0 && name != "info" {
			p.cmds = append(p.cmds, share{name: name, d: c.d, n: c.n})
		}
	}
	slices.SortFunc(p.cmds, func(x, y share) int { return int(y.d - x.d) })
	p.cats, p.total, err = categorize(buf.Bytes())
	return p, err
}

// commandStats reads INFO commandstats: calls and time per command.
func commandStats(ctx context.Context, c *redis.Client) (map[string]share, error) {
	m, err := info(ctx, c, "commandstats")
	if err != nil {
		return nil, err
	}
	out := make(map[string]share)
	for k, v := range m {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		var s share
		for _, f := range strings.Split(v, ",") {
			key, val, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			switch key {
			case "calls":
				s.n = n
			case "usec":
				s.d = time.Duration(n) * time.Microsecond
			}
		}
		out[name] = s
	}
	return out, nil
}

func (s share) sub(o share) share { return share{name: s.name, d: s.d - o.d, n: s.n - o.n} }

// categories group a profile's functions, first match wins.
var categories = []struct {
	name  string
	match func(fn string) bool
}{
	{"system calls (socket reads and writes, thread wake-ups)", func(fn string) bool {
		return strings.Contains(fn, "syscall") || strings.HasPrefix(fn, "internal/poll") ||
			strings.HasPrefix(fn, "runtime.netpoll") || strings.HasPrefix(fn, "runtime.futex")
	}},
	{"go-redis (command building, RESP encoding and parsing, connection pool)", func(fn string) bool {
		return strings.HasPrefix(fn, "github.com/redis/go-redis")
	}},
	{"jobguard (lockkit, middleware, singleton)", func(fn string) bool { return strings.HasPrefix(fn, "github.com/jobguard") }},
	{"asynq", func(fn string) bool { return strings.HasPrefix(fn, "github.com/hibiken/asynq") }},
	{"allocation and garbage collection", func(fn string) bool {
		for _, p := range []string{"runtime.malloc", "runtime.gc", "runtime.(*mspan)", "runtime.scanobject", "runtime.greyobject",
			"runtime.(*gcWork)", "runtime.sweep", "runtime.(*sweepLocked)", "runtime.(*mheap)", "runtime.(*mcache)",
			"runtime.(*mcentral)", "runtime.memclr", "runtime.heapBits", "runtime.writeHeapBits", "runtime.nextFreeFast",
			"runtime.markBits", "runtime.findObject", "runtime.wbBuf", "runtime.bulkBarrier", "runtime.newobject",
			"runtime.makeslice", "runtime.growslice", "runtime.rawstring", "runtime.(*gcControllerState)", "runtime.typePointers"} {
			if strings.HasPrefix(fn, p) {
				return true
			}
		}
		return false
	}},
	{"Go scheduler and other runtime", func(fn string) bool {
		return strings.HasPrefix(fn, "runtime.") || strings.HasPrefix(fn, "internal/runtime")
	}},
	{"standard library and other", func(string) bool { return true }},
}

// categorize sums a CPU profile's flat time per category, with `go tool
// pprof -top` reading the profile (it is self-describing: no binary needed).
func categorize(prof []byte) ([]share, time.Duration, error) {
	dir, err := os.MkdirTemp("", "jobguard-bench-profile")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "cpu.pprof")
	if err := os.WriteFile(path, prof, 0o600); err != nil {
		return nil, 0, err
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=100000", "-unit=us", path).Output()
	if err != nil {
		return nil, 0, fmt.Errorf("go tool pprof: %w", err)
	}
	sums := make(map[string]time.Duration)
	var total time.Duration
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[0], "us") {
			continue
		}
		us, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "us"), 64)
		if err != nil {
			continue
		}
		d := time.Duration(us * float64(time.Microsecond))
		fn := strings.Join(f[5:], " ")
		for _, c := range categories {
			if c.match(fn) {
				sums[c.name] += d
				break
			}
		}
		total += d
	}
	var cats []share
	for name, d := range sums {
		cats = append(cats, share{name: name, d: d})
	}
	slices.SortFunc(cats, func(x, y share) int { return int(y.d - x.d) })
	return cats, total, nil
}

// profileCycles profiles lockkit's uncontended acquire+release cycle, with
// b.goroutines goroutines.
func (b *bench) profileCycles(ctx context.Context) (profile, error) {
	client, _ := b.client()
	l, err := newLib("lockkit", client, b.prefix+"profile:")
	if err != nil {
		return profile{}, err
	}
	defer l.close()
	if _, err := runCycles(ctx, l, b.goroutines, 50*b.goroutines); err != nil {
		return profile{}, err
	}
	n := b.cycles / b.goroutines * b.goroutines
	return b.profiled(ctx, fmt.Sprintf("lockkit uncontended TryAcquire+Release, %d goroutines", b.goroutines), "cycle", n, func() error {
		_, err := runCycles(ctx, l, b.goroutines, n)
		return err
	})
}

// profileGuarded profiles one asynq server processing b.tputTasks no-op
// tasks behind singleton.Middleware (the throughput section's guarded
// no-op run).
func (b *bench) profileGuarded(ctx context.Context, env *asynqEnv) (profile, error) {
	srvClient, srvCtr := b.client()
	lockClient, lockCtr := b.client()
	q := env.queue("profile")
	if _, err := env.enqueue(ctx, q, b.tputTasks, func(i int) *asynq.Task {
		return asynq.NewTask("bench:work", fmt.Appendf(nil, `{"n":%d}`, i))
	}); err != nil {
		return profile{}, err
	}
	defer env.deleteQueue(q)
	locker, err := lockkit.NewRedis(lockClient, lockkit.WithPrefix(b.prefix+"e2e:"))
	if err != nil {
		return profile{}, err
	}
	defer locker.Close(ctx)
	guard, err := singleton.Middleware(locker, singleton.KeyByPayload())
	if err != nil {
		return profile{}, err
	}
	t := newTally(b.tputTasks)
	h := guard(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	return b.profiled(ctx, fmt.Sprintf("asynq server (Concurrency %d) with singleton.Middleware, no-op handler", b.concurrency), "task", b.tputTasks, func() error {
		st, err := env.serve(ctx, srvClient, srvCtr, lockCtr, serverConfig(q, b.concurrency), countTasks(h, t), t, b.e2eTimeout)
		if err == nil && !st.finished {
			err = fmt.Errorf("profile: %d of %d tasks in %s", t.n.Load(), b.tputTasks, b.e2eTimeout)
		}
		return err
	})
}

// profileSection renders the profiles.
func (r *report) profileSection() string {
	var w strings.Builder
	w.WriteString("Where the time goes: the benchmark process's CPU profile (`runtime/pprof`, flat time summed by " +
		"category of function) and Redis's own execution time per command (`INFO commandstats`, reset around the run; " +
		"`evalsha` is the scripts' whole time, and the commands they call are listed again under their own names). " +
		"Each run is separate from the measured rounds above.\n\n")
	for _, p := range r.profiles {
		fmt.Fprintf(&w, "**%s** (%d %ss)\n\n", p.what, p.units, p.unit)
		var rows [][]string
		for _, c := range p.cats {
			rows = append(rows, []string{c.name, usPer(c.d, p.units), pct(c.d, p.total)})
		}
		table(&w, []string{"process CPU", "µs per " + p.unit, "share"}, rows)
		rows = nil
		for i, c := range p.cmds {
			if i == 12 {
				break
			}
			rows = append(rows, []string{"`" + c.name + "`", fmt.Sprintf("%.2f", float64(c.n)/float64(p.units)), usPer(c.d, p.units)})
		}
		table(&w, []string{"Redis command", "calls per " + p.unit, "µs per " + p.unit}, rows)
	}
	return w.String()
}

func usPer(d time.Duration, n int) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Microsecond)/float64(max(n, 1)))
}

func pct(d, total time.Duration) string {
	if total <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(d)/float64(total))
}
