package lockcore

// The engine's calls that take no lease: force-release (and its notices),
// and a parked job's giving up of its place.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// checkSelect validates the key and Select of the operator call op.
func checkSelect(op, key string, which Select) error {
	set := 0
	for _, on := range []bool{which.Owner != "", which.Token != 0, which.Label != ""} {
		if on {
			set++
		}
	}
	switch {
	case key == "":
		return fmt.Errorf("%w: %s: key is empty", ErrInvalid, op)
	case set > 1:
		return fmt.Errorf("%w: %s(%q, %+v): set at most one of Owner, Token and Label", ErrInvalid, op, key, which)
	case which.Token < 0:
		return fmt.Errorf("%w: %s(%q): Token %d must not be negative", ErrInvalid, op, key, which.Token)
	}
	return nil
}

// cancelRun is Locker.CancelRun.
func (e *engine) cancelRun(ctx context.Context, key string, which Select) (int, error) {
	if err := checkSelect("CancelRun", key, which); err != nil {
		return 0, err
	}
	if which.Label != "" {
		return 0, fmt.Errorf("%w: CancelRun(%q): select by Owner or Token, not Label (a reservation runs nothing)", ErrInvalid, key)
	}
	n, err := e.b.cancel(ctx, key, which.Owner, which.Token)
	if err != nil {
		return 0, fmt.Errorf("lockkit: cancel the run of %q: %w", key, err)
	}
	if n == 0 && which.Token != 0 {
		return 0, fmt.Errorf("%w: cancel the run of %q: the run of token %d no longer holds it (it ended or was released, or is a reservation); %s", ErrNotHeld, key, which.Token, e.holdersNow(ctx, key))
	}
	return n, nil
}

func (e *engine) forceRelease(ctx context.Context, key string, which Select) (int, error) {
	if err := checkSelect("ForceRelease", key, which); err != nil {
		return 0, err
	}
	switch {
	case which.Label != "":
		return e.free(ctx, key, which.Label)
	case which.Token != 0:
		if err := e.forceReleaseToken(ctx, key, which.Token); err != nil {
			return 0, err
		}
		return 1, nil
	}
	n, err := e.b.evict(ctx, key, which.Owner, 0, randomID(8))
	if err != nil {
		return 0, fmt.Errorf("lockkit: force-release %q: %w", key, err)
	}
	return n, nil
}

func (e *engine) forceReleaseToken(ctx context.Context, key string, token int64) error {
	n, err := e.b.evict(ctx, key, "", token, randomID(8))
	if err != nil {
		return fmt.Errorf("lockkit: force-release %q token %d: %w", key, token, err)
	}
	if n > 0 {
		return nil
	}
	return fmt.Errorf("%w: force-release %q: the holder of token %d no longer holds it (it ended or was released); %s", ErrNotHeld, key, token, e.holdersNow(ctx, key))
}

// holdersNow describes key's holders now, for an error about one that is gone.
func (e *engine) holdersNow(ctx context.Context, key string) string {
	info, err := e.b.inspect(ctx, key)
	switch {
	case err != nil:
		return "the holders now are unknown: " + err.Error()
	case len(info.Holders) == 0:
		return "the key has no holder now"
	}
	hs := make([]string, len(info.Holders))
	for i, h := range info.Holders {
		hs[i] = fmt.Sprintf("owner %q label %q token %d", h.Owner, h.Label, h.Token)
	}
	return "it is held now by " + strings.Join(hs, ", ")
}

func (e *engine) free(ctx context.Context, key, label string) (int, error) {
	ok, err := e.b.free(ctx, key, label)
	if err != nil {
		return 0, fmt.Errorf("lockkit: force-release %q label %q: %w", key, label, err)
	}
	if ok {
		return 1, nil
	}
	return 0, nil
}

// unpark is RedisLocker.Unpark.
func (e *engine) unpark(ctx context.Context, key string, opt *AcquireOptions) error {
	r, err := e.cfg.request(key, opt)
	if err != nil {
		return err
	}
	entry := parkEntry(&r)
	if entry == "" {
		return nil
	}
	if err := e.b.unpark(ctx, r.key, entry); err != nil {
		return fmt.Errorf("lockkit: unpark %q from %q: %w", r.park, key, err)
	}
	return nil
}

// operatorRelease ends, with a cause that says an operator released them,
// the leases of key that a ForceRelease removed: notice is "t<token>" for
// the one of that token, or "f<top>:<owner>" for those up to top of owner
// (of any owner for ""); "c<token>" cancels the run of that token's lease
// (CancelRun), which stays held. It comes from the store's operators'
// channel, so a lease hears of it in milliseconds, not at its next renewal.
func (e *engine) operatorRelease(key, notice string) {
	var token, top int64
	owner, any := "", false
	switch {
	case strings.HasPrefix(notice, "c"):
		token, _ = strconv.ParseInt(notice[1:], 10, 64)
		var asked []*Lease
		e.mu.Lock()
		for l := range e.leases {
			if l.key == key && l.token == token {
				asked = append(asked, l)
			}
		}
		e.mu.Unlock()
		for _, l := range asked {
			l.cancelRun()
		}
		return
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
