package singleton

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// A resumed task goes to the head of its queue's pending list, where asynq
// dequeues next, not behind the tasks already pending; asynq's Inspector
// sees it pending.
func TestRunFirstPutsTheTaskAtTheHead(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue := fmt.Sprintf("runfirst-%d", time.Now().UnixNano())
	client := asynq.NewClientFromRedisClient(rdb)
	for i := range 3 {
		_, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID(fmt.Sprint("p", i)))
		require.NoError(t, err)
	}
	_, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue), asynq.TaskID("parked"), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)

	m := &guarded{rdb: rdb}
	require.NoError(t, m.runFirst(ctx, queue, "parked"))
	pending, err := rdb.LRange(ctx, "asynq:{"+queue+"}:pending", 0, -1).Result()
	require.NoError(t, err)
	// asynq takes from the right end (RPOPLPUSH).
	require.Equal(t, []string{"p2", "p1", "p0", "parked"}, pending)
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo(queue, "parked")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)

	require.ErrorContains(t, m.runFirst(ctx, queue, "parked"), "already in pending state")
	require.ErrorIs(t, m.runFirst(ctx, queue, "missing"), asynq.ErrTaskNotFound)
}
