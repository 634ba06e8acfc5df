package lockkit

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Debouncer records requests for a key's work so that a burst of them runs
// the work once, for its newest request (latest wins), shared by every
// process that uses the same Redis and prefix. Its keys are apart from
// leases, and its calls are not atomic with them. Every call is one script,
// safe to run twice as go-redis does after a lost reply. A Debouncer holds
// no goroutine and needs no closing.
type Debouncer struct {
	c      redis.UniversalClient
	prefix string // escaped
}

// NewDebouncer returns a Debouncer on client, which it does not close. Of
// opts only WithPrefix applies (Defaults to DefaultPrefix); the others are
// checked as NewRedis does and otherwise ignored, so that a Locker's options
// can be passed as they are. It returns an error matching ErrInvalid for a
// nil client or an invalid option.
func NewDebouncer(client redis.UniversalClient, opts ...Option) (*Debouncer, error) {
	cfg, err := clientConfig("NewDebouncer", client, opts)
	if err != nil {
		return nil, err
	}
	return &Debouncer{c: client, prefix: escapeKey(cfg.prefix)}, nil
}

// Debounce records a request for key's work, named by id (such as a task
// ID), as the key's newest: the burst is meant to run the work once, for
// its newest request, once the key has been quiet for quiet, and no later
// than maxWait after the burst's first request (zero: no such bound). The
// returned Request's Wait says when that is for this request. The burst
// ends when one of its requests is claimed (Claim). Repeating a call with
// the same id while it is still the newest returns the same Request. The
// newest request is remembered for DebounceRetention after it is due.
// quiet must be between a millisecond and MaxTTL, maxWait zero or between
// quiet and MaxTTL, key and id not empty (ErrInvalid); a Redis error is
// returned wrapped.
func (d *Debouncer) Debounce(ctx context.Context, key, id string, quiet, maxWait time.Duration) (Request, error) {
	switch {
	case key == "" || id == "":
		return Request{}, fmt.Errorf("%w: Debounce(%q, %q): key and id must not be empty", ErrInvalid, key, id)
	case quiet < time.Millisecond || quiet > MaxTTL:
		return Request{}, fmt.Errorf("%w: Debounce(%q): quiet %s must be between 1ms and %s", ErrInvalid, key, quiet, MaxTTL)
	case maxWait != 0 && (maxWait < quiet || maxWait > MaxTTL):
		return Request{}, fmt.Errorf("%w: Debounce(%q): maxWait %s must be zero or between quiet (%s) and %s", ErrInvalid, key, maxWait, quiet, MaxTTL)
	}
	vals, err := debounceScript.Run(ctx, d.c, []string{d.key(key)}, ms(quiet), ms(maxWait), id, ms(DebounceRetention)).Slice()
	if err == nil && len(vals) != 2 {
		err = fmt.Errorf("unexpected debounce reply %v", vals)
	}
	if err != nil {
		return Request{}, fmt.Errorf("lockkit: debounce %q: %w", key, err)
	}
	return Request{Gen: toInt(vals[0]), ID: id, Wait: time.Duration(toInt(vals[1])) * time.Millisecond}, nil
}

// Claim tells whether the request of key with generation gen is still the
// newest and, if so, ends the key's burst: the next Debounce starts a new
// one. Otherwise it returns the newest request and false. force claims gen
// even then (the newest request's work is known not to exist), unless the
// newest request was claimed meanwhile: its work ran or runs. A key with no
// request remembered (see DebounceRetention) is claimed. It returns
// ErrInvalid for an empty key or a gen that is not positive, and a Redis
// error wrapped.
func (d *Debouncer) Claim(ctx context.Context, key string, gen int64, force bool) (newest Request, claimed bool, err error) {
	if key == "" || gen <= 0 {
		return Request{}, false, fmt.Errorf("%w: Claim(%q, %d): key must not be empty and gen must be positive", ErrInvalid, key, gen)
	}
	f := "0"
	if force {
		f = "1"
	}
	vals, err := claimScript.Run(ctx, d.c, []string{d.key(key)}, gen, f).Slice()
	switch {
	case err != nil:
	case len(vals) == 1 && toInt(vals[0]) == 1:
		return Request{}, true, nil
	case len(vals) != 5:
		err = fmt.Errorf("unexpected claim reply %v", vals)
	}
	if err != nil {
		return Request{}, false, fmt.Errorf("lockkit: claim %q: %w", key, err)
	}
	id, _ := vals[2].(string)
	return Request{Gen: toInt(vals[1]), ID: id, Wait: time.Duration(toInt(vals[3])) * time.Millisecond, Claimed: toInt(vals[4]) == 1}, false, nil
}

// key is a key's requests (debounce.lua).
func (d *Debouncer) key(key string) string { return d.prefix + "{" + escapeKey(key) + "}:b" }
