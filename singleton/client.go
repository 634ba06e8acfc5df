package singleton

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// EnqueuedAtHeader is the task header in which Client records when a task was
// enqueued: Unix microseconds on the Redis server's clock, never earlier than
// the enqueue. Under middleware.Coalesce a task completes without running
// only if a run of its key began after this time (and after its delivery
// began, if that is earlier). A task without it (or with a value that is not
// a positive integer) counts from its delivery instead, which is later than
// its enqueue: fewer tasks are covered, never one enqueued after the
// covering run began.
const EnqueuedAtHeader = "jobguard-enqueued-at"

// clockSync is how often a Client reads the Redis server's clock again.
const clockSync = 30 * time.Second

// Client enqueues asynq tasks stamped with EnqueuedAtHeader, so that
// middleware.Coalesce can let one run cover every task enqueued before it
// began. Its Enqueue and EnqueueContext are asynq.Client's.
type Client struct {
	c   *asynq.Client
	rdb redis.UniversalClient

	mu     sync.Mutex
	offset time.Duration // an upper bound of the server clock minus ours
	synced time.Time     // when offset was measured; zero before
}

// NewClient returns a Client that enqueues with c and reads the clock of rdb,
// the Redis the servers use. It returns an error matching ErrInvalid for a
// nil c or rdb. The clock is read on the first enqueue and every 30 seconds
// after: one TIME round trip, none per task.
func NewClient(c *asynq.Client, rdb redis.UniversalClient) (*Client, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: NewClient: asynq client is nil", ErrInvalid)
	}
	if rdb == nil || reflect.ValueOf(rdb).IsNil() {
		return nil, fmt.Errorf("%w: NewClient: redis client is nil", ErrInvalid)
	}
	if _, err := taskOptions(asynq.NewTask("probe", nil)); err != nil {
		return nil, err
	}
	return &Client{c: c, rdb: rdb}, nil
}

// Enqueue is EnqueueContext with context.Background.
func (c *Client) Enqueue(task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	return c.EnqueueContext(context.Background(), task, opts...)
}

// EnqueueContext enqueues a copy of task that carries EnqueuedAtHeader, with
// the options given to asynq.NewTask and opts, like asynq.Client's. It
// returns asynq's errors unchanged, and an error when the Redis clock cannot
// be read (nothing is enqueued then).
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
	headers[EnqueuedAtHeader] = strconv.FormatInt(now.UnixMicro(), 10)
	built, err := taskOptions(task)
	if err != nil {
		return nil, err
	}
	stamped := asynq.NewTaskWithHeaders(task.Type(), task.Payload(), headers, built...)
	return c.c.EnqueueContext(ctx, stamped, opts...)
}

// now returns an upper bound of the Redis server's clock.
func (c *Client) now(ctx context.Context) (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.synced.IsZero() || time.Since(c.synced) > clockSync {
		sent := time.Now()
		server, err := c.rdb.Time(ctx).Result()
		if err != nil {
			return time.Time{}, fmt.Errorf("singleton: reading the Redis clock: %w", err)
		}
		// The server read its clock after we sent: server - sent bounds the
		// offset from above. A millisecond covers drift until the next read.
		c.offset, c.synced = server.Sub(sent)+time.Millisecond, time.Now()
	}
	return time.Now().Add(c.offset), nil
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

// enqueuedAt returns the time in t's EnqueuedAtHeader, or zero.
func enqueuedAt(t *asynq.Task) time.Time {
	v, err := strconv.ParseInt(t.Headers()[EnqueuedAtHeader], 10, 64)
	if err != nil || v <= 0 {
		return time.Time{}
	}
	return time.UnixMicro(v)
}
