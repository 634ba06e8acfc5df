package singleton

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
)

// A copy replacing another is named before it is enqueued, and the copy it
// replaces is revoked after: in between, an enqueue of Unique finds the
// replaced copy (still active, running the work) and is refused, instead of
// finding the new copy's name with no task behind it and taking the key
// over.
func TestUniqueFindsTheCopyAReplacingCopyIsNamedOver(t *testing.T) {
	ctx := context.Background()
	rdb := testredis.Client(t)
	queue, _ := testQueue(t, rdb, "copyname")
	l, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(testredis.Prefix(t, rdb)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	client, err := NewClient(asynq.NewClientFromRedisClient(rdb), rdb,
		KeyByFields("tenant_id"), Unique(l, UntilExecuted, 400*time.Millisecond)) // grace 100ms
	require.NoError(t, err)
	key := `asynq:report:tenant_id="acme"`
	// The reservation of work H (as Unique made it at H's enqueue), whose
	// copy c1 runs now.
	_, err = client.reserve(ctx, key, "H", queue)
	require.NoError(t, err)
	c1 := newCopyID("H")
	require.NoError(t, nameCopy(ctx, rdb, queue, "H", c1, time.Hour))
	_, err = asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTaskWithHeaders("report", []byte(`{"tenant_id":"acme"}`),
		map[string]string{asynqkey.LabelHeader: "H"}), asynq.Queue(queue), asynq.TaskID(c1), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // the reservation is past its enqueue grace

	// c1's delivery is put back with no retries left: its copy c2 is named,
	// not enqueued yet.
	c2 := newCopyID("H")
	require.NoError(t, nameCopy(ctx, rdb, queue, "H", c2, time.Hour))
	require.NoError(t, nameCopy(ctx, rdb, queue, "H", c2, time.Hour), "sent again: the pair is kept")
	_, err = client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":2}`)), asynq.Queue(queue))
	var dup *DuplicateTaskError
	require.ErrorAs(t, err, &dup, "refused: %s, replaced but not revoked yet, holds the key", c1)
	require.Equal(t, c1, dup.ID)
}
