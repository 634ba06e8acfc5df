package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
)

// scenario is a way of killing the master of a lease's key: right after one
// of the lease's writes (its acquire, its release, or a renewal while a
// lockkit.Do runs). Natural timing kills it as soon as the write returns; a
// forced one first cuts the master's replicas off (isolate), so that the
// promoted replica certainly lacks the write. A first locker (A) makes the
// write; a second one (B), with a client of its own as another process
// would have, tries the key once its client can write to the promoted
// replica.
type scenario struct {
	write  write
	forced bool
}

// write is the lease's write that the master dies after.
type write string

const (
	afterAcquire  write = "after-acquire"
	afterRelease  write = "after-release"
	duringRenewal write = "during-renewal"
)

func (s scenario) String() string {
	if s.forced {
		return string(s.write) + " forced"
	}
	return string(s.write) + " natural"
}

// scenarios are every scenario, in the order they run.
var scenarios = []scenario{
	{afterAcquire, false}, {afterAcquire, true},
	{afterRelease, false}, {afterRelease, true},
	{duringRenewal, false}, {duringRenewal, true},
}

// The leases' TTLs. A failover takes about 1.5–3s until a client can
// write again (TestSentinel and TestCluster log it).
const (
	// An acquired lease is first renewed no sooner than 3/4 of its renew
	// interval (lockkit renews a little early to batch renewals): B's try
	// comes well before, so that A can only learn of a lost acquire after
	// B's try, at its first renewal.
	acquireTTL   = 12 * time.Second
	acquireRenew = 6 * time.Second
	// A released lease that the failover brings back holds the key until
	// its TTL runs out.
	releaseTTL = 5 * time.Second
	// A renewed lease outlives a failover: renewals fail while no master
	// answers, and the lease is lost only if none succeeds within its TTL.
	renewTTL   = 6 * time.Second
	renewEvery = time.Second
)

// failovers is how many failovers each scenario runs: JOBGUARD_FAILOVERS,
// 1 unless set.
func failovers(t *testing.T) int {
	s := os.Getenv("JOBGUARD_FAILOVERS")
	if s == "" {
		return 1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("JOBGUARD_FAILOVERS=%q: want a positive number of failovers per scenario", s)
	}
	return n
}

// figures are what a scenario measured over its failovers.
type figures struct {
	topology  string
	scenario  scenario
	failovers int
	// acquireErrs are the first locker's acquires that failed (each failover
	// still runs, with nothing held).
	acquireErrs []error
	// lostWrites counts the failovers whose promoted replica lacked the
	// scenario's write (A's acquire, release or last renewal): it had what
	// the master had of the lease before that write (snapshot).
	lostWrites int
	// overlaps counts B's acquires of the key while A still believed it held
	// it (A's lease context not cancelled).
	overlaps int
	// lost counts A's leases reported lost (context cancelled with a cause
	// matching lockkit.ErrLost).
	lost int
	// stranded counts the keys still held after A had released them, and
	// strandedFor how long after the failover B had to wait for each.
	stranded    int
	strandedFor []time.Duration
	// late counts the failovers that outlasted the scenario's timing: B's
	// try came after A's first renewal could be sent (after-acquire) or
	// after A's TTL ran out (after-release).
	late int
	// promoted is how long after the kill the topology had promoted a
	// replica; writable, how long until B's client wrote to it.
	promoted, writable []time.Duration
}

func (f figures) String() string {
	s := fmt.Sprintf("failover: %s %s: %d failovers, overlaps %d, lost %d, stranded %d",
		f.topology, f.scenario, f.failovers, f.overlaps, f.lost, f.stranded)
	if f.stranded > 0 {
		s += fmt.Sprintf(" (for median %s, max %s)", median(f.strandedFor), maxOf(f.strandedFor))
	}
	s += fmt.Sprintf(", lost writes %d, acquire errors %d", f.lostWrites, len(f.acquireErrs))
	if f.late > 0 {
		s += fmt.Sprintf(", late %d", f.late)
	}
	return s + fmt.Sprintf("; promoted in median %s, max %s; client writes after median %s, max %s",
		median(f.promoted), maxOf(f.promoted), median(f.writable), maxOf(f.writable))
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

func maxOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds).Round(time.Millisecond)
}

// measureAll runs every scenario on topo, each as a subtest, with lockers
// built with opts (after the scenario's own prefix, owner, observer and
// quiet logger), logs one summary line per scenario and returns the figures
// in scenario order. TestSentinel and TestCluster pass no option and assert
// on the figures with checkWithoutOptions; a test of an option passes it:
//
//	func TestSentinelReplicaAcks(t *testing.T) {
//		needRedis(t)
//		t.Parallel()
//		opts := []lockkit.Option{lockkit.WithReplicaAcks(1, 200*time.Millisecond)}
//		for _, f := range measureAll(t, startSentinel(t), opts) {
//			// f.scenario, f.overlaps, f.acquireErrs (errors.Is
//			// lockkit.ErrNotReplicated), f.lost, f.stranded, ...
//		}
//	}
func measureAll(t *testing.T, topo topology, opts []lockkit.Option) []figures {
	var all []figures
	for _, sc := range scenarios {
		t.Run(strings.ReplaceAll(sc.String(), " ", "-"), func(t *testing.T) {
			f := measure(t, topo, sc, failovers(t), opts)
			t.Log(f)
			all = append(all, f)
		})
	}
	return all
}

// measure runs scenario sc n times on topo and returns its figures. It
// fails the test on what must hold whatever the options and the timing: the
// harness works, an overlapping lease is reported lost, and a stranded key
// is free again within its TTL.
func measure(t *testing.T, topo topology, sc scenario, n int, opts []lockkit.Option) figures {
	ctx := context.Background()
	f := figures{topology: topo.name(), scenario: sc}
	ca, cb := topo.client(), topo.client()
	defer ca.Close()
	defer cb.Close()
	ev := &events{}
	quiet := lockkit.WithLogger(slog.New(slog.DiscardHandler))
	a, err := lockkit.NewRedis(ca, append([]lockkit.Option{lockkit.WithPrefix(prefix), lockkit.WithOwner("a"),
		lockkit.WithObserver(ev.observe), quiet}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := lockkit.NewRedis(cb, append([]lockkit.Option{lockkit.WithPrefix(prefix), lockkit.WithOwner("b"), quiet}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLocker(t, a)
	defer closeLocker(t, b)
	for i := range n {
		tr := &trial{topo: topo, key: fmt.Sprintf("%s-%s-%d", topo.name(), strings.ReplaceAll(sc.String(), " ", "-"), i),
			a: a, b: b, cb: cb, ev: ev}
		tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		var o outcome
		switch sc.write {
		case afterAcquire:
			o, err = tr.afterAcquire(tctx, sc.forced)
		case afterRelease:
			o, err = tr.afterRelease(tctx, sc.forced)
		case duringRenewal:
			o, err = tr.duringRenewal(tctx, sc.forced)
		}
		cancel()
		// Restored even after a failed trial, for the scenarios after it.
		rctx, rcancel := context.WithTimeout(ctx, time.Minute)
		err = errors.Join(err, topo.restore(rctx))
		rcancel()
		if err != nil {
			t.Fatalf("%s failover %d: %v", sc, i, err)
		}
		if o.overlap && !o.lost {
			t.Errorf("%s failover %d: B acquired the key while A held it, and A's lease was never reported lost", sc, i)
		}
		if o.stranded && o.strandedFor > o.ttl {
			t.Errorf("%s failover %d: the released key stayed held %s, past its TTL %s", sc, i, o.strandedFor, o.ttl)
		}
		f.add(o)
	}
	return f
}

func closeLocker(t *testing.T, l *lockkit.Locker) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		t.Errorf("close locker: %v", err)
	}
}

// outcome is what one failover of a scenario did.
type outcome struct {
	acquireErr                           error
	lostWrite, overlap, lost, stranded   bool
	late                                 bool
	ttl, strandedFor, promoted, writable time.Duration
}

func (f *figures) add(o outcome) {
	f.failovers++
	if o.acquireErr != nil {
		f.acquireErrs = append(f.acquireErrs, o.acquireErr)
	}
	count := func(n *int, b bool) {
		if b {
			*n++
		}
	}
	count(&f.lostWrites, o.lostWrite)
	count(&f.overlaps, o.overlap)
	count(&f.lost, o.lost)
	count(&f.late, o.late)
	if o.stranded {
		f.stranded++
		f.strandedFor = append(f.strandedFor, o.strandedFor)
	}
	f.promoted = append(f.promoted, o.promoted)
	f.writable = append(f.writable, o.writable)
}

// trial is one failover of a scenario on a fresh key.
type trial struct {
	topo topology
	key  string
	a, b *lockkit.Locker
	cb   redis.UniversalClient // B's client
	ev   *events               // A's lease events
	m    *node                 // key's master
	rs   []*node               // its replicas
}

// locate finds key's master and its replicas and waits until they have
// every write it had.
func (tr *trial) locate(ctx context.Context) error {
	m, err := tr.topo.master(ctx, tr.key)
	if err != nil {
		return err
	}
	tr.m, tr.rs = m, tr.topo.replicas(ctx, m)
	if len(tr.rs) == 0 {
		return fmt.Errorf("master %s has no replica", m.addr())
	}
	return synced(ctx, tr.m, tr.rs)
}

// prepare readies the scenario's write: when forced, it cuts the master off
// from its replicas once they have every write it had. It returns what the
// master has of the lease before the write (snapshot).
func (tr *trial) prepare(ctx context.Context, forced bool) (before snap, err error) {
	if forced {
		if err := synced(ctx, tr.m, tr.rs); err != nil {
			return nil, err
		}
		if err := isolate(ctx, tr.m, tr.rs); err != nil {
			return nil, err
		}
	}
	return snapshot(ctx, tr.m, tr.key)
}

// failover SIGKILLs the master at once, reads what each replica has of the
// lease (snapshot) once it has seen the master go, waits until the topology
// has promoted one and B's client writes to it, and records how long each
// took in o. The promoted replica lacks the scenario's write when it has
// what the master had before it, before (but the keys that have expired
// since). Then it starts the killed master again, to come back as a
// replica while the scenario goes on: until then a Cluster master has no
// replica (lockkit.WithReplicaAcks fails every write), as it would until
// a crashed node is restarted.
func (tr *trial) failover(ctx context.Context, before snap, o *outcome) error {
	killed := time.Now()
	tr.m.kill()
	if err := poll(ctx, readyWithin, func() (string, error) {
		_, wait := links(ctx, tr.rs, "down")
		return wait, nil
	}); err != nil {
		return err
	}
	has := map[*node]snap{}
	for _, r := range tr.rs {
		var err error
		if has[r], err = snapshot(ctx, r, tr.key); err != nil {
			return err
		}
	}
	read := time.Now()
	if err := tr.topo.promoted(ctx, tr.key); err != nil {
		return fmt.Errorf("promotion: %w", err)
	}
	o.promoted = time.Since(killed)
	if err := writable(ctx, tr.cb, tr.key, promotedWithin); err != nil {
		return fmt.Errorf("B's client after the promotion: %w", err)
	}
	o.writable = time.Since(killed)
	m, err := tr.topo.master(ctx, tr.key)
	if err != nil {
		return err
	}
	got, ok := has[m]
	if !ok {
		return fmt.Errorf("%s was promoted, not a replica of the killed master", m.addr())
	}
	o.lostWrite = got.at(read) == before.at(read)
	return tr.topo.restart(ctx)
}

// failedAcquire records A's failed acquire, err, and fails the master over
// all the same, with nothing of A's to lose.
func (tr *trial) failedAcquire(ctx context.Context, err error, o *outcome) error {
	o.acquireErr = err
	err = tr.failover(ctx, nil, o)
	o.lostWrite = false
	return err
}

// writable waits, at most within, until c writes to the master of key's
// slot.
func writable(ctx context.Context, c redis.UniversalClient, key string, within time.Duration) error {
	probe := "probe:{" + key + "}"
	return poll(ctx, within, func() (string, error) {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := c.Set(wctx, probe, 1, time.Minute).Err(); err != nil {
			return err.Error(), nil
		}
		return "", nil
	})
}

// prefix is the lockers' key prefix: every Redis key of a lease on key is
// "<prefix>{<key>}:<part>".
const prefix = "failover:"

// snap is what a node holds of the leases on a key: each of their Redis
// keys, in order, with its value (DUMP) and when it expires (PEXPIRETIME,
// Unix ms; negative: never).
type snap []snapKey

type snapKey struct {
	key, value string
	expires    int64
}

// at renders the keys of s that have not expired at t (a replica hides
// expired keys before its master deletes them).
func (s snap) at(t time.Time) string {
	var b strings.Builder
	for _, e := range s {
		if e.expires < 0 || e.expires > t.UnixMilli() {
			fmt.Fprintf(&b, "%s %q %d\n", e.key, e.value, e.expires)
		}
	}
	return b.String()
}

// snapshot returns what n holds of the leases on key, read on a replica as
// well (READONLY: a Cluster replica serves the read itself).
func snapshot(ctx context.Context, n *node, key string) (snap, error) {
	c := n.client()
	defer c.Close()
	conn := c.Conn()
	defer conn.Close()
	if err := conn.ReadOnly(ctx).Err(); err != nil && !strings.Contains(err.Error(), "cluster support disabled") {
		return nil, fmt.Errorf("snapshot: %s: %w", n.addr(), err)
	}
	var keys []string
	iter := conn.Scan(ctx, 0, prefix+"{"+key+"}*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("snapshot: %s: %w", n.addr(), err)
	}
	slices.Sort(keys)
	var s snap
	for _, k := range keys {
		v, err := conn.Dump(ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			continue // expired since the scan
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot: %s: %w", n.addr(), err)
		}
		at, err := conn.Do(ctx, "PEXPIRETIME", k).Int64()
		if err != nil {
			return nil, fmt.Errorf("snapshot: %s: %w", n.addr(), err)
		}
		if at == -2 {
			continue // expired since the dump
		}
		s = append(s, snapKey{k, v, at})
	}
	return s, nil
}

// tryB makes B's TryAcquire until it takes the key or finds it held
// (conflict); other errors (the promoted master's first moments) are tried
// again.
func (tr *trial) tryB(ctx context.Context, ttl time.Duration) (lease *lockkit.Lease, err error) {
	err = poll(ctx, 10*time.Second, func() (string, error) {
		var e error
		lease, e = tr.b.TryAcquire(ctx, tr.key, &lockkit.AcquireOptions{TTL: ttl})
		if e == nil || errors.Is(e, lockkit.ErrNotAcquired) {
			return "", nil
		}
		return "B's try: " + e.Error(), nil
	})
	return lease, err
}

func release(ctx context.Context, l *lockkit.Lease) error {
	if l == nil {
		return nil
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, lockkit.ErrNotHeld) {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// afterAcquire: A acquires, the master is killed at once; after the
// failover B tries the key once, then A's lease either renews on the
// promoted replica or is reported lost.
func (tr *trial) afterAcquire(ctx context.Context, forced bool) (outcome, error) {
	o := outcome{ttl: acquireTTL}
	if err := tr.locate(ctx); err != nil {
		return o, err
	}
	before, err := tr.prepare(ctx, forced)
	if err != nil {
		return o, err
	}
	la, err := tr.a.TryAcquire(ctx, tr.key, &lockkit.AcquireOptions{TTL: acquireTTL, RenewInterval: acquireRenew})
	acquired := time.Now()
	if err != nil {
		return o, tr.failedAcquire(ctx, err, &o)
	}
	wa, cancel := la.Context(context.Background())
	defer cancel()
	if err := tr.failover(ctx, before, &o); err != nil {
		return o, err
	}
	lb, err := tr.tryB(ctx, acquireTTL)
	if err != nil {
		return o, err
	}
	o.late = time.Since(acquired) > acquireRenew*3/4
	o.overlap = lb != nil && wa.Err() == nil
	// A's fate: its first renewal succeeds or finds the lease gone.
	if err := tr.ev.wait(ctx, acquireTTL, func(e stamped) bool {
		return e.Key == tr.key && e.Token == la.Token() && (e.Kind == lockkit.LeaseRenewed || e.Kind == lockkit.LeaseLost)
	}); err != nil {
		return o, fmt.Errorf("A's lease neither renewed nor lost: %w", err)
	}
	o.lost = errors.Is(la.Err(), lockkit.ErrLost)
	return o, errors.Join(release(ctx, la), release(ctx, lb))
}

// afterRelease: A acquires and releases, the master is killed at once;
// after the failover B tries the key until it is free.
func (tr *trial) afterRelease(ctx context.Context, forced bool) (outcome, error) {
	o := outcome{ttl: releaseTTL}
	if err := tr.locate(ctx); err != nil {
		return o, err
	}
	la, err := tr.a.TryAcquire(ctx, tr.key, &lockkit.AcquireOptions{TTL: releaseTTL})
	acquired := time.Now()
	if err != nil {
		return o, tr.failedAcquire(ctx, err, &o)
	}
	before, err := tr.prepare(ctx, forced)
	if err != nil {
		return o, err
	}
	if err := la.Release(ctx); err != nil {
		return o, fmt.Errorf("A's release: %w", err)
	}
	if err := tr.failover(ctx, before, &o); err != nil {
		return o, err
	}
	seen := time.Now()
	lb, err := tr.tryB(ctx, releaseTTL)
	if err != nil {
		return o, err
	}
	o.late = time.Since(acquired) > releaseTTL
	if lb == nil {
		o.stranded = true
		err = poll(ctx, releaseTTL+5*time.Second, func() (string, error) {
			lb, err = tr.tryB(ctx, releaseTTL)
			if err != nil || lb != nil {
				return "", err
			}
			return "the released key is still held", nil
		})
		if err != nil {
			return o, err
		}
		o.strandedFor = time.Since(seen)
	}
	return o, release(ctx, lb)
}

// duringRenewal: A's lockkit.Do renews its lease every renewEvery; the
// master is killed right after a renewal. After the failover B tries the
// key until A's lease renews on the promoted replica or is lost.
func (tr *trial) duringRenewal(ctx context.Context, forced bool) (outcome, error) {
	o := outcome{ttl: renewTTL}
	if err := tr.locate(ctx); err != nil {
		return o, err
	}
	type run struct {
		ctx   context.Context
		token int64
	}
	started := make(chan run, 1)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- lockkit.Do(context.Background(), tr.a, tr.key, &lockkit.AcquireOptions{TTL: renewTTL, RenewInterval: renewEvery},
			func(ctx context.Context) error {
				l, _ := lockkit.LeaseFromContext(ctx)
				started <- run{ctx, l.Token()}
				select {
				case <-stop:
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			})
	}()
	var r run
	select {
	case r = <-started:
	case err := <-done:
		return o, tr.failedAcquire(ctx, err, &o)
	}
	defer func() { close(stop); <-done }()
	renewal := func(since time.Time, kinds ...lockkit.EventKind) (stamped, error) {
		var got stamped
		err := tr.ev.wait(ctx, renewTTL, func(e stamped) bool {
			if e.Key == tr.key && e.Token == r.token && e.at.After(since) && slices.Contains(kinds, e.Kind) {
				got = e
				return true
			}
			return false
		})
		return got, err
	}
	if _, err := renewal(time.Time{}, lockkit.LeaseRenewed); err != nil {
		return o, fmt.Errorf("A's first renewal: %w", err)
	}
	before, err := tr.prepare(ctx, forced)
	if err != nil {
		return o, err
	}
	since := time.Now()
	// The next renewal (with WithReplicaAcks, one that finds no replica
	// fails); the master dies as soon as it returns.
	if _, err := renewal(since, lockkit.LeaseRenewed, lockkit.LeaseRenewFailed); err != nil {
		return o, fmt.Errorf("A's renewal: %w", err)
	}
	killed := time.Now()
	if err := tr.failover(ctx, before, &o); err != nil {
		return o, err
	}
	// B tries the key until A's lease renews on the promoted replica or is
	// lost.
	var lb *lockkit.Lease
	fate := func(e stamped) bool {
		return e.Key == tr.key && e.Token == r.token &&
			(e.Kind == lockkit.LeaseLost || e.Kind == lockkit.LeaseRenewed && e.at.After(killed))
	}
	err = poll(ctx, renewTTL+5*time.Second, func() (string, error) {
		if lb == nil {
			l, err := tr.tryB(ctx, renewTTL)
			if err != nil {
				return "", err
			}
			if l != nil {
				lb, o.overlap = l, r.ctx.Err() == nil
			}
		}
		if tr.ev.has(fate) {
			return "", nil
		}
		return "A's lease neither renewed nor lost", nil
	})
	if err != nil {
		return o, err
	}
	if lb != nil && o.overlap {
		// A learns at its next renewal.
		if err := tr.ev.wait(ctx, renewTTL, func(e stamped) bool {
			return e.Key == tr.key && e.Token == r.token && e.Kind == lockkit.LeaseLost
		}); err != nil {
			return o, fmt.Errorf("A's lease, taken over by B, was not reported lost: %w", err)
		}
	}
	o.lost = errors.Is(context.Cause(r.ctx), lockkit.ErrLost)
	return o, release(ctx, lb)
}

// stamped is a lease event and when it was reported.
type stamped struct {
	lockkit.Event
	at time.Time
}

// events records a Locker's lease events (its observer) for the scenario
// to wait on.
type events struct {
	mu      sync.Mutex
	list    []stamped
	changed chan struct{} // closed at the next event
}

func (ev *events) observe(e lockkit.Event) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.list = append(ev.list, stamped{e, time.Now()})
	if ev.changed != nil {
		close(ev.changed)
		ev.changed = nil
	}
}

// has reports whether an event matching pred was reported.
func (ev *events) has(pred func(stamped) bool) bool {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return slices.ContainsFunc(ev.list, pred)
}

// wait waits, at most within, until an event matching pred is reported
// (or was).
func (ev *events) wait(ctx context.Context, within time.Duration, pred func(stamped) bool) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		ev.mu.Lock()
		if slices.ContainsFunc(ev.list, pred) {
			ev.mu.Unlock()
			return nil
		}
		if ev.changed == nil {
			ev.changed = make(chan struct{})
		}
		ch := ev.changed
		ev.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
