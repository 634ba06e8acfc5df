package lockkit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrNotLeader is returned by Campaign.Leader's callers, such as an elector
// built on a Campaign, while the Campaign does not hold its key.
var ErrNotLeader = errors.New("lockkit: not the leader")

// Elect campaigns for key on l: it waits (woken by pub/sub when the leader
// resigns, bounded by ctx) until it holds the key, then calls lead with a
// context that is cancelled when leadership is lost (context.Cause matches
// ErrLost) and with the term: the lease's fencing token, greater than every
// earlier term of the key. When lead returns, Elect resigns (releases the
// key) and returns lead's error; or the error of the campaign if ctx ended
// first (wrapping ctx.Err()). opt is as for Acquire (nil: defaults).
func Elect(ctx context.Context, l Locker, key string, opt *AcquireOptions, lead func(ctx context.Context, term int64) error) error {
	lease, err := l.Acquire(ctx, key, opt)
	if err != nil {
		return err
	}
	return lease.Run(ctx, func(ctx context.Context) error { return lead(ctx, lease.Token()) })
}

// Campaign keeps campaigning for a key in the background: whenever the key
// is free it takes it and keeps it renewed until it is lost, then campaigns
// again, until Stop. Leader reports the state at any time. It is the
// building block of "one active replica" checks such as gocron's Elector.
type Campaign struct {
	l   Locker
	key string
	opt AcquireOptions

	mu    sync.Mutex
	lease *Lease
	since time.Time // when lease was taken
	stop  context.CancelFunc
	done  chan struct{}
}

// NewCampaign starts campaigning for key on l with opt (nil: defaults; it
// must not wait forever, so its TTL bounds how long a dead leader blocks the
// others). It returns ErrInvalid for a nil l or an empty key.
func NewCampaign(l Locker, key string, opt *AcquireOptions) (*Campaign, error) {
	if l == nil || key == "" {
		return nil, fmt.Errorf("%w: NewCampaign(%v, %q): locker and key are required", ErrInvalid, l, key)
	}
	c := &Campaign{l: l, key: key, done: make(chan struct{})}
	if opt != nil {
		c.opt = *opt
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	go c.run(ctx)
	return c, nil
}

func (c *Campaign) run(ctx context.Context) {
	defer close(c.done)
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		lease, err := c.l.Acquire(ctx, c.key, &c.opt)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			// Redis unreachable or an invalid option: try again later.
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		c.mu.Lock()
		c.lease, c.since = lease, time.Now()
		c.mu.Unlock()
		select {
		case <-lease.Lost():
		case <-ctx.Done():
		}
		c.mu.Lock()
		c.lease = nil
		c.mu.Unlock()
		if ctx.Err() != nil {
			rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			_ = lease.Release(rctx) // resign, waking the other candidates
			cancel()
			return
		}
	}
}

// Leader reports whether the Campaign holds its key now, and the term (the
// fencing token of its lease). A lost lease is reported as soon as it is
// detected (at once through its renewal, or when its validity runs out).
func (c *Campaign) Leader() (term int64, ok bool) {
	term, _, ok = c.LeaderSince()
	return term, ok
}

// LeaderSince is Leader, with the time (on this process's clock) at which
// the Campaign took its key for this term.
func (c *Campaign) LeaderSince() (term int64, since time.Time, ok bool) {
	c.mu.Lock()
	l, since := c.lease, c.since
	c.mu.Unlock()
	if l == nil || l.Err() != nil {
		return 0, time.Time{}, false
	}
	select {
	case <-l.Lost():
		return 0, time.Time{}, false
	default:
	}
	if time.Now().After(l.validUntilLocked()) {
		return 0, time.Time{}, false
	}
	return l.Token(), since, true
}

// Stop ends the campaign and resigns if it leads, waking the other
// candidates. It waits for that, bounded by ctx.
func (c *Campaign) Stop(ctx context.Context) error {
	c.stop()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
