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
	epochTag string
	// waiter is set when the caller waits: it registers in the key's waiter set.
	waiter    string
	waiterTTL time.Duration
	// mode is the FollowUp's mode, modeNone without one.
	mode followUpMode
	// later: the call's first attempt reached the store (the later attempts
	// of a waiting call). On its first, a KeepNewest or Preempt call takes
	// the key's follow-up place and a Preempt call preempts the holders.
	later bool
	// behindOwnRun: a KeepNewest or Preempt call whose own earlier delivery
	// holds the key waits for it as a plain call: it is no follow-up.
	behindOwnRun bool
	// final: a Coalesce call that covers no other (modeFinal); its acquire
	// id starts with finalMark, which marks its holder for the Coalesce
	// calls that find it (acquire_coalesce.lua)
	final bool
	// since is when a Coalesce call's first attempt reached the store
	// (server microseconds), -1 before it did.
	since    int64
	coverFor time.Duration
	// reserved: the holder is a reservation from the start
	// (AcquireOptions.Reserve); takeReserved: it replaces a live
	// reservation carrying its label (AcquireOptions.TakeReservation).
	reserved     bool
	takeReserved bool
	hold         time.Duration
	order        int64 // the Order of a KeepNewest or Preempt FollowUp
	async        bool  // AcquireOptions.AsyncRelease
	grace        time.Duration
	// park, parkHold and onParked are AcquireOptions.Park's ID, Hold
	// (DefaultParkHold when zero) and OnParked.
	park     string
	parkHold time.Duration
	onParked func(key, id string)
}

func (c *config) request(key string, o *AcquireOptions) (request, error) {
	if o == nil {
		o = &AcquireOptions{}
	}
	r := request{key: key, owner: c.owner, label: o.Label, ttl: o.TTL, limit: o.Limit, fair: o.Fair, epoch: o.Epoch, epochTTL: o.EpochTTL, epochTag: o.EpochTag,
		since: -1, coverFor: DefaultCoverFor, reserved: o.Reserve}
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
	if !o.NoRenew && !o.Reserve {
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
	if r.epochTag != "" && r.epoch == 0 {
		return r, fmt.Errorf("%w: key %q: EpochTag %q needs an Epoch", ErrInvalid, key, r.epochTag)
	}
	if len(r.epochTag) > MaxEpochTag {
		return r, fmt.Errorf("%w: key %q: EpochTag is %d bytes, longer than MaxEpochTag (%d)", ErrInvalid, key, len(r.epochTag), MaxEpochTag)
	}
	if err := r.followUp(o.FollowUp); err != nil {
		return r, err
	}
	r.waiterTTL = 4 * c.poll
	r.aid = randomID(8)
	if r.reserved {
		r.aid = reservedMark + r.aid // a reservation, which TakeReservation may replace
		r.final = false              // a reservation's holder is not marked final
	} else if r.final {
		r.aid = finalMark + r.aid // the holder of a final Coalesce call, which covers no other
	}
	if o.TakeReservation && r.label == "" {
		return r, fmt.Errorf("%w: key %q: TakeReservation needs a Label", ErrInvalid, key)
	}
	if o.TakeReservation && r.reserved {
		return r, fmt.Errorf("%w: key %q: TakeReservation and Reserve exclude each other", ErrInvalid, key)
	}
	r.takeReserved = o.TakeReservation
	if o.HoldAtLeast < 0 || o.HoldAtLeast > MaxTTL {
		return r, fmt.Errorf("%w: key %q: HoldAtLeast %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, o.HoldAtLeast, MaxTTL)
	}
	r.hold = o.HoldAtLeast
	r.async = o.AsyncRelease
	r.parkHold = DefaultParkHold
	if p := o.Park; p != nil {
		r.park, r.onParked = p.ID, p.OnParked
		if r.park != "" && (r.label == "" || r.limit > 1) {
			return r, fmt.Errorf("%w: key %q: Park.ID %q needs a Label and Limit 1 (Label %q, Limit %d)", ErrInvalid, key, r.park, r.label, r.limit)
		}
		if p.Hold < 0 || p.Hold > MaxTTL {
			return r, fmt.Errorf("%w: key %q: Park.Hold %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, key, p.Hold, MaxTTL)
		}
		if p.Hold > 0 {
			r.parkHold = p.Hold
		}
	}
	return r, nil
}

// followUp fills r's follow-up fields from f, an AcquireOptions.FollowUp,
// after r's limit and fair are set. A pointer to one of the three types
// stands for its value.
func (r *request) followUp(f FollowUp) error {
	switch p := f.(type) {
	case *Coalesce:
		if p == nil {
			return fmt.Errorf("%w: key %q: FollowUp is a nil *lockcore.Coalesce", ErrInvalid, r.key)
		}
		f = *p
	case *KeepNewest:
		if p == nil {
			return fmt.Errorf("%w: key %q: FollowUp is a nil *lockcore.KeepNewest", ErrInvalid, r.key)
		}
		f = *p
	case *Preempt:
		if p == nil {
			return fmt.Errorf("%w: key %q: FollowUp is a nil *lockcore.Preempt", ErrInvalid, r.key)
		}
		f = *p
	}
	switch f := f.(type) {
	case nil:
		return nil
	case Coalesce:
		if err := r.oneHolder("Coalesce"); err != nil {
			return err
		}
		if !f.Since.IsZero() {
			if f.Since.UnixMicro() <= 0 {
				return fmt.Errorf("%w: key %q: Coalesce.Since %s is not after 1970", ErrInvalid, r.key, f.Since.Format(time.RFC3339Nano))
			}
			r.since = f.Since.UnixMicro()
		}
		if f.CoverFor < 0 || f.CoverFor > MaxTTL {
			return fmt.Errorf("%w: key %q: Coalesce.CoverFor %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, r.key, f.CoverFor, MaxTTL)
		}
		if f.CoverFor > 0 {
			r.coverFor = f.CoverFor
		}
		r.mode, r.final = modeCoalesce, f.Final
		return nil
	case KeepNewest:
		return r.keepNewest("KeepNewest", f.Order)
	case Preempt:
		if err := r.oneHolder("Preempt"); err != nil {
			return err
		}
		if f.Grace < 0 || f.Grace > MaxTTL {
			return fmt.Errorf("%w: key %q: Preempt.Grace %s must not be negative nor longer than MaxTTL (%s)", ErrInvalid, r.key, f.Grace, MaxTTL)
		}
		r.grace = f.Grace
		if err := r.keepNewest("Preempt", f.Order); err != nil {
			return err
		}
		r.mode = modePreempt
		return nil
	}
	return fmt.Errorf("%w: key %q: FollowUp %T is not a Coalesce, KeepNewest or Preempt value", ErrInvalid, r.key, f)
}

// oneHolder checks that r, with the follow-up named mode, has a Limit of 1
// and no Fair.
func (r *request) oneHolder(mode string) error {
	if r.limit > 1 || r.fair {
		return fmt.Errorf("%w: key %q: %s works with one holder and no Fair queue (Limit %d, Fair %t)", ErrInvalid, r.key, mode, r.limit, r.fair)
	}
	return nil
}

// keepNewest makes r the key's pending follow-up with order, the Order of
// the follow-up named mode.
func (r *request) keepNewest(mode string, order int64) error {
	if order < 0 {
		return fmt.Errorf("%w: key %q: %s.Order %d must not be negative", ErrInvalid, r.key, mode, order)
	}
	r.mode, r.order = modeKeepNewest, order
	return nil
}
