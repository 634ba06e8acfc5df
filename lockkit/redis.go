package lockkit

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// RedisLocker is a Locker backed by Redis, shared by every process that uses
// the same Redis and prefix. All keys of one lock share a {hash tag}, so it
// works on Redis Cluster as well as standalone and Sentinel deployments.
// Every call is safe to run twice, as go-redis does when a reply is late: a
// repeated acquire returns the lease its first run took, a repeated release
// reports the same success.
type RedisLocker struct {
	core *lockcore.RedisLocker
}

var _ Locker = (*RedisLocker)(nil)

// NewRedis returns a RedisLocker using client, which it does not close. It
// returns an error matching ErrInvalid for a nil client (also a typed nil) or
// an invalid option. The Locker starts no goroutine until a lease is acquired
// or a waiter waits; call Close to stop them. Its first acquire checks the
// server's version and fails with ErrUnsupported below Redis 6.2.
//
// A released lock's state is kept for the client's retry window,
// (MaxRetries+1) × (ReadTimeout + MaxRetryBackoff), between a second and a
// minute, so that a release that go-redis sends again reports the same.
func NewRedis(client redis.UniversalClient, opts ...Option) (*RedisLocker, error) {
	core := make([]lockcore.Option, len(opts))
	for i, o := range opts {
		core[i] = o.o
	}
	l, err := lockcore.NewRedis(client, core...)
	if err != nil {
		return nil, err
	}
	return &RedisLocker{core: l}, nil
}

// TryAcquire implements Locker.
func (l *RedisLocker) TryAcquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return lease(l.core.TryAcquire(ctx, key, opt.core()))
}

// Acquire implements Locker.
func (l *RedisLocker) Acquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return lease(l.core.Acquire(ctx, key, opt.core()))
}

func lease(c *lockcore.Lease, err error) (*Lease, error) {
	if err != nil {
		return nil, err
	}
	return &Lease{c: c}, nil
}

// Inspect implements Locker.
func (l *RedisLocker) Inspect(ctx context.Context, key string) (*Info, error) {
	in, err := l.core.Inspect(ctx, key)
	if err != nil {
		return nil, err
	}
	info := &Info{Key: in.Key, Waiters: in.Waiters, Holders: make([]Holder, len(in.Holders))}
	for i, h := range in.Holders {
		info.Holders[i] = Holder{Owner: h.Owner, Token: h.Token, TTL: h.TTL, Label: h.Label,
			Reserved: h.Reserved, Cancelling: h.Cancelling, CancelAge: h.CancelAge}
	}
	return info, nil
}

// Keys implements Locker. It uses SCAN on every master, never KEYS.
func (l *RedisLocker) Keys(ctx context.Context, pattern string) ([]string, error) {
	return l.core.Keys(ctx, pattern)
}

// ForceRelease implements Locker.
func (l *RedisLocker) ForceRelease(ctx context.Context, key string, which Select) (int, error) {
	return l.core.ForceRelease(ctx, key, lockcore.Select{Owner: which.Owner, Token: which.Token})
}

// CancelRun implements Locker.
func (l *RedisLocker) CancelRun(ctx context.Context, key string, which Select) (int, error) {
	return l.core.CancelRun(ctx, key, lockcore.Select{Owner: which.Owner, Token: which.Token})
}

// Held returns how many leases the Locker holds and renews now (for a
// gauge such as jobguardprom's).
func (l *RedisLocker) Held() int { return l.core.Held() }

// Close implements Locker. It does not close the Redis client.
func (l *RedisLocker) Close(ctx context.Context) error { return l.core.Close(ctx) }

// Option configures a RedisLocker.
type Option struct{ o lockcore.Option }

// WithPrefix sets the prefix of every Redis key and channel the Locker uses.
// Defaults to "jobguard:".
func WithPrefix(prefix string) Option { return Option{lockcore.WithPrefix(prefix)} }

// WithOwner sets the owner id recorded with every lease, shown by Inspect and in
// ConflictError. It must not be empty. Defaults to "hostname:pid:random".
func WithOwner(id string) Option { return Option{lockcore.WithOwner(id)} }

// WithTTL sets the TTL of leases whose AcquireOptions.TTL is zero. Must be
// between 100ms and 100 years. Defaults to 30s.
func WithTTL(ttl time.Duration) Option { return Option{lockcore.WithTTL(ttl)} }

// WithPollInterval bounds how long a waiter sleeps when no release notification
// arrives. Release notifications wake waiters at once; this only covers missed
// notifications. Must be positive. Defaults to 250ms.
func WithPollInterval(d time.Duration) Option { return Option{lockcore.WithPollInterval(d)} }

// WithRenewBatch sets how many renewals are pipelined in one round trip. Must be
// positive. Defaults to 1000.
func WithRenewBatch(n int) Option { return Option{lockcore.WithRenewBatch(n)} }

// WithLogger sets the logger of the Locker and of everything built on it:
// lost leases and failed renewals at Warn, other transitions at Debug; the
// middleware, singleton and cronguard adapters log their jobs through it
// too. A nil logger means slog.Default(). Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option { return Option{lockcore.WithLogger(l)} }

// WithObserver sets a function called synchronously for every lease event. It
// must be fast and must not call back into the Locker. Defaults to none.
func WithObserver(fn func(Event)) Option { return Option{lockcore.WithObserver(fn)} }

// Event is reported to the observer (WithObserver) for every lease
// transition: its Kind; the lease's Key, Owner and Token; Wait, how long
// Acquire waited (LeaseAcquired only); Err, the failure (LeaseRenewFailed,
// LeaseLost and LeaseContended).
type Event = lockcore.Event

// EventKind names what happened to a lease; String returns it in snake
// case, such as "renew_failed".
type EventKind = lockcore.EventKind

// Event kinds reported to the observer set with WithObserver.
const (
	LeaseAcquired    = lockcore.LeaseAcquired    // a lease was acquired (Event.Wait tells how long it waited)
	LeaseContended   = lockcore.LeaseContended   // an acquire found the key held
	LeaseReleased    = lockcore.LeaseReleased    // a lease was released by its holder
	LeaseRenewed     = lockcore.LeaseRenewed     // a lease was renewed
	LeaseRenewFailed = lockcore.LeaseRenewFailed // a renewal failed but the lease is still valid (Event.Err)
	LeaseLost        = lockcore.LeaseLost        // a lease was lost (Event.Err wraps ErrLost)
)
