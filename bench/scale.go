package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// How cost grows as work grows: each curve at sizes spanning 100×, on one
// Locker of default options.

// keysPoint is one run of cycles on distinct keys.
type keysPoint struct {
	lease    string // the lease's kind: "plain", or "parking" (Requeue's)
	cycles   int
	wall     time.Duration
	cmdTime  time.Duration // Redis time in the scripts, per cycle
	keysLeft int64         // keys the run left, right after it
	memLeft  int64         // used_memory after − before (bytes)
	baseline time.Duration // until the keys were back to where they began
}

// parkPoint is one key with many parked jobs.
type parkPoint struct {
	parked         int
	perPark        time.Duration // Redis time per parking acquire
	perResume      time.Duration // Redis time per release that reserves + adopt
	resumeRTs      float64       // round trips per resume (release + adopt)
	parkedMemBytes int64         // MEMORY USAGE of the parked queue
}

// listPoint is Keys over many held leases.
type listPoint struct {
	held      int
	wall      time.Duration // per Keys call (median of 3)
	cmds, rts int64         // per Keys call
	cmdTime   time.Duration // Redis time per Keys call
}

type scaleResult struct {
	window  time.Duration
	renewed []renewalResult
	keys    []keysPoint
	parked  []parkPoint
	lists   []listPoint
}

// parseSizes parses a comma-separated list of positive sizes; "" is none.
func parseSizes(s string) ([]int, error) {
	var out []int
	if s == "" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("invalid size %q in %q", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// inParallel calls fn(0) … fn(n-1) on 8 goroutines and returns the first
// error; a goroutine stops at its first error.
func inParallel(n int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// scaleNames are the commands the Locker's scripts run as, for commandstats.
var scaleNames = []string{"evalsha", "eval"}

func (b *bench) scale(ctx context.Context) (scaleResult, error) {
	var res scaleResult
	c, _ := b.client()
	o := c.Options()
	read := o.ReadTimeout
	if read <= 0 {
		read = 3 * time.Second
	}
	res.window = time.Duration(max(o.MaxRetries, 0)+1) * (read + max(o.MaxRetryBackoff, 0))
	for _, lease := range []string{"plain", "parking"} {
		for _, n := range b.scaleKeys {
			progress("scale: %d cycles of %s leases on distinct keys", n, lease)
			p, err := b.scaleDistinct(ctx, n, lease, res.window)
			if err != nil {
				return res, err
			}
			res.keys = append(res.keys, p)
		}
	}
	for _, n := range b.scaleRenewed {
		progress("scale: %d leases renewed by one Locker", n)
		leases := b.leases
		b.leases = n
		rr, err := b.renewal(ctx)
		b.leases = leases
		if err != nil {
			return res, err
		}
		res.renewed = append(res.renewed, rr)
	}
	for _, n := range b.scaleParked {
		progress("scale: %d parked jobs on one key", n)
		p, err := b.scalePark(ctx, n)
		if err != nil {
			return res, err
		}
		res.parked = append(res.parked, p)
	}
	for _, n := range b.scaleHeld {
		progress("scale: Keys over %d held leases", n)
		p, err := b.scaleList(ctx, n)
		if err != nil {
			return res, err
		}
		res.lists = append(res.lists, p)
	}
	return res, nil
}

// dbKeys is the number of keys in the Redis under test.
func (b *bench) dbKeys(ctx context.Context) (int64, error) { return b.admin.DBSize(ctx).Result() }

func (b *bench) usedMemory(ctx context.Context) (int64, error) {
	m, err := info(ctx, b.admin, "memory")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(m["used_memory"], 10, 64)
}

// scaleDistinct runs n acquire+release cycles, each on a key of its own, on
// 8 goroutines, then waits for the keys to expire.
func (b *bench) scaleDistinct(ctx context.Context, n int, lease string, window time.Duration) (keysPoint, error) {
	p := keysPoint{lease: lease, cycles: n}
	opt := func(int) *lockcore.AcquireOptions { return &lockcore.AcquireOptions{NoRenew: true} }
	if lease == "parking" {
		// As singleton's Requeue takes a task's key: the lease parks
		// duplicates (its own id), so it lives in the sorted set.
		opt = func(i int) *lockcore.AcquireOptions {
			id := "task-" + strconv.Itoa(i)
			return &lockcore.AcquireOptions{NoRenew: true, Label: id, TakeReservation: true,
				Park: &lockcore.Parking{ID: id, OnParked: func(string, string) {}}}
		}
	}
	c, _ := b.client()
	l, err := lockcore.NewRedis(c, lockcore.WithPrefix(b.prefix+"scale:"))
	if err != nil {
		return p, err
	}
	defer l.Close(ctx)
	keys0, err := b.dbKeys(ctx)
	if err != nil {
		return p, err
	}
	mem0, err := b.usedMemory(ctx)
	if err != nil {
		return p, err
	}
	t0, err := redisCmdTime(ctx, b.admin, scaleNames)
	if err != nil {
		return p, err
	}
	run := fmt.Sprintf("d%s%d:", lease, n)
	start := time.Now()
	err = inParallel(n, func(i int) error {
		lease, err := l.TryAcquire(ctx, run+strconv.Itoa(i), opt(i))
		if err == nil {
			err = lease.Release(ctx)
		}
		return err
	})
	p.wall = time.Since(start)
	if err != nil {
		return p, err
	}
	t1, err := redisCmdTime(ctx, b.admin, scaleNames)
	if err != nil {
		return p, err
	}
	p.cmdTime = (t1 - t0) / time.Duration(n)
	keys1, err := b.dbKeys(ctx)
	if err != nil {
		return p, err
	}
	mem1, err := b.usedMemory(ctx)
	if err != nil {
		return p, err
	}
	p.keysLeft, p.memLeft = keys1-keys0, mem1-mem0
	// Redis expires keys lazily and in sampled sweeps: poll until the count
	// is back, for at most the window and 30 s more.
	done := time.Now()
	for {
		k, err := b.dbKeys(ctx)
		if err != nil {
			return p, err
		}
		if k <= keys0 {
			p.baseline = time.Since(done)
			return p, nil
		}
		if time.Since(done) > window+30*time.Second {
			return p, fmt.Errorf("scale: %d keys left %s after the run", k-keys0, time.Since(done).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scalePark parks n jobs on one held key, then resumes them one by one: each
// release reserves the key for the oldest parked job, whose acquire adopts
// the reservation and releases in turn.
func (b *bench) scalePark(ctx context.Context, n int) (parkPoint, error) {
	p := parkPoint{parked: n}
	c, ctr := b.client()
	l, err := lockcore.NewRedis(c, lockcore.WithPrefix(b.prefix+"scale:"))
	if err != nil {
		return p, err
	}
	defer l.Close(ctx)
	key := fmt.Sprintf("parked-%d", n)
	ids := make(chan string, 1)
	onParked := func(_, id string) { ids <- id }
	opt := func(label, park string, adopt bool) *lockcore.AcquireOptions {
		return &lockcore.AcquireOptions{Label: label, TakeReservation: adopt, Park: &lockcore.Parking{ID: park, OnParked: onParked}, NoRenew: true}
	}
	holder, err := l.TryAcquire(ctx, key, opt("holder", "holder", false))
	if err != nil {
		return p, err
	}
	t0, err := redisCmdTime(ctx, b.admin, scaleNames)
	if err != nil {
		return p, err
	}
	for i := range n {
		id := strconv.Itoa(i)
		_, err := l.TryAcquire(ctx, key, opt(id, id, false))
		if !errors.Is(err, lockcore.ErrNotAcquired) {
			return p, fmt.Errorf("scale: park %d: %v", i, err)
		}
	}
	t1, err := redisCmdTime(ctx, b.admin, scaleNames)
	if err != nil {
		return p, err
	}
	// The parked queue's key (see *lockkit.Locker's layout).
	mem, err := b.admin.MemoryUsage(ctx, b.prefix+"scale:{"+key+"}:k").Result()
	if err != nil {
		return p, err
	}
	p.perPark, p.parkedMemBytes = (t1-t0)/time.Duration(n), mem
	c0 := ctr.counts()
	lease := holder
	for i := range n {
		if err := lease.Release(ctx); err != nil {
			return p, err
		}
		var id string
		select {
		case id = <-ids:
		case <-time.After(10 * time.Second):
			return p, fmt.Errorf("scale: resume %d: no parked job was handed the key", i)
		}
		if lease, err = l.TryAcquire(ctx, key, opt(id, "", true)); err != nil {
			return p, fmt.Errorf("scale: adopt %s: %w", id, err)
		}
	}
	if err := lease.Release(ctx); err != nil {
		return p, err
	}
	t2, err := redisCmdTime(ctx, b.admin, scaleNames)
	if err != nil {
		return p, err
	}
	rts := ctr.counts().sub(c0).rts
	p.perResume, p.resumeRTs = (t2-t1)/time.Duration(n), float64(rts)/float64(n)
	return p, nil
}

// scaleList holds n leases on one Locker and times Keys over them.
func (b *bench) scaleList(ctx context.Context, n int) (listPoint, error) {
	p := listPoint{held: n}
	c, _ := b.client()
	prefix := fmt.Sprintf("%sscale-list-%d:", b.prefix, n)
	l, err := lockcore.NewRedis(c, lockcore.WithPrefix(prefix))
	if err != nil {
		return p, err
	}
	defer l.Close(ctx)
	if err := inParallel(n, func(i int) error {
		_, err := l.TryAcquire(ctx, "held-"+strconv.Itoa(i), &lockcore.AcquireOptions{TTL: 10 * time.Minute, NoRenew: true})
		return err
	}); err != nil {
		return p, err
	}
	lc, ctr := b.client()
	lister, err := lockcore.NewRedis(lc, lockcore.WithPrefix(prefix))
	if err != nil {
		return p, err
	}
	defer lister.Close(ctx)
	var walls []float64
	var cmds, rts int64
	var cmdTime time.Duration
	for range 3 {
		c0 := ctr.counts()
		t0, err := redisCmdTime(ctx, b.admin, []string{"scan", "evalsha", "eval"})
		if err != nil {
			return p, err
		}
		start := time.Now()
		keys, err := lister.Keys(ctx, "*")
		if err != nil {
			return p, err
		}
		walls = append(walls, float64(time.Since(start)))
		if len(keys) != n {
			return p, fmt.Errorf("scale: Keys listed %d of %d held keys", len(keys), n)
		}
		t1, err := redisCmdTime(ctx, b.admin, []string{"scan", "evalsha", "eval"})
		if err != nil {
			return p, err
		}
		d := ctr.counts().sub(c0)
		cmds, rts, cmdTime = d.cmds, d.rts, t1-t0
	}
	p.wall, p.cmds, p.rts, p.cmdTime = time.Duration(median(walls)), cmds, rts, cmdTime
	return p, nil
}

// scaleSection writes the scale curves.
func (r *report) scaleSection() string {
	var w strings.Builder
	x := r.scaleRes
	if len(x.keys) > 0 {
		fmt.Fprintf(&w, "Acquire+release cycles (`TryAcquire` + `Release`), each on a key of its own, 8 goroutines on one "+
			"Locker: what the run leaves in Redis right after it (`DBSIZE` and `used_memory`, after − before), and how long "+
			"until the key count is back where it began (the Locker's client's retry window is %s with go-redis' defaults; "+
			"Redis expires keys in sampled sweeps, so the last ones go a little later). A released lock leaves one key, its "+
			"holders key with its last token and the record of its release, for the window: a run longer than the window "+
			"holds at its end about one key per cycle of the last window (cycles/s × window), whatever the run's length; their memory is "+
			"what a steady stream of that many tasks per second keeps. Lease: a plain lock (what the default Skip policy takes), "+
			"or a parking one (`Label`, `Park`, `TakeReservation`: what Requeue takes), which lives in the sorted-set form.\n\n", x.window)
		var rows [][]string
		for _, p := range x.keys {
			rate := float64(p.cycles) / p.wall.Seconds()
			rows = append(rows, []string{p.lease, fmt.Sprint(p.cycles), fmt.Sprintf("%.0f", rate),
				us(p.cmdTime), fmt.Sprint(p.keysLeft), fmt.Sprintf("%.0f", min(float64(p.cycles), rate*x.window.Seconds())),
				fmt.Sprintf("%.2f", float64(p.keysLeft)/float64(p.cycles)),
				fmt.Sprintf("%.1f MB", float64(p.memLeft)/1e6), fmt.Sprintf("%.0f", float64(p.memLeft)/float64(p.cycles)),
				p.baseline.Round(100 * time.Millisecond).String()})
		}
		table(&w, []string{"lease", "cycles", "cycles/s", "Redis script time/cycle", "keys left right after",
			"one key per cycle of the last window (cycles/s × window)", "keys left/cycle",
			"memory left", "bytes left/cycle", "back to the baseline after"}, rows)
		w.WriteString("\n")
	}
	if len(x.renewed) > 0 {
		w.WriteString("Leases held and renewed by one Locker (the renewal section's method at each size: TTL " +
			"3 s, renewed every second, up to 100 leases per pipeline; the measured ticks' averages).\n\n")
		var rows [][]string
		for _, rr := range x.renewed {
			n := time.Duration(rr.leases)
			rows = append(rows, []string{fmt.Sprint(rr.leases), fmt.Sprintf("%.1f", rr.rtsPerTick), fmt.Sprintf("%.0f", rr.cmdsPerTick),
				fmt.Sprintf("%.2f µs", float64(rr.cpuPerTick/n)/1e3), fmt.Sprintf("%.2f µs", float64(rr.redis.cpu/n)/1e3),
				fmt.Sprint(rr.goroutinesHolding - rr.goroutinesBefore), fmt.Sprint(rr.lost)})
		}
		table(&w, []string{"leases", "round trips per tick", "commands per tick", "process CPU per lease per tick",
			"Redis CPU per lease per tick", "goroutines added", "leases lost"}, rows)
		w.WriteString("\n")
	}
	if len(x.parked) > 0 {
		w.WriteString("Parked jobs on one held key (`AcquireOptions.Park`, each with its own `Label`): the Redis time of each " +
			"parking `TryAcquire`, then of each resume, the release that reserves the key for the oldest parked job plus " +
			"that job's `TakeReservation` acquire, one after the other until the queue is empty.\n\n")
		var rows [][]string
		for _, p := range x.parked {
			rows = append(rows, []string{fmt.Sprint(p.parked), us(p.perPark), us(p.perResume), fmt.Sprintf("%.1f", p.resumeRTs),
				fmt.Sprintf("%.0f", float64(p.parkedMemBytes)/float64(p.parked))})
		}
		table(&w, []string{"parked jobs", "Redis time per park", "Redis time per resume", "round trips per resume",
			"parked queue's memory per job (bytes)"}, rows)
		w.WriteString("\n")
	}
	if len(x.lists) > 0 {
		w.WriteString("`Locker.Keys(\"*\")` (what `jobguard ls` calls) over held leases of one prefix, each a plain lock: " +
			"median wall of 3 calls, and per call the commands and round trips sent and the Redis time in SCAN and the " +
			"inspect script.\n\n")
		var rows [][]string
		for _, p := range x.lists {
			rows = append(rows, []string{fmt.Sprint(p.held), msec(p.wall), fmt.Sprint(p.cmds), fmt.Sprint(p.rts), msec(p.cmdTime),
				fmt.Sprintf("%.2f µs", float64(p.cmdTime)/float64(time.Microsecond)/float64(p.held))})
		}
		table(&w, []string{"held leases", "wall per call", "commands", "round trips", "Redis time", "Redis time per held key"}, rows)
		w.WriteString("\n")
	}
	return w.String()
}
