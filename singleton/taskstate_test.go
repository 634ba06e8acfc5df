package singleton_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/singleton"
)

// TaskState tells the operator page a holder's task state in asynq and
// links to the task in asynqmon; for a Requeue copy it finds the copy that
// stands for the first task; a label that is no task has no state.
func TestTaskStateFindsTheHoldersTask(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue := fmt.Sprintf("taskstate-%d", time.Now().UnixNano())
	insp := asynq.NewInspectorFromRedisClient(rdb)
	t.Cleanup(func() { _ = insp.DeleteQueue(queue, true) })
	client := asynq.NewClientFromRedisClient(rdb)
	for _, id := range []string{"later", "o~b"} {
		_, err := client.Enqueue(asynq.NewTask("report", nil), asynq.Queue(queue), asynq.TaskID(id), asynq.ProcessIn(time.Hour))
		require.NoError(t, err)
	}
	_, err := client.Enqueue(asynq.NewTask("report", nil), asynq.Queue(queue), asynq.TaskID("now"))
	require.NoError(t, err)

	state, err := singleton.TaskState(insp, "https://ops.example.com/asynqmon/")
	require.NoError(t, err)
	got, link := state(ctx, "later")
	require.Equal(t, "scheduled", got)
	require.Equal(t, "https://ops.example.com/asynqmon/queues/"+queue+"/tasks/later", link)
	got, _ = state(ctx, "now")
	require.Equal(t, "pending", got)
	got, link = state(ctx, "o")
	require.Equal(t, "scheduled", got, "the copy that stands for it")
	require.Equal(t, "https://ops.example.com/asynqmon/queues/"+queue+"/tasks/o~b", link)
	got, link = state(ctx, "send-digest@2026-11-26T02:30:00Z")
	require.Empty(t, got, "no task")
	require.Empty(t, link)

	noLink, err := singleton.TaskState(insp, "")
	require.NoError(t, err)
	got, link = noLink(ctx, "later")
	require.Equal(t, "scheduled", got)
	require.Empty(t, link)

	_, err = singleton.TaskState(nil, "")
	require.ErrorIs(t, err, singleton.ErrInvalid)
	onHost, err := singleton.TaskState(insp, "/asynqmon")
	require.NoError(t, err)
	_, link = onHost(ctx, "later")
	require.Equal(t, "/asynqmon/queues/"+queue+"/tasks/later", link)
	for _, bad := range []string{"javascript:alert(1)", "//evil.example.com", "ops.example.com", "http://"} {
		_, err = singleton.TaskState(insp, bad)
		require.ErrorIs(t, err, singleton.ErrInvalid, bad)
	}
}
