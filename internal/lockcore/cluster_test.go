package lockcore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// nodeStall makes one Cluster node look stalled to a ClusterClient: while
// armed, every command and pipeline sent to that node's address waits until
// the stall ends, as it would behind a slow script or a failover. Only the
// test's own client sees it, not the server other tests share.
type nodeStall struct {
	mu    sync.Mutex
	addr  string
	until time.Time
}

func (s *nodeStall) stall(addr string, d time.Duration) {
	s.mu.Lock()
	s.addr, s.until = addr, time.Now().Add(d)
	s.mu.Unlock()
}

func (s *nodeStall) wait(addr string) {
	s.mu.Lock()
	until := time.Time{}
	if addr == s.addr {
		until = s.until
	}
	s.mu.Unlock()
	time.Sleep(time.Until(until))
}

func (s *nodeStall) hook(addr string) redis.Hook {
	return beforeHook(func([]redis.Cmder) { s.wait(addr) })
}

// beforeHook is a go-redis hook that calls itself with the commands of every
// command and pipeline before they are sent.
type beforeHook func(cmds []redis.Cmder)

func (h beforeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h beforeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h beforeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h(cmds)
		return next(ctx, cmds)
	}
}

// clusterWithNodeHooks returns a client of the test Cluster whose client
// of each node (at addr) has the hook hook(addr): a ClusterClient's own
// hooks see one pipeline where each node gets its own. It is closed when
// the test ends.
func clusterWithNodeHooks(t *testing.T, hook func(addr string) redis.Hook) *redis.ClusterClient {
	t.Helper()
	opts := testredis.ClusterOptions(t)
	opts.NewClient = func(o *redis.Options) *redis.Client {
		c := redis.NewClient(o)
		c.AddHook(hook(o.Addr))
		return c
	}
	cc := redis.NewClusterClient(opts)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// One Cluster node that stalls must not cost the leases on the other nodes:
// each node's leases are renewed on their own.
func TestClusterStalledNodeKeepsOtherLeases(t *testing.T) {
	ctx := ctxT(t)
	stall := &nodeStall{}
	cc := clusterWithNodeHooks(t, stall.hook)
	prefix := testredis.Prefix(t, cc)
	l, err := NewRedis(cc, WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	b := l.r

	// One key on each master.
	byNode := map[string]string{}
	for i := 0; len(byNode) < 3 && i < 1000; i++ {
		k := fmt.Sprint("job-", i)
		m, err := cc.MasterForKey(ctx, b.keys(k).holders)
		require.NoError(t, err)
		if _, ok := byNode[m.Options().Addr]; !ok {
			byNode[m.Options().Addr] = k
		}
	}
	require.Len(t, byNode, 3)
	ttl := 900 * time.Millisecond
	leases := map[string]*Lease{}
	for addr, k := range byNode {
		lease, err := l.TryAcquire(ctx, k, &AcquireOptions{TTL: ttl})
		require.NoError(t, err)
		leases[addr] = lease
	}
	var stalled string
	for addr := range byNode {
		stalled = addr
		break
	}
	stall.stall(stalled, 2*ttl)
	t.Logf("node %s stalls for %s", stalled, 2*ttl)

	select {
	case <-leases[stalled].Lost():
	case <-ctx.Done():
		t.Fatal("the lease on the stalled node was not reported lost")
	}
	for addr, lease := range leases {
		if addr == stalled {
			continue
		}
		require.NoError(t, lease.Err(), "the lease on healthy node %s was lost", addr)
		require.NoError(t, lease.Release(ctx))
	}
}

// keySlot is the server's CLUSTER KEYSLOT of a lock's keys.
func TestKeySlotMatchesTheServer(t *testing.T) {
	c := testredis.Cluster(t)
	b := &redisBackend{prefix: "p%7Bx%7D:"} // as NewRedis escapes "p{x}:"
	for _, key := range []string{"a", "tenant:42", "{weird}", "caf\u00e9", "x%y"} {
		want, err := c.ClusterKeySlot(context.Background(), b.keys(key).holders).Result()
		require.NoError(t, err)
		require.EqualValues(t, want, keySlot(escapeKey(key)), key)
	}
}
