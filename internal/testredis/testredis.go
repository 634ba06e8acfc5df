// Package testredis gives tests a Redis: the real server named by REDIS_ADDR
// (started by `make test`), or an embedded miniredis for fast unit tests, plus
// a go-redis hook that counts round trips.
package testredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Addr returns REDIS_ADDR. Without it the test is skipped, except under CI
// (CI=true), where a missing Redis is a failure.
func Addr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("REDIS_ADDR is not set; run the tests with `make test`")
		}
		t.Skip("REDIS_ADDR is not set; `make test` starts a redis-server and sets it")
	}
	return addr
}

// Client returns a client of the real Redis at Addr, closed when the test ends.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(t)})
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at %s: %v", Addr(t), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ClusterAddrs returns the seeds in REDIS_CLUSTER_ADDRS (comma-separated).
// Without it the test is skipped, except under CI (CI=true).
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	addrs := os.Getenv("REDIS_CLUSTER_ADDRS")
	if addrs == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("REDIS_CLUSTER_ADDRS is not set; run the tests with `make test`")
		}
		t.Skip("REDIS_CLUSTER_ADDRS is not set; `make test` starts a Redis Cluster and sets it")
	}
	return strings.Split(addrs, ",")
}

// ClusterOptions returns options for a client of the Redis Cluster at
// ClusterAddrs. Maintenance notifications are off: go-redis v9.23 leaves a
// circuit-breaker goroutine running after such a client is closed.
func ClusterOptions(t testing.TB) *redis.ClusterOptions {
	t.Helper()
	return &redis.ClusterOptions{
		Addrs:                    ClusterAddrs(t),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// Cluster returns a client of the Redis Cluster at ClusterAddrs, closed when
// the test ends.
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(ClusterOptions(t))
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis cluster at %v: %v", ClusterAddrs(t), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Mini starts a miniredis for the test and returns it with a client of it.
func Mini(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return mr, c
}

// Prefix returns a key prefix unique to this test run, and deletes every key
// under it from c when the test ends.
func Prefix(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	p := "test:" + name + ":" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		del := func(ctx context.Context, c redis.Cmdable) error {
			iter := c.Scan(ctx, 0, p+"*", 500).Iterator()
			for iter.Next(ctx) {
				c.Del(ctx, iter.Val())
			}
			return iter.Err()
		}
		if cc, ok := c.(*redis.ClusterClient); ok {
			_ = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return del(ctx, n) })
			return
		}
		_ = del(ctx, c)
	})
	return p
}

// Counter is a go-redis hook that counts round trips: one per command, one per
// pipeline. Add it with client.AddHook.
type Counter struct{ n atomic.Int64 }

// Count returns the round trips so far.
func (c *Counter) Count() int64 { return c.n.Load() }

// Reset sets the count to zero.
func (c *Counter) Reset() { c.n.Store(0) }

// DialHook implements redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

var _ redis.Hook = (*Counter)(nil)

// Each runs fn as subtests on every Redis a test can have: "Miniredis" (an
// embedded miniredis whose keys expire as real time passes), "Redis" (at
// Addr) and "RedisCluster" (at ClusterAddrs), the last two skipped as Addr
// and ClusterAddrs skip. Each subtest has a client of its own, closed when
// it ends; give its keys a prefix of their own with Prefix. The subtests
// run in parallel.
func Each(t *testing.T, fn func(t *testing.T, client redis.UniversalClient)) {
	t.Run("Miniredis", func(t *testing.T) {
		t.Parallel()
		mr, c := Mini(t)
		mr.ClockTTL(true)
		fn(t, c)
	})
	t.Run("Redis", func(t *testing.T) { t.Parallel(); fn(t, Client(t)) })
	t.Run("RedisCluster", func(t *testing.T) { t.Parallel(); fn(t, Cluster(t)) })
}
