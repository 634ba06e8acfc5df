package lockcore

// Batching (WithBatching): the script calls that one Locker has in flight
// at the same moment on one server go to it in one pipeline. Each server
// (each Cluster master) has a lane. A call that finds its lane idle is sent
// at once, alone, on its caller's goroutine, as without batching; calls that
// come while the lane has a call or a pipeline in flight queue, and when it
// returns the first of them sends them all, in one pipeline through
// scriptsOn (each call's own reply, error and EVAL fallback), on its own
// goroutine. No timer delays a call and no goroutine of its own runs.

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Bounds of the lanes: a pipeline carries at most laneBatch calls; a queued
// call waits for its lane at most laneStallRTTs times the lane's recent
// round trip, but at least laneStallMin and at most laneStallMax, and is
// then sent alone.
const (
	laneBatch     = 256
	laneStallRTTs = 8
	laneStallMin  = 5 * time.Millisecond
	laneStallMax  = 250 * time.Millisecond
)

// lanes are a Locker's lanes, one per server.
type lanes struct {
	b  *redisBackend
	mu sync.Mutex
	by map[string]*lane // by the address of the Cluster master, "" for the one server
	// stall, when set, replaces the bound on a queued call's wait.
	stall time.Duration
}

// lane is one server's: whether a call or pipeline is in flight, since
// when, and the calls queued behind it.
type lane struct {
	mu    sync.Mutex
	busy  bool
	since time.Time
	queue []*laneCall
	rtt   time.Duration // the moving average of its round trips
}

// laneCall is one script call on a lane.
type laneCall struct {
	ctx    context.Context
	key    string // the lock key
	acked  bool   // waits for replicas when the Locker does
	s      *redis.Script
	keys   []string
	args   []any
	master *redis.Client // with WithReplicaAcks, the master the call goes to
	cmd    *redis.Cmd    // its reply

	taken bool          // out of the queue, in a pipeline
	lead  []*laneCall   // the pipeline the call's goroutine sends
	wake  chan struct{} // told once: to send lead, or that cmd is in
}

// send adds c to p, as EVAL when eval.
func (c *laneCall) send(p redis.Pipeliner, eval bool) *redis.Cmd {
	if eval {
		return c.s.Eval(c.ctx, p, c.keys, c.args...)
	}
	return c.s.EvalSha(c.ctx, p, c.keys, c.args...)
}

// laneOf is the lane of c's key and, with WithReplicaAcks, its master.
func (ls *lanes) laneOf(c *laneCall) (*lane, error) {
	addr := ""
	if _, cluster := ls.b.c.(*redis.ClusterClient); cluster || ls.b.acks.n > 0 {
		m, err := ls.b.masterOf(c.ctx, c.key)
		if err != nil {
			return nil, err
		}
		c.master, addr = m, m.Options().Addr
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ln := ls.by[addr]
	if ln == nil {
		if ls.by == nil {
			ls.by = make(map[string]*lane)
		}
		ln = &lane{}
		ls.by[addr] = ln
	}
	return ln, nil
}

// do runs c on its lane: at once and alone when the lane is idle (or stuck
// for longer than a queued call waits), else queued for the next pipeline.
// A queued call whose ctx ends is withdrawn, never sent, and fails with
// ctx's error; one that waited longer than the lane's stall bound is sent
// alone. A call once sent waits for its reply, as a lone call does.
func (ls *lanes) do(c *laneCall) *redis.Cmd {
	ln, err := ls.laneOf(c)
	if err != nil { // no master known for the key: the client's own way
		ls.alone(c)
		return c.cmd
	}
	ln.mu.Lock()
	stall := ls.stallLocked(ln)
	switch {
	case !ln.busy:
		ln.busy, ln.since = true, time.Now()
		ln.mu.Unlock()
		ls.alone(c)
		ls.next(ln)
		return c.cmd
	case time.Since(ln.since) > stall:
		ln.mu.Unlock()
		ls.alone(c)
		return c.cmd
	case c.ctx.Err() != nil:
		ln.mu.Unlock()
		return failedCmd(c.ctx, c.ctx.Err())
	}
	c.wake = make(chan struct{}, 1)
	ln.queue = append(ln.queue, c)
	ln.mu.Unlock()

	t := time.NewTimer(stall)
	defer t.Stop()
	select {
	case <-c.wake:
	case <-c.ctx.Done():
		if ls.withdraw(ln, c) {
			return failedCmd(c.ctx, c.ctx.Err())
		}
		<-c.wake
	case <-t.C:
		if ls.withdraw(ln, c) {
			ls.alone(c)
			return c.cmd
		}
		<-c.wake
	}
	if c.lead != nil {
		ls.pipeline(c.lead)
		ls.next(ln)
	}
	return c.cmd
}

// stallLocked is how long a call queued on ln waits before it is sent
// alone.
func (ls *lanes) stallLocked(ln *lane) time.Duration {
	if ls.stall > 0 {
		return ls.stall
	}
	return min(max(laneStallRTTs*ln.rtt, laneStallMin), laneStallMax)
}

// withdraw takes c out of ln's queue, unless a pipeline took it first.
func (ls *lanes) withdraw(ln *lane, c *laneCall) bool {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if c.taken {
		return false
	}
	for i, q := range ln.queue {
		if q == c {
			ln.queue = append(ln.queue[:i], ln.queue[i+1:]...)
			break
		}
	}
	return true
}

// next ends ln's send in flight (and measures it), and hands the queued
// calls, as the next pipeline, to the first of them, or leaves ln idle.
func (ls *lanes) next(ln *lane) {
	ln.mu.Lock()
	rtt := time.Since(ln.since)
	if ln.rtt == 0 {
		ln.rtt = rtt
	} else {
		ln.rtt += (rtt - ln.rtt) / 8
	}
	if len(ln.queue) == 0 {
		ln.busy = false
		ln.mu.Unlock()
		return
	}
	n := min(len(ln.queue), laneBatch)
	batch := make([]*laneCall, n)
	copy(batch, ln.queue)
	ln.queue = append(ln.queue[:0], ln.queue[n:]...)
	for _, c := range batch {
		c.taken = true
	}
	ln.since = time.Now()
	ln.mu.Unlock()
	batch[0].lead = batch
	batch[0].wake <- struct{}{}
}

// alone sends c by itself, as a Locker without batching does.
func (ls *lanes) alone(c *laneCall) {
	c.cmd = ls.b.alone(c.ctx, c.key, c.acked, c.s, c.keys, c.args)
}

// pipeline sends batch, taken from a lane, in one pipeline (one alone) and
// tells every call but the first, whose goroutine sends it, that its reply
// is in. The pipeline does not end with any one call's ctx. With
// WithReplicaAcks it goes to the master on one connection and ends in one
// WAIT, whose shortfall fails only the calls that wait for replicas.
func (ls *lanes) pipeline(batch []*laneCall) {
	b := ls.b
	if len(batch) == 1 {
		ls.alone(batch[0])
		return
	}
	ctx := context.WithoutCancel(batch[0].ctx)
	cmds := make([]*redis.Cmd, len(batch))
	idx := make([]int, len(batch))
	for i := range idx {
		idx[i] = i
	}
	send := func(p redis.Pipeliner, i int, eval bool) *redis.Cmd { return batch[i].send(p, eval) }
	if b.acks.n > 0 {
		b.ackedOn(ctx, batch[0].master, idx, cmds, func(i int) string { return batch[i].key }, send,
			func(i int) bool { return batch[i].acked })
	} else {
		b.scriptsOn(ctx, b.c, idx, cmds, send, nil)
	}
	for i, c := range batch {
		c.cmd = cmds[i]
		if i > 0 {
			c.wake <- struct{}{}
		}
	}
}

// failedCmd is a reply that is err.
func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
