package lockkit

// The engine's calls that take no lease: throttle starts, debounce
// generations, cron claims, force-release (and its notices) and Free.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

func (e *engine) throttle(ctx context.Context, key string, n int, period time.Duration) (time.Duration, error) {
	return e.throttleCall(ctx, key, n, period, randomID(8), false)
}

func (e *engine) throttleStart(ctx context.Context, key string, n int, period time.Duration, id string, reserve bool) (time.Duration, error) {
	if id == "" {
		op := "ThrottleStart"
		if reserve {
			op = "ReserveStart"
		}
		return 0, fmt.Errorf("%w: %s(%q): id is empty", ErrInvalid, op, key)
	}
	return e.throttleCall(ctx, key, n, period, id, reserve)
}

func (e *engine) nextStart(ctx context.Context, key string, n int, period time.Duration) (time.Duration, error) {
	return e.throttleCall(ctx, key, n, period, "", false)
}

func (e *engine) returnStart(ctx context.Context, key, id string) error {
	if key == "" || id == "" {
		return fmt.Errorf("%w: ReturnStart(%q, %q): key and id must not be empty", ErrInvalid, key, id)
	}
	if err := e.b.returnStart(ctx, key, id); err != nil {
		return fmt.Errorf("lockkit: return start %q: %w", key, err)
	}
	return nil
}

// throttleCall takes or reserves a start logged as call, or only tells
// when fewer than n starts began for call "".
func (e *engine) throttleCall(ctx context.Context, key string, n int, period time.Duration, call string, reserve bool) (time.Duration, error) {
	switch {
	case key == "":
		return 0, fmt.Errorf("%w: Throttle: key is empty", ErrInvalid)
	case n < 1:
		return 0, fmt.Errorf("%w: Throttle(%q): n %d must be at least 1", ErrInvalid, key, n)
	case period < time.Millisecond || period > MaxTTL:
		return 0, fmt.Errorf("%w: Throttle(%q): period %s must be between 1ms and %s", ErrInvalid, key, period, MaxTTL)
	}
	wait, err := e.b.throttle(ctx, key, n, period, call, reserve)
	if err != nil {
		return 0, fmt.Errorf("lockkit: throttle %q: %w", key, err)
	}
	return wait, nil
}

func (e *engine) debounce(ctx context.Context, key, id string, quiet, maxWait time.Duration) (Request, error) {
	switch {
	case key == "" || id == "":
		return Request{}, fmt.Errorf("%w: Debounce(%q, %q): key and id must not be empty", ErrInvalid, key, id)
	case quiet < time.Millisecond || quiet > MaxTTL:
		return Request{}, fmt.Errorf("%w: Debounce(%q): quiet %s must be between 1ms and %s", ErrInvalid, key, quiet, MaxTTL)
	case maxWait != 0 && (maxWait < quiet || maxWait > MaxTTL):
		return Request{}, fmt.Errorf("%w: Debounce(%q): maxWait %s must be zero or between quiet (%s) and %s", ErrInvalid, key, maxWait, quiet, MaxTTL)
	}
	r, err := e.b.debounce(ctx, key, id, quiet, maxWait)
	if err != nil {
		return Request{}, fmt.Errorf("lockkit: debounce %q: %w", key, err)
	}
	return r, nil
}

func (e *engine) claim(ctx context.Context, key string, gen int64, force bool) (Request, bool, error) {
	if key == "" || gen <= 0 {
		return Request{}, false, fmt.Errorf("%w: Claim(%q, %d): key must not be empty and gen must be positive", ErrInvalid, key, gen)
	}
	r, ok, err := e.b.claim(ctx, key, gen, force)
	if err != nil {
		return Request{}, false, fmt.Errorf("lockkit: claim %q: %w", key, err)
	}
	return r, ok, nil
}

func (e *engine) forceRelease(ctx context.Context, key, owner string) (int, error) {
	if key == "" {
		return 0, fmt.Errorf("%w: ForceRelease: key is empty", ErrInvalid)
	}
	n, err := e.b.evict(ctx, key, owner, 0, randomID(8))
	if err != nil {
		return 0, fmt.Errorf("lockkit: force-release %q: %w", key, err)
	}
	return n, nil
}

func (e *engine) forceReleaseToken(ctx context.Context, key string, token int64) error {
	if key == "" || token <= 0 {
		return fmt.Errorf("%w: ForceReleaseToken(%q, %d): key must not be empty and token must be positive", ErrInvalid, key, token)
	}
	n, err := e.b.evict(ctx, key, "", token, randomID(8))
	if err != nil {
		return fmt.Errorf("lockkit: force-release %q token %d: %w", key, token, err)
	}
	if n > 0 {
		return nil
	}
	now := "the key has no holder now"
	if info, err := e.b.inspect(ctx, key); err != nil {
		now = "the holders now are unknown: " + err.Error()
	} else if len(info.Holders) > 0 {
		hs := make([]string, len(info.Holders))
		for i, h := range info.Holders {
			hs[i] = fmt.Sprintf("owner %q label %q token %d", h.Owner, h.Label, h.Token)
		}
		now = "it is held now by " + strings.Join(hs, ", ")
	}
	return fmt.Errorf("%w: force-release %q: the holder of token %d no longer holds it (it ended or was released); %s", ErrNotHeld, key, token, now)
}

func (e *engine) free(ctx context.Context, key, label string) (bool, error) {
	if key == "" || label == "" {
		return false, fmt.Errorf("%w: Free(%q, %q): key and label must not be empty", ErrInvalid, key, label)
	}
	ok, err := e.b.free(ctx, key, label)
	if err != nil {
		return false, fmt.Errorf("lockkit: free %q label %q: %w", key, label, err)
	}
	return ok, nil
}

// operatorRelease ends, with a cause that says an operator released them,
// the leases of key that a ForceRelease removed: notice is "t<token>" for
// the one of that token, or "f<top>:<owner>" for those up to top of owner
// (of any owner for ""). It comes from the store's operators' channel, so a
// lease hears of it in milliseconds, not at its next renewal.
func (e *engine) operatorRelease(key, notice string) {
	var token, top int64
	owner, any := "", false
	switch {
	case strings.HasPrefix(notice, "t"):
		token, _ = strconv.ParseInt(notice[1:], 10, 64)
	case strings.HasPrefix(notice, "f"):
		n, o, _ := strings.Cut(notice[1:], ":")
		top, _ = strconv.ParseInt(n, 10, 64)
		owner, any = o, true
	default:
		return
	}
	var ended []*Lease
	e.mu.Lock()
	for l := range e.leases {
		if l.key != key {
			continue
		}
		if (!any && l.token == token) || (any && l.token <= top && (owner == "" || owner == l.owner)) {
			ended = append(ended, l)
		}
	}
	e.mu.Unlock()
	for _, l := range ended {
		l.evicted()
	}
}
