package lockcore

// Lease writes that wait for replicas (WithReplicaAcks): each goes to the
// master that keeps its key in a pipeline that ends in WAIT, which counts the
// replicas that have what that connection wrote.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// acksFit refuses WithReplicaAcks on a client it cannot work with: a Ring
// (no master to wait on), or a read timeout that a WAIT of the timeout's
// length would run into.
func acksFit(client redis.UniversalClient, acks replicaAcks) error {
	if acks.n == 0 {
		return nil
	}
	var read time.Duration
	switch c := client.(type) {
	case *redis.Client:
		read = c.Options().ReadTimeout
	case *redis.ClusterClient:
		read = c.Options().ReadTimeout
	default:
		return fmt.Errorf("%w: WithReplicaAcks(%d, %s): needs a *redis.Client or a *redis.ClusterClient, not a %T", ErrInvalid, acks.n, acks.timeout, client)
	}
	if read == 0 {
		read = 3 * time.Second // go-redis's default
	}
	if read > 0 && acks.timeout >= read {
		return fmt.Errorf("%w: WithReplicaAcks(%d, %s): the timeout must be shorter than the client's ReadTimeout (%s)", ErrInvalid, acks.n, acks.timeout, read)
	}
	return nil
}

// pipeliner is what sends a pipeline: the Locker's client, or a Cluster
// master's.
type pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// masterOf is the client of the master that keeps key's records, whose
// pipeline goes on one connection: the Locker's client, or on a Cluster the
// master of the key's slot.
func (b *redisBackend) masterOf(ctx context.Context, key string) (*redis.Client, error) {
	switch c := b.c.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, b.keys(key).holders)
	}
	return nil, fmt.Errorf("%w: WithReplicaAcks needs a *redis.Client or a *redis.ClusterClient, not a %T", ErrInvalid, b.c)
}

// script runs one call of s that writes a lease, as s.Run does: acknowledged
// when the Locker waits for replicas (see call).
func (b *redisBackend) script(ctx context.Context, key string, s *redis.Script, keys []string, args []any) *redis.Cmd {
	return b.call(ctx, key, true, s, keys, args)
}

// call runs one call of s for the lock key, as s.Run does; with
// WithBatching through key's lane (batch.go); when the Locker waits for
// replicas and acked, on the master of key, acknowledged (ackedScripts).
func (b *redisBackend) call(ctx context.Context, key string, acked bool, s *redis.Script, keys []string, args []any) *redis.Cmd {
	if b.lanes != nil {
		return b.lanes.do(&laneCall{ctx: ctx, key: key, acked: acked, s: s, keys: keys, args: args})
	}
	return b.alone(ctx, key, acked, s, keys, args)
}

// alone runs one call of s by itself, as call does without batching.
func (b *redisBackend) alone(ctx context.Context, key string, acked bool, s *redis.Script, keys []string, args []any) *redis.Cmd {
	if !acked || b.acks.n == 0 {
		return s.Run(ctx, b.c, keys, args...)
	}
	return b.ackedScripts(ctx, 1, func(int) string { return key }, func(p redis.Pipeliner, _ int, eval bool) *redis.Cmd {
		if eval {
			return s.Eval(ctx, p, keys, args...)
		}
		return s.EvalSha(ctx, p, keys, args...)
	})[0]
}

// writeScripts sends n script calls as pipelineScripts does, call i for
// the lock key(i); when the Locker waits for replicas, acknowledged
// (ackedScripts).
func (b *redisBackend) writeScripts(ctx context.Context, n int, key func(int) string, send func(p redis.Pipeliner, i int, eval bool) *redis.Cmd) []*redis.Cmd {
	if b.acks.n == 0 {
		return b.pipelineScripts(ctx, n, send)
	}
	return b.ackedScripts(ctx, n, key, send)
}

// ackedScripts sends n script calls, call i for the lock key(i), one
// pipeline per master that keeps their keys, each ending in WAIT: a call
// whose pipeline fewer than b.acks.n replicas acknowledged within
// b.acks.timeout fails with an error matching ErrNotReplicated (the script
// may have run).
func (b *redisBackend) ackedScripts(ctx context.Context, n int, key func(int) string, send func(p redis.Pipeliner, i int, eval bool) *redis.Cmd) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	byMaster := make(map[*redis.Client][]int)
	var order []*redis.Client
	for i := range n {
		m, err := b.masterOf(ctx, key(i))
		if err != nil {
			cmds[i] = failedCmd(ctx, err)
			continue
		}
		if _, ok := byMaster[m]; !ok {
			order = append(order, m)
		}
		byMaster[m] = append(byMaster[m], i)
	}
	every := func(int) bool { return true }
	for _, m := range order {
		b.ackedOn(ctx, m, byMaster[m], cmds, key, send, every)
	}
	return cmds
}

// ackedOn sends the calls idx, call i for the lock key(i), on the master m
// in one pipeline ending in WAIT (see scriptsOn), when any call of idx is
// acked.
func (b *redisBackend) ackedOn(ctx context.Context, m *redis.Client, idx []int, cmds []*redis.Cmd, key func(int) string,
	send func(p redis.Pipeliner, i int, eval bool) *redis.Cmd, acked func(int) bool) {
	b.scriptsOn(ctx, m, idx, cmds, send, acked)
	// A master's client does not follow a redirection, as the
	// ClusterClient does: a call whose slot moved (a failover the slot map
	// had not caught up with) is sent again, once, to the master the
	// redirection names, when the map names it too.
	for _, i := range idx {
		if err := cmds[i].Err(); err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")) {
			if m := b.movedTo(ctx, key(i), err); m != nil {
				b.scriptsOn(ctx, m, []int{i}, cmds, send, acked)
			}
		}
	}
}

// movedTo is the client of the master that a MOVED or ASK reply for key
// names, once the ClusterClient's slot map names it too (it is told to
// reload, and given a second), or nil.
func (b *redisBackend) movedTo(ctx context.Context, key string, err error) *redis.Client {
	cc, ok := b.c.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	f := strings.Fields(err.Error()) // MOVED <slot> <addr>
	if len(f) != 3 {
		return nil
	}
	cc.ReloadState(ctx)
	deadline := time.Now().Add(time.Second)
	for {
		m, err := cc.MasterForKey(ctx, b.keys(key).holders)
		if err == nil && m.Options().Addr == f[2] {
			return m
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		cc.ReloadState(ctx)
		time.Sleep(10 * time.Millisecond)
	}
}

// ackErr is nil when w, a WAIT, counted enough replicas, else an error
// matching ErrNotReplicated that says how many it counted.
func (b *redisBackend) ackErr(w *redis.Cmd) error {
	got, err := w.Int64()
	if err != nil {
		return fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
	}
	if got < int64(b.acks.n) {
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %s", ErrNotReplicated, got, b.acks.n, b.acks.timeout)
	}
	return nil
}

// confirm makes r's lease, which its acquire found already taken for it (a
// repeat of the call, or a release that handed it over), a write of this
// connection, acknowledged: the acquire found it without writing, and a
// WAIT counts the writes of its connection (Redis 7.0's counts all the
// server wrote before it; later versions' only the connection's own). It sets the lease's TTL (extend.lua), which
// replicas apply after whatever made the lease.
func (b *redisBackend) confirm(ctx context.Context, r *request, token int64) error {
	k := b.keys(r.key)
	a := extendArgs{Member: memberOf(token, r.aid, r.owner, r.label), TTL: r.ttl, Epoch: r.epoch > 0 || r.order > 0}
	n, err := b.script(ctx, r.key, extendScript, []string{k.holders, k.meta}, a.list()).Int64()
	switch {
	case err != nil:
		return err
	case n != 1:
		return fmt.Errorf("confirming a lease found taken for this call: %w", errNotHeld)
	}
	return nil
}
