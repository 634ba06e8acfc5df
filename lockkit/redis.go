package lockkit

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// Locker hands out leases on keys, backed by Redis: it is shared by every
// process that uses the same Redis and prefix (or by the goroutines of one
// process, on an embedded Redis: package lockkit/inprocess). All keys of one lock share a {hash tag}, so it
// works on Redis Cluster as well as standalone and Sentinel deployments.
// Every call is safe to run twice, as go-redis does when a reply is late: a
// repeated acquire returns the lease its first run took, a repeated release
// reports the same success.
type Locker struct {
	core *lockcore.RedisLocker
}

// NewRedis returns a Locker using client, which it does not close. It
// returns an error matching ErrInvalid for a nil client (also a typed nil) or
// an invalid option. The Locker starts no goroutine until a lease is acquired
// or a waiter waits; call Close to stop them. Its first acquire checks the
// server's version and fails with ErrUnsupported below Redis 6.2.
//
// A released lock's state is kept for the client's retry window,
// (MaxRetries+1) × (ReadTimeout + MaxRetryBackoff), between a second and a
// minute, so that a release that go-redis sends again reports the same.
func NewRedis(client redis.UniversalClient, opts ...Option) (*Locker, error) {
	core := make([]lockcore.Option, len(opts))
	for i, o := range opts {
		core[i] = o.o
	}
	l, err := lockcore.NewRedis(client, core...)
	if err != nil {
		return nil, err
	}
	return &Locker{core: l}, nil
}

// TryAcquire makes one attempt. It returns a held lease, or an error that
// matches ErrNotAcquired (a *ConflictError), ErrInvalid, ErrClosed, or a
// Redis error.
func (l *Locker) TryAcquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return lease(l.core.TryAcquire(ctx, key, opt.core()))
}

// Acquire waits until the key can be acquired or ctx ends. Waiters are woken
// when a holder releases. When ctx ends first the error wraps ctx.Err() and
// the last *ConflictError.
func (l *Locker) Acquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return lease(l.core.Acquire(ctx, key, opt.core()))
}

func lease(c *lockcore.Lease, err error) (*Lease, error) {
	if err != nil {
		return nil, err
	}
	return &Lease{c: c}, nil
}

// Inspect reports the live holders and waiters of key.
func (l *Locker) Inspect(ctx context.Context, key string) (*Info, error) {
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

// Keys returns, sorted, the keys that have a live holder and match
// pattern in Redis glob syntax ('*' matches any run of characters, '/'
// included; '?' one character; "[a-z]", "[^a]" a class; '\' escapes).
// It uses SCAN on every master, never KEYS.
func (l *Locker) Keys(ctx context.Context, pattern string) ([]string, error) {
	return l.core.Keys(ctx, pattern)
}

// ForceRelease removes the live holders of key that which selects,
// whoever holds them, and wakes waiters: an operator's release of a
// stuck key. It returns how many holders were removed (a repeated call,
// as after a lost reply, returns the first run's count), ErrInvalid for
// an empty key or an invalid Select, and ErrNotHeld (naming the key's
// holders now) when which names a Token whose holder no longer holds
// the key. A removed holder can no longer be renewed, and every later
// acquire of the key gets a greater fencing token; its work's ctx is
// cancelled with a cause matching ErrLost within milliseconds (or at
// its next renewal when its Locker missed the notice). The key is free
// at once, while the removed holder's work may still run: to stop a
// run without that, use CancelRun.
func (l *Locker) ForceRelease(ctx context.Context, key string, which Select) (int, error) {
	return l.core.ForceRelease(ctx, key, lockcore.Select{Owner: which.Owner, Token: which.Token})
}

// CancelRun asks the runs holding key that which selects to stop,
// whoever holds them, and never lets two runs of the key overlap: the
// contexts of each selected lease are cancelled with a cause matching
// ErrCancelled (not ErrLost), within milliseconds or at its next
// renewal; the lease stays held and renewed until its run returns and
// releases it. Inspect shows the request (Holder.Cancelling) until
// then, for a day at most. It returns how many runs were selected (a
// repeated call returns the same), ErrInvalid for an empty key or an
// invalid Select, and ErrNotHeld when which names a Token that no run
// holds.
func (l *Locker) CancelRun(ctx context.Context, key string, which Select) (int, error) {
	return l.core.CancelRun(ctx, key, lockcore.Select{Owner: which.Owner, Token: which.Token})
}

// Held returns how many leases the Locker holds and renews now (for a
// gauge such as jobguardprom's).
func (l *Locker) Held() int { return l.core.Held() }

// Close stops renewal and releases every lease the Locker still holds.
// A release that fails (Redis unreachable) leaves its leases to expire
// with their TTL; Close still sends the others until ctx ends, and
// returns the failures joined.
// It does not close the Redis client.
func (l *Locker) Close(ctx context.Context) error { return l.core.Close(ctx) }

// Option configures a Locker.
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

// WithReplicaAcks makes every write that creates, renews or hands on a
// lease, and every release that records a run's completion, wait until n
// replicas of the master that took it have acknowledged it (Redis WAIT on
// the write's connection), for at most timeout. A write that fewer replicas
// acknowledged in time counts as not done: an acquire gives the key back
// and fails with an error matching ErrNotReplicated (so does Reserve), a
// renewal counts as failed (the lease is lost if none succeeds before it
// runs out), an Extend fails, and a release that recorded a completion
// returns the error (the release itself happened). A lease so made
// survives a failover that promotes one of those replicas; it does not
// survive a failover that promotes a replica that did not acknowledge it
// (more replicas than n, or a failover within the wait), nor both sides of a
// partition that each elect a master. Every such write costs the wait for
// the slowest of the n replicas, in the write's own round trip.
//
// n 0 turns it off. n must be at most 100, timeout at least a millisecond and
// shorter than the client's ReadTimeout (WAIT blocks the connection). It
// needs a *redis.Client (also one made by redis.NewFailoverClient for
// Sentinel) or a *redis.ClusterClient; a Ring is refused with ErrInvalid.
// Defaults to 0: a standalone Redis has no replicas to wait for.
func WithReplicaAcks(n int, timeout time.Duration) Option {
	return Option{lockcore.WithReplicaAcks(n, timeout)}
}

// WithBatching makes the Redis calls that the Locker's goroutines have in
// flight at the same moment share their round trips: a call (an acquire, a
// release, an Extend, a renewal, Inspect, ForceRelease, CancelRun) that
// finds no other call of the Locker in flight to its server is sent at once,
// alone, as without the option; calls that come while one is in flight wait
// for it and then go together, in one pipeline (one per Cluster master, so a
// slow master holds up only its own calls). No timer delays a call. Each
// call keeps its own reply and error, and with WithReplicaAcks its own
// acknowledgement (one WAIT ends the pipeline). A waiting call whose ctx
// ends is never sent and returns ctx's error; one that waited about eight
// round trips (5ms to 250ms) for a stuck call is sent alone. It adds no
// error of its own.
//
// It helps a Locker that many goroutines use at once (lockkit used
// directly, with tens of goroutines on one Locker): it cuts Redis CPU per
// call and raises calls per second. It does not help asynq workers, whose
// server dequeues one task at a time, so that few of their calls meet.
// Defaults to off.
func WithBatching() Option { return Option{lockcore.WithBatching()} }

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
