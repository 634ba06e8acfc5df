// Package throttle keeps, per key, a budget of starts shared by every
// process on one Redis: at most n starts in any window of one period.
//
//	starts, err := throttle.New(rdb, 2, time.Minute)
//	if err != nil { ... }
//	wait, err := starts.Take(ctx, "send-digest")
//	if err != nil { ... }
//	if wait > 0 {
//		// the budget is spent: a start opens in wait
//	}
//
// Work that comes back when told (a task put back to its queue) reserves
// its start with ReserveInTurn, naming its turn: work refused together is
// booked distinct slots, so that it comes back spread over the periods,
// each try about when its own start opens, not all at the first opening.
//
// Budgets live under lockkit's key prefix (WithPrefix, "jobguard:"
// by default) beside the leases of a *lockkit.Locker, and apart from
// them; a Throttle on a Locker's Redis and prefix shares them:
//
//	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix))
//	starts, err := throttle.New(rdb, n, period, throttle.WithPrefix(prefix))
package throttle

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/rediskey"
	"github.com/jobguard/jobguard/lockkit"
)

//go:embed throttle.lua
var script string

var throttleScript = redis.NewScript(script)

// Throttle keeps, per key, a budget of starts shared by every process that
// uses the same Redis and prefix: at most n starts in any window of one
// period (a sliding log of the starts, throttle.lua). It is apart from
// leases, and not atomic with them: the same name may be a throttle key and
// a lease key. Every call is one script, safe to run twice as go-redis does
// after a lost reply: a start or reservation is logged under its id and a
// booking under its turn, so a repeat takes nothing more. A Throttle
// holds no goroutine and needs no closing. Build it with New.
type Throttle struct {
	c      redis.UniversalClient
	prefix string // escaped
	n      int
	period time.Duration
}

// turnKept is how long a turn that ReserveInTurn booked is still known
// after its booking lapsed: work back that late, as when its runtime
// schedules in whole seconds or polls for due work, still reserves before
// newcomers instead of booking a new turn behind them.
const turnKept = time.Minute

// Option configures a Throttle.
type Option func(*Throttle)

// WithPrefix sets the prefix of the Throttle's Redis keys: Throttles on the
// same Redis and prefix share their budgets. Defaults to
// "jobguard:", the prefix of a Locker built without
// lockkit.WithPrefix.
func WithPrefix(prefix string) Option {
	return func(t *Throttle) { t.prefix = rediskey.Key(prefix) }
}

// New returns a Throttle of n starts per period on client, which it does
// not close. It returns an error matching lockkit.ErrInvalid for a nil
// client (also a typed nil), n below 1, or a period shorter than a
// millisecond or longer than 100 years.
func New(client redis.UniversalClient, n int, period time.Duration, opts ...Option) (*Throttle, error) {
	if v := reflect.ValueOf(client); client == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: throttle.New: client is nil", lockkit.ErrInvalid)
	}
	switch {
	case n < 1:
		return nil, fmt.Errorf("%w: throttle.New: n %d must be at least 1", lockkit.ErrInvalid, n)
	case period < time.Millisecond || period > lockcore.MaxTTL:
		return nil, fmt.Errorf("%w: throttle.New: period %s must be between 1ms and %s", lockkit.ErrInvalid, period, lockcore.MaxTTL)
	}
	t := &Throttle{c: client, prefix: rediskey.Key(lockcore.DefaultPrefix), n: n, period: period}
	for _, o := range opts {
		if o != nil {
			o(t)
		}
	}
	return t, nil
}

// ID returns a new id for a start of one try of work, such as one delivery
// of a task, work naming the work across its tries (a task's first ID);
// "" names none. TakeOver finds a start by the work its id names.
func ID(work string) string {
	id := make([]byte, 8)
	_, _ = rand.Read(id) // crypto/rand.Read never fails on supported platforms
	if work == "" {
		return hex.EncodeToString(id)
	}
	return hex.EncodeToString(id) + ":" + work
}

// Take takes one start from key's budget. It returns zero when the start
// is allowed, or how long until one would be. Turns booked by
// ReserveInTurn are ahead of it: each counts against the budget, dated at
// its slot, until it is claimed or lapses. It returns
// lockkit.ErrInvalid for an empty key, and a Redis error wrapped.
func (t *Throttle) Take(ctx context.Context, key string) (time.Duration, error) {
	return t.call(ctx, "Take", key, ID(""), take, "")
}

// Start is Take for a start named by id (unique to one start, such as one
// delivery of a task): a repeat with the same id, as after a lost reply,
// takes no second start, and Return gives it back. A start that Reserve
// reserved for id is taken without counting again, dated now, whatever the
// budget. Errors are those of Take, and lockkit.ErrInvalid for an empty id.
func (t *Throttle) Start(ctx context.Context, key, id string) (time.Duration, error) {
	if id == "" {
		return 0, fmt.Errorf("%w: Throttle.Start(%q): id is empty", lockkit.ErrInvalid, key)
	}
	return t.call(ctx, "Start", key, id, take, "")
}

// TakeOver is Start for a try of work that got key after an earlier try of
// the same work held it (id and that try's id made by ID for the same
// work): that try's start, taken or reserved (the newest, a taken one
// first), becomes id's, dated now, if it is still in the window, so that
// both tries spend one start and a Return of the earlier try, even a late
// one, finds none. Without such a start (the earlier try gave it back, or
// never took one) it is Start, and with turn (ReserveInTurn's, "" for
// none) it is also the claimant of turn's booking, or books it when
// refused, as ReserveInTurn does; a start taken ends turn's booking.
// A repeat, as after a lost reply, finds id's start and takes nothing more.
// Errors are those of Start.
func (t *Throttle) TakeOver(ctx context.Context, key, id, turn string) (time.Duration, error) {
	if id == "" {
		return 0, fmt.Errorf("%w: Throttle.TakeOver(%q): id is empty", lockkit.ErrInvalid, key)
	}
	return t.call(ctx, "TakeOver", key, id, takeOver, turn)
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
		return 0, fmt.Errorf("%w: Throttle.Reserve(%q): id is empty", lockkit.ErrInvalid, key)
	}
	return t.call(ctx, "Reserve", key, id, reserve, "")
}

// ReserveInTurn is Reserve for work that comes back when told, with turn
// naming the work across its tries (such as a task's first ID; unlike id,
// the same for every try). When the budget is spent it books turn a slot
// of its own, the next free one after the starts, reservations and
// bookings before it, and returns how long until that slot: work refused
// together is told distinct waits and comes back spread out, not all at
// the first opening. A call whose turn is booked reserves the start when
// the starts and reservations of the window leave room (the bookings, which
// it is one of, do not count against it), ending its booking; otherwise
// its booking stays and it returns how long until a start opens (until
// its slot, if that is later). A booking nobody claims lapses one period
// after its slot, when newcomers stop counting it; its turn is still known
// for a minute more: work back that late, as when its runtime schedules in
// whole seconds or polls for due work, still reserves before newcomers
// instead of booking a new turn behind them. A repeat of a call that
// booked the turn, as after a lost reply, is its claimant. Errors are
// those of Reserve, and lockkit.ErrInvalid for an empty turn.
func (t *Throttle) ReserveInTurn(ctx context.Context, key, id, turn string) (time.Duration, error) {
	switch {
	case id == "":
		return 0, fmt.Errorf("%w: Throttle.ReserveInTurn(%q): id is empty", lockkit.ErrInvalid, key)
	case turn == "":
		return 0, fmt.Errorf("%w: Throttle.ReserveInTurn(%q): turn is empty", lockkit.ErrInvalid, key)
	}
	return t.call(ctx, "ReserveInTurn", key, id, reserve, turn)
}

// Next tells how long until fewer than n starts of key began in the last
// period or are booked by ReserveInTurn (zero: now), and takes none.
// Reserved starts are not counted, as their work may not begin, so a start
// may still be refused while reservations fill the budget. Errors are
// those of Take.
func (t *Throttle) Next(ctx context.Context, key string) (time.Duration, error) {
	return t.call(ctx, "Next", key, "", take, "")
}

// Return gives back to key's budget the start that Start took or Reserve
// reserved for id, for work that did not start after all; nothing when
// there is none. It returns lockkit.ErrInvalid for an empty key or id, and
// a Redis error wrapped.
func (t *Throttle) Return(ctx context.Context, key, id string) error {
	if key == "" || id == "" {
		return fmt.Errorf("%w: Throttle.Return(%q, %q): key and id must not be empty", lockkit.ErrInvalid, key, id)
	}
	keys := t.keys(key)
	if _, err := t.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, keys[0], id)
		p.ZRem(ctx, keys[1], id)
		return nil
	}); err != nil {
		return fmt.Errorf("throttle: return start %q: %w", key, err)
	}
	return nil
}

// keys are a throttle's starts, reserved starts and booked turns
// (throttle.lua).
func (t *Throttle) keys(key string) []string {
	base := rediskey.Base(t.prefix, key)
	return []string{base + ":t", base + ":tr", base + ":tq"}
}

// How a call logs its start (throttle.lua's ARGV[4]).
const (
	take     = "0"
	reserve  = "1"
	takeOver = "2"
)

// call takes, reserves or takes over (how) a start logged as id, in turn if
// turn is not "", or only tells when one would be allowed for id "".
func (t *Throttle) call(ctx context.Context, op, key, id, how, turn string) (time.Duration, error) {
	if key == "" {
		return 0, fmt.Errorf("%w: Throttle.%s: key is empty", lockkit.ErrInvalid, op)
	}
	period := (t.period + time.Millisecond - 1) / time.Millisecond // rounded up
	wait, err := throttleScript.Run(ctx, t.c, t.keys(key), t.n, int64(period), id, how, turn, int64(turnKept/time.Millisecond)).Int64()
	if err != nil {
		return 0, fmt.Errorf("throttle: %q: %w", key, err)
	}
	return time.Duration(wait) * time.Millisecond, nil
}
