package lockcore

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// Option configures a RedisLocker.
type Option func(*config)

type config struct {
	prefix     string
	owner      string
	ttl        time.Duration
	poll       time.Duration
	renewBatch int
	logger     *slog.Logger
	observer   func(Event)
	acks       replicaAcks
	batching   bool
}

// replicaAcks is how many replicas must acknowledge a lease write before it
// counts, and how long the write waits for them (WithReplicaAcks); n 0: the
// writes wait for none.
type replicaAcks struct {
	n       int
	timeout time.Duration
}

// WithPrefix sets the prefix of every Redis key and channel the Locker uses.
// Defaults to DefaultPrefix ("jobguard:").
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithOwner sets the owner id recorded with every lease, shown by Inspect and in
// ConflictError. It must not be empty. Defaults to "hostname:pid:random".
func WithOwner(id string) Option { return func(c *config) { c.owner = id } }

// WithTTL sets the TTL of leases whose AcquireOptions.TTL is zero. Must be at least
// MinTTL and at most MaxTTL. Defaults to DefaultTTL (30s).
func WithTTL(ttl time.Duration) Option { return func(c *config) { c.ttl = ttl } }

// WithPollInterval bounds how long a waiter sleeps when no release notification
// arrives. Release notifications wake waiters at once; this only covers missed
// notifications. Must be positive. Defaults to DefaultPollInterval (250ms).
func WithPollInterval(d time.Duration) Option { return func(c *config) { c.poll = d } }

// WithRenewBatch sets how many renewals are pipelined in one round trip. Must be
// positive. Defaults to DefaultRenewBatch (1000).
func WithRenewBatch(n int) Option { return func(c *config) { c.renewBatch = n } }

// WithLogger sets the logger of the Locker and of everything built on it:
// lost leases and failed renewals at Warn, other transitions at Debug; the
// middleware, singleton and cronguard adapters log their jobs through it
// too. A nil logger means slog.Default(). Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithObserver sets a function called synchronously for every lease event. It
// must be fast and must not call back into the Locker. Defaults to none.
func WithObserver(fn func(Event)) Option { return func(c *config) { c.observer = fn } }

// WithReplicaAcks: see lockkit.WithReplicaAcks.
func WithReplicaAcks(n int, timeout time.Duration) Option {
	return func(c *config) { c.acks = replicaAcks{n: n, timeout: timeout} }
}

// WithBatching: see lockkit.WithBatching.
func WithBatching() Option { return func(c *config) { c.batching = true } }

func newConfig(opts []Option) (config, error) {
	c := config{
		prefix:     DefaultPrefix,
		ttl:        DefaultTTL,
		poll:       DefaultPollInterval,
		renewBatch: DefaultRenewBatch,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.owner == "" {
		c.owner = defaultOwner()
	}
	switch {
	case c.ttl < MinTTL || c.ttl > MaxTTL:
		return c, fmt.Errorf("%w: WithTTL(%s): must be at least %s and at most %s", ErrInvalid, c.ttl, MinTTL, MaxTTL)
	case c.poll <= 0 || c.poll > MaxTTL/4:
		return c, fmt.Errorf("%w: WithPollInterval(%s): must be positive and at most %s", ErrInvalid, c.poll, MaxTTL/4)
	case c.renewBatch <= 0:
		return c, fmt.Errorf("%w: WithRenewBatch(%d): must be positive", ErrInvalid, c.renewBatch)
	case c.acks.n < 0 || c.acks.n > 100:
		return c, fmt.Errorf("%w: WithReplicaAcks(%d, %s): n must be between 0 and 100", ErrInvalid, c.acks.n, c.acks.timeout)
	case c.acks.n > 0 && c.acks.timeout < time.Millisecond:
		return c, fmt.Errorf("%w: WithReplicaAcks(%d, %s): the timeout must be at least 1ms", ErrInvalid, c.acks.n, c.acks.timeout)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c, nil
}

// defaultOwner returns "hostname:pid:random", the owner id used when WithOwner
// is not given. Each call returns a different id.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), randomID(4))
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}
