package lockkit

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

// request is a validated acquire with every default filled in.
type request struct {
	key   string
	owner string
	// aid identifies one acquire call: a repeated script of the same call
	// returns the lease the first run took instead of a conflict with it.
	aid      string
	label    string
	ttl      time.Duration
	interval time.Duration // 0 when renewal is off
	limit    int
	fair     bool
	epoch    int64
	epochTTL time.Duration
	// waiter is set when the caller waits: it registers in the key's waiter set.
	waiter    string
	waiterTTL time.Duration
	// coalesce: since is when the call's first attempt reached the store
	// (server microseconds), -1 before it did.
	coalesce bool
	final    bool // a Coalesce call that covers no other (its acquire id starts with "z")
	since    int64
	coverFor time.Duration
	detached bool
	adopt    bool
	hold     time.Duration
	// supersede: "1" on a Supersede Acquire's first attempt, "2" after.
	supersede string
	// preempt: "1" on a Preempt Acquire's first attempt, "2" after, "0" off.
	preempt string
	order   int64 // AcquireOptions.Order
	async   bool  // AcquireOptions.AsyncRelease
	grace   time.Duration
	// park is AcquireOptions.Park, parkHold its ParkHold, onParked its
	// OnParked.
	park     string
	parkHold time.Duration
	onParked func(id string)
}

func (c *config) request(key string, o *AcquireOptions) (request, error) {
	if o == nil {
		o = &AcquireOptions{}
	}
	r := request{key: key, owner: c.owner, label: o.Label, ttl: o.TTL, limit: o.Limit, fair: o.Fair, epoch: o.Epoch, epochTTL: o.EpochTTL,
		coalesce: o.Coalesce, since: -1, coverFor: o.CoverFor, detached: o.Detached}
	if key == "" {
		return r, fmt.Errorf("%w: key is empty", ErrInvalid)
	}
	if r.ttl == 0 {
		r.ttl = c.ttl
	}
	if r.ttl < MinTTL {
		return r, fmt.Errorf("%w: key %q: TTL %s is shorter than MinTTL (%s)", ErrInvalid, key, r.ttl, MinTTL)
	}
	if r.ttl > MaxTTL {
		return r, fmt.Errorf("%w: key %q: TTL %s is longer than MaxTTL (%s)", ErrInvalid, key, r.ttl, MaxTTL)
	}
	if !o.NoRenew && !o.Detached {
		r.interval = o.RenewInterval
		if r.interval == 0 {
			r.interval = r.ttl / 3
		}
		if r.interval < 0 || r.interval >= r.ttl {
			return r, fmt.Errorf("%w: key %q: RenewInterval %s must be positive and shorter than TTL %s", ErrInvalid, key, o.RenewInterval, r.ttl)
		}
	}
	if r.limit == 0 {
		r.limit = 1
	}
	if r.limit < 1 {
		return r, fmt.Errorf("%w: key %q: Limit %d must be at least 1", ErrInvalid, key, o.Limit)
	}
	if r.epoch < 0 {
		return r, fmt.Errorf("%w: key %q: Epoch %d must not be negative", ErrInvalid, key, r.epoch)
	}
	if r.epochTTL < 0 || r.epochTTL > MaxTTL {
		return r, fmt.Errorf("%w: key %q: EpochTTL %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, r.epochTTL, MaxTTL)
	}
	if r.epochTTL == 0 {
		r.epochTTL = r.ttl
	}
	if !o.Since.IsZero() {
		if o.Since.UnixMicro() <= 0 {
			return r, fmt.Errorf("%w: key %q: Since %s is not after 1970", ErrInvalid, key, o.Since.Format(time.RFC3339Nano))
		}
		r.since = o.Since.UnixMicro()
	}
	if r.coverFor < 0 || r.coverFor > MaxTTL {
		return r, fmt.Errorf("%w: key %q: CoverFor %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, r.coverFor, MaxTTL)
	}
	if r.coverFor == 0 {
		r.coverFor = DefaultCoverFor
	}
	if o.Final && !r.coalesce {
		return r, fmt.Errorf("%w: key %q: Final needs Coalesce", ErrInvalid, key)
	}
	if r.coalesce && (r.fair || r.limit > 1) {
		return r, fmt.Errorf("%w: key %q: Coalesce works with one holder and no Fair queue", ErrInvalid, key)
	}
	r.waiterTTL = 4 * c.poll
	r.aid = randomID(8)
	if r.detached {
		r.aid = "r" + r.aid // marks a reservation, which Adopt may replace
	} else if o.Final && r.coalesce {
		r.final = true
		r.aid = "z" + r.aid // marks a final Coalesce call, which covers no other
	}
	if o.Adopt && r.label == "" {
		return r, fmt.Errorf("%w: key %q: Adopt needs a Label", ErrInvalid, key)
	}
	if o.Adopt && r.detached {
		return r, fmt.Errorf("%w: key %q: Adopt and Detached exclude each other", ErrInvalid, key)
	}
	r.adopt = o.Adopt
	if o.HoldAtLeast < 0 || o.HoldAtLeast > MaxTTL {
		return r, fmt.Errorf("%w: key %q: HoldAtLeast %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, o.HoldAtLeast, MaxTTL)
	}
	r.hold = o.HoldAtLeast
	r.supersede = "0"
	if o.Supersede {
		r.supersede = "1"
	}
	r.preempt = "0"
	if o.Preempt {
		r.preempt = "1"
		if r.limit > 1 || r.fair || r.coalesce {
			return r, fmt.Errorf("%w: key %q: Preempt works with one holder, no Fair queue and no Coalesce", ErrInvalid, key)
		}
	}
	if o.PreemptGrace < 0 || o.PreemptGrace > MaxTTL {
		return r, fmt.Errorf("%w: key %q: PreemptGrace %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, o.PreemptGrace, MaxTTL)
	}
	r.grace = o.PreemptGrace
	if o.Order < 0 {
		return r, fmt.Errorf("%w: key %q: Order %d must not be negative", ErrInvalid, key, o.Order)
	}
	if o.Supersede {
		r.order = o.Order
	}
	r.async = o.AsyncRelease
	r.park, r.parkHold, r.onParked = o.Park, o.ParkHold, o.OnParked
	if r.park != "" && (r.label == "" || r.limit > 1) {
		return r, fmt.Errorf("%w: key %q: Park needs a Label and Limit 1", ErrInvalid, key)
	}
	if r.parkHold < 0 || r.parkHold > MaxTTL {
		return r, fmt.Errorf("%w: key %q: ParkHold %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, r.parkHold, MaxTTL)
	}
	if r.parkHold == 0 {
		r.parkHold = DefaultParkHold
	}
	return r, nil
}
