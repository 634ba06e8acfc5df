package cronguard_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// outcomes collects, per tick, what each replica did with it.
type outcomes struct {
	mu      sync.Mutex
	byTick  map[int64]map[int]middleware.EventKind // tick (Unix ms) → replica → outcome
	dups    int
	errs    []error
	changed chan struct{}
}

func newOutcomes() *outcomes {
	return &outcomes{byTick: make(map[int64]map[int]middleware.EventKind), changed: make(chan struct{}, 1)}
}

// observer returns replica i's observer.
func (o *outcomes) observer(i int) middleware.Observer {
	return func(_ context.Context, e middleware.Event) {
		switch e.Kind {
		case middleware.EventAcquired, middleware.EventClaimed, middleware.EventDuplicate, middleware.EventError:
		default:
			return
		}
		o.mu.Lock()
		if e.Kind == middleware.EventError {
			o.errs = append(o.errs, e.Err)
		}
		if e.Kind == middleware.EventDuplicate {
			o.dups++
		}
		m := o.byTick[guard.WorkOf(e.Job).Epoch]
		if m == nil {
			m = make(map[int]middleware.EventKind)
			o.byTick[guard.WorkOf(e.Job).Epoch] = m
		}
		m[i] = e.Kind
		o.mu.Unlock()
		select {
		case o.changed <- struct{}{}:
		default:
		}
	}
}

// complete returns the ticks every one of n replicas reported, in order.
func (o *outcomes) complete(n int) []int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ticks []int64
	for tick, m := range o.byTick {
		if len(m) == n {
			ticks = append(ticks, tick)
		}
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i] < ticks[j] })
	return ticks
}

// waitComplete waits until n replicas reported at least want ticks.
func (o *outcomes) waitComplete(t *testing.T, n, want int, timeout time.Duration) []int64 {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if ticks := o.complete(n); len(ticks) >= want {
			return ticks
		}
		select {
		case <-o.changed:
		case <-deadline:
			t.Fatalf("only %d of %d ticks completed in %s", len(o.complete(n)), want, timeout)
		}
	}
}

func (o *outcomes) of(tick int64) map[int]middleware.EventKind {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[int]middleware.EventKind)
	for k, v := range o.byTick[tick] {
		out[k] = v
	}
	return out
}

// lateBy makes a replica fire d after its schedule, as one whose clock is d
// behind the others would.
func lateBy(d time.Duration) cron.JobWrapper {
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			time.Sleep(d)
			j.Run()
		})
	}
}

// node is one replica: its own Redis client, Locker and Cron.
type node struct {
	rdb    redis.UniversalClient
	locker *lockkit.Locker
	cron   *cron.Cron
	rt     *testredis.Counter
}

type nodeConfig struct {
	cluster bool // on the Redis Cluster instead of the standalone server
	prefix  string
	owner   string
	late    time.Duration // fires this late (a slow or skewed replica)
	behind  time.Duration // its clock is this far behind
	opts    []cronguard.Option
	spec    string
	entry   string
	job     cron.Job
}

// startNode starts a replica of the entry; it is stopped when the test ends.
func startNode(t *testing.T, cfg nodeConfig) *node {
	t.Helper()
	var rdb redis.UniversalClient = redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	if cfg.cluster {
		rdb = redis.NewClusterClient(testredis.ClusterOptions(t))
	}
	// Open the connection first: its handshake is not a tick's cost.
	require.NoError(t, rdb.Ping(context.Background()).Err())
	rt := &testredis.Counter{}
	rdb.AddHook(rt)
	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(cfg.prefix), lockkit.WithOwner(cfg.owner))
	require.NoError(t, err)
	late, behind := cfg.late, cfg.behind
	opts := append([]cronguard.Option{
		cronguard.WithSeconds(),
		cronguard.WithLogger(cron.DiscardLogger),
		cronguard.WithClock(func() time.Time { return time.Now().Add(-behind) }),
	}, cfg.opts...)
	g, err := cronguard.New(locker, opts...)
	require.NoError(t, err)
	chain := []cron.JobWrapper{cron.Recover(cron.DiscardLogger)}
	if late > 0 {
		chain = append(chain, lateBy(late))
	}
	c := cron.New(cron.WithSeconds(), cron.WithLogger(cron.DiscardLogger), cron.WithChain(chain...))
	_, err = g.Add(c, cfg.entry, cfg.spec, cfg.job)
	require.NoError(t, err)
	n := &node{rdb: rdb, locker: locker, cron: c, rt: rt}
	t.Cleanup(func() { n.stop() })
	c.Start()
	return n
}

// stop stops the Cron, waits for its running jobs, closes the Locker and the
// client. It may be called more than once.
func (n *node) stop() {
	<-n.cron.Stop().Done()
	_ = n.locker.Close(context.Background())
	_ = n.rdb.Close()
}

// TestFleetRunsEachTickOnce: three replicas of an every-second entry, one on
// time, one firing 150ms late, one whose clock is 300ms behind (it fires 300ms
// late and reads a time 300ms early), and a 1ms job: over 30 ticks every tick
// runs exactly once, within its second.
func TestFleetRunsEachTickOnce(t *testing.T) {
	t.Parallel()
	testFleetRunsEachTickOnce(t, false)
}

// TestFleetRunsEachTickOnceOnCluster is the same on a Redis Cluster.
func TestFleetRunsEachTickOnceOnCluster(t *testing.T) {
	t.Parallel()
	testFleetRunsEachTickOnce(t, true)
}

// testPrefix returns a key prefix on the standalone server or the cluster.
func testPrefix(t *testing.T, cluster bool) string {
	if cluster {
		return testredis.Prefix(t, testredis.Cluster(t))
	}
	return testredis.Prefix(t, testredis.Client(t))
}

func testFleetRunsEachTickOnce(t *testing.T, cluster bool) {
	prefix := testPrefix(t, cluster)
	out := newOutcomes()
	type run struct {
		tick time.Time
		at   time.Time
	}
	var (
		mu   sync.Mutex
		runs []run
	)
	skews := []struct{ late, behind time.Duration }{{0, 0}, {150 * time.Millisecond, 0}, {300 * time.Millisecond, 300 * time.Millisecond}}
	var nodes []*node
	for i, sk := range skews {
		nodes = append(nodes, startNode(t, nodeConfig{
			cluster: cluster, prefix: prefix, owner: fmt.Sprintf("replica-%d", i), late: sk.late, behind: sk.behind,
			entry: "once", spec: "* * * * * *",
			opts: []cronguard.Option{cronguard.WithObserver(out.observer(i))},
			job: cronguard.Func(func(ctx context.Context) error {
				tick, _ := cronguard.Tick(ctx)
				mu.Lock()
				runs = append(runs, run{tick: tick, at: time.Now()})
				mu.Unlock()
				time.Sleep(time.Millisecond) // the work
				return nil
			}),
		}))
	}
	const want = 30
	ticks := out.waitComplete(t, len(nodes), want, 45*time.Second)
	for _, n := range nodes {
		n.stop()
	}

	out.mu.Lock()
	require.Empty(t, out.errs)
	require.Zero(t, out.dups, "a 1ms job never overlaps")
	out.mu.Unlock()
	perTick := make(map[int64]int)
	mu.Lock()
	for _, r := range runs {
		perTick[r.tick.UnixMilli()]++
		lag := r.at.Sub(r.tick)
		require.True(t, lag >= 0 && lag < time.Second, "tick %s ran at %s", r.tick, r.at)
	}
	mu.Unlock()
	for _, tick := range ticks {
		kinds := out.of(tick)
		acquired, claimed := 0, 0
		for _, k := range kinds {
			switch k {
			case middleware.EventAcquired:
				acquired++
			case middleware.EventClaimed:
				claimed++
			}
		}
		require.Equal(t, 1, acquired, "tick %d: %v", tick, kinds)
		require.Equal(t, len(nodes)-1, claimed, "tick %d: %v", tick, kinds)
	}
	// No tick between the first and the last complete one was missed or repeated.
	for tick := ticks[0]; tick <= ticks[len(ticks)-1]; tick += 1000 {
		require.Equal(t, 1, perTick[tick], "tick %s", time.UnixMilli(tick))
	}
	// Redis cost: at most acquire + release per tick and replica, plus the
	// first call of each script (NOSCRIPT, then EVAL) and the Locker's one
	// server version check (INFO).
	for i, n := range nodes {
		fired := 0
		out.mu.Lock()
		for _, m := range out.byTick {
			if _, ok := m[i]; ok {
				fired++
			}
		}
		out.mu.Unlock()
		require.LessOrEqual(t, n.rt.Count(), int64(2*fired+3), "replica %d: %d round trips for %d ticks", i, n.rt.Count(), fired)
		t.Logf("replica %d: %d round trips for %d ticks", i, n.rt.Count(), fired)
	}
}

// TestFleetLongJobNeverOverlaps: with a job longer than the period, no two
// runs overlap anywhere in the fleet, and the skipped ticks are reported.
func TestFleetLongJobNeverOverlaps(t *testing.T) {
	t.Parallel()
	prefix := testredis.Prefix(t, testredis.Client(t))
	out := newOutcomes()
	var running, maxRunning atomic.Int32
	var mu sync.Mutex
	perTick := make(map[int64]int)
	skews := []struct{ late, behind time.Duration }{{0, 0}, {150 * time.Millisecond, 0}, {300 * time.Millisecond, 300 * time.Millisecond}}
	var nodes []*node
	for i, sk := range skews {
		nodes = append(nodes, startNode(t, nodeConfig{
			prefix: prefix, owner: fmt.Sprintf("replica-%d", i), late: sk.late, behind: sk.behind,
			entry: "long", spec: "* * * * * *",
			opts: []cronguard.Option{cronguard.WithObserver(out.observer(i))},
			job: cronguard.Func(func(ctx context.Context) error {
				tick, _ := cronguard.Tick(ctx)
				mu.Lock()
				perTick[tick.UnixMilli()]++
				mu.Unlock()
				n := running.Add(1)
				defer running.Add(-1)
				for {
					m := maxRunning.Load()
					if n <= m || maxRunning.CompareAndSwap(m, n) {
						break
					}
				}
				select { // the work: longer than the period
				case <-time.After(1500 * time.Millisecond):
				case <-ctx.Done():
					return context.Cause(ctx)
				}
				return nil
			}),
		}))
	}
	ticks := out.waitComplete(t, len(nodes), 6, 20*time.Second)
	for _, n := range nodes {
		n.stop()
	}
	require.Equal(t, int32(1), maxRunning.Load(), "runs overlapped")
	out.mu.Lock()
	require.Empty(t, out.errs)
	out.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	skippedTicks := 0
	for _, tick := range ticks {
		require.LessOrEqual(t, perTick[tick], 1, "tick %s", time.UnixMilli(tick))
		kinds := out.of(tick)
		dups := 0
		for _, k := range kinds {
			if k == middleware.EventDuplicate {
				dups++
			}
		}
		if dups == len(nodes) {
			skippedTicks++
			require.Zero(t, perTick[tick])
		}
	}
	require.NotZero(t, skippedTicks, "ticks skipped for overlap are reported by every replica")
	require.GreaterOrEqual(t, len(perTick), 2)
}

// TestDeadReplicaFreesEntryWithinTTL: a replica that dies mid-run (its Redis
// client closed, so its lease is no longer renewed) blocks later ticks for at
// most the lease TTL.
func TestDeadReplicaFreesEntryWithinTTL(t *testing.T) {
	t.Parallel()
	testDeadReplicaFreesEntryWithinTTL(t, false)
}

// TestDeadReplicaFreesEntryWithinTTLOnCluster is the same on a Redis Cluster.
func TestDeadReplicaFreesEntryWithinTTLOnCluster(t *testing.T) {
	t.Parallel()
	testDeadReplicaFreesEntryWithinTTL(t, true)
}

func testDeadReplicaFreesEntryWithinTTL(t *testing.T, cluster bool) {
	prefix := testPrefix(t, cluster)
	const ttl = 2 * time.Second
	out := newOutcomes()
	started := make(chan time.Time, 1)
	lostCause := make(chan error, 1)
	doomed := startNode(t, nodeConfig{
		cluster: cluster, prefix: prefix, owner: "doomed", entry: "e", spec: "* * * * * *",
		opts: []cronguard.Option{cronguard.WithTTL(ttl), cronguard.WithObserver(out.observer(0))},
		job: cronguard.Func(func(ctx context.Context) error {
			tick, _ := cronguard.Tick(ctx)
			started <- tick
			<-ctx.Done() // hangs until the lease is lost
			lostCause <- context.Cause(ctx)
			return context.Cause(ctx)
		}),
	})
	ran := make(chan time.Time, 16)
	startNode(t, nodeConfig{
		cluster: cluster, prefix: prefix, owner: "survivor", entry: "e", spec: "* * * * * *", late: 300 * time.Millisecond,
		opts: []cronguard.Option{cronguard.WithTTL(ttl), cronguard.WithObserver(out.observer(1))},
		job: cronguard.Func(func(ctx context.Context) error {
			tick, _ := cronguard.Tick(ctx)
			ran <- tick
			return nil
		}),
	})
	deadTick := recv(t, started)
	// The doomed replica dies: it stops scheduling and cannot reach Redis.
	stopped := doomed.cron.Stop()
	require.NoError(t, doomed.rdb.Close())
	died := time.Now()

	tick := recv(t, ran)
	require.True(t, tick.After(deadTick))
	require.LessOrEqual(t, time.Since(died), ttl+time.Second+500*time.Millisecond, "the survivor waited longer than the TTL")
	out.mu.Lock()
	require.NotZero(t, out.dups, "the survivor skipped ticks while the dead replica's lease lived")
	out.mu.Unlock()
	// The dead replica's job learns that its lease is gone.
	require.ErrorIs(t, recv(t, lostCause), lockkit.ErrLost)
	<-stopped.Done()
}

// TestRoundTripsPerTick measures the Redis cost with a go-redis hook: a replica
// that runs a tick pays acquire + release, the others one acquire.
func TestRoundTripsPerTick(t *testing.T) {
	prefix := testredis.Prefix(t, testredis.Client(t))
	type rep struct {
		clk  *clock
		wrap cron.JobWrapper
		rt   *testredis.Counter
	}
	var reps []rep
	for i := range 3 {
		rdb := testredis.Client(t)
		rt := &testredis.Counter{}
		rdb.AddHook(rt)
		locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix), lockkit.WithOwner(fmt.Sprint("replica-", i)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = locker.Close(context.Background()) })
		clk := newClock(t0)
		w, err := cronguard.Wrap(locker, "rt", "* * * * * *", cronguard.WithSeconds(), cronguard.WithClock(clk.Now), cronguard.WithLogger(cron.DiscardLogger))
		require.NoError(t, err)
		reps = append(reps, rep{clk: clk, wrap: w, rt: rt})
	}
	wins := make([]int, len(reps))
	fireTick := func(k int) {
		tick := t0.Add(time.Duration(k) * time.Second)
		for j := range reps {
			i := (k + j) % len(reps) // a different replica fires first each tick
			reps[i].clk.Set(tick.Add(time.Duration(j) * 100 * time.Millisecond))
			reps[i].wrap(cronguard.Func(func(context.Context) error { wins[i]++; return nil })).Run()
		}
	}
	// Warm-up: each replica runs one tick, which loads the scripts and
	// subscribes its Locker to the operators' channel, once.
	for k := range len(reps) {
		fireTick(k)
	}
	for i := range reps {
		reps[i].rt.Reset()
		wins[i] = 0
	}
	const ticks = 30
	for k := len(reps); k < len(reps)+ticks; k++ {
		fireTick(k)
	}
	for i, r := range reps {
		losses := ticks - wins[i]
		require.Equal(t, int64(2*wins[i]+losses), r.rt.Count(), "replica %d", i)
		t.Logf("replica %d: %d wins × 2 + %d losses × 1 = %d round trips for %d ticks", i, wins[i], losses, r.rt.Count(), ticks)
	}
}

// TestLostLeaseCancelsFuncJob: when the lease is lost while a Func job runs,
// its ctx is cancelled with lockkit.ErrLost and the loss is reported.
func TestLostLeaseCancelsFuncJob(t *testing.T) {
	rdb := testredis.Client(t)
	prefix := testredis.Prefix(t, rdb)
	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer locker.Close(context.Background())
	rec := newRecorder()
	logs := &logRecorder{}
	clk := newClock(time.Now())
	w, err := cronguard.Wrap(locker, "e", "* * * * * *", cronguard.WithSeconds(), cronguard.WithClock(clk.Now),
		cronguard.WithTTL(300*time.Millisecond), cronguard.WithObserver(rec.observe), cronguard.WithLogger(logs))
	require.NoError(t, err)
	started := make(chan struct{})
	var cause error
	done := make(chan struct{})
	go func() {
		defer close(done)
		w(cronguard.Func(func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return cause
		})).Run()
	}()
	<-started
	// Someone deletes the lease: the next renewal finds it gone.
	require.NoError(t, rdb.Del(context.Background(), prefix+"{cron:e}:h").Err())
	<-done
	require.ErrorIs(t, cause, lockkit.ErrLost)
	ev, ok := rec.find(middleware.EventLost)
	require.True(t, ok)
	require.ErrorIs(t, ev.Err, lockkit.ErrLost)
	require.True(t, logs.has("error lease lost"))
	ev, ok = rec.find(middleware.EventReleased)
	require.True(t, ok)
	require.True(t, errors.Is(ev.Err, lockkit.ErrLost))
}

// A tick whose claim ran in Redis while the claiming replica never got the
// reply (go-redis' retries all failed) runs on no replica: a cron tick runs
// at most once (docs/cron.md, "Long runs and failures").
func TestTickWhoseClaimReplyWasLostRunsNowhere(t *testing.T) {
	clean := testredis.Client(t)
	prefix := testredis.Prefix(t, clean)
	faulty := redis.NewClient(clean.Options())
	t.Cleanup(func() { _ = faulty.Close() })
	hook := &testredis.Faults{Match: testredis.ScriptShape(8, 20)} // acquire.lua: an epoch claim
	faulty.AddHook(hook)
	rec := newRecorder()
	var runs atomic.Int32
	job := cron.FuncJob(func() { runs.Add(1) })
	replica := func(c redis.UniversalClient, i int, at time.Time) cron.Job {
		l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix), lockkit.WithOwner(fmt.Sprintf("replica-%d", i)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		w, err := cronguard.Wrap(l, "digest", "* * * * * *", cronguard.WithSeconds(), cronguard.WithLogger(cron.DiscardLogger),
			cronguard.WithObserver(rec.observe), cronguard.WithClock(func() time.Time { return at }))
		require.NoError(t, err)
		return w(job)
	}
	a, b := replica(faulty, 0, t0), replica(clean, 1, t0.Add(100*time.Millisecond))

	hook.Arm(testredis.DropReply, 1)
	a.Run()
	require.EqualValues(t, 1, hook.Hits(), "the claim ran; its reply was lost")
	ev, ok := rec.find(middleware.EventError)
	require.True(t, ok, "the claiming replica reports the lost reply")
	require.Error(t, ev.Err)
	b.Run()
	require.Zero(t, runs.Load(), "no replica ran the tick")
	require.Equal(t, 1, rec.count(middleware.EventDuplicate, t0)+rec.count(middleware.EventClaimed, t0),
		"the other replica found the tick taken")
}

// Replicas that share an entry name but not its spec are reported, once per
// entry and replica, with no round trip more: the spec's hash is kept with
// each tick's claim. A replica whose tick follows a claim of another spec
// says so when it runs (disjoint ticks: each replica runs at its own) and
// when it finds its tick claimed; replicas with the same spec never do.
func TestReplicasWithAnotherSpecAreReported(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { testReplicasWithAnotherSpec(t, false) })
	t.Run("cluster", func(t *testing.T) { testReplicasWithAnotherSpec(t, true) })
}

func testReplicasWithAnotherSpec(t *testing.T, cluster bool) {
	f := redisFleet(t, cluster)
	recs := []*recorder{newRecorder(), newRecorder(), newRecorder(), newRecorder()}
	logs := []*logRecorder{{}, {}, {}, {}}
	specs := []string{"0 * * * * *", "30 * * * * *", "0 */2 * * * *", "0 * * * * *"}
	var replicas []*replica
	for i, spec := range specs {
		replicas = append(replicas, f.replica(i, "digest", spec, recs[i], cronguard.WithLogger(logs[i])))
	}
	runs := make([]int, len(replicas))
	fire := func(i int, at time.Duration) {
		replicas[i].fire(t0.Add(at), cronguard.Func(func(context.Context) error { runs[i]++; return nil }))
	}
	errorsOf := func(i int) []error {
		var errs []error
		recs[i].mu.Lock()
		defer recs[i].mu.Unlock()
		for _, e := range recs[i].events {
			if e.Kind == middleware.EventError {
				errs = append(errs, e.Err)
			}
		}
		return errs
	}
	fire(0, 0)                 // 09:00:00, the first claim
	fire(1, 30*time.Second)    // 09:00:30 follows a claim of "0 * * * * *"
	fire(0, 60*time.Second)    // 09:01:00 follows one of "30 * * * * *"
	fire(1, 90*time.Second)    // reported once already
	fire(0, 120*time.Second)   // 09:02:00
	fire(2, 120*time.Second+5) // the same tick, claimed by a replica of another spec
	fire(3, 120*time.Second+9) // the same tick, claimed by a replica of the same spec
	fire(0, 180*time.Second)
	fire(3, 240*time.Second)
	require.Equal(t, []int{4, 2, 0, 1}, runs)
	for i, want := range []int{1, 1, 1, 0} {
		errs := errorsOf(i)
		require.Len(t, errs, want, "replica %d (%s): %v", i, specs[i], errs)
		for _, err := range errs {
			require.ErrorIs(t, err, cronguard.ErrSpecMismatch)
			require.ErrorContains(t, err, `entry "digest"`)
			require.ErrorContains(t, err, specs[i])
		}
		require.Equal(t, want == 1, logs[i].has("error "), "replica %d logs it at Error", i)
	}
}
