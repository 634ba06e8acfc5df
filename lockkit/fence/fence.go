package fence

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/rediskey"
	"github.com/jobguard/jobguard/lockkit"
)

// Errors returned by this package. Compare with errors.Is.
var (
	// ErrStale is returned by a write whose token is older than the newest
	// token that has written to its key: the write changed nothing. The
	// error is a *StaleError that carries the newest token.
	ErrStale = errors.New("fence: stale token")
	// ErrNoLease is returned by FromContext when ctx carries no lease: the
	// work does not run under lockkit.Do, a Lease's Context, or a job of
	// middleware, singleton or cronguard.
	ErrNoLease = errors.New("fence: ctx carries no lease")
	// ErrInvalid is wrapped by every validation error (it is
	// lockkit.ErrInvalid); the message names the call and the bad value.
	ErrInvalid = lockkit.ErrInvalid
)

// StaleError is returned by a write whose token is older than its key's
// fence. It matches ErrStale with errors.Is.
type StaleError struct {
	// Key is the key the write was for.
	Key string
	// Lease is the key of the writer's lease (Token.Key); empty when the
	// Token did not name it.
	Lease string
	// Token is the writer's token, and Newest the newest token that has
	// written to Key: a later lease's.
	Token, Newest int64
}

func (e *StaleError) Error() string {
	lease := ""
	if e.Lease != "" {
		lease = fmt.Sprintf(" (lease %q)", e.Lease)
	}
	return fmt.Sprintf("fence: stale token: %q was written with token %d, newer than this write's %d%s: nothing changed",
		e.Key, e.Newest, e.Token, lease)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Token is a fencing token and the key of the lease it belongs to.
type Token struct {
	// Key is the lease's key, named in a StaleError; it may be empty.
	Key string
	// Value is the lease's fencing token (lockkit's Lease.Token); it must
	// be positive.
	Value int64
}

// FromContext returns the token of the lease that ctx carries: the lease of
// lockkit.Do's work, of a Lease's Context, or of a job that middleware,
// singleton (asynq) or cronguard (cron) runs. It returns ErrNoLease when ctx
// carries none, such as a handler registered without the adapter's
// middleware, or a duplicate that runs under the adapters' WithShadow
// without a lease. It does not check that the lease is still held: the fence
// does, when the token writes.
func FromContext(ctx context.Context) (Token, error) {
	l, ok := lockcore.LeaseFromContext(ctx)
	if !ok {
		return Token{}, fmt.Errorf("%w: run the work under lockkit.Do, a Lease's Context, or the middleware, singleton or cronguard adapters", ErrNoLease)
	}
	return Token{Key: l.Key(), Value: l.Token()}, nil
}

// defaultLinger is how long a key's fence outlives the key when WithLinger
// is not given.
const defaultLinger = 24 * time.Hour

// Writer makes fenced writes to Redis. Each write is one script that
// refuses it (ErrStale) when a newer token has written to the key, else
// writes and keeps the token in the key's fence (see the package doc for
// where the fence is kept and for how long). Every write is safe to send
// twice, as go-redis does after a lost reply. A Writer holds no goroutine
// and needs no closing; it is safe for concurrent use. Build it with New.
type Writer struct {
	c      redis.UniversalClient
	prefix string // escaped
	linger time.Duration
	window time.Duration
}

// Option configures a Writer.
type Option func(*Writer)

// WithPrefix sets the prefix of the fence keys and of the records of
// writes. Defaults to "jobguard:", the prefix of a Locker built without
// lockkit.WithPrefix.
func WithPrefix(prefix string) Option {
	return func(w *Writer) { w.prefix = rediskey.Key(prefix) }
}

// WithLinger sets how long a key's fence outlives the key, once it expired
// or was deleted: a stale writer back after that is no longer refused.
// Must be between 1ms and 100 years. Defaults to 24h.
func WithLinger(d time.Duration) Option {
	return func(w *Writer) { w.linger = d }
}

// New returns a Writer on client, which it does not close. It returns an
// error matching ErrInvalid for a nil client (also a typed nil) or a
// linger out of range.
func New(client redis.UniversalClient, opts ...Option) (*Writer, error) {
	if v := reflect.ValueOf(client); client == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: fence.New: client is nil", ErrInvalid)
	}
	w := &Writer{c: client, prefix: rediskey.Key(lockcore.DefaultPrefix), linger: defaultLinger, window: lockcore.RetryWindow(client)}
	for _, o := range opts {
		if o != nil {
			o(w)
		}
	}
	if w.linger < time.Millisecond || w.linger > lockcore.MaxTTL {
		return nil, fmt.Errorf("%w: fence.New: WithLinger %s must be between 1ms and %s", ErrInvalid, w.linger, lockcore.MaxTTL)
	}
	return w, nil
}

var (
	//go:embed scripts/fence.lua
	fenceSrc string
	//go:embed scripts/set.lua
	setSrc string
	//go:embed scripts/hset.lua
	hsetSrc string
	//go:embed scripts/del.lua
	delSrc string
	//go:embed scripts/incrby.lua
	incrBySrc string
	//go:embed scripts/xadd.lua
	xaddSrc string

	// Each write script starts with fence.lua.
	setScript    = redis.NewScript(fenceSrc + setSrc)
	hsetScript   = redis.NewScript(fenceSrc + hsetSrc)
	delScript    = redis.NewScript(fenceSrc + delSrc)
	incrByScript = redis.NewScript(fenceSrc + incrBySrc)
	xaddScript   = redis.NewScript(fenceSrc + xaddSrc)
)

// Set sets key to value (a string, []byte, number or bool, as go-redis
// takes them) if t is not older than key's fence. A positive ttl gives key
// that TTL; zero gives it none (a TTL it had is dropped, as SET does). It
// returns a *StaleError (ErrStale) when a newer token has written to key,
// ErrInvalid for a bad token, key or ttl (negative, a fraction of a
// millisecond, or longer than 100 years), and a Redis error wrapped.
func (w *Writer) Set(ctx context.Context, t Token, key string, value any, ttl time.Duration) error {
	if ttl < 0 || ttl%time.Millisecond != 0 || ttl > lockcore.MaxTTL {
		return fmt.Errorf("%w: fence: Set(%q): ttl %s must be zero or whole milliseconds up to %s", ErrInvalid, key, ttl, lockcore.MaxTTL)
	}
	_, err := w.write(ctx, "Set", setScript, t, key, value, ttl.Milliseconds())
	return err
}

// HSet sets fields of the hash at key if t is not older than key's fence:
// values are field, value, field, value, ... (at least one pair). Errors
// are those of Set, and ErrInvalid for an odd or empty values.
func (w *Writer) HSet(ctx context.Context, t Token, key string, values ...any) error {
	if len(values) == 0 || len(values)%2 != 0 {
		return fmt.Errorf("%w: fence: HSet(%q): %d values: give field, value pairs", ErrInvalid, key, len(values))
	}
	_, err := w.write(ctx, "HSet", hsetScript, t, key, values...)
	return err
}

// Del deletes key if t is not older than key's fence; the fence stays for
// the linger (WithLinger), so that a stale writer cannot bring key back.
// Deleting a key that does not exist is no error. Errors are those of Set.
func (w *Writer) Del(ctx context.Context, t Token, key string) error {
	_, err := w.write(ctx, "Del", delScript, t, key)
	return err
}

// Incr is IncrBy(ctx, t, key, 1).
func (w *Writer) Incr(ctx context.Context, t Token, key string) (int64, error) {
	return w.IncrBy(ctx, t, key, 1)
}

// IncrBy adds n to the integer at key (a missing key counts as 0) if t is
// not older than key's fence, and returns the value after it. A call sent
// twice adds once; two calls add twice. Errors are those of Set, and the
// Redis error of a key that does not hold an integer (nothing changed).
func (w *Writer) IncrBy(ctx context.Context, t Token, key string, n int64) (int64, error) {
	v, err := w.write(ctx, "IncrBy", incrByScript, t, key, n)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// maxEntryPairs is the most field, value pairs XAdd takes: the script
// passes them to XADD in one call, and Lua passes a few thousand values at
// once (fewer than 8000 on Redis, than 5120 on miniredis, which
// lockkit/inprocess runs).
const maxEntryPairs = 2000

// XAdd appends an entry to the stream at key, with an ID Redis picks, if t
// is not older than key's fence, and returns the entry's ID: values are
// field, value, field, value, ... (at least one pair, at most 2,000). A
// call sent twice appends one entry. Errors are those of HSet, and
// ErrInvalid for more than 2,000 pairs.
func (w *Writer) XAdd(ctx context.Context, t Token, key string, values ...any) (string, error) {
	if len(values) == 0 || len(values)%2 != 0 {
		return "", fmt.Errorf("%w: fence: XAdd(%q): %d values: give field, value pairs", ErrInvalid, key, len(values))
	}
	if len(values) > 2*maxEntryPairs {
		return "", fmt.Errorf("%w: fence: XAdd(%q): %d field, value pairs, more than %d", ErrInvalid, key, len(values)/2, maxEntryPairs)
	}
	return w.write(ctx, "XAdd", xaddScript, t, key, values...)
}

// write runs the write script s of operation op for key with token t and
// the script's own arguments, and returns its reply (fence.lua).
func (w *Writer) write(ctx context.Context, op string, s *redis.Script, t Token, key string, args ...any) (string, error) {
	if t.Value <= 0 {
		return "", fmt.Errorf("%w: fence: %s(%q): token %d is no fencing token: take it from FromContext or a Lease's Token", ErrInvalid, op, key, t.Value)
	}
	fenceKey, writeKey, err := w.keys(op, key)
	if err != nil {
		return "", err
	}
	argv := make([]any, 0, 3+len(args))
	argv = append(argv, t.Value, w.linger.Milliseconds(), w.window.Milliseconds())
	argv = append(argv, args...)
	reply, err := s.Run(ctx, w.c, []string{key, fenceKey, writeKey}, argv...).Slice()
	if err != nil {
		return "", fmt.Errorf("fence: %s(%q): %w", op, key, err)
	}
	if len(reply) != 2 {
		return "", fmt.Errorf("fence: %s(%q): unexpected reply %v", op, key, reply)
	}
	applied, _ := reply[0].(int64)
	v, _ := reply[1].(string)
	if applied == 1 {
		return v, nil
	}
	newest, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return "", fmt.Errorf("fence: %s(%q): the fence holds %q, not a token", op, key, v)
	}
	return "", &StaleError{Key: key, Lease: t.Key, Token: t.Value, Newest: newest}
}

// keys returns the names of key's fence and of the record of a new write
// call, each in key's Cluster hash slot (see the package doc), or
// ErrInvalid when there are none.
func (w *Writer) keys(op, key string) (fenceKey, writeKey string, err error) {
	id := make([]byte, 8)
	_, _ = rand.Read(id) // crypto/rand.Read never fails on supported platforms
	call := hex.EncodeToString(id)
	switch {
	case key == "":
		return "", "", fmt.Errorf("%w: fence: %s: key is empty", ErrInvalid, op)
	case hasHashTag(key):
		return w.prefix + "fence:" + key, w.prefix + "fence-write:" + call + ":" + key, nil
	case strings.Contains(key, "}"):
		return "", "", fmt.Errorf("%w: fence: %s(%q): the key has no hash tag and contains '}', so no fence key can share its Cluster slot: give it a hash tag (\"{...}\")", ErrInvalid, op, key)
	}
	return w.prefix + "fence{" + key + "}", w.prefix + "fence-write:" + call + "{" + key + "}", nil
}

// hasHashTag reports whether key has a Redis Cluster hash tag: a '{' with
// a '}' after it, and something between the first '{' and the first '}'
// after it.
func hasHashTag(key string) bool {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return false
	}
	return strings.IndexByte(key[i+1:], '}') > 0
}
