//go:build faults

package faults_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/asynqtest"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// asynqDB is the database of the standalone Redis the asynq scenarios use:
// asynq's global keys (asynq:queues, asynq:servers) stay away from other
// packages' tests. Each scenario also has its own queue and lock key prefix.
const asynqDB = 13

// newAsynqEnv returns a scenario's queue, lock key prefix and clients on
// database asynqDB of the standalone Redis.
func newAsynqEnv(t *testing.T) *asynqtest.Env {
	t.Helper()
	return asynqtest.NewEnv(t, asynqtest.Standalone(t, asynqDB))
}

// asynqGuard is the singleton middleware every worker of a scenario uses: tasks
// keyed by their task ID (or all by sharedKey, see keyOption), duplicates
// requeued after 50ms. held, if not nil, counts the duplicates it holds back.
func asynqGuard(rdb redis.UniversalClient, prefix, owner string, ttl time.Duration, held *atomic.Int32, key ...singleton.ServerOption) (asynq.MiddlewareFunc, *lockkit.Locker, error) {
	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix), lockkit.WithOwner(owner))
	if err != nil {
		return nil, nil, err
	}
	if len(key) == 0 {
		key = []singleton.ServerOption{singleton.KeyByTaskID()}
	}
	mw, err := singleton.Middleware(locker,
		key[0],
		singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)),
		singleton.WithTTL(ttl),
		singleton.WithRedis(rdb),
		singleton.WithObserver(func(_ context.Context, e middleware.Event) {
			// A re-delivery of a task whose earlier run holds the key waits
			// for it; another task of the key is a duplicate.
			if (e.Kind == middleware.EventDuplicate || e.Kind == middleware.EventWaited) && held != nil {
				held.Add(1)
			}
		}))
	if err != nil {
		_ = locker.Close(context.Background())
		return nil, nil, err
	}
	return mw, locker, nil
}

// asynqConfig is the asynq.Config of every worker: asynqtest.Config (the
// singleton pieces, fast polling and forwarding, and no logs), except that
// other errors (asynq's ErrLeaseExpired from its recoverer) are retried at
// once.
func asynqConfig(queue string, concurrency int) asynq.Config {
	return asynqtest.ConfigRetrying(queue, concurrency, func(int, error, *asynq.Task) time.Duration { return 0 })
}

// taskOf names the work a run did: the ID of the task it was enqueued as,
// also for a copy that Requeue enqueued (its label, asynqkey.LabelHeader).
func taskOf(ctx context.Context, t *asynq.Task) string {
	if id := t.Headers()[asynqkey.LabelHeader]; id != "" {
		return id
	}
	id, _ := asynq.GetTaskID(ctx)
	return id
}

// taskRun is one handler call: from its start to its end. A run of a killed
// process has no end of its own; the scenario gives it the time its lease
// expired at the earliest.
type taskRun struct {
	task, where string
	start, end  time.Time // end is zero while the run is in progress
	completed   bool      // the work was done (not abandoned)
}

// taskLog records every handler start and end, per task. The scenarios key
// their work by task ID, so a task is also a lock key.
type taskLog struct {
	mu   sync.Mutex
	runs []*taskRun
}

func (l *taskLog) begin(task, where string, at time.Time) *taskRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := &taskRun{task: task, where: where, start: at}
	l.runs = append(l.runs, r)
	return r
}

func (l *taskLog) finish(r *taskRun, at time.Time, completed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.end, r.completed = at, completed
}

// peaks returns the most runs of each task seen at once, a run without an
// end counting until the end of time. A run that starts when another ends
// does not overlap it.
func (l *taskLog) peaks() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	type edge struct {
		at    time.Time
		delta int
	}
	edges := map[string][]edge{}
	for _, r := range l.runs {
		edges[r.task] = append(edges[r.task], edge{r.start, +1})
		if !r.end.IsZero() {
			edges[r.task] = append(edges[r.task], edge{r.end, -1})
		}
	}
	out := map[string]int{}
	for task, es := range edges {
		slices.SortFunc(es, func(a, b edge) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.delta - b.delta // ends first
		})
		n := 0
		for _, e := range es {
			n += e.delta
			out[task] = max(out[task], n)
		}
	}
	return out
}

// completions returns how many runs of each task did the work.
func (l *taskLog) completions() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, r := range l.runs {
		if r.completed {
			out[r.task]++
		}
	}
	return out
}

// ended reports whether every run has ended.
func (l *taskLog) ended() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.runs {
		if r.end.IsZero() {
			return false
		}
	}
	return true
}

// of returns the runs of task in start order.
func (l *taskLog) of(task string) []taskRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []taskRun
	for _, r := range l.runs {
		if r.task == task {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b taskRun) int { return a.start.Compare(b.start) })
	return out
}

// taskOutcome is what a scenario reports and asserts on.
type taskOutcome struct {
	peak                  int // the most runs of one task (one lock key) at once
	lost, twice, archived int // tasks never completed, tasks completed more than once
}

func (l *taskLog) outcome(t *testing.T, e *asynqtest.Env, tasks []string) taskOutcome {
	t.Helper()
	var o taskOutcome
	for _, p := range l.peaks() {
		o.peak = max(o.peak, p)
	}
	done := l.completions()
	for _, id := range tasks {
		switch {
		case done[id] == 0:
			o.lost++
		case done[id] > 1:
			o.twice++
		}
	}
	o.archived = e.QueueInfo().Archived
	return o
}

// A worker process is killed with SIGKILL while its handlers run under
// singleton leases (KeyByTaskID, Requeue, a 1.5s TTL). The dead worker's keys
// free within TTL + 1s; asynq re-delivers its tasks; no re-run starts before
// the dead holder's lease would have expired; every task then runs to
// completion exactly once and nothing is archived.
//
// asynq hands a dead worker's task back only once its worker lease (30s,
// renewed by the dead worker's heartbeater) has expired and its recoverer's
// 30s cutoff has passed. To keep the test short, the scenario moves the
// scores of the queue's lease ZSET (asynq:{<queue>}:lease, lease expiry in
// unix seconds) 60s into the past right after the kill, which is what those
// 60s would have done, and then starts a fresh server, whose recoverer runs at
// once. asynq therefore re-delivers long before the dead holder's lock lease
// expires: the guard has to hold the re-runs back.
func TestKilledAsynqWorker(t *testing.T) {
	if os.Getenv("JOBGUARD_FAULT_CHILD") != "" {
		return // runs as the child in TestMain
	}
	const ttl = 1500 * time.Millisecond
	const childConcurrency, tasks = 2, 3
	e := newAsynqEnv(t)
	rl := &taskLog{}

	var ids []string
	for i := range tasks {
		// Retries left: asynq's recoverer archives a lease-expired task that has none.
		info := e.Enqueue(asynq.NewTask("work", fmt.Appendf(nil, `{"n":%d}`, i)), asynq.MaxRetry(3))
		ids = append(ids, info.ID)
	}

	lines, kill := startWorkerChild(t, e, ttl, childConcurrency, "")
	defer kill()

	// The child's handlers report "started <task id> <fencing token>".
	tokens := map[string]int64{}
	dead := map[string]*taskRun{}
	for len(tokens) < childConcurrency {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "the child exited")
			var id string
			var token int64
			_, err := fmt.Sscanf(line, "started %s %d", &id, &token)
			require.NoError(t, err, "child said %q", line)
			require.Contains(t, ids, id)
			tokens[id] = token
			dead[id] = rl.begin(id, "killed worker", time.Now())
		case <-time.After(10 * time.Second):
			t.Fatal("the child's handlers did not start")
		}
	}

	locker, err := lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix))
	require.NoError(t, err)
	defer locker.Close(context.Background())
	keyOf := func(id string) string { return "asynq:work:id:" + id }

	// Let the child renew its leases at least once (without a renewal less
	// than half the TTL would be left by now), then kill it mid-lease.
	require.Eventually(t, func() bool {
		for id, r := range dead {
			info, err := locker.Inspect(context.Background(), keyOf(id))
			if err != nil || len(info.Holders) != 1 || time.Since(r.start) < ttl/2 || info.Holders[0].TTL < ttl/2+100*time.Millisecond {
				return false
			}
		}
		return true
	}, 5*time.Second, 5*time.Millisecond)

	// Just before the kill: the lease TTL left on each key. The lease
	// expires no earlier than the time before the call plus that TTL, less
	// the millisecond Inspect may round up (it counts whole milliseconds from
	// Redis's clock truncated to the millisecond).
	expires := map[string]time.Time{}
	for id, token := range tokens {
		before := time.Now()
		info, err := locker.Inspect(context.Background(), keyOf(id))
		require.NoError(t, err)
		require.Len(t, info.Holders, 1)
		require.Equal(t, token, info.Holders[0].Token)
		expires[id] = before.Add(info.Holders[0].TTL - time.Millisecond)
	}
	killed := time.Now()
	kill()
	for id, r := range dead {
		// From the guard's view the dead run lasts as long as its lease.
		rl.finish(r, expires[id], false)
	}

	// asynq's 60s, simulated: every lease of the queue expired 60s earlier.
	ctx := context.Background()
	leaseKey := asynqkey.Lease(e.Queue)
	leases, err := e.RDB.ZRangeWithScores(ctx, leaseKey, 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, leases, childConcurrency, "the killed worker's tasks are active")
	for _, z := range leases {
		require.NoError(t, e.RDB.ZAddXX(ctx, leaseKey, redis.Z{Member: z.Member, Score: z.Score - 60}).Err())
	}

	// A fresh server: its recoverer hands the dead worker's tasks back at once.
	var held atomic.Int32
	mw, l2, err := asynqGuard(e.RDB, e.Prefix, "fresh-server", ttl, &held)
	require.NoError(t, err)
	defer l2.Close(context.Background())
	retries := map[string]int{}
	var mu sync.Mutex
	srv := asynq.NewServerFromRedisClient(e.RDB, asynqConfig(e.Queue, 4))
	require.NoError(t, srv.Start(mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id := taskOf(ctx, task)
		r := rl.begin(id, "fresh server", time.Now())
		n, _ := asynq.GetRetryCount(ctx)
		mu.Lock()
		retries[id] = n
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // the work
		rl.finish(r, time.Now(), true)
		return nil
	}))))
	defer srv.Shutdown()

	// The dead holder's keys free within TTL + 1s, not before their leases expire.
	free := map[string]time.Time{}
	require.Eventually(t, func() bool {
		for id, token := range tokens {
			if _, ok := free[id]; ok {
				continue
			}
			info, err := locker.Inspect(ctx, keyOf(id))
			if err == nil && !slices.ContainsFunc(info.Holders, func(h lockkit.Holder) bool { return h.Token == token }) {
				free[id] = time.Now()
			}
		}
		return len(free) == len(tokens)
	}, ttl+5*time.Second, 5*time.Millisecond)
	for id, at := range free {
		require.Less(t, at.Sub(killed), ttl+time.Second, "task %s: key free within TTL + 1s of the kill", id)
		require.False(t, at.Before(expires[id]), "task %s: key free %s before the dead holder's lease expired", id, expires[id].Sub(at))
	}

	require.Eventually(t, func() bool {
		done := rl.completions()
		return len(done) == tasks && rl.ended()
	}, 20*time.Second, 5*time.Millisecond)
	recovered := time.Now()
	e.Drained(10 * time.Second)

	for id := range tokens {
		runs := rl.of(id)
		require.Len(t, runs, 2, "task %s: the killed run and one re-run", id)
		require.False(t, runs[1].start.Before(expires[id]),
			"task %s re-ran %s before the dead holder's lease expired", id, expires[id].Sub(runs[1].start))
		mu.Lock()
		require.Equal(t, 1, retries[id], "task %s was re-delivered by asynq's recoverer", id)
		mu.Unlock()
	}
	o := rl.outcome(t, e, ids)
	var firstFree, lastFree, firstRerun time.Duration
	firstFree = math.MaxInt64
	for id, at := range free {
		firstFree = min(firstFree, at.Sub(killed))
		lastFree = max(lastFree, at.Sub(killed))
		if rr := rl.of(id)[1].start.Sub(killed); firstRerun == 0 || rr < firstRerun {
			firstRerun = rr
		}
	}
	t.Logf("SIGKILLed asynq worker (lock TTL %s, %d tasks, %d in the killed worker): max concurrent runs per key %d, "+
		"lost %d, run twice %d, archived %d; re-deliveries held back by the dead holder's leases %d; "+
		"keys free %s–%s after the kill, first re-run %s after, all done %s after",
		ttl, tasks, childConcurrency, o.peak, o.lost, o.twice, o.archived, held.Load(), firstFree.Round(time.Millisecond),
		lastFree.Round(time.Millisecond), firstRerun.Round(time.Millisecond), recovered.Sub(killed).Round(time.Millisecond))
	require.Positive(t, held.Load(), "asynq re-delivered while the dead holder's leases were valid")
	require.Equal(t, 1, o.peak, "no re-run overlapped a valid lease")
	require.Zero(t, o.lost)
	require.Zero(t, o.twice)
	require.Zero(t, o.archived)
}

// startWorkerChild starts asynqWorkerChild on e's queue with lock TTL ttl,
// concurrency workers and key ("" for KeyByTaskID, sharedKey for one key).
// It returns the lines the child prints and kill, which SIGKILLs the child
// and waits for it (once; later calls do nothing).
func startWorkerChild(t *testing.T, e *asynqtest.Env, ttl time.Duration, concurrency int, key string) (<-chan string, func()) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "JOBGUARD_FAULT_CHILD=asynq-worker", "REDIS_ADDR="+testredis.Addr(t),
		"JOBGUARD_DB="+strconv.Itoa(asynqDB), "JOBGUARD_PREFIX="+e.Prefix, "JOBGUARD_QUEUE="+e.Queue,
		"JOBGUARD_TTL="+ttl.String(), "JOBGUARD_CONCURRENCY="+strconv.Itoa(concurrency), "JOBGUARD_KEY="+key)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var once sync.Once
	return lines, func() {
		once.Do(func() {
			_ = child.Process.Kill()
			for range lines { // until the pipe closes: Wait must come after the reads
			}
			_ = child.Wait()
		})
	}
}

// asynqWorkerChild is the killed process of TestKilledAsynqWorker: an asynq
// server whose handlers report their start on stdout and then block until
// the process is killed.
func asynqWorkerChild() {
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ttl, err := time.ParseDuration(os.Getenv("JOBGUARD_TTL"))
	if err != nil {
		fail(err)
	}
	db, _ := strconv.Atoi(os.Getenv("JOBGUARD_DB"))
	concurrency, _ := strconv.Atoi(os.Getenv("JOBGUARD_CONCURRENCY"))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), DB: db})
	mw, _, err := asynqGuard(rdb, os.Getenv("JOBGUARD_PREFIX"), "doomed-worker", ttl, nil, keyOption(os.Getenv("JOBGUARD_KEY"))...)
	if err != nil {
		fail(err)
	}
	var mu sync.Mutex
	srv := asynq.NewServerFromRedisClient(rdb, asynqConfig(os.Getenv("JOBGUARD_QUEUE"), concurrency))
	err = srv.Start(mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		lease, _ := lockkit.LeaseFromContext(ctx)
		mu.Lock()
		fmt.Println("started", taskOf(ctx, task), lease.Token())
		mu.Unlock()
		select {} // works until killed
	})))
	if err != nil {
		fail(err)
	}
	select {}
}

// A server shuts down with a short ShutdownTimeout while its handlers run and
// keep running for a while after their ctx is cancelled. asynq puts the tasks
// back at once and a second server picks them up; with KeyByTaskID (and the
// Requeue copies of MaxRetry(0) tasks keeping their original's key) no re-run
// starts before the old run has returned, and no task is lost or archived.
// Half the handlers finish their work anyway: their re-deliveries wait for
// them and then complete without running (the work is done once). The other
// half abandon it, so the second server does it once.
func TestShutdownRequeueNeverOverlaps(t *testing.T) {
	const tasks = 6
	const grace = 300 * time.Millisecond // how long a handler ignores its cancelled ctx
	e := newAsynqEnv(t)
	rl := &taskLog{}
	finishes := func(n int) bool { return n%2 == 0 }

	var ids []string
	index := map[string]int{}
	for i := range tasks {
		retries := 3
		if i%3 == 0 {
			retries = 0 // a duplicate of it is re-enqueued as a copy
		}
		info := e.Enqueue(asynq.NewTask("work", fmt.Appendf(nil, `{"n":%d}`, i)), asynq.MaxRetry(retries))
		ids = append(ids, info.ID)
		index[info.ID] = i
	}

	started := make(chan string, tasks)
	cancelled := make(chan struct{}, tasks)
	handler := func(where string) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			id := taskOf(ctx, task)
			r := rl.begin(id, where, time.Now())
			if where == "second" {
				time.Sleep(20 * time.Millisecond) // the work
				rl.finish(r, time.Now(), true)
				return nil
			}
			started <- id
			<-ctx.Done()
			cancelled <- struct{}{}
			time.Sleep(grace) // deaf to the cancellation for a while
			rl.finish(r, time.Now(), finishes(index[id]))
			if finishes(index[id]) {
				return nil
			}
			return ctx.Err()
		})
	}
	mwA, lA, err := asynqGuard(e.RDB, e.Prefix, "first", 5*time.Second, nil)
	require.NoError(t, err)
	defer lA.Close(context.Background())
	cfgA := asynqConfig(e.Queue, tasks)
	cfgA.ShutdownTimeout = 200 * time.Millisecond
	srvA := asynq.NewServerFromRedisClient(e.RDB, cfgA)
	require.NoError(t, srvA.Start(mwA(handler("first"))))
	defer srvA.Shutdown()
	for range tasks {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the first server did not start every task")
		}
	}

	var held atomic.Int32
	mwB, lB, err := asynqGuard(e.RDB, e.Prefix, "second", 5*time.Second, &held)
	require.NoError(t, err)
	defer lB.Close(context.Background())
	srvB := asynq.NewServerFromRedisClient(e.RDB, asynqConfig(e.Queue, tasks))
	require.NoError(t, srvB.Start(mwB(handler("second"))))
	defer srvB.Shutdown()

	shutdown := time.Now()
	srvA.Shutdown() // after 200ms every task goes back to pending and its ctx is cancelled
	for range tasks {
		select {
		case <-cancelled:
		case <-time.After(10 * time.Second):
			t.Fatal("a handler's ctx was not cancelled by the shutdown")
		}
	}
	require.Eventually(t, func() bool {
		done := rl.completions()
		for _, id := range ids {
			if done[id] != 1 {
				return false
			}
		}
		return rl.ended()
	}, 20*time.Second, 5*time.Millisecond)
	recovered := time.Now()
	e.Drained(10 * time.Second)

	var lastOld time.Time
	for _, id := range ids {
		runs := rl.of(id)
		if len(runs) > 0 && runs[0].end.After(lastOld) {
			lastOld = runs[0].end
		}
		if finishes(index[id]) {
			require.Len(t, runs, 1, "task %s: the interrupted run finished the work; its re-delivery did not run", id)
			require.Equal(t, "first", runs[0].where)
			continue
		}
		require.Len(t, runs, 2, "task %s: the interrupted run and one re-run", id)
		require.Equal(t, "first", runs[0].where)
		require.Equal(t, "second", runs[1].where)
		require.False(t, runs[1].start.Before(runs[0].end), "task %s re-ran %s before the old run returned",
			id, runs[0].end.Sub(runs[1].start))
	}
	o := rl.outcome(t, e, ids)
	t.Logf("shutdown (ShutdownTimeout 200ms, handlers deaf for %s, %d tasks): max concurrent runs per key %d, "+
		"lost %d, run twice %d, archived %d; "+
		"re-deliveries held back by the old runs' leases %d; old runs returned %s after Shutdown, all done %s after",
		grace, tasks, o.peak, o.lost, o.twice, o.archived, held.Load(), lastOld.Sub(shutdown).Round(time.Millisecond),
		recovered.Sub(shutdown).Round(time.Millisecond))
	require.Positive(t, held.Load(), "the second server got re-deliveries while the old runs held their keys")
	require.Equal(t, 1, o.peak, "no re-run overlapped the run still holding the key")
	require.Zero(t, o.lost)
	require.Zero(t, o.twice, "a re-delivery never redid work its earlier run had finished")
	require.Zero(t, o.archived)
}

// sharedKey is the one key of the scenarios whose tasks all share it.
const sharedKey = "shared"

// keyOption is the key option a child worker is told to use: "shared" for
// sharedKey, anything else for asynqGuard's default (KeyByTaskID).
func keyOption(name string) []singleton.ServerOption {
	if name != sharedKey {
		return nil
	}
	return []singleton.ServerOption{singleton.KeyFunc(sharedKeyFunc)}
}

func sharedKeyFunc(context.Context, *asynq.Task) (string, error) { return sharedKey, nil }

// A worker process is SIGKILLed while it runs the first of a burst of tasks
// that share one key and were queued for it by singleton.ParkAtEnqueue
// (backstop 1s). The parked tasks are not stranded behind the dead run:
// those asynq delivers at their backstop while the dead holder's lease
// lives are parked again, and once it expired the re-delivered killed task
// runs and each run's end starts the next parked task. Every
// task runs to completion exactly once, never two runs of the key at once,
// none before the dead lease expired, and nothing is archived. asynq's
// recovery of the killed task is simulated as in TestKilledAsynqWorker.
func TestKilledWorkerLeavesNoParkedTaskBehind(t *testing.T) {
	if os.Getenv("JOBGUARD_FAULT_CHILD") != "" {
		return // runs as the child in TestMain
	}
	const ttl = 1500 * time.Millisecond
	const tasks = 4
	e := newAsynqEnv(t)
	byTask, byKey := &taskLog{}, &taskLog{}

	enq, err := lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix))
	require.NoError(t, err)
	defer enq.Close(context.Background())
	client, err := singleton.NewClient(e.Client, e.RDB, singleton.KeyFunc(sharedKeyFunc), singleton.ParkAtEnqueue(enq, time.Second))
	require.NoError(t, err)
	var ids []string
	for i := range tasks {
		info, err := client.Enqueue(asynq.NewTask("work", fmt.Appendf(nil, `{"n":%d}`, i)), asynq.Queue(e.Queue), asynq.MaxRetry(3))
		require.NoError(t, err)
		ids = append(ids, info.ID)
	}

	lines, kill := startWorkerChild(t, e, ttl, 2, sharedKey)
	defer kill()

	var first string
	var token int64
	select {
	case line, ok := <-lines:
		require.True(t, ok, "the child exited")
		_, err := fmt.Sscanf(line, "started %s %d", &first, &token)
		require.NoError(t, err, "child said %q", line)
	case <-time.After(10 * time.Second):
		t.Fatal("the child's handler did not start")
	}
	require.Equal(t, ids[0], first, "the task that reserved the key runs first")
	deadTask, deadKey := byTask.begin(first, "killed worker", time.Now()), byKey.begin(sharedKey, "killed worker", time.Now())

	// Past the parked tasks' backstop, and past a renewal of the lease.
	locker, err := lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix))
	require.NoError(t, err)
	defer locker.Close(context.Background())
	require.Eventually(t, func() bool {
		info, err := locker.Inspect(context.Background(), sharedKey)
		return err == nil && len(info.Holders) == 1 && time.Since(deadTask.start) > 1500*time.Millisecond &&
			info.Holders[0].TTL > ttl/2+100*time.Millisecond
	}, 10*time.Second, 5*time.Millisecond)
	before := time.Now()
	info, err := locker.Inspect(context.Background(), sharedKey)
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, token, info.Holders[0].Token)
	expires := before.Add(info.Holders[0].TTL - time.Millisecond)
	kill()
	byTask.finish(deadTask, expires, false)
	byKey.finish(deadKey, expires, false)

	ctx := context.Background()
	leaseKey := asynqkey.Lease(e.Queue)
	leases, err := e.RDB.ZRangeWithScores(ctx, leaseKey, 0, -1).Result()
	require.NoError(t, err)
	require.NotEmpty(t, leases, "the killed worker's task is active")
	for _, z := range leases {
		require.NoError(t, e.RDB.ZAddXX(ctx, leaseKey, redis.Z{Member: z.Member, Score: z.Score - 60}).Err())
	}

	mw, l2, err := asynqGuard(e.RDB, e.Prefix, "fresh-server", ttl, nil, keyOption(sharedKey)...)
	require.NoError(t, err)
	defer l2.Close(context.Background())
	srv := asynq.NewServerFromRedisClient(e.RDB, asynqConfig(e.Queue, 4))
	require.NoError(t, srv.Start(mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id := taskOf(ctx, task)
		r, k := byTask.begin(id, "fresh server", time.Now()), byKey.begin(sharedKey, "fresh server", time.Now())
		time.Sleep(20 * time.Millisecond) // the work
		byTask.finish(r, time.Now(), true)
		byKey.finish(k, time.Now(), true)
		return nil
	}))))
	defer srv.Shutdown()

	require.Eventually(t, func() bool { return len(byTask.completions()) == tasks && byTask.ended() }, 20*time.Second, 5*time.Millisecond)
	e.Drained(10 * time.Second)
	o := byTask.outcome(t, e, ids)
	keyPeak := 0
	for _, p := range byKey.peaks() {
		keyPeak = max(keyPeak, p)
	}
	rerun := byTask.of(first)
	require.Len(t, rerun, 2, "the killed run and one re-run")
	t.Logf("SIGKILLed worker with %d tasks parked at enqueue behind its run (lock TTL %s): lost %d, run twice %d, archived %d, "+
		"most runs of the key at once %d, killed task re-ran %s after its dead lease expired",
		tasks-1, ttl, o.lost, o.twice, o.archived, keyPeak, rerun[1].start.Sub(expires).Round(time.Millisecond))
	require.False(t, rerun[1].start.Before(expires), "the killed task re-ran before the dead lease expired")
	require.Equal(t, 1, keyPeak, "two runs of the key at once")
	require.Zero(t, o.lost)
	require.Zero(t, o.twice)
	require.Zero(t, o.archived)
}
