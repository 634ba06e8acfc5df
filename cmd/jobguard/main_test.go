package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
)

var bin string // the built jobguard binary

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jobguard-cli")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "jobguard")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		panic("go build: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// jobguard runs the binary against standalone Redis with prefix, feeding it
// stdin, and returns its stdout, stderr and exit code.
func jobguard(t *testing.T, prefix, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--prefix", prefix}, args...)...)
	cmd.Env = append(os.Environ(), "REDIS_ADDR="+testredis.Addr(t), "REDIS_CLUSTER_ADDRS=")
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return out.String(), errOut.String(), code
}

func locker(t *testing.T, c redis.UniversalClient, prefix, owner string) *lockcore.RedisLocker {
	l, err := lockcore.NewRedis(c, lockcore.WithPrefix(prefix), lockcore.WithOwner(owner))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func TestListInspectRelease(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	a, b := locker(t, c, prefix, "worker-a"), locker(t, c, prefix, "worker-b")
	la, err := a.TryAcquire(ctx, "tenant:42", &lockcore.AcquireOptions{Limit: 2, Label: "task-1", TTL: 3 * time.Second})
	require.NoError(t, err)
	work, cancel := la.Context(ctx)
	defer cancel()
	_, err = b.TryAcquire(ctx, "tenant:42", &lockcore.AcquireOptions{Limit: 2})
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "report", nil)
	require.NoError(t, err)
	_, err = a.TryAcquire(ctx, "report", &lockcore.AcquireOptions{Label: "task-9", Reserve: true, Park: &lockcore.Parking{ID: "task-9"}})
	require.ErrorIs(t, err, lockcore.ErrNotAcquired) // parked for the key

	out, _, code := jobguard(t, prefix, "", "ls")
	require.Zero(t, code)
	require.Regexp(t, `(?m)^KEY\s+HOLDERS\s+WAITERS\s+PARKED\s+OWNERS\s+TTL$`, out)
	require.Regexp(t, `(?m)^report\s+1\s+0\s+1\s+worker-b\s`, out)
	require.Regexp(t, `(?m)^tenant:42\s+2\s+0\s+0\s+worker-a,worker-b\s`, out)
	out, _, code = jobguard(t, prefix, "", "inspect", "report")
	require.Zero(t, code)
	require.Contains(t, out, "key report: 1 holder(s), 0 waiter(s), 1 parked")
	require.Contains(t, out, "parked: task-9", "the parked job's id")
	out, _, code = jobguard(t, prefix, "", "ls", "tenant:*", "--json")
	require.Zero(t, code)
	var keys []keyView
	require.NoError(t, json.Unmarshal([]byte(out), &keys))
	require.Len(t, keys, 1)
	require.Equal(t, "tenant:42", keys[0].Key)
	require.Len(t, keys[0].Holders, 2)

	out, _, code = jobguard(t, prefix, "", "--json", "inspect", "tenant:42")
	require.Zero(t, code)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Contains(t, v.Holders, holderView{Owner: "worker-a", Label: "task-1", Token: la.Token(), TTLms: v.Holders[indexOf(v, "worker-a")].TTLms})
	_, _, code = jobguard(t, prefix, "", "inspect", "nobody")
	require.Equal(t, exitNotHeld, code)

	// Release asks first; "n" keeps the holders.
	_, errOut, code := jobguard(t, prefix, "n\n", "release", "tenant:42", "--owner", "worker-a")
	require.Equal(t, exitDeclined, code)
	require.Contains(t, errOut, `Release 1 holder(s) of "tenant:42" owned by "worker-a"?`)
	require.NoError(t, work.Err())
	out, _, code = jobguard(t, prefix, "y\n", "release", "tenant:42", "--owner", "worker-a")
	require.Zero(t, code)
	require.Contains(t, out, "released 1 holder(s) of tenant:42: their runs are cancelled")
	select {
	case <-work.Done(): // at once (the operators' channel), at the latest at its next renewal, within TTL/3 = 1s
	case <-time.After(3 * time.Second):
		t.Fatal("the released holder's work was not cancelled")
	}
	require.ErrorIs(t, context.Cause(work), lockcore.ErrCancelled)
	// The run still holds the key until it returns, and inspect says so.
	require.NoError(t, la.Err())
	out, _, code = jobguard(t, prefix, "", "inspect", "tenant:42")
	require.Zero(t, code)
	require.Regexp(t, `(?m)^worker-a\s+task-1\s+\d+\s+\S+\s+cancelling: waiting for the run to return, asked \S+ ago$`, out)
	require.Regexp(t, `(?m)^worker-b\s.*running$`, out)

	// --force frees the key at once, warning with the fencing token.
	_, errOut, code = jobguard(t, prefix, "n\n", "release", "tenant:42", "--owner", "worker-a", "--force")
	require.Equal(t, exitDeclined, code)
	require.Contains(t, errOut, fmt.Sprintf("The run is still going: a new run may start beside it; its writes carry fencing token %d.", la.Token()))
	out, _, code = jobguard(t, prefix, "", "release", "tenant:42", "--owner", "worker-a", "--force", "--yes")
	require.Zero(t, code)
	require.Contains(t, out, "freed 1 holder(s) of tenant:42 (their runs may still be going)")
	info, err := a.Inspect(ctx, "tenant:42")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "worker-b", info.Holders[0].Owner)

	out, _, code = jobguard(t, prefix, "", "release", "tenant:42", "--yes", "--json")
	require.Zero(t, code)
	require.JSONEq(t, `{"key":"tenant:42","released":1,"force":false}`, out)
	out, _, code = jobguard(t, prefix, "", "release", "tenant:42", "--yes", "--force", "--json")
	require.Zero(t, code)
	require.JSONEq(t, `{"key":"tenant:42","released":1,"force":true}`, out)
	_, _, code = jobguard(t, prefix, "", "release", "tenant:42", "--yes")
	require.Equal(t, exitNotHeld, code)
}

func indexOf(v keyView, owner string) int {
	for i, h := range v.Holders {
		if h.Owner == owner {
			return i
		}
	}
	return 0
}

// watch shows keys as they come and go, and stops on SIGINT with exit 0.
func TestWatch(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	l := locker(t, c, prefix, "worker-a")
	cmd := exec.Command(bin, "--prefix", prefix, "watch", "--json", "--interval", "50ms")
	cmd.Env = append(os.Environ(), "REDIS_ADDR="+testredis.Addr(t), "REDIS_CLUSTER_ADDRS=")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	next := func() []keyView {
		require.True(t, lines.Scan(), "watch printed nothing")
		var frame struct {
			Keys []keyView `json:"keys"`
		}
		require.NoError(t, json.Unmarshal(lines.Bytes(), &frame))
		return frame.Keys
	}
	require.Empty(t, next())
	lease, err := l.TryAcquire(ctx, "job", nil)
	require.NoError(t, err)
	for keys := next(); len(keys) == 0; keys = next() {
	}
	require.NoError(t, lease.Release(ctx))
	for keys := next(); len(keys) == 1; keys = next() {
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for lines.Scan() {
	}
	require.NoError(t, cmd.Wait(), "exit 0 on SIGINT")
}

func TestClusterAndErrors(t *testing.T) {
	ctx := context.Background()
	cc := testredis.Cluster(t)
	prefix := testredis.Prefix(t, cc)
	_, err := locker(t, cc, prefix, "worker-c").TryAcquire(ctx, "on-cluster", nil)
	require.NoError(t, err)
	cmd := exec.Command(bin, "--prefix", prefix, "--cluster", strings.Join(testredis.ClusterAddrs(t), ","), "ls")
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Regexp(t, `(?m)^on-cluster\s+1\s+0\s+0\s+worker-c\s`, string(out))

	for _, args := range [][]string{{}, {"frobnicate"}, {"inspect"}, {"release", "a", "b"}, {"watch", "--interval", "0s"}, {"--no-such-flag", "ls"}} {
		_, _, code := jobguard(t, prefix, "", args...)
		require.Equal(t, exitUsage, code, "%q", args)
	}
	_, errOut, code := jobguard(t, prefix, "", "--redis", "127.0.0.1:1", "ls")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "jobguard:")
	// After "--" nothing is a flag, also past the first argument: a key
	// may start with '-'.
	_, errOut, code = jobguard(t, prefix, "", "--", "inspect", "-x")
	require.NotEqual(t, exitUsage, code, errOut)
	out2, _, code := jobguard(t, prefix, "", "-h")
	require.Zero(t, code)
	require.Empty(t, out2)
}

// Keys, owners and labels come from task IDs and payloads: ls, inspect and
// watch print their control bytes escaped, so none reaches the terminal and
// a newline cannot forge a row.
func TestControlBytesEscaped(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	l := locker(t, c, prefix, "worker\x1b[31m-a")
	_, err := l.TryAcquire(ctx, "job:\x1b[2J\nforged  9  9  9  root  1h", &lockcore.AcquireOptions{Label: "id\r\nfake\u202e\tx\\n"})
	require.NoError(t, err)
	check := func(out string, rows int) {
		t.Helper()
		require.NotContains(t, out, "\x1b")
		require.NotContains(t, out, "\r")
		require.NotContains(t, out, "\u202e")
		require.NotContains(t, out, "\t")
		require.Equal(t, rows, strings.Count(out, "\n"), "%q", out)
		require.NotRegexp(t, `(?m)^forged`, out)
	}
	out, _, code := jobguard(t, prefix, "", "ls")
	require.Zero(t, code)
	check(out, 2)
	require.Contains(t, out, `job:\x1b[2J\nforged`)
	require.Contains(t, out, `worker\x1b[31m-a`)
	out, _, code = jobguard(t, prefix, "", "inspect", "job:\x1b[2J\nforged  9  9  9  root  1h")
	require.Zero(t, code)
	check(out, 3)
	require.Contains(t, out, `id\r\nfake\u202e\tx\\n`)

	cmd := exec.Command(bin, "--prefix", prefix, "watch", "--interval", "50ms")
	cmd.Env = append(os.Environ(), "REDIS_ADDR="+testredis.Addr(t), "REDIS_CLUSTER_ADDRS=")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewReader(stdout)
	var frame strings.Builder
	for !strings.HasSuffix(frame.String(), "\n\n") { // a frame ends with an empty line
		b, err := lines.ReadByte()
		require.NoError(t, err)
		frame.WriteByte(b)
	}
	check(frame.String(), 4)
}

// release acts on the holders its prompt showed, by their fencing tokens:
// when the key changes hands before the operator answers, it releases
// nothing and names the change; --token pins a release to the holder that
// inspect showed.
func TestReleasePinnedToTheTokensShown(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	a := locker(t, c, prefix, "worker-a")
	seen, err := a.TryAcquire(ctx, "tenant:42", nil)
	require.NoError(t, err)

	cmd := exec.Command(bin, "--prefix", prefix, "release", "tenant:42")
	cmd.Env = append(os.Environ(), "REDIS_ADDR="+testredis.Addr(t), "REDIS_CLUSTER_ADDRS=")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	var out bytes.Buffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Start())
	r := bufio.NewReader(stderr)
	prompt, err := r.ReadString('?')
	require.NoError(t, err)
	require.Contains(t, prompt, `Release 1 holder(s) of "tenant:42"`)
	// While the operator reads the prompt, the run ends and another takes the key.
	require.NoError(t, seen.Release(ctx))
	now, err := a.TryAcquire(ctx, "tenant:42", nil)
	require.NoError(t, err)
	_, err = stdin.Write([]byte("y\n"))
	require.NoError(t, err)
	rest, _ := io.ReadAll(r)
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "stdout %q stderr %q", out.String(), rest)
	require.Equal(t, exitNotHeld, ee.ExitCode())
	require.Contains(t, string(rest), fmt.Sprintf("token %d no longer holds it", seen.Token()))
	require.Contains(t, string(rest), fmt.Sprintf("token %d", now.Token()), "names the holder now")
	info, err := a.Inspect(ctx, "tenant:42")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1, "the new holder keeps the key")

	_, errOut, code := jobguard(t, prefix, "", "release", "tenant:42", "--yes", "--token", fmt.Sprint(seen.Token()))
	require.Equal(t, exitNotHeld, code)
	require.Contains(t, errOut, "no longer holds it")
	o, _, code := jobguard(t, prefix, "", "release", "tenant:42", "--yes", "--token", fmt.Sprint(now.Token()))
	require.Zero(t, code)
	require.Contains(t, o, "released 1 holder(s) of tenant:42")
}

// watch outlives Redis errors: each failed look is one line on stderr, and
// it goes on looking until interrupted.
func TestWatchGoesOnAfterARedisError(t *testing.T) {
	cmd := exec.Command(bin, "watch", "--interval", "20ms")
	cmd.Env = append(os.Environ(), "REDIS_ADDR=127.0.0.1:1", "REDIS_CLUSTER_ADDRS=")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stderr)
	for seen := 0; seen < 2; seen++ { // and go-redis logs nothing of its own
		require.True(t, lines.Scan(), "watch stopped")
		require.Contains(t, lines.Text(), "jobguard watch: ")
		require.Contains(t, lines.Text(), "trying again in 20ms")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for lines.Scan() {
	}
	require.NoError(t, cmd.Wait(), "exit 0 on SIGINT")
}

// With --sentinel and --master the CLI finds the master through the
// sentinels, and follows it when they fail it over: a watch started before
// the failover shows a lease taken on the promoted replica after it.
func TestSentinelFollowsTheMasterAcrossAFailover(t *testing.T) {
	ctx := context.Background()
	m := testredis.StartServer(t)
	r := testredis.StartReplica(t, m)
	s := testredis.StartSentinel(t, m, "jobs")
	mc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = mc.Close() })
	prefix := testredis.Prefix(t, mc)
	l, err := lockcore.NewRedis(mc, lockcore.WithPrefix(prefix), lockcore.WithOwner("worker-s"), lockcore.WithReplicaAcks(1, time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	_, err = l.TryAcquire(ctx, "before", nil)
	require.NoError(t, err)

	args := []string{"--prefix", prefix, "--sentinel", s.Addr(), "--master", "jobs"}
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "REDIS_CLUSTER_ADDRS=")
		return cmd
	}
	out, err := command(append(args, "ls")...).Output()
	require.NoError(t, err)
	require.Regexp(t, `(?m)^before\s+1\s+0\s+0\s+worker-s\s`, string(out))

	cmd := command(append(args, "watch", "--json", "--interval", "50ms")...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	keys := func() []string {
		require.True(t, lines.Scan(), "watch printed nothing")
		var frame struct {
			Keys []keyView `json:"keys"`
		}
		require.NoError(t, json.Unmarshal(lines.Bytes(), &frame))
		var names []string
		for _, k := range frame.Keys {
			names = append(names, k.Key)
		}
		return names
	}
	require.Equal(t, []string{"before"}, keys())

	s.Failover(r)
	rc := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	promoted := locker(t, rc, prefix, "worker-p")
	_, err = promoted.TryAcquire(ctx, "after", nil)
	require.NoError(t, err)
	for names := keys(); !slices.Contains(names, "after"); names = keys() {
	}
	out, err = command(append(args, "ls")...).Output()
	require.NoError(t, err)
	require.Regexp(t, `(?m)^after\s+1\s+0\s+0\s+worker-p\s`, string(out))
	require.Regexp(t, `(?m)^before\s+1\s+0\s+0\s+worker-s\s`, string(out), "the lease acknowledged by the replica survived")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sentinel", s.Addr(), "ls"}, "--sentinel: give the master's name with --master"},
		{[]string{"--master", "jobs", "ls"}, "--master: give the Sentinel addresses with --sentinel"},
		{[]string{"--sentinel", s.Addr(), "--master", "jobs", "--cluster", "127.0.0.1:1", "ls"}, "--sentinel and --cluster: give one of them"},
	} {
		_, errOut, code := jobguard(t, prefix, "", tc.args...)
		require.NotEqual(t, 0, code, "%q", tc.args)
		require.Contains(t, errOut, tc.want)
	}
}
