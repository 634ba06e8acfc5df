package singleton

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/debounce"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/middleware"
)

// A debounced task runs only if it is its key's newest request; an older one
// gives way to it unless the newest request's task does not exist in asynq,
// and a late delivery of an older task after the newest ran gives way
// without asking asynq.
func TestLatestRequestWins(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue, insp := testQueue(t, rdb, "latest")
	requests, err := debounce.New(rdb, debounce.WithPrefix(queue+":"))
	require.NoError(t, err)
	m := &guarded{requests: requests}
	older, err := m.requests.Debounce(ctx, "k", debounceID(queue, "t1"), time.Second, 0)
	require.NoError(t, err)
	newer, err := m.requests.Debounce(ctx, "k", debounceID(queue, "t2"), time.Second, 0)
	require.NoError(t, err)
	admit := func(gen int64) error {
		return m.admitNewest(context.WithValue(ctx, genKey{}, gen), middleware.Job{Key: "k", Name: "sync"})
	}

	err = admit(older.Gen) // without an Inspector the newest is trusted to exist
	var dup *middleware.DuplicateError
	require.ErrorAs(t, err, &dup)
	require.Equal(t, middleware.ReasonSuperseded, dup.Reason)
	require.Equal(t, middleware.ActionSkip, dup.Action)
	require.ErrorContains(t, err, `a newer request of the key, "`+queue+`\nt2" (generation `)
	require.ErrorContains(t, err, "is pending")

	m.inspector = insp // t2 is no task in the queue: its enqueue failed, so t1 runs instead
	require.NoError(t, admit(older.Gen))
	require.NoError(t, admit(newer.Gen))
	m.inspector = nil
	err = admit(older.Gen) // a late delivery of t1 after t2 ran
	require.ErrorAs(t, err, &dup)
	require.ErrorContains(t, err, "ran or runs")
	require.NoError(t, m.admitNewest(ctx, middleware.Job{Key: "k"}), "a task that is not debounced is not asked about")
}
