package fence

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

func TestMain(m *testing.M) {
	if os.Getenv("JOBGUARD_FENCE_CHILD") == "worker" {
		workerChild()
		return
	}
	goleak.VerifyTestMain(m)
}

// processTTL is the lease TTL of the worker process of TestPausedWorker.
const processTTL = time.Second

// A worker process runs a job under the guard (middleware, as singleton
// and cronguard run theirs) and writes with its token; it is paused
// (SIGSTOP) past its lease while a second run takes the key and writes.
// Resumed (SIGCONT), it writes again, ignoring its cancelled ctx as a
// handler may: the write is refused with the second run's token, and the
// data holds the second run's.
func TestPausedWorker(t *testing.T) {
	clients(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		prefix := testredis.Prefix(t, c)
		key := prefix + "report"
		child := exec.Command(os.Args[0], "-test.run=^$")
		child.Env = append(os.Environ(), "JOBGUARD_FENCE_CHILD=worker", "JOBGUARD_PREFIX="+prefix)
		if _, ok := c.(*redis.ClusterClient); ok {
			child.Env = append(child.Env, "JOBGUARD_FENCE_CLUSTER=1")
		}
		stdin, err := child.StdinPipe()
		require.NoError(t, err)
		stdout, err := child.StdoutPipe()
		require.NoError(t, err)
		var stderr strings.Builder
		child.Stderr = &stderr
		defer func() {
			if t.Failed() {
				t.Logf("the worker's stderr:\n%s", stderr.String())
			}
		}()
		require.NoError(t, child.Start())
		defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
		out := bufio.NewReader(stdout)
		line := func() string {
			l, err := out.ReadString('\n')
			require.NoError(t, err, "the worker's output")
			return strings.TrimSpace(l)
		}
		first := line()
		t1, err := strconv.ParseInt(strings.TrimPrefix(first, "wrote "), 10, 64)
		require.NoError(t, err, "the worker said %q", first)
		require.Equal(t, "first run", c.Get(ctx, key).Val())

		require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
		paused := time.Now()
		l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix), lockkit.WithPollInterval(10*time.Millisecond))
		require.NoError(t, err)
		defer l.Close(ctx)
		w, err := New(c, WithPrefix(prefix))
		require.NoError(t, err)
		g, err := middleware.New(l, middleware.WithPolicy(middleware.Wait(10*time.Second, middleware.Fail())))
		require.NoError(t, err)
		var t2 int64
		run := g.Run(ctx, middleware.Job{Key: "report", Name: "report"}, func(ctx context.Context) error {
			tok, err := FromContext(ctx)
			if err != nil {
				return err
			}
			t2 = tok.Value
			return w.Set(ctx, tok, key, "second run", 0)
		})
		require.True(t, run.Ran, "the second run took the key once the paused worker's lease expired")
		require.NoError(t, run.Err)
		took := time.Since(paused)
		require.Greater(t, t2, t1)

		require.NoError(t, child.Process.Signal(syscall.SIGCONT))
		_, err = fmt.Fprintln(stdin, "write")
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("refused: newest %d", t2), line(), "the paused worker's late write")
		require.Equal(t, "second run", c.Get(ctx, key).Val(), "the data holds the second run's write")
		t.Logf("worker paused; the second run took the key %s later (lease TTL %s); its late write refused",
			took.Round(time.Millisecond), processTTL)
	})
}

// workerChild is the worker process of TestPausedWorker. It runs one job
// under the guard: writes with its token, says so ("wrote <token>"), waits
// for a line on stdin (the test pauses it meanwhile), writes again with a
// ctx that ignores the lease's cancellation, and says what became of that
// write.
func workerChild() {
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	var c redis.UniversalClient
	if os.Getenv("JOBGUARD_FENCE_CLUSTER") != "" {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(os.Getenv("REDIS_CLUSTER_ADDRS"), ",")})
	} else {
		c = redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	}
	prefix := os.Getenv("JOBGUARD_PREFIX")
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix), lockkit.WithTTL(processTTL))
	if err != nil {
		fail(err)
	}
	g, err := middleware.New(l)
	if err != nil {
		fail(err)
	}
	w, err := New(c, WithPrefix(prefix))
	if err != nil {
		fail(err)
	}
	key := prefix + "report"
	in := bufio.NewScanner(os.Stdin)
	out := g.Run(context.Background(), middleware.Job{Key: "report", Name: "report"}, func(ctx context.Context) error {
		tok, err := FromContext(ctx)
		if err != nil {
			return err
		}
		if err := w.Set(ctx, tok, key, "first run", 0); err != nil {
			return err
		}
		fmt.Println("wrote", tok.Value)
		in.Scan() // paused here, past the lease
		err = w.Set(context.WithoutCancel(ctx), tok, key, "first run, late", 0)
		var stale *StaleError
		switch {
		case errors.As(err, &stale):
			fmt.Println("refused: newest", stale.Newest)
		case err != nil:
			fmt.Println("error:", err)
		default:
			fmt.Println("written")
		}
		return nil
	})
	if !out.Ran {
		fail(fmt.Errorf("the job did not run: %v", out.Err))
	}
	os.Exit(0)
}
