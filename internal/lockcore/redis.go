package lockcore

// RedisLocker: the Locker on Redis, its options and its methods.

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisLocker is a Locker backed by Redis, shared by every process that uses
// the same Redis and prefix. All keys of one lock share a {hash tag}, so it
// works on Redis Cluster as well as standalone and Sentinel deployments.
//
// Redis layout for key K under prefix P: P{K}:h holds the holders. A plain
// lock (limit 1, no waiting, queue, epoch, Coalesce, Supersede, Preempt,
// TakeReservation or Park) that no other kind of acquire touched keeps its one holder
// there as a STRING; its release leaves "~<token>." there for the client's
// retry window: the last token and the record of the release, moved into
// P{K}:d:<token> when the key is taken again within the window. Any
// other operation first turns the STRING into a sorted set scored by expiry,
// with records of completed labels and cleaned-up calls, which the key keeps
// while waiters, a queue or parked jobs may live; its released holders are
// then kept in P{K}:d for the retry window, or, by a release that leaves the
// key empty, in P{K}:h as a plain release leaves it. P{K}:b holds the newest request
// recorded by Debounce, P{K}:k the parked jobs (Parking.ID), P{K}:c
// the start of the last Coalesce run that succeeded, P{K}:f the last fencing
// token (for a second), P{K}:m the last epoch and the order of the latest Supersede run, P{K}:q and P{K}:w the
// waiters; releases are published on P{K}:r. In P and K, the characters
// '{', '}' and '%' are written %7B, %7D and %25, so that {K} is always the
// hash tag: any key and any prefix work on Redis Cluster. Every key expires
// on its own; nothing a released lock leaves outlives the retry window (see
// NewRedis).
//
// Every script is safe to run twice, as go-redis does when a reply is late:
// a repeated acquire returns the lease its first run took, a repeated release
// reports the same success.
type RedisLocker struct {
	e *engine
	r *redisBackend
}

var _ Locker = (*RedisLocker)(nil)

// NewRedis returns a RedisLocker using client, which it does not close. It
// returns an error matching ErrInvalid for a nil client (also a typed nil) or
// an invalid option. The Locker starts no goroutine until a lease is acquired
// or a waiter waits; call Close to stop them. Its first acquire checks the
// server's version and fails with ErrUnsupported below MinRedisVersion.
//
// A released lock's holders key is kept for the client's retry window,
// (MaxRetries+1) × (ReadTimeout + MaxRetryBackoff) (a ClusterClient:
// (MaxRedirects+1) × (MaxRetries+1) attempts), between a second and a
// minute: 14s with go-redis v9.17's defaults, 24s with v9.23's; so that a
// release that go-redis sends again reports the same.
func NewRedis(client redis.UniversalClient, opts ...Option) (*RedisLocker, error) {
	cfg, err := clientConfig("NewRedis", client, opts)
	if err != nil {
		return nil, err
	}
	b := &redisBackend{c: client, prefix: escapeKey(cfg.prefix), grace: retryWindow(client), subs: make(map[string]*subscribers)}
	return &RedisLocker{e: newEngine(cfg, b), r: b}, nil
}

// clientConfig is the config of opts for op on client: it refuses a nil
// client, also a typed nil, and an invalid option.
func clientConfig(op string, client redis.UniversalClient, opts []Option) (config, error) {
	if client == nil {
		return config{}, fmt.Errorf("%w: %s: client is nil", ErrInvalid, op)
	}
	if v := reflect.ValueOf(client); v.Kind() == reflect.Pointer && v.IsNil() {
		return config{}, fmt.Errorf("%w: %s: client is a nil %T", ErrInvalid, op, client)
	}
	return newConfig(opts)
}

// retryWindow is how long after a command's first run go-redis may run it
// again: every attempt waits for a read timeout and a backoff. A Client and
// a Ring make 1 + MaxRetries attempts; a ClusterClient makes 1 +
// MaxRedirects (default 3) attempts, on a node whose client makes 1 +
// MaxRetries each (MaxRetries defaults to none for a cluster).
func retryWindow(client redis.UniversalClient) time.Duration {
	attempts, read, backoff := 4, 3*time.Second, 512*time.Millisecond
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		attempts, read, backoff = max(o.MaxRetries, 0)+1, o.ReadTimeout, o.MaxRetryBackoff
	case *redis.ClusterClient:
		o := c.Options()
		attempts, read, backoff = (max(o.MaxRedirects, 0)+1)*(max(o.MaxRetries, 0)+1), o.ReadTimeout, o.MaxRetryBackoff
	case *redis.Ring:
		o := c.Options()
		attempts, read, backoff = max(o.MaxRetries, 0)+1, o.ReadTimeout, o.MaxRetryBackoff
	}
	if read <= 0 {
		read = 3 * time.Second
	}
	w := time.Duration(attempts) * (read + max(backoff, 0))
	return min(max(w, time.Second), time.Minute)
}

// Owner returns the owner id recorded with this Locker's leases.
func (l *RedisLocker) Owner() string { return l.e.cfg.owner }

// TryAcquire implements Locker.
func (l *RedisLocker) TryAcquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return l.e.tryAcquire(ctx, key, opt)
}

// Acquire implements Locker.
func (l *RedisLocker) Acquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return l.e.acquireWait(ctx, key, opt)
}

// Inspect implements Locker.
func (l *RedisLocker) Inspect(ctx context.Context, key string) (*Info, error) {
	return l.e.inspect(ctx, key)
}

// ForceRelease implements Locker.
func (l *RedisLocker) ForceRelease(ctx context.Context, key string, which Select) (int, error) {
	return l.e.forceRelease(ctx, key, which)
}

// CancelRun implements Locker.
func (l *RedisLocker) CancelRun(ctx context.Context, key string, which Select) (int, error) {
	return l.e.cancelRun(ctx, key, which)
}

// Redis returns the client the Locker was built on and its key prefix
// (WithPrefix; DefaultPrefix without it), for what keeps its own state
// beside the Locker's leases on the same Redis and prefix: a
// throttle.Throttle or a debounce.Debouncer built with them shares the
// budgets and requests of every process on that Redis and prefix.
func (l *RedisLocker) Redis() (client redis.UniversalClient, prefix string) {
	return l.r.c, l.e.cfg.prefix
}

// Held returns how many leases the Locker holds and renews now (not
// reservations, which nothing renews).
func (l *RedisLocker) Held() int { return l.e.held() }

// Logger returns the logger set with WithLogger (slog.Default() without
// it). The layers above lockkit log through it, when the Locker they are
// given is a *RedisLocker, unless they are given their own.
func (l *RedisLocker) Logger() *slog.Logger { return l.e.cfg.logger }

// Close implements Locker. It does not close the Redis client.
func (l *RedisLocker) Close(ctx context.Context) error { return l.e.close(ctx) }

// Keys implements Locker. It uses SCAN on every master, never KEYS, then
// checks each key's holders; a key may be missed or reported after it was
// released, as SCAN guarantees. It walks the whole keyspace: ScanKeys reads
// one bounded page.
func (l *RedisLocker) Keys(ctx context.Context, pattern string) ([]string, error) {
	match := globEscape(l.r.prefix) + "{" + serverGlob(pattern) + "}:h"
	var (
		mu  sync.Mutex
		out []string
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var found []string
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			found = append(found, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return err
		}
		live, err := l.r.liveKeys(ctx, c, l.matching(found, pattern))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		out = append(out, live...)
		return nil
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
	sort.Strings(out)
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
