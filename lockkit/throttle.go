package lockkit

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"
)

// Throttle keeps, per key, a budget of starts shared by every process that
// uses the same Redis and prefix: at most n starts in any window of one
// period (a sliding log of the starts, throttle.lua). It is apart from
// leases, and not atomic with them: the same name may be a throttle key and
// a lease key. Every call is one script, safe to run twice as go-redis does
// after a lost reply: a start or reservation is logged under its id, so a
// repeat takes nothing more. A Throttle holds no goroutine and needs no
// closing.
type Throttle struct {
	c      redis.UniversalClient
	prefix string // escaped
	n      int
	period time.Duration
}

// NewThrottle returns a Throttle of n starts per period on client, which it
// does not close. Of opts only WithPrefix applies (Defaults to
// DefaultPrefix); the others are checked as NewRedis does and otherwise
// ignored, so that a Locker's options can be passed as they are. It returns
// an error matching ErrInvalid for a nil client, n below 1, a period shorter
// than a millisecond or longer than MaxTTL, or an invalid option.
func NewThrottle(client redis.UniversalClient, n int, period time.Duration, opts ...Option) (*Throttle, error) {
	cfg, err := clientConfig("NewThrottle", client, opts)
	if err != nil {
		return nil, err
	}
	return newThrottle(client, escapeKey(cfg.prefix), n, period)
}

func newThrottle(client redis.UniversalClient, prefix string, n int, period time.Duration) (*Throttle, error) {
	switch {
	case n < 1:
		return nil, fmt.Errorf("%w: NewThrottle: n %d must be at least 1", ErrInvalid, n)
	case period < time.Millisecond || period > MaxTTL:
		return nil, fmt.Errorf("%w: NewThrottle: period %s must be between 1ms and %s", ErrInvalid, period, MaxTTL)
	}
	return &Throttle{c: client, prefix: prefix, n: n, period: period}, nil
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

// Take takes one start from key's budget. It returns zero when the start
// is allowed, or how long until one would be. It returns ErrInvalid for an
// empty key, and a Redis error wrapped.
func (t *Throttle) Take(ctx context.Context, key string) (time.Duration, error) {
	return t.call(ctx, "Take", key, randomID(8), false)
}

// Start is Take for a start named by id (unique to one start, such as one
// delivery of a task): a repeat with the same id, as after a lost reply,
// takes no second start, and Return gives it back. A start that Reserve
// reserved for id is taken without counting again, dated now, whatever the
// budget. Errors are those of Take, and ErrInvalid for an empty id.
func (t *Throttle) Start(ctx context.Context, key, id string) (time.Duration, error) {
	if id == "" {
		return 0, fmt.Errorf("%w: Throttle.Start(%q): id is empty", ErrInvalid, key)
	}
	return t.call(ctx, "Start", key, id, false)
}

// Reserve reserves a start of key's budget for id, for work about to
// begin: the reservation counts against the budget until Start takes it
// when the work begins (dating the start then), Return gives it back, or
// one period after it was made (a process that died holding it). It
// returns zero when the start is reserved (a repeat with the same id
// reserves nothing more), or how long until a start would be allowed.
// Errors are those of Start.
func (t *Throttle) Reserve(ctx context.Context, key, id string) (time.Duration, error) {
	if id == "" {
		return 0, fmt.Errorf("%w: Throttle.Reserve(%q): id is empty", ErrInvalid, key)
	}
	return t.call(ctx, "Reserve", key, id, true)
}

// Next tells how long until fewer than n starts of key began in the last
// period (zero: now), and takes none. Reserved starts are not counted, as
// their work may not begin, so a start may still be refused while
// reservations fill the budget. Errors are those of Take.
func (t *Throttle) Next(ctx context.Context, key string) (time.Duration, error) {
	return t.call(ctx, "Next", key, "", false)
}

// Return gives back to key's budget the start that Start took or Reserve
// reserved for id, for work that did not start after all; nothing when
// there is none. It returns ErrInvalid for an empty key or id, and a Redis
// error wrapped.
func (t *Throttle) Return(ctx context.Context, key, id string) error {
	if key == "" || id == "" {
		return fmt.Errorf("%w: Throttle.Return(%q, %q): key and id must not be empty", ErrInvalid, key, id)
	}
	keys := t.keys(key)
	if _, err := t.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, keys[0], id)
		p.ZRem(ctx, keys[1], id)
		return nil
	}); err != nil {
		return fmt.Errorf("lockkit: return start %q: %w", key, err)
	}
	return nil
}

// keys are a throttle's starts and reserved starts (throttle.lua).
func (t *Throttle) keys(key string) []string {
	base := t.prefix + "{" + escapeKey(key) + "}"
	return []string{base + ":t", base + ":tr"}
}

// call takes or reserves a start logged as id, or only tells when fewer
// than n starts began for id "".
func (t *Throttle) call(ctx context.Context, op, key, id string, reserve bool) (time.Duration, error) {
	if key == "" {
		return 0, fmt.Errorf("%w: Throttle.%s: key is empty", ErrInvalid, op)
	}
	r := "0"
	if reserve {
		r = "1"
	}
	wait, err := throttleScript.Run(ctx, t.c, t.keys(key), t.n, ms(t.period), id, r).Int64()
	if err != nil {
		return 0, fmt.Errorf("lockkit: throttle %q: %w", key, err)
	}
	return time.Duration(wait) * time.Millisecond, nil
}
