package singleton

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
)

// orderKeep is how long a key's order counter is kept after its last
// enqueue.
const orderKeep = 10 * time.Minute

// orderCmd takes the next order of a key. KEYS[1] the key's last order
// (STRING); ARGV[1] how long to keep it (ms). Returns the order.
var orderCmd = redis.NewScript(`
local t = redis.call('TIME')
local o = math.max(tonumber(redis.call('GET', KEYS[1]) or '0') + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
local s = string.format('%d', o)
redis.call('SET', KEYS[1], s, 'PX', ARGV[1])
return s
`)

// clockSync is how often a Client reads the Redis server's clock again.
const clockSync = 30 * time.Second

// Client enqueues asynq tasks stamped with the time of their enqueue, so
// that middleware.Coalesce can let one run cover every task enqueued before
// it began, and with their place in their key's order, so that
// middleware.KeepNewest and middleware.Preempt keep the newest enqueued
// task of a key; with Unique, it refuses a task whose key another task
// reserved; with Debounce, it schedules each task as its key's newest
// request; with ParkAtEnqueue, it queues each task for its key, to run when
// the key frees. Its Enqueue and EnqueueContext are asynq.Client's.
//
// The time is the Redis server's (Unix microseconds in the task header
// "jobguard-enqueued-at"), never earlier than the enqueue. Under
// middleware.Coalesce a task completes without running only if a run of its
// key began after this time (and after its delivery began, if that is
// earlier). A task without it (enqueued by a plain asynq.Client) counts
// from its delivery instead, which is later than its enqueue: fewer tasks
// are covered, never one enqueued after the covering run began.
//
// The order (middleware.Job.Order, in the header "jobguard-order") is taken
// from Redis when the task is enqueued (not when it is due, for
// asynq.ProcessIn or ProcessAt): greater than every order given to an
// earlier enqueue of the key (as the Client derives it), and at least the
// Redis server's time in microseconds, so that orders keep growing after
// the key's counter expired, ten minutes after its last enqueue. Under
// middleware.KeepNewest and middleware.Preempt a task with a lower order
// than its key's follow-up or latest run completes without running
// (superseded), whatever order its delivery reaches Redis in. A Client with
// Debounce records the task's generation instead, one with Unique its
// reservation's fencing token (each also grows per key and is at least the
// server time in microseconds), and one with ParkAtEnqueue none (its tasks
// run in enqueue order). A task without an order is placed by its arrival
// at Redis.
type Client struct {
	c        *asynq.Client
	rdb      redis.UniversalClient
	keys     *guarded // the key and type options
	unique   *uniqueSpec
	debounce *debounceSpec
	park     *parkSpec
	keyed    bool // its keys are finer than the type: stamp asynqkey.KeyHeader
	// decisions: about how many entries of the decision log to keep when a
	// refused enqueue is recorded there; 0 records none.
	decisions int

	mu     sync.Mutex
	server time.Time // an upper bound of the server clock at synced
	synced time.Time // when the clock was read (with its monotonic reading); zero before
}

// NewClient returns a Client that enqueues with c and reads the clock of rdb,
// the Redis the servers use. The clock is read on the first enqueue and
// every 30 seconds after: one TIME round trip (one per master, side by side,
// on a Redis Cluster), none per task. Without Unique, Debounce or
// ParkAtEnqueue each enqueue takes the task's order from rdb: one script
// call (see Client).
//
// The key options
// (KeyByType by default, KeyByTaskID, KeyByPayload, KeyByFields, KeyFunc,
// PerQueue) and ForTypes derive each task's key as Middleware does (its
// order, and with Unique, Debounce or ParkAtEnqueue its reservation or
// request): give both the same ones. A key that only groups the
// Middleware's keys (KeyByType, the default, for keys that start with the
// task's type) orders them exactly too. A Client whose key is finer than
// the type (a key option other than KeyByType, or PerQueue) records each
// task's key in the task header "jobguard-key" (the first 16 hex digits of
// the key's SHA-256 and the key options, such as
// `3fa2b1c4d5e6f708 KeyByFields("tenant_id")`: never the key itself, which
// may hold tenant data that asynqmon would show), and a Middleware that
// derives another key fails the task with ErrKeyMismatch instead of
// applying its policy: a Middleware
// keyed more coarsely would take tasks the Client keeps apart for
// duplicates. A KeyFunc is called at enqueue with a ctx in which the
// task's ID and queue are known to the key options but not to
// asynq.GetTaskID.
//
// It returns an error matching ErrInvalid for a nil c or rdb or an invalid
// option.
func NewClient(c *asynq.Client, rdb redis.UniversalClient, opts ...ClientOption) (*Client, error) {
	return newClient(c, rdb, nil, opts, nil)
}

// newClient is NewClient; locker, when not nil, is the Locker of the
// Unique, Debounce or ParkAtEnqueue option given a nil one, and logLen,
// when not nil, the Guard's decision log length (Guard.Client).
func newClient(c *asynq.Client, rdb redis.UniversalClient, locker *lockkit.Locker, opts []ClientOption, logLen *int) (*Client, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: NewClient: asynq client is nil", ErrInvalid)
	}
	if rdb == nil || reflect.ValueOf(rdb).IsNil() {
		return nil, fmt.Errorf("%w: NewClient: redis client is nil", ErrInvalid)
	}
	if _, err := taskOptions(asynq.NewTask("probe", nil)); err != nil {
		return nil, err
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.applyClient(&cfg)
		}
	}
	if locker != nil {
		cfg.defaultLocker(locker)
	}
	if logLen != nil {
		cfg.decisions, cfg.decisionsSet = *logLen, true
	}
	keys, err := cfg.buildKeys()
	if err != nil {
		return nil, err
	}
	if cfg.unique != nil {
		if err := cfg.unique.validate(); err != nil {
			return nil, err
		}
	}
	if cfg.debounce != nil {
		if cfg.unique != nil {
			return nil, fmt.Errorf("%w: Debounce and Unique exclude each other: Debounce keeps the newest task, Unique the first", ErrInvalid)
		}
		if err := cfg.debounce.validate(); err != nil {
			return nil, err
		}
	}
	if cfg.park != nil {
		if cfg.unique != nil || cfg.debounce != nil {
			return nil, fmt.Errorf("%w: ParkAtEnqueue excludes Unique and Debounce: it runs every task, they refuse or replace duplicates", ErrInvalid)
		}
		if err := cfg.park.validate(rdb); err != nil {
			return nil, err
		}
	}
	decisions := defaultDecisionLogLen
	if cfg.decisionsSet {
		if cfg.decisions < 0 {
			return nil, fmt.Errorf("%w: WithDecisionLog(%d): want 0 (none) or more entries", ErrInvalid, cfg.decisions)
		}
		decisions = cfg.decisions
	}
	return &Client{c: c, rdb: rdb, keys: keys, unique: cfg.unique, debounce: cfg.debounce, park: cfg.park, decisions: decisions,
		keyed: cfg.perQueue || (len(cfg.keys) > 0 && cfg.keys[0].name != "KeyByType()")}, nil
}

// Enqueue is EnqueueContext with context.Background.
func (c *Client) Enqueue(task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	return c.EnqueueContext(context.Background(), task, opts...)
}

// EnqueueContext enqueues a copy of task that carries its time of enqueue
// and (but with ParkAtEnqueue) its order (see Client), with the options
// given to asynq.NewTask and opts, like asynq.Client's, giving the task an
// ID with asynq.TaskID unless it has one (a task of a type that ForTypes
// leaves out carries its time of enqueue only).
// It returns an error matching ErrKey when the task's key cannot be
// derived. With Unique it first reserves the task's key: it returns a
// *DuplicateTaskError when another task that still exists holds the
// reservation. With ParkAtEnqueue it
// first reserves the key for the task or parks the task (see
// ParkAtEnqueue). It returns asynq's errors
// unchanged (a reservation made for the task is then given back), and an
// error when Redis cannot be reached; nothing is enqueued then.
func (c *Client) EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	if task == nil {
		return nil, fmt.Errorf("%w: EnqueueContext: task is nil", ErrInvalid)
	}
	now, err := c.now(ctx)
	if err != nil {
		return nil, err
	}
	headers := maps.Clone(task.Headers())
	if headers == nil {
		headers = make(map[string]string, 1)
	}
	headers[asynqkey.EnqueuedAtHeader] = strconv.FormatInt(now.UnixMicro(), 10)
	built, err := taskOptions(task)
	if err != nil {
		return nil, err
	}
	park := c.park != nil && !deferred(built) && !deferred(opts)
	if c.keys.types != nil && !c.keys.types[task.Type()] {
		return c.c.EnqueueContext(ctx, asynq.NewTaskWithHeaders(task.Type(), task.Payload(), headers, built...), opts...)
	}
	id, queue := optionValues(append(slices.Clone(built), opts...))
	generated := id == ""
	if generated {
		id = newTaskID()
		opts = append(slices.Clone(opts), asynq.TaskID(id))
	}
	if queue == "" {
		queue = "default"
	}
	if c.unique != nil {
		headers[uniqueHeaderName] = uniqueHeader(c.unique.life, c.unique.ttl)
	}
	if park {
		headers[parkedHeader] = "1"
	}
	stamped := asynq.NewTaskWithHeaders(task.Type(), task.Payload(), headers, built...)
	key, err := deriveKey(context.WithValue(ctx, identityKey{}, identity{id: id, queue: queue}), stamped, c.keys.key, c.keys.perQueue)
	if err != nil {
		return nil, fmt.Errorf("%w: task %q: %w", ErrKey, task.Type(), err)
	}
	if c.keyed {
		stamped.Headers()[asynqkey.KeyHeader] = keyHeader(key, c.keys.keyOptions())
	}
	if c.debounce != nil {
		return c.enqueueNewest(ctx, stamped, key, id, queue, generated, opts)
	}
	if park {
		return c.enqueueParked(ctx, stamped, key, id, queue, generated, opts)
	}
	if c.unique == nil {
		order, err := orderCmd.Run(ctx, c.rdb, []string{asynqkey.Order(key)}, orderKeep.Milliseconds()).Text()
		if err != nil {
			return nil, fmt.Errorf("singleton: task %q: taking its order: %w", task.Type(), err)
		}
		stamped.Headers()[asynqkey.OrderHeader] = order
		return c.enqueueOwnID(ctx, stamped, id, queue, generated, opts)
	}
	res, err := c.reserve(ctx, key, id, queue)
	if err != nil {
		var dup *DuplicateTaskError
		if errors.As(err, &dup) {
			c.logRefusal(ctx, stamped, id, queue, dup)
		}
		return nil, err
	}
	stamped.Headers()[asynqkey.OrderHeader] = strconv.FormatInt(res.Token(), 10)
	info, err := c.enqueueOwnID(ctx, stamped, id, queue, generated, opts)
	if err != nil {
		c.giveBack(ctx, res, stamped, id, queue)
		return nil, err
	}
	return info, nil
}

// giveBack releases res, the reservation of task (ID id) whose enqueue
// failed, unless the task is there after all (the enqueue ran and its reply
// was lost) or that cannot be told: the reservation then stays, and the
// next enqueue of the key takes it over once it finds the task gone. A task
// with the ID that is not this one (not its type, payload and
// asynqkey.EnqueuedAtHeader: another task whose ID made asynq refuse this
// one) does
// not keep it.
func (c *Client) giveBack(ctx context.Context, res *lockcore.Lease, task *asynq.Task, id, queue string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	state, err := c.taskState(rctx, queue, id)
	if err != nil {
		return
	}
	if state != "" {
		info, err := asynq.NewInspectorFromRedisClient(c.rdb).GetTaskInfo(queue, id)
		if err != nil || (info.Type == task.Type() && bytes.Equal(info.Payload, task.Payload()) &&
			info.Headers[asynqkey.EnqueuedAtHeader] == task.Headers()[asynqkey.EnqueuedAtHeader]) {
			return
		}
	}
	_ = res.Release(rctx)
}

// enqueueNewest records task (ID id) as its key's newest request and
// enqueues it to be processed when that request is due.
func (c *Client) enqueueNewest(ctx context.Context, task *asynq.Task, key, id, queue string, generated bool, opts []asynq.Option) (*asynq.TaskInfo, error) {
	gen, at, err := c.debounce.debounce(ctx, key, queue, id)
	if err != nil {
		return nil, fmt.Errorf("singleton: task %q: %w", task.Type(), err)
	}
	task.Headers()[asynqkey.DebounceGenHeader] = strconv.FormatInt(gen, 10)
	task.Headers()[asynqkey.OrderHeader] = strconv.FormatInt(gen, 10)
	return c.enqueueOwnID(ctx, task, id, queue, generated, append(slices.Clone(opts), asynq.ProcessAt(at)))
}

// enqueueOwnID enqueues task, whose ID is id. When the Client generated the
// ID, a conflict on it is an earlier run of this enqueue (go-redis sent the
// script again after a lost reply): the task is there, and its info is
// returned.
func (c *Client) enqueueOwnID(ctx context.Context, task *asynq.Task, id, queue string, generated bool, opts []asynq.Option) (*asynq.TaskInfo, error) {
	info, err := c.c.EnqueueContext(ctx, task, opts...)
	if err != nil && generated && errors.Is(err, asynq.ErrTaskIDConflict) {
		if info, ierr := asynq.NewInspectorFromRedisClient(c.rdb).GetTaskInfo(queue, id); ierr == nil {
			return info, nil
		}
	}
	return info, err
}

// now returns an upper bound of the Redis server's clock: of every master's
// clock on a Redis Cluster (or every shard's on a Ring), since the run that
// may cover a task takes its start from the clock of the node that owns the
// task's key, which the Client does not know. Time since the last read is
// measured on the monotonic clock, so a step of this host's wall clock does
// not move the stamp.
func (c *Client) now(ctx context.Context) (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.synced.IsZero() || time.Since(c.synced) > clockSync {
		sent := time.Now()
		server, err := serverClock(ctx, c.rdb)
		if err != nil {
			return time.Time{}, fmt.Errorf("singleton: reading the Redis clock: %w", err)
		}
		// Each server read its clock after we sent: server + time since sent
		// bounds its clock from above, less the drift between the clocks
		// since: a millisecond, and clockDrift of the time since.
		c.server, c.synced = server.Add(time.Millisecond), sent
	}
	since := time.Since(c.synced)
	return c.server.Add(since + since/clockDrift), nil
}

// clockDrift bounds how fast a Redis server's clock may run against this
// host's monotonic clock between two reads (clockSync apart): 1/clockDrift
// of the time since the last read, 500 ppm (15 ms after 30 s), several times
// what unsynchronised hardware clocks drift. A stamp later than the
// server's clock only makes a run that began just after the enqueue not
// cover the task (it runs again); an earlier one could let a run that began
// before the enqueue cover it.
const clockDrift = 2000

// serverClock returns the latest of the clocks of rdb's masters.
func serverClock(ctx context.Context, rdb redis.UniversalClient) (time.Time, error) {
	var each func(context.Context, func(context.Context, *redis.Client) error) error
	switch r := rdb.(type) {
	case *redis.ClusterClient:
		each = r.ForEachMaster
	case *redis.Ring:
		each = r.ForEachShard
	default:
		return rdb.Time(ctx).Result()
	}
	var (
		mu     sync.Mutex
		latest time.Time
	)
	err := each(ctx, func(ctx context.Context, node *redis.Client) error {
		t, err := node.Time(ctx).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if t.After(latest) {
			latest = t
		}
		return nil
	})
	if err == nil && latest.IsZero() {
		err = errors.New("no master answered")
	}
	return latest, err
}

// taskOptions returns the options task was built with (asynq.NewTask's
// opts), which asynq keeps unexported.
func taskOptions(task *asynq.Task) ([]asynq.Option, error) {
	f := reflect.ValueOf(task).Elem().FieldByName("opts")
	if !f.IsValid() || f.Type() != reflect.TypeOf([]asynq.Option(nil)) {
		return nil, fmt.Errorf("singleton: this asynq version's Task keeps its options where Client cannot copy them")
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().([]asynq.Option), nil
}

// taskOrder returns the order in t's asynqkey.OrderHeader, or zero.
func taskOrder(t *asynq.Task) int64 {
	v, err := strconv.ParseInt(t.Headers()[asynqkey.OrderHeader], 10, 64)
	if err != nil || v <= 0 {
		return 0
	}
	return v
}

// enqueuedAt returns the time in t's asynqkey.EnqueuedAtHeader, or zero.
func enqueuedAt(t *asynq.Task) time.Time {
	v, err := strconv.ParseInt(t.Headers()[asynqkey.EnqueuedAtHeader], 10, 64)
	if err != nil || v <= 0 {
		return time.Time{}
	}
	return time.UnixMicro(v)
}
