package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/singleton"
)

// uniqueEnv is a Client with Unique and a server whose handler the test steers.
type uniqueEnv struct {
	*env
	client *singleton.Client
	locker *lockkit.Locker
	rt     *testredis.Counter

	mu      sync.Mutex
	results map[string][]error // tenant → what the next runs return, in order
	block   chan struct{}      // when set, runs wait for it to close
	started chan string        // each run sends its tenant when it starts
	hold    bool               // when set, a failed task stays in retry until the test runs it
	ran     map[string]int     // tenant → runs
}

func newUniqueEnv(t *testing.T, r connect, life singleton.Lifetime, ttl time.Duration) *uniqueEnv {
	e := newEnvOn(t, r)
	u := &uniqueEnv{env: e, results: map[string][]error{}, ran: map[string]int{}, rt: &testredis.Counter{}, started: make(chan string, 64)}
	u.locker = e.locker()
	var err error
	u.client, err = singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB,
		singleton.KeyByFields("tenant_id"), singleton.Unique(u.locker, life, ttl))
	require.NoError(t, err)
	return u
}

// serve starts two servers (each with its own Locker, as on two machines)
// whose middleware keys by tenant.
func (u *uniqueEnv) serve() {
	for i := range 2 {
		u.serveOn(u.env.locker(lockkit.WithOwner(fmt.Sprintf("server-%d", i))))
	}
}

func (u *uniqueEnv) serveOn(locker *lockkit.Locker) {
	mw, err := singleton.Middleware(locker, singleton.KeyByFields("tenant_id"))
	require.NoError(u.t, err)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("report", func(ctx context.Context, t *asynq.Task) error {
		tenant := string(t.Payload()[len(`{"tenant_id":"`) : len(t.Payload())-2])
		u.mu.Lock()
		block := u.block
		var res error
		if rs := u.results[tenant]; len(rs) > 0 {
			res, u.results[tenant] = rs[0], rs[1:]
		}
		u.mu.Unlock()
		select {
		case u.started <- tenant:
		default:
		}
		if block != nil {
			<-block
		}
		u.mu.Lock()
		u.ran[tenant]++
		u.mu.Unlock()
		return res
	})
	cfg := u.config(1)
	delay := 300 * time.Millisecond
	if u.hold {
		delay = time.Hour
	}
	cfg.RetryDelayFunc = func(int, error, *asynq.Task) time.Duration { return delay }
	u.start(cfg, mux)
}

func (u *uniqueEnv) enqueue(tenant string, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	return u.client.Enqueue(asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":%q}`, tenant)), append([]asynq.Option{asynq.Queue(u.Queue)}, opts...)...)
}

func (u *uniqueEnv) runs(tenant string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.ran[tenant]
}

// refused checks that err is a refused duplicate naming holder in state.
func refused(t *testing.T, err error, holder *asynq.TaskInfo, state string) {
	t.Helper()
	var dup *singleton.DuplicateTaskError
	require.ErrorAs(t, err, &dup)
	require.ErrorIs(t, err, singleton.ErrDuplicate)
	require.ErrorIs(t, err, asynq.ErrDuplicateTask)
	require.Equal(t, holder.ID, dup.ID)
	require.Equal(t, state, dup.State)
}

// UntilExecuted: a duplicate enqueue is refused while the task is pending,
// after a failure asynq retries, and while it runs; the key frees when it
// succeeds.
func TestUniqueUntilExecuted(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		u := newUniqueEnv(t, r, singleton.UntilExecuted, 0)
		a, err := u.enqueue("acme", asynq.MaxRetry(3))
		require.NoError(t, err)
		_, err = u.enqueue("acme")
		refused(t, err, a, "pending")
		other, err := u.enqueue("globex")
		require.NoError(t, err, "another key is not refused")

		u.results["acme"] = []error{errors.New("smtp down"), nil}
		u.block = make(chan struct{})
		u.hold = true
		u.serve()
		u.waitState(a, asynq.TaskStateActive)
		_, err = u.enqueue("acme")
		refused(t, err, a, "active")
		close(u.block)
		u.waitState(a, asynq.TaskStateRetry)
		_, err = u.enqueue("acme")
		refused(t, err, a, "retry")
		require.NoError(t, asynq.NewInspectorFromRedisClient(u.RDB).RunTask(u.Queue, a.ID), "the retry runs now")
		require.Eventually(t, func() bool { return u.runs("acme") == 2 && u.runs("globex") == 1 }, 10*time.Second, 5*time.Millisecond,
			"the failed run is retried")
		u.Drained(10 * time.Second)
		next, err := u.enqueue("acme")
		require.NoError(t, err, "the key frees when the task succeeds")
		require.NotEqual(t, a.ID, next.ID)
		_ = other
	})
}

// A reservation never outlives its task: archived, deleted by an operator,
// or past its TTL, the key is free again.
func TestUniqueIsNeverStuck(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		const ttl = 2 * time.Second
		u := newUniqueEnv(t, r, singleton.UntilExecuted, ttl)

		// An operator deletes the pending task: its reservation is taken
		// over once its enqueue cannot be in flight any more (ttl/4), long
		// before the reservation's TTL.
		a, err := u.enqueue("acme")
		require.NoError(t, err)
		reserved := time.Now()
		require.NoError(t, u.Inspector.DeleteTask(u.Queue, a.ID))
		_, err = u.enqueue("acme")
		refused(t, err, a, "enqueuing")
		var b *asynq.TaskInfo
		require.Eventually(t, func() bool {
			b, err = u.enqueue("acme")
			return err == nil
		}, ttl, 10*time.Millisecond)
		require.Less(t, time.Since(reserved), ttl, "taken over, not expired")

		// The TTL bounds a reservation whose task stays (a crashed worker's
		// task waiting for asynq's recovery): the key frees after it.
		require.Eventually(t, func() bool {
			_, err := u.enqueue("acme")
			return err == nil
		}, 5*time.Second, 20*time.Millisecond)
		require.NoError(t, u.Inspector.DeleteQueue(u.Queue, true))
		_ = b

		// A MaxRetry(0) task that fails is archived: the key frees.
		u2 := newUniqueEnv(t, r, singleton.UntilExecuted, 0)
		u2.results["acme"] = []error{errors.New("boom")}
		c, err := u2.enqueue("acme", asynq.MaxRetry(0))
		require.NoError(t, err)
		u2.serve()
		u2.waitState(c, asynq.TaskStateArchived)
		_, err = u2.enqueue("acme")
		require.NoError(t, err, "an archived task's reservation ends")

		// A task its handler revokes is deleted: the key frees.
		u3 := newUniqueEnv(t, r, singleton.UntilExecuted, 0)
		u3.results["acme"] = []error{fmt.Errorf("not needed any more: %w", asynq.RevokeTask)}
		d, err := u3.enqueue("acme", asynq.MaxRetry(5))
		require.NoError(t, err)
		u3.serve()
		require.Eventually(t, func() bool {
			_, err := u3.Inspector.GetTaskInfo(u3.Queue, d.ID)
			return errors.Is(err, asynq.ErrTaskNotFound)
		}, 10*time.Second, 5*time.Millisecond)
		_, err = u3.enqueue("acme")
		require.NoError(t, err, "a revoked task's reservation ends")
	})
}

// UntilStarted: the key frees when the task starts, so a duplicate can be
// enqueued while it runs.
func TestUniqueUntilStarted(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		u := newUniqueEnv(t, r, singleton.UntilStarted, 0)
		a, err := u.enqueue("acme")
		require.NoError(t, err)
		_, err = u.enqueue("acme")
		refused(t, err, a, "pending")
		u.block = make(chan struct{})
		u.serve()
		require.Eventually(t, func() bool {
			_, err := u.enqueue("acme")
			return err == nil
		}, 10*time.Second, 5*time.Millisecond, "a duplicate is accepted once the task started")
		close(u.block)
		u.Drained(10 * time.Second)
	})
}

// What uniqueness costs, counted with a go-redis hook: a unique enqueue is
// the reservation and the enqueue (one round trip more than asynq's), a
// refused duplicate the reservation and a read of the holder's state.
func TestUniqueRoundTrips(t *testing.T) {
	e := newEnvOn(t, standalone)
	rdb := testredis.Client(t)
	rt := &testredis.Counter{}
	rdb.AddHook(rt)
	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(e.Prefix))
	require.NoError(t, err)
	defer locker.Close(context.Background())
	ac := asynq.NewClientFromRedisClient(rdb)
	client, err := singleton.NewClient(ac, rdb, singleton.KeyByFields("tenant_id"), singleton.Unique(locker, 0, 0))
	require.NoError(t, err)
	task := func(tenant string) *asynq.Task {
		return asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":%q}`, tenant), asynq.Queue(e.Queue))
	}
	// Warm up: the clock read, the scripts' first loads, the version check.
	_, err = client.Enqueue(task("warm"))
	require.NoError(t, err)
	_, err = client.Enqueue(task("warm"))
	require.Error(t, err)
	_, err = ac.Enqueue(task("plain-warm"))
	require.NoError(t, err)

	rt.Reset()
	_, err = ac.Enqueue(task("plain"))
	require.NoError(t, err)
	plain := rt.Count()
	rt.Reset()
	_, err = client.Enqueue(task("acme"))
	require.NoError(t, err)
	unique := rt.Count()
	rt.Reset()
	_, err = client.Enqueue(task("acme"))
	require.ErrorIs(t, err, singleton.ErrDuplicate)
	dup := rt.Count()
	t.Logf("round trips: asynq enqueue %d, unique enqueue %d, refused duplicate %d", plain, unique, dup)
	require.Equal(t, plain+1, unique)
	require.Equal(t, int64(3), dup, "the reservation, the holder's state, the decision log entry")
}

// Concurrent enqueues of one key: exactly one is accepted, even though a
// reservation is made before its task exists.
func TestUniqueConcurrentEnqueues(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		u := newUniqueEnv(t, r, singleton.UntilExecuted, 0)
		var accepted, refusedN atomic.Int32
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := u.enqueue("acme")
				switch {
				case err == nil:
					accepted.Add(1)
				case errors.Is(err, singleton.ErrDuplicate):
					refusedN.Add(1)
				default:
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		require.EqualValues(t, 1, accepted.Load())
		require.EqualValues(t, 19, refusedN.Load())
		require.EqualValues(t, 1, u.QueueInfo().Pending)
	})
}

// UntilExecuted: the running task adopts its reservation, so it is renewed
// while the task runs, however short the reservation's TTL.
func TestUniqueReservationIsRenewedWhileTheTaskRuns(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		const ttl = time.Second
		u := newUniqueEnv(t, r, singleton.UntilExecuted, ttl)
		a, err := u.enqueue("acme")
		require.NoError(t, err)
		u.block = make(chan struct{})
		u.serve()
		require.Equal(t, "acme", recv(t, u.started, 10*time.Second))
		time.Sleep(ttl + ttl/2) // the reservation's own TTL passes while the task runs
		u.refusedWhileActive(a)
	})
}

// refusedWhileActive checks that a task of a's key is refused while a runs
// (blocked on u.block), then lets a succeed, and checks that the key frees.
func (u *uniqueEnv) refusedWhileActive(a *asynq.TaskInfo) {
	t := u.t
	t.Helper()
	_, err := u.enqueue("acme")
	refused(t, err, a, "active")
	close(u.block)
	u.Drained(10 * time.Second)
	_, err = u.enqueue("acme")
	require.NoError(t, err, "the key frees when the task succeeds")
}

// waitState waits until task has state.
func (u *uniqueEnv) waitState(task *asynq.TaskInfo, state asynq.TaskState) {
	u.t.Helper()
	require.Eventually(u.t, func() bool {
		ti, err := u.Inspector.GetTaskInfo(u.Queue, task.ID)
		return err == nil && ti.State == state
	}, 10*time.Second, 5*time.Millisecond, "task %s never became %s", task.ID, state)
}

// A worker that stops renewing (it crashed, or lost Redis) while its task
// runs holds the adopted reservation no longer than its Locker's TTL.
func TestUniqueCrashedWorkerFreesWithinTheTTL(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		u := newUniqueEnv(t, r, singleton.UntilExecuted, 0)
		a, err := u.enqueue("acme")
		require.NoError(t, err)
		// The worker's Locker has its own connection, which the test cuts.
		conn := r(t)
		const ttl = time.Second
		locker, err := lockkit.NewRedis(conn, lockkit.WithPrefix(u.Prefix), lockkit.WithOwner("doomed"), lockkit.WithTTL(ttl))
		require.NoError(t, err)
		u.block = make(chan struct{})
		u.serveOn(locker)
		require.Equal(t, "acme", recv(t, u.started, 10*time.Second), "the task runs: its reservation is adopted")
		_, err = u.enqueue("acme")
		refused(t, err, a, "active")
		cut := time.Now()
		require.NoError(t, conn.Close())
		var last error
		ok := assert.Eventually(t, func() bool {
			_, last = u.enqueue("acme")
			return last == nil
		}, 5*ttl, 10*time.Millisecond)
		require.True(t, ok, "last error: %v", last)
		require.Less(t, time.Since(cut), 3*ttl, "freed within about the TTL")
		close(u.block)
		_ = locker.Close(context.Background())
	})
}

// go-redis sends asynq's enqueue script again when its reply is lost: the
// second run finds the task the first one enqueued. The Client's own task
// ID tells it so: the enqueue succeeds and the reservation stays.
func TestUniqueEnqueueRetriedByGoRedis(t *testing.T) {
	e := newEnvOn(t, standalone)
	client, hook := faultyUniqueClient(t, e, "}:t:") // asynq's enqueue script: its first key is the task's
	task := asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`), asynq.Queue(e.Queue))

	hook.Arm(testredis.Repeat, 1)
	info, err := client.Enqueue(task)
	require.NoError(t, err, "the repeated script found the task its first run enqueued")
	require.EqualValues(t, 1, hook.Hits())
	require.Equal(t, 2, e.QueueInfo().Pending)
	_, err = client.Enqueue(task)
	var dup *singleton.DuplicateTaskError
	require.ErrorAs(t, err, &dup, "the reservation stayed")
	require.Equal(t, info.ID, dup.ID)
}

// asynq refuses a task whose ID (asynq.TaskID) another task has: when that
// task is another key's, the refused task's reservation is given back, so
// later tasks of its key are not refused in that other task's name.
func TestUniqueGivesBackTheReservationOfATaskRefusedForAnotherTasksID(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		u := newUniqueEnv(t, r, singleton.UntilExecuted, 0)
		_, err := u.enqueue("acme", asynq.TaskID("nightly"))
		require.NoError(t, err)
		_, err = u.enqueue("globex", asynq.TaskID("nightly"))
		require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
		_, err = u.enqueue("globex")
		require.NoError(t, err, "globex's key is free: its refused task is not there")
	})
}

// go-redis sends asynq's enqueue script again when its reply is lost: with
// the caller's own task ID (asynq.TaskID) the second run finds the task the
// first one enqueued, and the reservation stays with it.
func TestUniqueEnqueueWithATaskIDRetriedByGoRedis(t *testing.T) {
	e := newEnvOn(t, standalone)
	client, hook := faultyUniqueClient(t, e, "}:t:")
	task := asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`), asynq.Queue(e.Queue))

	hook.Arm(testredis.Repeat, 1)
	_, err := client.Enqueue(task, asynq.TaskID("acme-1"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict, "asynq's answer to the repeated script")
	require.EqualValues(t, 1, hook.Hits())
	_, err = client.Enqueue(task)
	var dup *singleton.DuplicateTaskError
	require.ErrorAs(t, err, &dup, "the reservation stayed with the task")
	require.Equal(t, "acme-1", dup.ID)
}

// A refused enqueue is recorded in the decision log, under the ID the task
// would have had, with the task that holds its key; WithDecisionLog(0)
// records none.
func TestUniqueRefusalIsInTheDecisionLog(t *testing.T) {
	e := newEnvOn(t, standalone)
	locker := e.locker()
	for _, n := range []int{defaultDecisionLogLen, 0} {
		client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB, singleton.KeyByFields("tenant_id"),
			singleton.Unique(locker, 0, 0), singleton.WithDecisionLog(n))
		require.NoError(t, err)
		tenant := fmt.Sprint("acme-", n)
		task := asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":%q}`, tenant))
		first, err := client.Enqueue(task, asynq.Queue(e.Queue))
		require.NoError(t, err)
		id := fmt.Sprint("refused-", n, "-", e.Queue)
		_, err = client.Enqueue(task, asynq.Queue(e.Queue), asynq.TaskID(id))
		refused(t, err, first, "pending")
		entries, err := e.RDB.XRevRangeN(context.Background(), decisionlog.Stream, "+", "-", 1000).Result()
		require.NoError(t, err)
		var found []map[string]any
		for _, x := range entries {
			if x.Values["task"] == id {
				found = append(found, x.Values)
			}
		}
		if n == 0 {
			require.Empty(t, found, "WithDecisionLog(0) records nothing")
			continue
		}
		require.Len(t, found, 1)
		require.Equal(t, map[string]any{"call": found[0]["call"], "task": id, "origin": id, "type": "report", "queue": e.Queue,
			"key": fmt.Sprintf("asynq:report:tenant_id=%q", tenant), "reason": "refused", "by_task": first.ID, "by_state": "pending"}, found[0])
	}
	_, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB, singleton.WithDecisionLog(-1))
	require.ErrorIs(t, err, singleton.ErrInvalid)
}

// A task ID may hold '/' (tenant/42): the reservation still names its task,
// so a duplicate is refused naming it, in its state.
func TestUniqueTaskIDWithSlashHoldsItsKey(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		u := newUniqueEnv(t, r, singleton.UntilExecuted, 0)
		a, err := u.enqueue("acme", asynq.TaskID("report/acme/1"))
		require.NoError(t, err)
		_, err = u.enqueue("acme")
		refused(t, err, a, "pending")
	})
}

// A reservation's task may live on as a Requeue copy that an earlier
// version made, named "<ID>~a" or "<ID>~b" (a rolling upgrade): an enqueue
// that looks for the task finds it and is refused. (A copy of this version
// is found by its work's name for it: TestUniqueReservationFollowsTheRequeuedCopy.)
func TestUniqueFindsACopyOfAnEarlierVersion(t *testing.T) {
	for _, id := range []string{"H~a", "H~b"} {
		t.Run(id, func(t *testing.T) {
			e := newEnvOn(t, standalone)
			locker := e.locker()
			client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB,
				singleton.KeyByFields("tenant_id"), singleton.Unique(locker, singleton.UntilExecuted, 400*time.Millisecond)) // grace 100ms
			require.NoError(t, err)
			key := `asynq:report:tenant_id="acme"`
			_, err = coretest.Of(t, locker).TryAcquire(context.Background(), asynqkey.Reservation(key), &lockcore.AcquireOptions{Label: e.Queue + "/H", Reserve: true, TTL: 20 * time.Second})
			require.NoError(t, err)
			task := asynq.NewTaskWithHeaders("report", []byte(`{"tenant_id":"acme","n":1}`), map[string]string{asynqkey.LabelHeader: "H"})
			_, err = e.Client.Enqueue(task, asynq.Queue(e.Queue), asynq.TaskID(id), asynq.ProcessIn(time.Hour))
			require.NoError(t, err)
			time.Sleep(200 * time.Millisecond) // the reservation is past its enqueue grace
			_, err = client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":2}`)), asynq.Queue(e.Queue))
			var dup *singleton.DuplicateTaskError
			require.ErrorAs(t, err, &dup, "refused: %s holds the key", id)
			require.Equal(t, id, dup.ID)
		})
	}
}

// An UntilStarted task that completes without running (Skip: a task that did
// not take a reservation held the key) will never start: its reservation
// ends, and the next enqueue of the key is accepted.
func TestUntilStartedTaskThatDoesNotRunFreesItsKey(t *testing.T) {
	e := newEnvOn(t, standalone)
	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB,
		singleton.KeyByFields("tenant_id"), singleton.Unique(e.locker(), singleton.UntilStarted, 0))
	require.NoError(t, err)
	mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"), singleton.WithRedis(e.RDB))
	require.NoError(t, err)
	release := make(chan struct{})
	started := make(chan string, 8)
	e.start(e.config(4), mw(holding(started, release)))
	defer close(release)
	a, err := e.Client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":0}`)), asynq.Queue(e.Queue))
	require.NoError(t, err)
	require.Equal(t, a.ID, recv(t, started, 10*time.Second))
	b, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":1}`)), asynq.Queue(e.Queue))
	require.NoError(t, err)
	e.gone(b.ID, "B completes without running, and asynq deletes it")
	_, err = client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":2}`)), asynq.Queue(e.Queue))
	require.NoError(t, err, "B is gone and never starts: nothing holds the key")
}

// A reservation made by an earlier version, whose label held its queue's
// '/' unescaped ("<queue>/<id>", split at the last '/'), still refuses a
// second task while its task is pending, during a rolling upgrade.
func TestUniqueKeepsAnEarlierVersionsReservationInAQueueWithSlash(t *testing.T) {
	u := newUniqueEnv(t, standalone, singleton.UntilExecuted, 400*time.Millisecond) // grace 100ms
	q := u.Queue + "/eu"
	t.Cleanup(func() { _ = u.Inspector.DeleteQueue(q, true) })
	_, err := coretest.Of(t, u.locker).TryAcquire(context.Background(), `unique:asynq:report:tenant_id="acme"`,
		&lockcore.AcquireOptions{Label: q + "/T1", Reserve: true, TTL: 20 * time.Second})
	require.NoError(t, err)
	held, err := u.Client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(q), asynq.TaskID("T1"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // the reservation is past its enqueue grace
	_, err = u.client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(q))
	refused(t, err, held, "scheduled")
}

// An UntilExecuted task whose run an operator cancelled (lockkit's
// Locker.CancelRun) while its handler ignored its ctx is revoked when the
// handler returns: its reservation ends with the run, and the next enqueue
// of the key is accepted at once (not after the reservation's TTL).
func TestUniqueReservationOfACancelledRunEndsWithTheRun(t *testing.T) {
	e := newEnvOn(t, standalone)
	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(e.RDB), e.RDB,
		singleton.KeyByFields("tenant_id"), singleton.Unique(e.locker(), singleton.UntilExecuted, time.Hour))
	require.NoError(t, err)
	mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"), singleton.WithRedis(e.RDB))
	require.NoError(t, err)
	started, finish, cancelled := make(chan string, 4), make(chan struct{}), make(chan error, 1)
	e.start(e.config(2), mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-ctx.Done()
		cancelled <- context.Cause(ctx)
		<-finish // a call that ignores ctx goes on
		return ctx.Err()
	})))
	a, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(e.Queue))
	require.NoError(t, err)
	require.Equal(t, a.ID, recv(t, started, 10*time.Second))
	n, err := e.locker().CancelRun(context.Background(), `asynq:report:tenant_id="acme"`, lockkit.Select{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.ErrorIs(t, recv(t, cancelled, 10*time.Second), lockkit.ErrCancelled)
	_, err = client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":1}`)), asynq.Queue(e.Queue))
	require.ErrorIs(t, err, singleton.ErrDuplicate, "the run goes on: its reservation holds")
	close(finish)
	e.gone(a.ID, "revoked: neither retried nor archived")
	_, err = client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":2}`)), asynq.Queue(e.Queue))
	require.NoError(t, err, "the reservation ended with the run")
}
