package singleton_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/singleton"
)

// A task that completes without running says why in its asynq result, which
// the Inspector and asynqmon show while asynq keeps the task (Retention):
// the reason and the task that held its key.
func TestTaskNotRunSaysWhyInItsResult(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		mw, err := singleton.Middleware(e.locker())
		require.NoError(t, err)
		started, release := make(chan string, 1), make(chan struct{})
		e.start(e.config(2), mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			started <- id
			<-release
			return nil
		})))
		first := e.Enqueue(asynq.NewTask("report", nil), asynq.Retention(time.Hour))
		require.Equal(t, first.ID, <-started)
		dup := e.Enqueue(asynq.NewTask("report", nil), asynq.Retention(time.Hour))
		var info *asynq.TaskInfo
		require.Eventually(t, func() bool {
			info, err = e.Inspector.GetTaskInfo(e.Queue, dup.ID)
			return err == nil && info.State == asynq.TaskStateCompleted
		}, 10*time.Second, 5*time.Millisecond, "the duplicate completes without running")
		close(release)
		var why map[string]any
		require.NoError(t, json.Unmarshal(info.Result, &why), "%s", info.Result)
		require.Equal(t, map[string]any{"outcome": "completed without running", "key": "asynq:report", "reason": "held",
			"by_task": first.ID, "by_owner": why["by_owner"]}, why)
		require.NotEmpty(t, why["by_owner"])
	})
}
