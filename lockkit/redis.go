package lockkit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/acquire.lua
	acquireSrc string
	//go:embed scripts/release.lua
	releaseSrc string
	//go:embed scripts/extend.lua
	extendSrc string
	//go:embed scripts/leave.lua
	leaveSrc string
	//go:embed scripts/inspect.lua
	inspectSrc string

	acquireScript = redis.NewScript(acquireSrc)
	releaseScript = redis.NewScript(releaseSrc)
	extendScript  = redis.NewScript(extendSrc)
	leaveScript   = redis.NewScript(leaveSrc)
	inspectScript = redis.NewScript(inspectSrc)
)

// RedisLocker is a Locker backed by Redis, shared by every process that uses
// the same Redis and prefix. All keys of one lock share a {hash tag}, so it
// works on Redis Cluster as well as standalone and Sentinel deployments.
//
// Redis layout for key K under prefix P: P{K}:h holds the holders (a sorted
// set scored by expiry), P{K}:f the last fencing token (for a second),
// P{K}:m the last epoch, P{K}:q and P{K}:w the waiters; releases are
// published on P{K}:r. Every key expires on its own.
type RedisLocker struct {
	e *engine
	r *redisBackend
}

var _ Locker = (*RedisLocker)(nil)

// NewRedis returns a RedisLocker using client, which it does not close. It
// returns an error matching ErrInvalid for a nil client or an invalid option.
// The Locker starts no goroutine until a lease is acquired or a waiter waits;
// call Close to stop them.
func NewRedis(client redis.UniversalClient, opts ...Option) (*RedisLocker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: NewRedis: client is nil", ErrInvalid)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	b := &redisBackend{c: client, prefix: cfg.prefix, subs: make(map[string]*subscribers)}
	return &RedisLocker{e: newEngine(cfg, b), r: b}, nil
}

// Owner returns the owner id recorded with this Locker's leases.
func (l *RedisLocker) Owner() string { return l.e.cfg.owner }

// TryAcquire implements Locker.
func (l *RedisLocker) TryAcquire(ctx context.Context, key string, opt *Options) (*Lease, error) {
	return l.e.tryAcquire(ctx, key, opt)
}

// Acquire implements Locker.
func (l *RedisLocker) Acquire(ctx context.Context, key string, opt *Options) (*Lease, error) {
	return l.e.acquireWait(ctx, key, opt)
}

// Inspect implements Locker.
func (l *RedisLocker) Inspect(ctx context.Context, key string) (*Info, error) {
	return l.e.inspect(ctx, key)
}

// Close implements Locker. It does not close the Redis client.
func (l *RedisLocker) Close(ctx context.Context) error { return l.e.close(ctx) }

// Keys returns the keys matching pattern (Redis glob syntax, applied to the
// key without the prefix) that have at least one holder. It uses SCAN on every
// master, never KEYS; a key may be missed or reported after it was released,
// as SCAN guarantees.
func (l *RedisLocker) Keys(ctx context.Context, pattern string) ([]string, error) {
	match := globEscape(l.r.prefix) + "{" + pattern + "}:h"
	var (
		mu  sync.Mutex
		out []string
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			k = strings.TrimSuffix(strings.TrimPrefix(k, l.r.prefix+"{"), "}:h")
			mu.Lock()
			out = append(out, k)
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := l.r.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, l.r.c)
	}
	if err != nil {
		return nil, fmt.Errorf("lockkit: keys %q: %w", pattern, err)
	}
	return out, nil
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

type redisBackend struct {
	c      redis.UniversalClient
	prefix string

	mu   sync.Mutex
	ps   *redis.PubSub
	subs map[string]*subscribers
	wg   sync.WaitGroup
	done bool
}

type lockKeys struct{ holders, meta, queue, waiters, fence, channel string }

func (b *redisBackend) keys(key string) lockKeys {
	base := b.prefix + "{" + key + "}"
	return lockKeys{base + ":h", base + ":m", base + ":q", base + ":w", base + ":f", base + ":r"}
}

func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func (b *redisBackend) acquire(ctx context.Context, r *request) (acquireResult, error) {
	k := b.keys(r.key)
	fair := "0"
	if r.fair {
		fair = "1"
	}
	vals, err := acquireScript.Run(ctx, b.c, []string{k.holders, k.meta, k.queue, k.waiters, k.fence},
		r.owner, ms(r.ttl), r.limit, r.waiter, fair, ms(r.waiterTTL), r.epoch, ms(r.epochTTL)).Slice()
	if err != nil {
		return acquireResult{}, err
	}
	if len(vals) < 2 {
		return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
	}
	switch toInt(vals[0]) {
	case 1:
		return acquireResult{ok: true, token: toInt(vals[1])}, nil
	case -1:
		return acquireResult{lastEpoch: toInt(vals[1])}, nil
	}
	return conflictOf(r.key, vals)
}

// conflictOf reads the acquire script's reply for a held key.
func conflictOf(key string, vals []any) (acquireResult, error) {
	if len(vals) < 5 {
		return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
	}
	c := &ConflictError{Key: key, TTL: time.Duration(toInt(vals[2])) * time.Millisecond, Holders: int(toInt(vals[3])), Ahead: int(toInt(vals[4]))}
	if m, _ := vals[1].(string); m != "" {
		c.Token, c.Owner = parseMember(m)
	}
	return acquireResult{conflict: c}, nil
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// pipelineScript runs script once per lease in one pipeline, retrying with
// EVAL the calls that found the script cache empty (after a Redis restart).
func (b *redisBackend) pipelineScript(ctx context.Context, s *redis.Script, leases []*Lease, keys func(lockKeys) []string, args func(*Lease) []any) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(leases))
	run := func(idx []int, eval bool) {
		_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				ks := keys(b.keys(leases[i].key))
				if eval {
					cmds[i] = s.Eval(ctx, p, ks, args(leases[i])...)
				} else {
					cmds[i] = s.EvalSha(ctx, p, ks, args(leases[i])...)
				}
			}
			return nil
		})
	}
	all := make([]int, len(leases))
	for i := range all {
		all[i] = i
	}
	run(all, false)
	var again []int
	for i, c := range cmds {
		if err := c.Err(); err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		run(again, true)
	}
	return cmds
}

func (b *redisBackend) release(ctx context.Context, leases []*Lease) ([]bool, error) {
	held := make([]bool, len(leases))
	if len(leases) == 1 {
		l := leases[0]
		k := b.keys(l.key)
		n, err := releaseScript.Run(ctx, b.c, []string{k.holders, k.waiters}, l.member, k.channel).Int64()
		held[0] = n == 1
		return held, err
	}
	cmds := b.pipelineScript(ctx, releaseScript, leases, func(k lockKeys) []string { return []string{k.holders, k.waiters} }, func(l *Lease) []any {
		return []any{l.member, b.keys(l.key).channel}
	})
	var errs []error
	for i, c := range cmds {
		n, err := c.Int64()
		if err != nil {
			errs = append(errs, err)
		}
		held[i] = n == 1
	}
	return held, errors.Join(errs...)
}

func (b *redisBackend) extend(ctx context.Context, leases []*Lease) []error {
	ttl := func(l *Lease) int64 {
		l.e.mu.Lock()
		defer l.e.mu.Unlock()
		return ms(l.ttl)
	}
	cmds := b.pipelineScript(ctx, extendScript, leases,
		func(k lockKeys) []string { return []string{k.holders, k.meta} },
		func(l *Lease) []any {
			epoch := "0"
			if l.epoch {
				epoch = "1"
			}
			return []any{l.member, ttl(l), epoch}
		})
	errs := make([]error, len(leases))
	for i, c := range cmds {
		n, err := c.Int64()
		switch {
		case err != nil:
			errs[i] = err
		case n != 1:
			errs[i] = errNotHeld
		}
	}
	return errs
}

func (b *redisBackend) leave(ctx context.Context, key, waiter string) error {
	k := b.keys(key)
	return leaveScript.Run(ctx, b.c, []string{k.queue, k.waiters}, waiter, k.channel).Err()
}

func (b *redisBackend) inspect(ctx context.Context, key string) (*Info, error) {
	k := b.keys(key)
	vals, err := inspectScript.Run(ctx, b.c, []string{k.holders, k.waiters}).Slice()
	if err != nil {
		return nil, err
	}
	info := &Info{Key: key}
	if len(vals) > 0 {
		info.Waiters = int(toInt(vals[0]))
	}
	for i := 1; i+1 < len(vals); i += 2 {
		m, _ := vals[i].(string)
		tok, owner := parseMember(m)
		info.Holders = append(info.Holders, Holder{Owner: owner, Token: tok, TTL: time.Duration(toInt(vals[i+1])) * time.Millisecond})
	}
	return info, nil
}

// wakeups shares one pub/sub connection among all waiters of the Locker; a
// channel is subscribed while at least one waiter needs it. It returns once
// Redis has confirmed the subscription (or after subscribeWait), so that a
// release after it is never missed.
func (b *redisBackend) wakeups(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	name := b.keys(key).channel
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return ch, func() {}
	}
	if b.ps == nil {
		b.ps = b.c.Subscribe(context.Background())
		msgs := b.ps.ChannelWithSubscriptions()
		b.wg.Add(1)
		go b.dispatch(msgs)
	}
	set := b.subs[name]
	if set == nil {
		set = &subscribers{chans: make(map[chan struct{}]struct{}), ready: make(chan struct{})}
		b.subs[name] = set
		// A failed subscribe only costs latency: waiters fall back to polling.
		_ = b.ps.Subscribe(context.Background(), name)
	}
	set.chans[ch] = struct{}{}
	b.mu.Unlock()
	t := time.NewTimer(subscribeWait)
	select {
	case <-set.ready:
	case <-t.C:
	}
	t.Stop()
	return ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(set.chans, ch)
		if len(set.chans) == 0 && b.subs[name] == set {
			delete(b.subs, name)
			if !b.done {
				_ = b.ps.Unsubscribe(context.Background(), name)
			}
		}
	}
}

// subscribeWait bounds how long a waiter waits for Redis to confirm its
// subscription before it relies on polling alone.
const subscribeWait = time.Second

type subscribers struct {
	chans     map[chan struct{}]struct{}
	ready     chan struct{} // closed when Redis confirms the subscription
	confirmed bool
}

func (b *redisBackend) dispatch(msgs <-chan any) {
	defer b.wg.Done()
	for m := range msgs {
		b.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			if set := b.subs[m.Channel]; set != nil && m.Kind == "subscribe" && !set.confirmed {
				set.confirmed = true
				close(set.ready)
			}
		case *redis.Message:
			if set := b.subs[m.Channel]; set != nil {
				for ch := range set.chans {
					select {
					case ch <- struct{}{}:
					default:
					}
				}
			}
		}
		b.mu.Unlock()
	}
}

func (b *redisBackend) close() error {
	b.mu.Lock()
	b.done = true
	ps := b.ps
	b.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	b.wg.Wait()
	return err
}
