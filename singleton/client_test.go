package singleton_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

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
	us, err := strconv.ParseInt(info.Headers[singleton.EnqueuedAtHeader], 10, 64)
	require.NoError(t, err)
	require.WithinDuration(t, before, time.UnixMicro(us), time.Second)
	require.NotContains(t, task.Headers(), singleton.EnqueuedAtHeader, "the caller's task is not changed")

	plain, err := c.EnqueueContext(context.Background(), asynq.NewTask("report", nil, asynq.Queue("reports")))
	require.NoError(t, err)
	require.Equal(t, "reports", plain.Queue, "options of asynq.NewTask are kept")
	require.NotEmpty(t, plain.Headers[singleton.EnqueuedAtHeader])

	_, err = singleton.NewClient(nil, rdb)
	require.ErrorIs(t, err, singleton.ErrInvalid)
	_, err = singleton.NewClient(ac, nil)
	require.ErrorIs(t, err, singleton.ErrInvalid)
	_, err = c.Enqueue(nil)
	require.ErrorIs(t, err, singleton.ErrInvalid)
}
