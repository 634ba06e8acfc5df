package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// go-redis v9.17's process-wide clock goroutine is go-redis's, not a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

// testDB keeps this package's asynq keys (asynq:* is global to a database)
// away from the other packages' tests running at the same time.
const testDB = 12

func checkRun(t *testing.T, rdb redis.UniversalClient) {
	var out bytes.Buffer
	res, err := run(context.Background(), &out, rdb, options{})
	require.NoError(t, err, out.String())
	require.Equal(t, tenants*perTenant, res.Ran["report:build"], "every report ran, requeued duplicates included")
	require.Equal(t, cacheWarms, res.Ran["cache:warm"]+res.Skipped["cache:warm"], "every cache warm-up ran or was skipped")
	require.Positive(t, res.Skipped["cache:warm"])
	require.Positive(t, res.Requeued["report:build"])
	require.Len(t, res.MaxOverlap, 1+tenants)
	for key, n := range res.MaxOverlap {
		require.Equal(t, 1, n, "%s overlapped", key)
	}
	require.Zero(t, res.Archived)
	require.Zero(t, res.Failed)
	require.Contains(t, out.String(), "most runs of one key at once (must be 1):")
	require.Regexp(t, `operator view: http://127\.0\.0\.1:\d+/locks/`, out.String())
}

// The bare-machine path: an embedded Redis, as main starts without
// REDIS_ADDR.
func TestRunOnMiniredis(t *testing.T) {
	checkRun(t, lockkittest.NewStore(t).Client())
}

// The REDIS_ADDR path: a real Redis.
func TestRunOnRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), DB: testDB})
	defer rdb.Close()
	checkRun(t, rdb)
}

// syncBuffer is a bytes.Buffer safe for the demo's writers, which signals
// when the output first contains a string.
type syncBuffer struct {
	mu   sync.Mutex
	b    bytes.Buffer
	want string
	seen chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	if s.seen != nil && strings.Contains(s.b.String(), s.want) {
		close(s.seen)
		s.seen = nil
	}
	return n, err
}

// With -serve the demo keeps running after its summary, enqueuing bursts,
// until its ctx ends (Ctrl-C), and then stops cleanly.
func TestServeRunsUntilCancelled(t *testing.T) {
	rdb := lockkittest.NewStore(t).Client()
	seen := make(chan struct{})
	out := &syncBuffer{want: "a burst every", seen: seen}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := run(ctx, out, rdb, options{serve: true})
		done <- err
	}()
	select {
	case <-seen:
	case err := <-done:
		t.Fatalf("run returned before serving: %v", err)
	case <-time.After(maxRunTime):
		t.Fatal("the demo never started serving")
	}
	select {
	case err := <-done:
		t.Fatalf("run returned while serving: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop after its ctx ended")
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	require.Contains(t, out.b.String(), "stopping")
}
