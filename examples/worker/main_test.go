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
	checkOutputIsTrue(t, out.String())
	require.Contains(t, out.String(), "-serve keeps both machines and the view up until Ctrl-C",
		"the page stops with the demo: the output says how to keep it up")
}

// checkOutputIsTrue checks what the demo says against what it does: a
// parked duplicate is not "back in" the backstop's 30s (the run that frees
// its key starts it), and a machine never names itself as another holder.
func checkOutputIsTrue(t *testing.T, out string) {
	t.Helper()
	require.NotContains(t, out, "back in", "a parked duplicate starts when its key frees, not after a delay")
	require.Contains(t, out, "starts when the key frees")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[1] == "skipped" {
			require.False(t, strings.HasSuffix(line, "held by "+f[0]), "a machine names itself as another holder: %s", line)
			require.NotContains(t, line, "held by a task on "+f[0], "a machine names its own holder as another: %s", line)
			if strings.Contains(line, "held by another task on") {
				require.Contains(t, line, "held by another task on "+f[0]+" (this machine)", line)
			}
		}
	}
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
