package lockcore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// gate is a go-redis hook that, once armed, holds the first round trip (a
// command or a pipeline) with a script call it matches in flight until
// opened, and records every round trip's commands.
type gate struct {
	match func(redis.Cmder) bool // nil: every script call

	mu    sync.Mutex
	armed bool
	held  chan struct{} // closed when a round trip is held
	open  chan struct{}
	trips [][]redis.Cmder
	pipes int // round trips that were pipelines
}

// arm makes the gate hold the next matching round trip, and returns a
// channel closed once it does.
func (g *gate) arm() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.held, g.open = true, make(chan struct{}), make(chan struct{})
	return g.held
}

// release lets the held round trip go on.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open != nil {
		select {
		case <-g.open:
		default:
			close(g.open)
		}
	}
}

// reset forgets the round trips so far.
func (g *gate) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.trips, g.pipes = nil, 0
}

// recorded returns the round trips so far, and how many were pipelines.
func (g *gate) recorded() ([][]redis.Cmder, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([][]redis.Cmder(nil), g.trips...), g.pipes
}

func (g *gate) pass(cmds []redis.Cmder, pipe bool) {
	if handshake(cmds) {
		return
	}
	g.mu.Lock()
	g.trips = append(g.trips, cmds)
	if pipe {
		g.pipes++
	}
	hold := false
	if g.armed {
		for _, c := range cmds {
			if isScriptCall(c) && (g.match == nil || g.match(c)) {
				hold = true
				break
			}
		}
	}
	var held, open chan struct{}
	if hold {
		g.armed = false
		held, open = g.held, g.open
	}
	g.mu.Unlock()
	if hold {
		close(held)
		<-open
	}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.pass([]redis.Cmder{cmd}, false)
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.pass(cmds, true)
		return next(ctx, cmds)
	}
}

// handshake reports whether cmds are a new connection's handshake (HELLO,
// CLIENT SETINFO), which newer go-redis versions send through the hooks:
// no call of the Locker's.
func handshake(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if n := c.Name(); n != "hello" && n != "client" {
			return false
		}
	}
	return len(cmds) > 0
}

func isScriptCall(c redis.Cmder) bool { return c.Name() == "evalsha" || c.Name() == "eval" }

// scriptKey is the first key of a script call, "" for another command.
func scriptKey(c redis.Cmder) string {
	if a := c.Args(); isScriptCall(c) && len(a) > 3 {
		return fmt.Sprint(a[3])
	}
	return ""
}

// onKey matches the script calls on key's records.
func onKey(b *redisBackend, key string) func(redis.Cmder) bool {
	base := b.base(key) + ":"
	return func(c redis.Cmder) bool { return strings.HasPrefix(scriptKey(c), base) }
}

// queued is how many calls wait on l's lanes.
func queued(l *RedisLocker) int {
	ls := l.r.lanes
	ls.mu.Lock()
	defer ls.mu.Unlock()
	n := 0
	for _, ln := range ls.by {
		ln.mu.Lock()
		n += len(ln.queue)
		ln.mu.Unlock()
	}
	return n
}

// batchDeployments are the clients the batching tests run on.
var batchDeployments = map[string]func(t *testing.T) redis.UniversalClient{
	"standalone": func(t *testing.T) redis.UniversalClient { return testredis.Client(t) },
	"cluster":    func(t *testing.T) redis.UniversalClient { return testredis.Cluster(t) },
}

// batchedLocker is a Locker with WithBatching on c, whose queued calls wait
// for as long as stall (a minute for 0), with c's scripts loaded and its
// first acquire (the server's version, the operators' channel) done. The
// gate, added to c, has seen none of it.
func batchedLocker(t *testing.T, c redis.UniversalClient, stall time.Duration, opts ...Option) (*RedisLocker, *gate) {
	t.Helper()
	ctx := ctxT(t)
	g := &gate{}
	c.AddHook(g)
	l, err := NewRedis(c, append([]Option{WithPrefix(testredis.Prefix(t, c)), WithBatching()}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { g.release(); _ = l.Close(context.Background()) })
	if stall == 0 {
		stall = time.Minute
	}
	l.r.lanes.stall = stall
	// Load every script the tests call on every master.
	for i := range 64 {
		lease, err := l.TryAcquire(ctx, fmt.Sprint("warm-", i), nil)
		require.NoError(t, err)
		_, err = l.Inspect(ctx, fmt.Sprint("warm-", i))
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
	}
	g.reset()
	return l, g
}

// keysOn returns n keys whose records one server keeps: on a Cluster, the
// master of key's (a key of the first master when key is ""), or any other
// master when other.
func keysOn(t *testing.T, l *RedisLocker, key string, other bool, n int) []string {
	t.Helper()
	cc, ok := l.r.c.(*redis.ClusterClient)
	addrOf := func(k string) string {
		if !ok {
			return ""
		}
		m, err := cc.MasterForKey(context.Background(), l.r.keys(k).holders)
		require.NoError(t, err)
		return m.Options().Addr
	}
	want := ""
	if key != "" {
		want = addrOf(key)
	} else {
		want = addrOf("k-0")
	}
	var keys []string
	for i := 0; len(keys) < n && i < 10000; i++ {
		k := fmt.Sprint("k-", i)
		if (addrOf(k) == want) != other && k != key {
			keys = append(keys, k)
		}
	}
	require.Len(t, keys, n)
	return keys
}

// result is what one call returned.
type result struct {
	lease *Lease
	err   error
}

// await returns what ch gives, or fails the test after 10s.
func await[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("a call did not return")
	}
	panic("unreachable")
}

// tryAcquire runs TryAcquire in a goroutine.
func tryAcquire(ctx context.Context, l *RedisLocker, key string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		lease, err := l.TryAcquire(ctx, key, nil)
		ch <- result{lease, err}
	}()
	return ch
}

// Eight acquires at once on one server, the first held in flight while
// the others come, cost two round trips: the first alone, the seven others
// in one pipeline.
func TestBatchingSharesRoundTrips(t *testing.T) {
	for name, connect := range batchDeployments {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			l, g := batchedLocker(t, connect(t), 0)
			keys := keysOn(t, l, "", false, 8)
			held := g.arm()
			first := tryAcquire(ctx, l, keys[0])
			await(t, held)
			var rest []<-chan result
			for _, k := range keys[1:] {
				rest = append(rest, tryAcquire(ctx, l, k))
			}
			require.Eventually(t, func() bool { return queued(l) == 7 }, 5*time.Second, time.Millisecond)
			g.release()
			var leases []*Lease
			for i, ch := range append([]<-chan result{first}, rest...) {
				r := await(t, ch)
				require.NoError(t, r.err, keys[i])
				leases = append(leases, r.lease)
			}
			trips, _ := g.recorded()
			for _, lease := range leases {
				require.NoError(t, lease.Release(ctx))
			}
			require.Len(t, trips, 2, "round trips of 8 acquires")
			require.Len(t, trips[0], 1, "the first acquire went alone")
			require.Len(t, trips[1], 7, "the other 7 went together")
		})
	}
}

// A call that finds its lane idle is sent at once, alone, as a command
// rather than a pipeline: as without batching.
func TestBatchingLoneCallIsSentAlone(t *testing.T) {
	for name, connect := range batchDeployments {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			l, g := batchedLocker(t, connect(t), 0)
			lease, err := l.TryAcquire(ctx, "lone", nil)
			require.NoError(t, err)
			trips, pipes := g.recorded()
			require.Len(t, trips, 1)
			require.Zero(t, pipes, "a lone call is no pipeline")
			require.Zero(t, queued(l))
			require.NoError(t, lease.Release(ctx))
		})
	}
}

// A Cluster master whose call is stuck in flight holds up the calls queued
// for it, not the calls to the other masters.
func TestBatchingSlowMasterHoldsUpOnlyItsOwn(t *testing.T) {
	ctx := ctxT(t)
	l, g := batchedLocker(t, testredis.Cluster(t), 0)
	slow := keysOn(t, l, "", false, 2)
	fast := keysOn(t, l, slow[0], true, 6)
	g.match = onKey(l.r, slow[0])
	held := g.arm()
	first := tryAcquire(ctx, l, slow[0])
	await(t, held)
	behind := tryAcquire(ctx, l, slow[1])
	require.Eventually(t, func() bool { return queued(l) == 1 }, 5*time.Second, time.Millisecond)
	for _, k := range fast {
		r := await(t, tryAcquire(ctx, l, k))
		require.NoError(t, r.err, "%s, on another master, waited for the stuck one", k)
		require.NoError(t, r.lease.Release(ctx))
	}
	select {
	case r := <-behind:
		t.Fatalf("a call queued behind the stuck one was sent: %v", r.err)
	default:
	}
	g.release()
	for _, ch := range []<-chan result{first, behind} {
		r := await(t, ch)
		require.NoError(t, r.err)
		require.NoError(t, r.lease.Release(ctx))
	}
}

// A call queued behind one stuck in flight for longer than the lane's
// stall bound is sent alone.
func TestBatchingStuckLaneSendsQueuedCallsAlone(t *testing.T) {
	for name, connect := range batchDeployments {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			l, g := batchedLocker(t, connect(t), 20*time.Millisecond)
			keys := keysOn(t, l, "", false, 3)
			held := g.arm()
			first := tryAcquire(ctx, l, keys[0])
			await(t, held)
			for _, k := range keys[1:] { // queued, then after 20ms alone; then at once
				r := await(t, tryAcquire(ctx, l, k))
				require.NoError(t, r.err)
				require.NoError(t, r.lease.Release(ctx))
			}
			g.release()
			r := await(t, first)
			require.NoError(t, r.err)
			require.NoError(t, r.lease.Release(ctx))
		})
	}
}

// One call's failure in a pipeline is its own: a WRONGTYPE reply fails only
// that call, and a call whose script Redis no longer has is sent again
// with EVAL, alone, while the others keep their replies.
func TestBatchingCallErrorsAreTheirOwn(t *testing.T) {
	for name, connect := range batchDeployments {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			c := connect(t)
			l, g := batchedLocker(t, c, 0)
			keys := keysOn(t, l, "", false, 5)
			wrong, noscript := keys[3], keys[4]
			require.NoError(t, c.Set(ctx, l.r.keys(wrong).waiters, "not a sorted set", time.Minute).Err())
			_, err := l.TryAcquire(ctx, noscript, nil)
			require.NoError(t, err)
			hook := &noScriptOnce{hash: inspectScript.Hash(), src: inspectSrc}
			c.AddHook(hook)
			g.reset()

			held := g.arm()
			first := tryAcquire(ctx, l, keys[0])
			await(t, held)
			acquires := []<-chan result{tryAcquire(ctx, l, keys[1]), tryAcquire(ctx, l, keys[2])}
			inspect := func(key string) <-chan error {
				ch := make(chan error, 1)
				go func() {
					info, err := l.Inspect(ctx, key)
					if err == nil && len(info.Holders) != 1 {
						err = fmt.Errorf("inspect %s: %d holders", key, len(info.Holders))
					}
					ch <- err
				}()
				return ch
			}
			wrongErr, noscriptErr := inspect(wrong), inspect(noscript)
			require.Eventually(t, func() bool { return queued(l) == 4 }, 5*time.Second, time.Millisecond)
			g.release()
			require.ErrorContains(t, await(t, wrongErr), "WRONGTYPE")
			require.NoError(t, await(t, noscriptErr), "the call answered NOSCRIPT was sent again")
			require.EqualValues(t, 1, hook.evals.Load())
			for _, ch := range append(acquires, first) {
				r := await(t, ch)
				require.NoError(t, r.err)
				require.NoError(t, r.lease.Release(ctx))
			}
		})
	}
}

// A queued call whose ctx ends before its turn is never sent, and returns
// ctx's error.
func TestBatchingCancelledQueuedCallIsNotSent(t *testing.T) {
	for name, connect := range batchDeployments {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			l, g := batchedLocker(t, connect(t), 0)
			keys := keysOn(t, l, "", false, 2)
			held := g.arm()
			first := tryAcquire(ctx, l, keys[0])
			await(t, held)
			cctx, cancel := context.WithCancel(ctx)
			cancelled := tryAcquire(cctx, l, keys[1])
			require.Eventually(t, func() bool { return queued(l) == 1 }, 5*time.Second, time.Millisecond)
			cancel()
			r := await(t, cancelled)
			require.ErrorIs(t, r.err, context.Canceled)
			require.Nil(t, r.lease)
			g.release()
			r = await(t, first)
			require.NoError(t, r.err)
			require.NoError(t, r.lease.Release(ctx))
			trips, _ := g.recorded()
			for _, trip := range trips {
				for _, c := range trip {
					if onKey(l.r, keys[1])(c) {
						require.NotEqual(t, plainAcquireScript.Hash(), c.Args()[1], "the cancelled acquire was sent")
					}
				}
			}
			info, err := l.Inspect(ctx, keys[1])
			require.NoError(t, err)
			require.Empty(t, info.Holders)
		})
	}
}

// With WithReplicaAcks a pipeline ends in one WAIT, and a WAIT that falls
// short fails only the calls that wait for replicas.
func TestBatchingReplicaAcksOneWaitPerPipeline(t *testing.T) {
	ctx := ctxT(t)
	p := startReplicated(t)
	l, g := batchedLocker(t, p.mclient, 0, WithReplicaAcks(1, time.Second))
	keys := keysOn(t, l, "", false, 8)
	run := func(keys []string) (acquired []result, inspected []error) {
		held := g.arm()
		first := tryAcquire(ctx, l, keys[0])
		await(t, held)
		var acqs []<-chan result
		for _, k := range keys[1:3] {
			acqs = append(acqs, tryAcquire(ctx, l, k))
		}
		insp := make(chan error, 1)
		go func() { _, err := l.Inspect(ctx, keys[3]); insp <- err }()
		require.Eventually(t, func() bool { return queued(l) == 3 }, 5*time.Second, time.Millisecond)
		g.release()
		for _, ch := range append([]<-chan result{first}, acqs...) {
			acquired = append(acquired, await(t, ch))
		}
		return acquired, []error{await(t, insp)}
	}
	acquired, inspected := run(keys[:4])
	for _, r := range acquired {
		require.NoError(t, r.err)
		require.NoError(t, r.lease.Release(ctx))
	}
	require.NoError(t, inspected[0])
	trips, _ := g.recorded()
	var names []string
	for _, c := range trips[1] {
		names = append(names, c.Name())
	}
	require.Equal(t, []string{"evalsha", "evalsha", "evalsha", "wait"}, names, "the pipeline of two acquires and an inspect")

	p.replica.Pause()
	defer p.replica.Resume()
	acquired, inspected = run(keys[4:])
	for _, r := range acquired {
		require.ErrorIs(t, r.err, ErrNotReplicated)
	}
	require.NoError(t, inspected[0], "an inspect waits for no replica")
}

// Batching is off unless WithBatching asks for it.
func TestBatchingIsOffByDefault(t *testing.T) {
	require.Nil(t, miniLocker(t).r.lanes)
	require.NotNil(t, miniLocker(t, WithBatching()).r.lanes)
}
