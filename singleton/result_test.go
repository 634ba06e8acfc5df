package singleton_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/decisionlog"
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
		e.start(e.config(2), mw(holding(started, release)))
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

// A task that completes without running is also recorded in the decision log,
// which outlives the task: `jobguard why <task-id>` reads it. WithDecisionLog(0)
// records nothing; a negative length is refused.
func TestDecisionLogSaysWhyATaskDidNotRun(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		for _, n := range []int{defaultDecisionLogLen, 0} {
			opts := []singleton.ServerOption{singleton.WithRedis(e.RDB)}
			if n == 0 {
				opts = append(opts, singleton.WithDecisionLog(0))
			}
			mw, err := singleton.Middleware(e.locker(), opts...)
			require.NoError(t, err)
			started, release := make(chan string, 1), make(chan struct{})
			srv := e.start(e.config(2), mw(holding(started, release)))
			typ := fmt.Sprint("report-", n)
			first := e.Enqueue(asynq.NewTask(typ, nil))
			require.Equal(t, first.ID, <-started)
			dup := e.Enqueue(asynq.NewTask(typ, nil))
			require.Eventually(t, func() bool {
				_, err := e.Inspector.GetTaskInfo(e.Queue, dup.ID)
				return errors.Is(err, asynq.ErrTaskNotFound)
			}, 10*time.Second, 5*time.Millisecond, "the duplicate completes without running, and asynq deletes it")
			close(release)
			srv.Shutdown()

			entries, err := e.RDB.XRevRangeN(context.Background(), decisionlog.Stream, "+", "-", 1000).Result()
			require.NoError(t, err)
			var found []map[string]any
			for _, x := range entries {
				if x.Values["task"] == dup.ID {
					found = append(found, x.Values)
				}
			}
			if n == 0 {
				require.Empty(t, found, "WithDecisionLog(0) records nothing")
				continue
			}
			require.Len(t, found, 1)
			require.NotEmpty(t, found[0]["call"])
			require.Equal(t, map[string]any{"call": found[0]["call"], "task": dup.ID, "origin": dup.ID, "type": typ, "queue": e.Queue, "key": "asynq:" + typ,
				"reason": "held", "by_task": first.ID, "by_owner": found[0]["by_owner"], "by_token": found[0]["by_token"]}, found[0])
			require.NotEmpty(t, found[0]["by_token"], "the holder's token: since when it holds the key")
		}
		_, err := singleton.Middleware(e.locker(), singleton.WithRedis(e.RDB), singleton.WithDecisionLog(-1))
		require.ErrorIs(t, err, singleton.ErrInvalid)
		_, err = singleton.Middleware(e.locker(), singleton.WithDecisionLog(100))
		require.ErrorIs(t, err, singleton.ErrInvalid, "a log asked for without WithRedis is refused, not dropped")
		require.ErrorContains(t, err, "needs WithRedis")
	})
}

// afterEach is a client hook that calls fn with the commands of each round
// trip (a command, or a pipeline) once it returned.
type afterEach func(cmds ...redis.Cmder)

func (afterEach) DialHook(next redis.DialHook) redis.DialHook { return next }

func (fn afterEach) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		fn(cmd)
		return err
	}
}

func (fn afterEach) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		fn(cmds...)
		return err
	}
}

// sentHook records the commands of each round trip of a client (add, as
// an afterEach).
type sentHook struct {
	mu   sync.Mutex
	sent [][]string
}

func (h *sentHook) add(cmds ...redis.Cmder) {
	var names []string
	for _, c := range cmds {
		names = append(names, c.Name())
	}
	h.mu.Lock()
	h.sent = append(h.sent, names)
	h.mu.Unlock()
}

// take returns the round trips recorded since the last take, but those
// that only set up a connection (go-redis sends them through the hooks when
// it dials again).
func (h *sentHook) take() [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var s [][]string
	for _, names := range h.sent {
		if !slices.ContainsFunc(names, func(n string) bool { return !slices.Contains([]string{"hello", "select", "client", "auth"}, n) }) {
			continue
		}
		s = append(s, names)
	}
	h.sent = nil
	return s
}

// A skipped task's two records, its result and its decision log entry, cost
// its path one round trip on a standalone Redis of WithRedis: one pipeline.
func TestSkippedTaskRecordsWhyInOneRoundTrip(t *testing.T) {
	e := newEnvOn(t, standalone)
	hook := &sentHook{}
	rdb := standalone(t)
	rdb.AddHook(afterEach(hook.add))
	mw, err := singleton.Middleware(e.locker(), singleton.WithRedis(rdb))
	require.NoError(t, err)
	started, release := make(chan string, 1), make(chan struct{})
	e.start(e.config(2), mw(holding(started, release)))
	defer close(release)
	first := e.Enqueue(asynq.NewTask("report", nil))
	require.Equal(t, first.ID, <-started)
	hook.take()
	dup := e.Enqueue(asynq.NewTask("report", nil), asynq.Retention(time.Hour))
	var info *asynq.TaskInfo
	require.Eventually(t, func() bool {
		info, err = e.Inspector.GetTaskInfo(e.Queue, dup.ID)
		return err == nil && info.State == asynq.TaskStateCompleted
	}, 10*time.Second, 5*time.Millisecond, "the duplicate completes without running")
	require.Equal(t, [][]string{{"eval", "xadd"}}, hook.take(), "the result (written only while the task exists) and the entry in one pipeline")
	var why map[string]any
	require.NoError(t, json.Unmarshal(info.Result, &why), "%s", info.Result)
	require.Equal(t, "held", why["reason"])
	require.Equal(t, first.ID, why["by_task"])
	entries, err := e.RDB.XRevRangeN(context.Background(), decisionlog.Stream, "+", "-", 1000).Result()
	require.NoError(t, err)
	n := 0
	for _, x := range entries {
		if x.Values["task"] == dup.ID {
			n++
			require.Equal(t, "held", x.Values["reason"])
		}
	}
	require.Equal(t, 1, n, "one entry for the duplicate")
}
