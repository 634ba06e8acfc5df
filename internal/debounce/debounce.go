// Package debounce records requests for a key's work so that a burst of
// them runs the work once, for its newest request (latest wins), shared by
// every process on one Redis.
//
//	requests, err := debounce.New(rdb)
//	if err != nil { ... }
//	// Each request of the burst, e.g. at enqueue:
//	req, err := requests.Debounce(ctx, "reindex:tenant-42", taskID, time.Second, 10*time.Second)
//	// When a request is due (after req.Wait): only the newest one runs.
//	newest, claimed, err := requests.Claim(ctx, "reindex:tenant-42", req.Gen, false)
//
// Requests live under lockkit's key prefix (WithPrefix, "jobguard:"
// by default) beside the leases of a *lockkit.Locker, and apart from
// them; a Debouncer on a Locker's Redis and prefix shares them:
//
//	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix))
//	requests, err := debounce.New(rdb, debounce.WithPrefix(prefix))
package debounce

import (
	"context"
	_ "embed"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/rediskey"
	"github.com/jobguard/jobguard/lockkit"
)

// retention is how long Debounce remembers a key's newest request after it
// was due, so that Claim can tell an older request of the burst from it.
const retention = 24 * time.Hour

var (
	//go:embed debounce.lua
	debounceSrc string
	//go:embed claim.lua
	claimSrc string

	debounceScript = redis.NewScript(debounceSrc)
	claimScript    = redis.NewScript(claimSrc)
)

// Request is a request for a key's work recorded by Debouncer.Debounce.
type Request struct {
	// Gen orders the requests of a key: a later Debounce call gets a greater
	// one. It is at least the Redis server's time in microseconds.
	Gen int64
	// ID is the id given to Debounce.
	ID string
	// Wait is how long after the call the request is due: quiet, cut so
	// that it is due no later than maxWait after the burst's first request.
	// For Claim's newest request: how long until it is due, zero if it is.
	Wait time.Duration
	// Claimed, for Claim's newest request, tells that it was claimed
	// already: its work ran or runs.
	Claimed bool
}

// Debouncer records requests for a key's work so that a burst of them runs
// the work once, for its newest request (latest wins), shared by every
// process that uses the same Redis and prefix. Its keys are apart from
// leases, and its calls are not atomic with them. Every call is one script,
// safe to run twice as go-redis does after a lost reply. A Debouncer holds
// no goroutine and needs no closing. Build it with New.
type Debouncer struct {
	c      redis.UniversalClient
	prefix string // escaped
}

// Option configures a Debouncer.
type Option func(*Debouncer)

// WithPrefix sets the prefix of the Debouncer's Redis keys: Debouncers on
// the same Redis and prefix share their requests. Defaults to
// "jobguard:", the prefix of a Locker built without
// lockkit.WithPrefix.
func WithPrefix(prefix string) Option {
	return func(d *Debouncer) { d.prefix = rediskey.Key(prefix) }
}

// New returns a Debouncer on client, which it does not close. It returns
// an error matching lockkit.ErrInvalid for a nil client (also a typed nil).
func New(client redis.UniversalClient, opts ...Option) (*Debouncer, error) {
	if v := reflect.ValueOf(client); client == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: debounce.New: client is nil", lockkit.ErrInvalid)
	}
	d := &Debouncer{c: client, prefix: rediskey.Key(lockcore.DefaultPrefix)}
	for _, o := range opts {
		if o != nil {
			o(d)
		}
	}
	return d, nil
}

// Debounce records a request for key's work, named by id (such as a task
// ID), as the key's newest: the burst is meant to run the work once, for
// its newest request, once the key has been quiet for quiet, and no later
// than maxWait after the burst's first request (zero: no such bound). The
// returned Request's Wait says when that is for this request. The burst
// ends when one of its requests is claimed (Claim). Repeating a call with
// the same id while it is still the newest returns the same Request. The
// newest request is remembered for 24 hours after it is due. quiet must
// be between a millisecond and 100 years, maxWait zero or between
// quiet and 100 years, key and id not empty (lockkit.ErrInvalid); a
// Redis error is returned wrapped.
func (d *Debouncer) Debounce(ctx context.Context, key, id string, quiet, maxWait time.Duration) (Request, error) {
	switch {
	case key == "" || id == "":
		return Request{}, fmt.Errorf("%w: Debounce(%q, %q): key and id must not be empty", lockkit.ErrInvalid, key, id)
	case quiet < time.Millisecond || quiet > lockcore.MaxTTL:
		return Request{}, fmt.Errorf("%w: Debounce(%q): quiet %s must be between 1ms and %s", lockkit.ErrInvalid, key, quiet, lockcore.MaxTTL)
	case maxWait != 0 && (maxWait < quiet || maxWait > lockcore.MaxTTL):
		return Request{}, fmt.Errorf("%w: Debounce(%q): maxWait %s must be zero or between quiet (%s) and %s", lockkit.ErrInvalid, key, maxWait, quiet, lockcore.MaxTTL)
	}
	vals, err := debounceScript.Run(ctx, d.c, []string{d.key(key)}, ms(quiet), ms(maxWait), id, ms(retention)).Slice()
	if err == nil && len(vals) != 2 {
		err = fmt.Errorf("unexpected debounce reply %v", vals)
	}
	if err != nil {
		return Request{}, fmt.Errorf("debounce: %q: %w", key, err)
	}
	return Request{Gen: toInt(vals[0]), ID: id, Wait: time.Duration(toInt(vals[1])) * time.Millisecond}, nil
}

// Claim tells whether the request of key with generation gen is still the
// newest and, if so, ends the key's burst: the next Debounce starts a new
// one. Otherwise it returns the newest request and false. force claims gen
// even then (the newest request's work is known not to exist), unless the
// newest request was claimed meanwhile: its work ran or runs. A key with no
// request remembered (for 24 hours after it was due) is claimed. It returns
// lockkit.ErrInvalid for an empty key or a gen that is not positive, and a
// Redis error wrapped.
func (d *Debouncer) Claim(ctx context.Context, key string, gen int64, force bool) (newest Request, claimed bool, err error) {
	if key == "" || gen <= 0 {
		return Request{}, false, fmt.Errorf("%w: Claim(%q, %d): key must not be empty and gen must be positive", lockkit.ErrInvalid, key, gen)
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
		return Request{}, false, fmt.Errorf("debounce: claim %q: %w", key, err)
	}
	id, _ := vals[2].(string)
	return Request{Gen: toInt(vals[1]), ID: id, Wait: time.Duration(toInt(vals[3])) * time.Millisecond, Claimed: toInt(vals[4]) == 1}, false, nil
}

// key is a key's requests (debounce.lua).
func (d *Debouncer) key(key string) string { return rediskey.Base(d.prefix, key) + ":b" }

// ms is d in whole milliseconds, rounded up, as the scripts take it.
func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// toInt reads an integer of a script's reply: an integer, or a string
// (generations are strings, beyond Lua's exact integers).
func toInt(v any) int64 {
	n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	return n
}
