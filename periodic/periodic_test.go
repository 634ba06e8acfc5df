package periodic

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/periodickey"
	"github.com/jobguard/jobguard/internal/testredis"
)

// go-redis v9.17's process-wide clock goroutine is go-redis's, not a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// deployment makes clients of one Redis deployment, closed when the test ends.
type deployment func(t *testing.T) redis.UniversalClient

func onEachRedis(t *testing.T, test func(t *testing.T, connect deployment)) {
	t.Run("standalone", func(t *testing.T) {
		test(t, func(t *testing.T) redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
	t.Run("cluster", func(t *testing.T) {
		test(t, func(t *testing.T) redis.UniversalClient {
			c := redis.NewClusterClient(testredis.ClusterOptions(t))
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
	})
}

// queueName returns a queue of this test only, deleted when it ends.
func queueName(t *testing.T, c redis.UniversalClient) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	q := "jg-periodic-" + hex.EncodeToString(b)
	insp := asynq.NewInspectorFromRedisClient(c)
	t.Cleanup(func() { _ = insp.DeleteQueue(q, true) })
	return q
}

// ticksIn returns the ticks of the tasks in q, from their IDs, counting
// every state a task can be in before a server runs it.
func ticksIn(t *testing.T, c redis.UniversalClient, q string) map[int64]int {
	insp := asynq.NewInspectorFromRedisClient(c)
	out := map[int64]int{}
	tasks, err := insp.ListPendingTasks(q, asynq.PageSize(10000))
	if errors.Is(err, asynq.ErrQueueNotFound) {
		return out // nothing enqueued yet
	}
	require.NoError(t, err)
	for _, ti := range tasks {
		ms, err := strconv.ParseInt(ti.ID[strings.LastIndexByte(ti.ID, ':')+1:], 10, 64)
		require.NoError(t, err)
		out[ms]++
	}
	return out
}

// Three replicas, one with its clock 400ms behind and one that dies at its
// tenth tick between deciding to enqueue and enqueueing: the queue holds
// exactly one task per tick, none missing. Each replica pays one round trip
// per tick (reading the tick's mark), three when it found none (the
// enqueue, and the mark).
func TestThreeReplicasEnqueueEachTickOnce(t *testing.T) {
	onEachRedis(t, func(t *testing.T, connect deployment) {
		admin := connect(t)
		q := queueName(t, admin)
		const ticks = 60
		const period = 100 * time.Millisecond
		var (
			fired, raced, won [3]atomic.Int64
			waited            [3]atomic.Int64
			rts               [3]*testredis.Counter
			scheds            []*Scheduler
		)
		prefix := testredis.Prefix(t, admin) // the same on every replica
		start := time.Now().Truncate(period).Add(3 * period)
		end := start.Add(ticks * period)
		for i := range 3 {
			c := connect(t)
			require.NoError(t, c.Ping(context.Background()).Err()) // connected: HELLO is not counted
			rts[i] = &testredis.Counter{}
			c.AddHook(rts[i])
			clock := time.Now
			if i == 2 {
				clock = func() time.Time { return time.Now().Add(-400 * time.Millisecond) }
			}
			s := NewSchedulerFromRedisClient(c, &asynq.SchedulerOpts{
				PreEnqueueFunc: func(*asynq.Task, []asynq.Option) { raced[i].Add(1) },
				PostEnqueueFunc: func(_ *asynq.TaskInfo, err error) {
					if err == nil {
						won[i].Add(1)
					}
				},
			}, WithClock(clock), WithPrefix(prefix))
			s.cfg.onClaimWait = func() { waited[i].Add(1) }
			s.cfg.beforeEnqueue = func(_ string, tick time.Time) hookResult {
				if tick.Before(start) || !tick.Before(end) {
					return hookSkip // outside the measured ticks
				}
				if n := fired[i].Add(1); i == 1 && n == 10 {
					return hookDie // replica 1 dies at its tenth tick
				}
				return hookEnqueue
			}
			_, err := s.Register("@every 100ms", asynq.NewTask("report", nil), asynq.Queue(q))
			require.NoError(t, err)
			scheds = append(scheds, s)
		}
		for _, s := range scheds {
			require.NoError(t, s.Start())
		}
		time.Sleep(time.Until(end.Add(600 * time.Millisecond))) // the last tick, on the clock 400ms behind
		for _, s := range scheds {
			s.Shutdown()
		}
		got := ticksIn(t, admin, q)
		require.Len(t, got, ticks, "one task per tick")
		for k := range ticks {
			require.Equal(t, 1, got[start.Add(time.Duration(k)*period).UnixMilli()], "tick %d", k)
		}
		var total int64
		for i := range 3 {
			total += won[i].Load()
			// One round trip per tick fired, one more each time another
			// replica's claim of the tick was found (replicas 0 and 1 fire
			// at once), two more per tick claimed; a client's first
			// enqueue may also load asynq's script (NOSCRIPT, EVAL) and
			// register the queue (SADD), and its first pipeline open a
			// second connection (HELLO, and its setup pipeline).
			require.LessOrEqual(t, rts[i].Count(), fired[i].Load()+waited[i].Load()+2*raced[i].Load()+4, "replica %d", i)
			t.Logf("replica %d: fired %d ticks, waited for a claim %d times, claimed %d, enqueued %d, %d round trips", i, fired[i].Load(), waited[i].Load(), raced[i].Load(), won[i].Load(), rts[i].Count())
		}
		require.EqualValues(t, ticks, total)
		require.Less(t, fired[1].Load(), int64(ticks), "replica 1 died")
	})
}

// CatchUp: after every replica was down, the missed ticks within the window
// are enqueued once each, oldest first, or only the latest.
func TestCatchUp(t *testing.T) {
	onEachRedis(t, func(t *testing.T, connect deployment) {
		for _, mode := range []CatchUpMode{CatchUpAll, CatchUpLatest} {
			c := connect(t)
			q := queueName(t, c)
			prefix := testredis.Prefix(t, c)
			// Start on a second: the replicas' catch-up then looks within
			// the second the test saw, whose latest tick is now's.
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
			now := time.Now()
			var order []int64
			var mu sync.Mutex
			newSched := func() *Scheduler {
				s := NewSchedulerFromRedisClient(c, nil, CatchUp(time.Minute, mode), WithPrefix(prefix))
				s.cfg.beforeEnqueue = func(_ string, tick time.Time) hookResult {
					if tick.After(now) {
						return hookSkip // only the catch-up is measured
					}
					mu.Lock()
					order = append(order, tick.UnixMilli())
					mu.Unlock()
					return hookEnqueue
				}
				return s
			}
			a, b := newSched(), newSched()
			id, err := a.Register("@every 1s", asynq.NewTask("report", nil), asynq.Queue(q))
			require.NoError(t, err)
			_, err = b.Register("@every 1s", asynq.NewTask("report", nil), asynq.Queue(q))
			require.NoError(t, err)
			// The last tick enqueued was 5s ago; 2 minutes ago is outside the window.
			last := now.Truncate(time.Second).Add(-5 * time.Second)
			require.NoError(t, c.ZAdd(context.Background(), a.lastKey(a.entries[id]), redis.Z{Score: float64(last.UnixMilli()), Member: "t"}).Err())
			require.NoError(t, a.Start())
			require.NoError(t, b.Start())
			require.Eventually(t, func() bool {
				got := ticksIn(t, c, q)
				if mode == CatchUpLatest {
					return len(got) == 1
				}
				return len(got) == 5
			}, 5*time.Second, 10*time.Millisecond)
			a.Shutdown()
			b.Shutdown()
			got := ticksIn(t, c, q)
			for ms, n := range got {
				require.Equal(t, 1, n)
				require.True(t, ms > last.UnixMilli() && ms <= now.UnixMilli())
			}
			if mode == CatchUpLatest {
				require.Contains(t, got, now.Truncate(time.Second).UnixMilli())
			}
			mu.Lock()
			for i := 1; i < len(order); i++ {
				if order[i] < order[i-1] {
					require.Greater(t, order[i], int64(0)) // another replica's sequence
				}
			}
			mu.Unlock()
		}
	})
}

// A PeriodicTaskManager registers the provider's configs and follows their
// changes; an entry's ID is its config's, the same on every replica.
func TestManagerFollowsTheConfigs(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	defer c.Close()
	q := queueName(t, c)
	p := &provider{configs: []*asynq.PeriodicTaskConfig{
		{Cronspec: "@every 100ms", Task: asynq.NewTask("a", nil), Opts: []asynq.Option{asynq.Queue(q)}},
	}}
	m, err := NewPeriodicTaskManager(asynq.PeriodicTaskManagerOpts{PeriodicTaskConfigProvider: p, RedisUniversalClient: c, SyncInterval: 50 * time.Millisecond},
		WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	require.NoError(t, m.Start())
	defer m.Shutdown()
	countType := func(typ string) int {
		tasks, err := asynq.NewInspectorFromRedisClient(c).ListPendingTasks(q, asynq.PageSize(10000))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return 0
		}
		require.NoError(t, err)
		n := 0
		for _, ti := range tasks {
			if ti.Type == typ {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return countType("a") >= 2 }, 5*time.Second, 10*time.Millisecond)
	p.set([]*asynq.PeriodicTaskConfig{{Cronspec: "@every 100ms", Task: asynq.NewTask("b", nil), Opts: []asynq.Option{asynq.Queue(q)}}})
	require.Eventually(t, func() bool { return countType("b") >= 2 }, 5*time.Second, 10*time.Millisecond)
	a := countType("a")
	time.Sleep(300 * time.Millisecond) // three periods of the removed entry
	require.Equal(t, a, countType("a"), "the removed config enqueues no more")

	p.set([]*asynq.PeriodicTaskConfig{{Cronspec: "not a spec", Task: asynq.NewTask("c", nil)}})
	require.ErrorIs(t, m.sync(), ErrInvalid)
}

type provider struct {
	mu      sync.Mutex
	configs []*asynq.PeriodicTaskConfig
}

func (p *provider) set(c []*asynq.PeriodicTaskConfig) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.configs = c
}

func (p *provider) GetConfigs() ([]*asynq.PeriodicTaskConfig, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.configs, nil
}

func TestValidation(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	s := NewSchedulerFromRedisClient(c, nil)
	for want, reg := range map[string]func() error{
		"task is nil":                 func() error { _, err := s.Register("@hourly", nil); return err },
		"expected exactly 5 fields":   func() error { _, err := s.Register("* * *", asynq.NewTask("a", nil)); return err },
		"the period must be at least": func() error { _, err := s.Register("@every 10us", asynq.NewTask("a", nil)); return err },
		"names each tick's task":      func() error { _, err := s.Register("@hourly", asynq.NewTask("a", nil), asynq.TaskID("x")); return err },
		"WithWindow(10ms)":            func() error { return NewSchedulerFromRedisClient(c, nil, WithWindow(10*time.Millisecond)).Start() },
		"CatchUp(0s, 1)":              func() error { return NewSchedulerFromRedisClient(c, nil, CatchUp(0, CatchUpAll)).Start() },
		"WithClock(nil)":              func() error { return NewSchedulerFromRedisClient(c, nil, WithClock(nil)).Start() },
		"client is nil":               func() error { return NewSchedulerFromRedisClient(nil, nil).Start() },
		"PeriodicTaskConfigProvider": func() error {
			_, err := NewPeriodicTaskManager(asynq.PeriodicTaskManagerOpts{RedisUniversalClient: c})
			return err
		},
		"give RedisConnOpt or": func() error {
			_, err := NewPeriodicTaskManager(asynq.PeriodicTaskManagerOpts{PeriodicTaskConfigProvider: &provider{}})
			return err
		},
	} {
		err := reg()
		require.ErrorIs(t, err, ErrInvalid, want)
		require.ErrorContains(t, err, want)
	}
	id, err := s.Register("@hourly", asynq.NewTask("a", []byte("p")), asynq.Queue("q"))
	require.NoError(t, err)
	again := NewSchedulerFromRedisClient(c, nil)
	id2, err := again.Register("@hourly", asynq.NewTask("a", []byte("p")), asynq.Queue("q"))
	require.NoError(t, err)
	require.Equal(t, id, id2, "the same config is the same entry on every replica")
	_, err = s.Register("@hourly", asynq.NewTask("a", []byte("p")), asynq.Queue("q"))
	require.ErrorIs(t, err, ErrInvalid)
	require.NoError(t, s.Unregister(id))
	require.ErrorIs(t, s.Unregister(id), ErrNotFound)
}

// The documented defaults: a window of 1 minute (WithWindow) and, for a
// PeriodicTaskManager whose SyncInterval is zero, a sync every 3 minutes.
func TestDefaults(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	require.Equal(t, time.Minute, NewSchedulerFromRedisClient(c, nil).cfg.window)
	m, err := NewPeriodicTaskManager(asynq.PeriodicTaskManagerOpts{PeriodicTaskConfigProvider: &provider{}, RedisUniversalClient: c})
	require.NoError(t, err)
	require.Equal(t, 3*time.Minute, m.interval)
}

// A Scheduler that was shut down does not start again: Start returns an
// error, whether it had started before or not, and a second Shutdown
// returns (a loop started after the first would keep it waiting).
func TestShutDownSchedulerDoesNotStart(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	for _, startedBefore := range []bool{false, true} {
		s := NewSchedulerFromRedisClient(c, nil)
		if startedBefore {
			require.NoError(t, s.Start())
		}
		s.Shutdown()
		_, err := s.Register("@every 1s", asynq.NewTask("a", nil))
		require.NoError(t, err)
		require.Error(t, s.Start(), "started before: %v", startedBefore)
		done := make(chan struct{})
		go func() { s.Shutdown(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("the second Shutdown did not return (started before: %v)", startedBefore)
		}
	}
}

// stepClock is a clock that moves only when told.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// A tick that comes due while the catch-up enqueues is fired by the loop
// that follows it: the loop goes on from where the catch-up looked, not from
// the clock after it (here every catch-up enqueue takes 300ms of the clock:
// four of them take it past the tick one second after the start).
func TestCatchUpHandsOverToTheLoop(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	q := queueName(t, c)
	start := time.Now().Truncate(time.Second)
	clock := &stepClock{t: start}
	s := NewSchedulerFromRedisClient(c, nil, CatchUp(time.Minute, CatchUpAll), WithClock(clock.now), WithPrefix(testredis.Prefix(t, c)))
	fired := make(chan time.Time, 16)
	s.cfg.beforeEnqueue = func(_ string, tick time.Time) hookResult {
		if !tick.After(start) {
			clock.add(300 * time.Millisecond) // a catch-up enqueue
		}
		fired <- tick
		return hookEnqueue
	}
	id, err := s.Register("@every 1s", asynq.NewTask("report", nil), asynq.Queue(q))
	require.NoError(t, err)
	last := start.Add(-4 * time.Second)
	require.NoError(t, c.ZAdd(context.Background(), s.lastKey(s.entries[id]), redis.Z{Score: float64(last.UnixMilli()), Member: "t"}).Err())
	require.NoError(t, s.Start())
	defer s.Shutdown()
	for want := last.Add(time.Second); !want.After(start.Add(time.Second)); want = want.Add(time.Second) {
		select {
		case got := <-fired:
			require.Equal(t, want.UnixMilli(), got.UnixMilli())
		case <-time.After(5 * time.Second):
			t.Fatalf("tick %s (start %+v) was not fired", want.Format(time.TimeOnly), want.Sub(start))
		}
	}
}

// A replica that comes back from a pause longer than the window fires no
// tick older than the window: those were the other replicas' to enqueue,
// and their tasks may be gone, so enqueueing one again would run it twice.
// The replica's clock jumps 5s while it enqueues its first tick.
func TestPausedReplicaFiresNoStaleTick(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	q := queueName(t, c)
	var mu sync.Mutex
	var offset time.Duration
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return time.Now().Add(offset)
	}
	s := NewSchedulerFromRedisClient(c, nil, WithWindow(time.Second), WithClock(clock), WithPrefix(testredis.Prefix(t, c)))
	type fire struct{ tick, at time.Time }
	fired := make(chan fire, 16)
	s.cfg.beforeEnqueue = func(_ string, tick time.Time) hookResult {
		at := clock()
		mu.Lock()
		if offset == 0 {
			offset = 5 * time.Second // paused while enqueueing its first tick
		}
		mu.Unlock()
		fired <- fire{tick, at}
		return hookEnqueue
	}
	_, err := s.Register("@every 1s", asynq.NewTask("report", nil), asynq.Queue(q))
	require.NoError(t, err)
	require.NoError(t, s.Start())
	defer s.Shutdown()
	var first time.Time
	for i := range 2 {
		select {
		case f := <-fired:
			require.LessOrEqual(t, f.at.Sub(f.tick), time.Second, "tick %s fired %s after it was due", f.tick.Format(time.TimeOnly), f.at.Sub(f.tick))
			if i == 0 {
				first = f.tick
			} else {
				require.GreaterOrEqual(t, f.tick.Sub(first), 5*time.Second, "the ticks of the pause are skipped")
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("tick %d was not fired", i)
		}
	}
}

// A tick whose task is revoked (asynq.RevokeTask, as Preempt does, or
// Requeue with no retries left) is deleted by asynq at once; a replica whose
// clock is 400ms behind, firing the tick after that, does not enqueue it
// again: the tick stays claimed for its window however its task ended.
func TestRevokedTickIsNotEnqueuedAgain(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	q := queueName(t, c)
	prefix := testredis.Prefix(t, c)
	const period = 200 * time.Millisecond
	tick := time.Now().Truncate(period).Add(3 * period)
	srv, runs, revoked := revokingServer(t, c, q)
	serverUp := true
	defer func() {
		if serverUp {
			srv.Shutdown()
		}
	}()

	release, bFired, bMovedOn := make(chan struct{}), make(chan struct{}), make(chan struct{})
	newSched := func(clock func() time.Time, hook func(time.Time) hookResult) *Scheduler {
		s := NewSchedulerFromRedisClient(c, nil, WithClock(clock), WithPrefix(prefix))
		s.cfg.beforeEnqueue = func(_ string, t time.Time) hookResult { return hook(t) }
		_, err := s.Register("@every 200ms", asynq.NewTask("report", nil), asynq.Queue(q), asynq.MaxRetry(0))
		require.NoError(t, err)
		return s
	}
	a := newSched(time.Now, func(t time.Time) hookResult {
		if t.Equal(tick) {
			return hookEnqueue
		}
		return hookSkip
	})
	var movedOn sync.Once
	b := newSched(func() time.Time { return time.Now().Add(-400 * time.Millisecond) }, func(t time.Time) hookResult {
		switch {
		case t.Equal(tick):
			close(bFired)
			<-release // until the tick's task was revoked
			return hookEnqueue
		case t.After(tick):
			movedOn.Do(func() { close(bMovedOn) }) // done with the tick
		}
		return hookSkip
	})
	require.NoError(t, a.Start())
	defer a.Shutdown()
	require.NoError(t, b.Start())
	defer b.Shutdown()

	waitFor := func(ch chan struct{}, what string) {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting: %s", what)
		}
	}
	waitFor(revoked, "the tick's task to run")
	require.Eventually(t, func() bool {
		_, err := asynq.NewInspectorFromRedisClient(c).GetTaskInfo(q, periodickey.TaskID(firstID(a), tick))
		return errors.Is(err, asynq.ErrTaskNotFound)
	}, 5*time.Second, 5*time.Millisecond, "asynq deletes a revoked task")
	srv.Shutdown()
	serverUp = false
	waitFor(bFired, "the replica behind to fire the tick")
	close(release)
	waitFor(bMovedOn, "the replica behind to fire the next tick")
	require.Zero(t, ticksIn(t, c, q)[tick.UnixMilli()], "the revoked tick was enqueued again")
	require.EqualValues(t, 1, runs.Load())
}

func firstID(s *Scheduler) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.entries {
		return id
	}
	return ""
}

// Task headers are part of an entry's identity: two entries that differ
// only in their task's headers are two entries, as in asynq's Scheduler,
// both for Register and for a PeriodicTaskManager's configs; each enqueues
// its own task. An entry without headers keeps the ID it had before headers
// counted.
func TestHeadersArePartOfTheEntry(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	task := func(tenant string) *asynq.Task {
		return asynq.NewTaskWithHeaders("report", []byte("p"), map[string]string{"tenant": tenant})
	}
	s := NewSchedulerFromRedisClient(c, nil, WithPrefix(testredis.Prefix(t, c)))
	a, err := s.Register("@hourly", task("acme"))
	require.NoError(t, err)
	b, err := s.Register("@hourly", task("globex"))
	require.NoError(t, err, "a task that differs in its headers is another entry")
	require.NotEqual(t, a, b)
	_, err = s.Register("@hourly", task("acme"))
	require.ErrorIs(t, err, ErrInvalid, "the same headers are the same entry")
	require.ErrorContains(t, err, "headers")
	plain, err := s.Register("@hourly", asynq.NewTask("report", []byte("p")))
	require.NoError(t, err)
	require.Equal(t, "99e2ebcabd8f14dd6b63", plain, "the ID of an entry without headers is unchanged")

	q := queueName(t, c)
	p := &provider{configs: []*asynq.PeriodicTaskConfig{
		{Cronspec: "@every 100ms", Task: task("acme"), Opts: []asynq.Option{asynq.Queue(q)}},
		{Cronspec: "@every 100ms", Task: task("globex"), Opts: []asynq.Option{asynq.Queue(q)}},
	}}
	m, err := NewPeriodicTaskManager(asynq.PeriodicTaskManagerOpts{PeriodicTaskConfigProvider: p, RedisUniversalClient: c, SyncInterval: time.Hour},
		WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	require.NoError(t, m.Start())
	defer m.Shutdown()
	require.Eventually(t, func() bool {
		tasks, err := asynq.NewInspectorFromRedisClient(c).ListPendingTasks(q)
		seen := map[string]bool{}
		for _, ti := range tasks {
			seen[ti.Headers["tenant"]] = true
		}
		return err == nil && seen["acme"] && seen["globex"]
	}, 5*time.Second, 10*time.Millisecond, "each config enqueues its own task")
}

// The window is checked before the enqueue; an enqueue that stalls (a GC
// pause, a slow PreEnqueueFunc) until the tick's task and mark have expired
// would be accepted a second time. It is not sent after the tick's
// retention has passed on the replica's clock. Here the replica 400ms behind
// stalls for 2s, a window plus its retention, in which the task that the
// other replica enqueued and its mark expire (deleted by the test).
func TestStalledEnqueueIsNotSentAfterTheWindow(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	q := queueName(t, c)
	prefix := testredis.Prefix(t, c)
	const period = 200 * time.Millisecond
	tick := time.Now().Truncate(period).Add(3 * period)
	var mu sync.Mutex
	offset := -400 * time.Millisecond
	behind := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return time.Now().Add(offset)
	}
	enqueued, expired, movedOn := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	newSched := func(clock func() time.Time, opts *asynq.SchedulerOpts, hook func(time.Time) hookResult) *Scheduler {
		s := NewSchedulerFromRedisClient(c, opts, WithClock(clock), WithPrefix(prefix), WithWindow(time.Second))
		s.cfg.beforeEnqueue = func(_ string, t time.Time) hookResult { return hook(t) }
		_, err := s.Register("@every 200ms", asynq.NewTask("report", nil), asynq.Queue(q))
		require.NoError(t, err)
		return s
	}
	a := newSched(time.Now, &asynq.SchedulerOpts{PostEnqueueFunc: func(_ *asynq.TaskInfo, err error) {
		if err == nil {
			close(enqueued)
		}
	}}, func(t time.Time) hookResult {
		if t.Equal(tick) {
			return hookEnqueue
		}
		return hookSkip
	})
	b := newSched(behind, &asynq.SchedulerOpts{PreEnqueueFunc: func(*asynq.Task, []asynq.Option) {
		<-expired
		mu.Lock()
		offset += 2 * time.Second // stalled until the tick's task and mark expired
		mu.Unlock()
	}}, func(t time.Time) hookResult {
		switch {
		case t.Equal(tick):
			return hookEnqueue
		case t.After(tick):
			once.Do(func() { close(movedOn) })
		}
		return hookSkip
	})
	waitFor := func(ch chan struct{}, what string) {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting: %s", what)
		}
	}
	id := firstID(a)
	require.NoError(t, a.Start())
	defer a.Shutdown()
	waitFor(enqueued, "the tick to be enqueued")
	a.Shutdown()
	// What a window plus the retention does: the task and the mark expire.
	require.NoError(t, asynq.NewInspectorFromRedisClient(c).DeleteTask(q, periodickey.TaskID(id, tick)))
	require.NoError(t, c.Del(context.Background(), periodickey.Mark(prefix, id, tick)).Err())
	require.NoError(t, b.Start())
	defer b.Shutdown()
	close(expired)
	waitFor(movedOn, "the stalled replica to go on to a later tick")
	require.Zero(t, ticksIn(t, c, q)[tick.UnixMilli()], "the stalled enqueue was sent after the window")
}

// failMark fails every script call on a tick's mark (the claim): a mark
// that cannot be read.
type failMark struct{ calls *atomic.Int64 }

func (failMark) DialHook(next redis.DialHook) redis.DialHook { return next }
func (failMark) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f failMark) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			if k, _ := cmd.Args()[3].(string); periodickey.IsMark(k) {
				f.calls.Add(1)
				cmd.SetErr(errors.New("connection reset by peer"))
				return cmd.Err()
			}
		}
		return next(ctx, cmd)
	}
}

// A tick whose mark cannot be read is enqueued all the same: the tick's task
// ID still refuses a second enqueue, and a lone replica does not lose it.
func TestUnreadableMarkDoesNotDropTheTick(t *testing.T) {
	clean := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = clean.Close() })
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	var failed atomic.Int64
	c.AddHook(failMark{&failed})
	q := queueName(t, clean)
	prefix := testredis.Prefix(t, clean)
	const period = 200 * time.Millisecond
	tick := time.Now().Truncate(period).Add(2 * period)
	fired := make(chan struct{})
	s := NewSchedulerFromRedisClient(c, nil, WithPrefix(prefix))
	s.cfg.beforeEnqueue = func(_ string, at time.Time) hookResult {
		if at.Equal(tick) {
			close(fired)
			return hookEnqueue
		}
		return hookSkip
	}
	_, err := s.Register("@every 200ms", asynq.NewTask("report", nil), asynq.Queue(q))
	require.NoError(t, err)
	require.NoError(t, s.Start())
	defer s.Shutdown()
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("the tick did not fire")
	}
	require.Eventually(t, func() bool { return ticksIn(t, clean, q)[tick.UnixMilli()] == 1 }, 5*time.Second, 5*time.Millisecond,
		"the tick is enqueued though its mark could not be read")
	require.Positive(t, failed.Load(), "the claim of the tick's mark failed")
}

// revokingServer starts an asynq server on q whose handler revokes every
// task (asynq.RevokeTask, as Preempt does): it counts the runs, and closes
// revoked at the first.
func revokingServer(t *testing.T, c redis.UniversalClient, q string) (srv *asynq.Server, runs *atomic.Int64, revoked chan struct{}) {
	runs, revoked = &atomic.Int64{}, make(chan struct{})
	srv = asynq.NewServerFromRedisClient(c, asynq.Config{Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if runs.Add(1) == 1 {
			close(revoked)
		}
		return fmt.Errorf("preempted: %w", asynq.RevokeTask)
	})))
	return srv, runs, revoked
}

// claimReplicas starts two replicas of one "@every 200ms" entry on c with
// window (a claim lives a quarter of it), the first with its clock 400ms
// ahead (it fires each tick first); only tick is fired (enqueued by a
// replica that claims it), and ahead's afterClaim hook is ahead's own; the
// one ahead uses aheadClient if not nil. It returns the replicas.
func claimReplicas(t *testing.T, c, aheadClient redis.UniversalClient, q string, window time.Duration, tick time.Time, ahead func(time.Time) hookResult) (a, b *Scheduler) {
	prefix := testredis.Prefix(t, c)
	if aheadClient == nil {
		aheadClient = c
	}
	newSched := func(c redis.UniversalClient, skew time.Duration) *Scheduler {
		s := NewSchedulerFromRedisClient(c, nil, WithClock(func() time.Time { return time.Now().Add(skew) }), WithPrefix(prefix), WithWindow(window))
		require.Equal(t, window/4, s.cfg.claimTTL)
		s.cfg.beforeEnqueue = func(_ string, at time.Time) hookResult {
			if at.Equal(tick) {
				return hookEnqueue
			}
			return hookSkip
		}
		_, err := s.Register("@every 200ms", asynq.NewTask("report", nil), asynq.Queue(q), asynq.MaxRetry(0))
		require.NoError(t, err)
		return s
	}
	a, b = newSched(aheadClient, 400*time.Millisecond), newSched(c, 0)
	a.cfg.afterClaim = ahead
	require.NoError(t, a.Start())
	t.Cleanup(a.Shutdown)
	require.NoError(t, b.Start())
	t.Cleanup(b.Shutdown)
	return a, b
}

// A replica that claimed a tick and stalled until its claim lapsed (a GC
// pause, a slow PreEnqueueFunc) does not enqueue it: the other replica
// claimed and enqueued it meanwhile, and its task, revoked, is gone; an
// enqueue that late would run the tick twice.
func TestClaimantStalledPastItsClaimDoesNotEnqueueTheTick(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	q := queueName(t, c)
	tick := time.Now().Truncate(200 * time.Millisecond).Add(5 * 200 * time.Millisecond)
	srv, runs, revoked := revokingServer(t, c, q)
	t.Cleanup(srv.Shutdown)
	stalled, release, resumed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	a, _ := claimReplicas(t, c, nil, q, 2*time.Second, tick, func(time.Time) hookResult {
		close(stalled)
		<-release // until the other replica enqueued the tick and its task was revoked
		defer close(resumed)
		return hookEnqueue
	})
	wait := func(ch chan struct{}, what string) {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting: %s", what)
		}
	}
	wait(stalled, "the replica ahead to claim the tick")
	wait(revoked, "the other replica to enqueue the tick once the claim lapsed, and its task to run")
	require.Eventually(t, func() bool {
		_, err := asynq.NewInspectorFromRedisClient(c).GetTaskInfo(q, periodickey.TaskID(firstID(a), tick))
		return errors.Is(err, asynq.ErrTaskNotFound)
	}, 5*time.Second, 5*time.Millisecond, "asynq deletes a revoked task")
	close(release)
	wait(resumed, "the stalled replica to go on")
	a.Shutdown() // its fire of the tick has returned
	require.Zero(t, ticksIn(t, c, q)[tick.UnixMilli()], "the stalled replica enqueued the tick again")
	require.EqualValues(t, 1, runs.Load())
}

// A replica that claimed a tick and died before enqueueing it leaves the
// tick to another: once the claim lapses, the other claims and enqueues it,
// within the window (1s here: the claim lives 250ms).
func TestClaimantThatDiesLeavesTheTickToAnother(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	q := queueName(t, c)
	tick := time.Now().Truncate(200 * time.Millisecond).Add(5 * 200 * time.Millisecond)
	died := make(chan struct{})
	claimReplicas(t, c, nil, q, time.Second, tick, func(time.Time) hookResult {
		close(died)
		return hookDie
	})
	select {
	case <-died:
	case <-time.After(10 * time.Second):
		t.Fatal("the replica ahead did not claim the tick")
	}
	require.Eventually(t, func() bool { return ticksIn(t, c, q)[tick.UnixMilli()] == 1 }, 5*time.Second, 5*time.Millisecond,
		"the other replica enqueues the tick once the claim lapsed")
}

// slowClaimReply holds back the reply of each claim of a tick (the script
// ran on the server) for d: a claim whose reply came late, as when go-redis
// sends it again after a lost reply and the second run finds the claim.
type slowClaimReply struct{ d time.Duration }

func (slowClaimReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (slowClaimReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h slowClaimReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			if k, _ := cmd.Args()[3].(string); periodickey.IsMark(k) {
				time.Sleep(h.d)
			}
		}
		return err
	}
}

// A claim's life begins when the claim runs on the server, not when its
// reply arrives: a replica whose claim reply came after the claim's margin
// (here 600ms against 400ms) does not enqueue the tick, which the other
// replica enqueued once the claim lapsed, and whose task was revoked.
func TestLateClaimReplyDoesNotEnqueueTheTickAgain(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	slow := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	t.Cleanup(func() { _ = slow.Close() })
	slow.AddHook(slowClaimReply{600 * time.Millisecond})
	q := queueName(t, c)
	tick := time.Now().Truncate(200 * time.Millisecond).Add(5 * 200 * time.Millisecond)
	srv, runs, revoked := revokingServer(t, c, q)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			srv.Shutdown()
		}
	})
	a, _ := claimReplicas(t, c, slow, q, 2*time.Second, tick, func(time.Time) hookResult {
		select {
		case <-revoked: // the other replica enqueued the tick, and its task ran
		case <-time.After(10 * time.Second):
			t.Error("the other replica did not enqueue the tick")
		}
		return hookEnqueue
	})
	select {
	case <-revoked:
	case <-time.After(10 * time.Second):
		t.Fatal("the tick's task did not run")
	}
	a.Shutdown() // its fire of the tick has returned
	srv.Shutdown()
	stopped = true
	require.Zero(t, ticksIn(t, c, q)[tick.UnixMilli()], "the replica whose claim reply came late enqueued the tick again")
	require.EqualValues(t, 1, runs.Load())
}
