package singleton_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// decisionsOf are the decision log's entries about task id, newest first.
func decisionsOf(t *testing.T, e *env, id string) []decisionlog.Decision {
	t.Helper()
	entries, err := e.RDB.XRevRangeN(context.Background(), decisionlog.Stream, "+", "-", 1000).Result()
	require.NoError(t, err)
	var found []decisionlog.Decision
	for _, x := range entries {
		if d := decisionlog.Decode(x); d.Task == id {
			found = append(found, d)
		}
	}
	return found
}

// A task parked behind its key's holder is in the decision log: held, parked,
// the task and owner that hold the key, since when (the holder's fencing
// token, at least the Redis server's time in microseconds when it took the
// key) and when it comes back by itself (the backstop). The run that frees
// the key resumes it; its run adds no entry.
func TestParkedTaskIsInTheDecisionLog(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		mw, err := singleton.Middleware(e.locker(), singleton.WithRedis(e.RDB), singleton.WithPolicy(middleware.Requeue(time.Second)))
		require.NoError(t, err)
		started, release := make(chan string, 2), make(chan struct{})
		e.start(e.config(2), mw(holding(started, release)))
		before := time.Now()
		first := e.Enqueue(asynq.NewTask("report", nil))
		require.Equal(t, first.ID, recv(t, started, 10*time.Second))
		dup := e.Enqueue(asynq.NewTask("report", nil))
		var found []decisionlog.Decision
		require.Eventually(t, func() bool {
			found = decisionsOf(t, e, dup.ID)
			return len(found) > 0
		}, 10*time.Second, 5*time.Millisecond, "the parked task's entry")
		d := found[0]
		require.Equal(t, decisionlog.ActionParked, d.Action)
		require.Equal(t, "held", d.Reason)
		require.Equal(t, "asynq:report", d.Key)
		require.Equal(t, first.ID, d.ByTask)
		require.NotEmpty(t, d.ByOwner)
		require.WithinDuration(t, before, d.Since(), 2*time.Second, "since the holder took the key (token %d)", d.ByToken)
		require.GreaterOrEqual(t, d.BackIn, time.Second, "the backstop, at least the policy's delay")
		require.LessOrEqual(t, d.BackIn, 30*time.Second)
		require.Equal(t, strconv.FormatInt(d.BackIn.Milliseconds(), 10), d.Fields["back_in_ms"])

		close(release)
		require.Equal(t, dup.ID, recv(t, started, 10*time.Second), "resumed when the key is freed")
		e.Drained(10 * time.Second)
		require.Len(t, decisionsOf(t, e, first.ID), 0, "a task that ran has no entry")
		require.Len(t, decisionsOf(t, e, dup.ID), 1, "its run adds none")
	})
}

// A task the middleware refuses (its key cannot be derived, or its key
// header differs) did not run, and the decision log says so: reason
// archived, cause the refusal. asynq archives it.
func TestRefusedTaskIsInTheDecisionLog(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		mw, err := singleton.Middleware(e.locker(), singleton.KeyByFields("tenant_id"), singleton.WithRedis(e.RDB))
		require.NoError(t, err)
		ran := make(chan string, 2)
		now := make(chan struct{})
		close(now)
		e.start(e.config(2), mw(holding(ran, now)))
		noKey := e.Enqueue(asynq.NewTask("report", []byte(`{"other":"acme"}`)), asynq.MaxRetry(3))
		otherKey := e.Enqueue(asynq.NewTaskWithHeaders("report", []byte(`{"tenant_id":"acme"}`),
			map[string]string{asynqkey.KeyHeader: keyHeaderOf("asynq:report:acme", `KeyFunc(...)`)}))
		require.Eventually(t, func() bool { return e.QueueInfo().Archived == 2 }, 10*time.Second, 5*time.Millisecond)
		require.Empty(t, ran, "neither ran")
		for id, cause := range map[string]string{noKey.ID: `payload has no field "tenant_id"`, otherKey.ID: "KeyFunc(...)"} {
			found := decisionsOf(t, e, id)
			require.Len(t, found, 1, id)
			require.Equal(t, decisionlog.ReasonArchived, found[0].Reason)
			require.Contains(t, found[0].Cause, cause)
			require.Empty(t, found[0].Action)
		}
	})
}
