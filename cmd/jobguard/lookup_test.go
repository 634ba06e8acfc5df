package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/singleton"
)

// lookDB is the database of the standalone Redis that these tests keep to
// when they look at a whole database: no other package's tests use it.
const lookDB = 9 // singleton keeps to 11, examples/worker to 12, the integration modules to 13 and 14, singleton's decision log tests to 15

// dbClient is a client of database db of the standalone Redis.
func dbClient(t *testing.T, db int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t), DB: db})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The keys in -h are the keys singleton derives: the examples' KeyByFields
// key is the one a singleton Client keyed by "tenant_id" stamps on a
// "report:build" task of tenant "acme" (not a JSON payload in the key).
func TestHelpExamplesUseRealKeys(t *testing.T) {
	_, help, code := jobguard(t, "p", "", "-h")
	require.Zero(t, code)
	require.NotContains(t, help, `{"tenant_id"`)
	keys := regexp.MustCompile(`'(asynq:[^']*tenant_id=[^']*)'`).FindAllStringSubmatch(help, -1)
	require.NotEmpty(t, keys, "an example of a KeyByFields key")

	ctx := context.Background()
	rdb := dbClient(t, lookDB)
	queue := strings.ReplaceAll(testredis.Prefix(t, rdb), ":", "-")
	ac := asynq.NewClientFromRedisClient(rdb)
	c, err := singleton.NewClient(ac, rdb, singleton.KeyByFields("tenant_id"))
	require.NoError(t, err)
	info, err := c.Enqueue(asynq.NewTask("report:build", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(queue))
	require.NoError(t, err)
	t.Cleanup(func() {
		ins := asynq.NewInspectorFromRedisClient(rdb)
		_ = ins.DeleteQueue(queue, true)
		rdb.Del(ctx, asynqkey.Order(`asynq:report:build:tenant_id="acme"`))
	})
	derived, _, _ := strings.Cut(info.Headers[asynqkey.KeyHeader], " ")
	for _, k := range keys {
		sum := sha256.Sum256([]byte(k[1]))
		require.Equal(t, derived, hex.EncodeToString(sum[:8]), "%s is the key singleton derives", k[1])
	}
}

// Each command's -h prints that command's help, with its own flags and the
// connection flags, not the whole usage.
func TestCommandHelp(t *testing.T) {
	for cmd, own := range map[string]string{"ls": "-json", "inspect": "-json", "release": "-force", "watch": "-interval", "why": "-max-entries"} {
		out, errOut, code := jobguard(t, "p", "", cmd, "-h")
		require.Zero(t, code, cmd)
		require.Empty(t, out)
		require.True(t, strings.HasPrefix(errOut, "Usage: jobguard [flags] "+cmd), "%s -h: %q", cmd, errOut)
		require.Regexp(t, `(?m)^  `+own+`( |$)`, errOut, cmd)
		require.Contains(t, errOut, "Connection flags (every command):\n")
		require.Contains(t, errOut, "\n  -prefix string")
		require.NotContains(t, errOut, "jobguard: look at and free", cmd)
	}
	_, errOut, code := jobguard(t, "p", "", "watch", "--interval", "5s", "-h")
	require.Zero(t, code)
	require.Contains(t, errOut, "(default 1s)", "defaults, not the values given")
	require.NotContains(t, errOut, "-max-entries", "watch's flags only")
}

// ls that finds no key under the prefix, in a database that holds none or
// under a prefix that is not the Lockers', says so, names where the keys
// are, and exits 3; a prefix whose keys are all free lists nothing, exit 0.
func TestListOfAnEmptyPrefixSaysSo(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t) // database 0
	prefix := testredis.Prefix(t, c)
	lease, err := locker(t, c, prefix, "worker-a").TryAcquire(ctx, "asynq:cache:rebuild", nil)
	require.NoError(t, err)

	require.NoError(t, dbClient(t, lookDB).FlushDB(ctx).Err())
	out, errOut, code := jobguard(t, prefix, "", "--db", fmt.Sprint(lookDB), "ls")
	require.Equal(t, exitNotHeld, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, fmt.Sprintf("jobguard ls: no key under prefix %q in %s (db %d); no jobguard key found there under any prefix; databases with keys: db0 (",
		prefix, testredis.Addr(t), lookDB))
	require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)

	other := testredis.Prefix(t, dbClient(t, lookDB))
	_, err = locker(t, dbClient(t, lookDB), other, "worker-b").TryAcquire(ctx, "asynq:report:build", nil)
	require.NoError(t, err)
	out, errOut, code = jobguard(t, "typo:", "", "--db", fmt.Sprint(lookDB), "--json", "ls", "asynq:*")
	require.Equal(t, exitNotHeld, code, errOut)
	require.Equal(t, "[]\n", out)
	require.Contains(t, errOut, fmt.Sprintf(`jobguard ls: no key under prefix "typo:" in %s (db %d); prefixes found there: %q (1 key(s)) (--prefix)`,
		testredis.Addr(t), lookDB, other))

	// A prefix whose keys are all free holds keys: an empty list, exit 0.
	require.NoError(t, lease.Release(ctx))
	out, errOut, code = jobguard(t, prefix, "", "ls")
	require.Zero(t, code, errOut)
	require.Equal(t, "KEY  HOLDERS  WAITERS  PARKED  OWNERS  TTL\n", out)
}

// inspect of a key the prefix does not hold says so and names the closest
// key it holds; a key whose holder is gone is no such key: it is shown with
// no holder.
func TestInspectOfAnUnknownKey(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	l := locker(t, c, prefix, "worker-a")
	for _, k := range []string{`asynq:report:build:tenant_id="acme"`, `asynq:report:build:tenant_id="globex"`, "asynq:cache:rebuild"} {
		_, err := l.TryAcquire(ctx, k, nil)
		require.NoError(t, err)
	}
	out, errOut, code := jobguard(t, prefix, "", "inspect", `asynq:report:build:{"tenant_id":"acme"}`)
	require.Equal(t, exitNotHeld, code)
	require.Empty(t, out)
	require.Equal(t, fmt.Sprintf(`jobguard inspect: no key asynq:report:build:{"tenant_id":"acme"} under prefix %q in %s; the closest of its 3 key(s): asynq:report:build:tenant_id="acme"`+"\n",
		prefix, testredis.Addr(t)), errOut)

	// A released key is known: inspect shows it with no holder.
	gone, err := l.TryAcquire(ctx, "asynq:gone", nil)
	require.NoError(t, err)
	require.NoError(t, gone.Release(ctx))
	out, errOut, code = jobguard(t, prefix, "", "inspect", "asynq:gone")
	require.Equal(t, exitNotHeld, code)
	require.Contains(t, out, "key asynq:gone: 0 holder(s), 0 waiter(s), 0 parked")
	require.Empty(t, errOut)

	// An empty prefix: where the keys are.
	_, errOut, code = jobguard(t, prefix+"typo:", "", "inspect", "asynq:cache:rebuild")
	require.Equal(t, exitNotHeld, code)
	require.Contains(t, errOut, fmt.Sprintf("jobguard inspect: no key asynq:cache:rebuild under prefix %q in %s; prefixes found there: ", prefix+"typo:", testredis.Addr(t)))
	require.Contains(t, errOut, fmt.Sprintf("%q (4 key(s))", prefix))
}

// An unreachable Redis is one line of jobguard's own on stderr, naming the
// address: go-redis's pool logs nothing.
func TestUnreachableRedisIsOneLine(t *testing.T) {
	for _, args := range [][]string{{"ls"}, {"inspect", "asynq:cache:rebuild"}, {"release", "asynq:cache:rebuild", "--yes"}, {"why", "t-1"}} {
		cmd := exec.Command(bin, append([]string{"--redis", "127.0.0.1:1"}, args...)...)
		cmd.Env = append(os.Environ(), "REDIS_CLUSTER_ADDRS=")
		var errOut strings.Builder
		cmd.Stderr = &errOut
		out, err := cmd.Output()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		require.Equal(t, exitError, ee.ExitCode(), "%q", args)
		require.Empty(t, out)
		require.Regexp(t, `^jobguard: Redis at 127\.0\.0\.1:1: dial tcp 127\.0\.0\.1:1: connect: connection refused\n$`, errOut.String(), "%q", args)
	}
}

// On a Redis Cluster, ls and inspect look for keys and prefixes on every
// master.
func TestLookupsOnACluster(t *testing.T) {
	ctx := context.Background()
	cc := testredis.Cluster(t)
	prefix := testredis.Prefix(t, cc)
	l := locker(t, cc, prefix, "worker-c")
	for _, k := range []string{`asynq:report:build:tenant_id="acme"`, "asynq:report:built", "asynq:cache:rebuild"} {
		_, err := l.TryAcquire(ctx, k, nil)
		require.NoError(t, err)
	}
	run := func(prefix string, args ...string) (string, string, int) {
		cmd := exec.Command(bin, append([]string{"--prefix", prefix, "--cluster", strings.Join(testredis.ClusterAddrs(t), ",")}, args...)...)
		cmd.Env = append(os.Environ(), "REDIS_ADDR=", "REDIS_CLUSTER_ADDRS=")
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		return out.String(), errOut.String(), code
	}
	_, errOut, code := run(prefix, "inspect", "asynq:report:build")
	require.Equal(t, exitNotHeld, code)
	require.Contains(t, errOut, `; the closest of its 3 key(s): asynq:report:build:tenant_id="acme"`)
	_, errOut, code = run("typo:", "ls")
	require.Equal(t, exitNotHeld, code)
	require.Contains(t, errOut, fmt.Sprintf("%q (3 key(s)) (--prefix)", prefix))
}
