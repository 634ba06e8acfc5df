package singleton_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/singleton"
)

// Client stamps each task with the Redis clock and keeps every option: those
// given to asynq.NewTask and those given to Enqueue.
func TestClientStampsAndKeepsOptions(t *testing.T) {
	_, rdb := testredis.Mini(t)
	ac := asynq.NewClientFromRedisClient(rdb)
	c, err := singleton.NewClient(ac, rdb)
	require.NoError(t, err)

	before := time.Now()
	task := asynq.NewTaskWithHeaders("report", []byte(`{}`), map[string]string{"trace": "abc"}, asynq.Queue("reports"), asynq.MaxRetry(7))
	info, err := c.Enqueue(task, asynq.Timeout(time.Minute))
	require.NoError(t, err)
	require.Equal(t, "reports", info.Queue)
	require.Equal(t, 7, info.MaxRetry)
	require.Equal(t, time.Minute, info.Timeout)
	require.Equal(t, "abc", info.Headers["trace"])
	us, err := strconv.ParseInt(info.Headers[asynqkey.EnqueuedAtHeader], 10, 64)
	require.NoError(t, err)
	require.WithinDuration(t, before, time.UnixMicro(us), time.Second)
	require.NotContains(t, task.Headers(), asynqkey.EnqueuedAtHeader, "the caller's task is not changed")

	plain, err := c.EnqueueContext(context.Background(), asynq.NewTask("report", nil, asynq.Queue("reports")))
	require.NoError(t, err)
	require.Equal(t, "reports", plain.Queue, "options of asynq.NewTask are kept")
	require.NotEmpty(t, plain.Headers[asynqkey.EnqueuedAtHeader])

	_, err = singleton.NewClient(nil, rdb)
	require.ErrorIs(t, err, singleton.ErrInvalid)
	_, err = singleton.NewClient(ac, nil)
	require.ErrorIs(t, err, singleton.ErrInvalid)
	_, err = c.Enqueue(nil)
	require.ErrorIs(t, err, singleton.ErrInvalid)
}

// skewHook moves the TIME replies of the node at each address in skew by its
// duration, as a master whose clock runs ahead would answer.
type skewHook struct {
	addr string
	skew *sync.Map // addr -> time.Duration
}

func (h skewHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h skewHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h skewHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if tc, ok := cmd.(*redis.TimeCmd); ok && err == nil {
			if d, ok := h.skew.Load(h.addr); ok {
				tc.SetVal(tc.Val().Add(d.(time.Duration)))
			}
		}
		return err
	}
}

// On a Redis Cluster a stamp is never earlier than the clock of any master,
// whichever node owns the key: one master whose clock runs 500 ms ahead of
// the others moves every stamp.
func TestClientStampIsNoEarlierThanAnyClusterMastersClock(t *testing.T) {
	var skew sync.Map
	opt := testredis.ClusterOptions(t)
	opt.NewClient = func(o *redis.Options) *redis.Client {
		c := redis.NewClient(o)
		c.AddHook(skewHook{addr: o.Addr, skew: &skew})
		return c
	}
	cluster := redis.NewClusterClient(opt)
	t.Cleanup(func() { _ = cluster.Close() })
	ctx := context.Background()
	var masters []*redis.Client
	var mu sync.Mutex
	require.NoError(t, cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, c)
		return nil
	}))
	require.GreaterOrEqual(t, len(masters), 2)
	ahead := masters[0]
	skew.Store(ahead.Options().Addr, 500*time.Millisecond)

	_, mini := testredis.Mini(t)
	ac := asynq.NewClientFromRedisClient(mini)
	for i := range 12 { // each Client reads the clock on its first enqueue
		c, err := singleton.NewClient(ac, cluster)
		require.NoError(t, err)
		floor, err := ahead.Time(ctx).Result()
		require.NoError(t, err)
		info, err := c.Enqueue(asynq.NewTask("report", nil))
		require.NoError(t, err)
		us, err := strconv.ParseInt(info.Headers[asynqkey.EnqueuedAtHeader], 10, 64)
		require.NoError(t, err)
		require.False(t, time.UnixMicro(us).Before(floor.Truncate(time.Microsecond)),
			"client %d: stamp %s is earlier than the clock of master %s (%s)", i, time.UnixMicro(us), ahead.Options().Addr, floor)
	}
}
