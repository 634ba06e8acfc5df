// Package elect elects one leader among processes on a *lockkit.Locker: the
// leader is the holder of a key, its term the lease's fencing token.
//
// Elect runs work while this process leads:
//
//	err := elect.Elect(ctx, locker, "reports:leader", nil, func(ctx context.Context, term int64) error {
//		// Only one process runs this at a time. ctx is cancelled with a cause
//		// matching lockkit.ErrLost when leadership is lost; term grows with
//		// every new leader.
//		return lead(ctx, term)
//	})
//
// A Campaign campaigns in the background and reports whether it leads:
//
//	c, err := elect.New(locker, "reports:leader", nil)
//	if err != nil { ... }
//	defer c.Stop(ctx)
//	if term, ok := c.Leader(); ok { ... }
//
// It uses only a *lockkit.Locker's leases: leadership has the semantics
// of a lease (renewed while the process lives, lost when it cannot be).
package elect

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jobguard/jobguard/lockkit"
)

// ErrNotLeader is returned by the callers of Campaign.Leader, such as an
// elector built on a Campaign (gocronguard's), while the Campaign does not
// hold its key.
var ErrNotLeader = errors.New("elect: not the leader")

// resignTimeout bounds the release with which a stopped Campaign resigns.
const resignTimeout = 5 * time.Second

// Elect campaigns for key on l: it waits (woken by pub/sub when the leader
// resigns, bounded by ctx) until it holds the key, then calls lead with a
// context that is cancelled when leadership is lost (context.Cause matches
// lockkit.ErrLost) and with the term: the lease's fencing token, greater
// than every earlier term of the key. When lead returns, Elect resigns
// (releases the key) and returns lead's error; or the error of the campaign
// if ctx ended first (wrapping ctx.Err()). opt is as for Locker.Acquire
// (nil: defaults).
func Elect(ctx context.Context, l *lockkit.Locker, key string, opt *lockkit.AcquireOptions, lead func(ctx context.Context, term int64) error) error {
	return lockkit.Do(ctx, l, key, opt, func(ctx context.Context) error {
		lease, _ := lockkit.LeaseFromContext(ctx)
		return lead(ctx, lease.Token())
	})
}

// Campaign keeps campaigning for a key in the background: whenever the key
// is free it takes it and keeps it renewed until it is lost, then campaigns
// again, until Stop. Leader reports the state at any time. It is the
// building block of "one active replica" checks such as gocronguard's
// Elector. Build it with New.
type Campaign struct {
	l   *lockkit.Locker
	key string
	opt lockkit.AcquireOptions

	mu    sync.Mutex
	lease *lockkit.Lease
	since time.Time // when lease was taken
	stop  context.CancelFunc
	done  chan struct{}
}

// New starts campaigning for key on l with opt (nil: defaults; it must not
// wait forever, so its TTL bounds how long a dead leader blocks the
// others). It returns an error matching lockkit.ErrInvalid for a nil l or
// an empty key. A Locker that fails an acquire (Redis unreachable, an
// invalid opt) is tried again with a backoff of up to 5s; a closed one
// (lockkit.ErrClosed) ends the campaign.
func New(l *lockkit.Locker, key string, opt *lockkit.AcquireOptions) (*Campaign, error) {
	if l == nil || key == "" {
		return nil, fmt.Errorf("%w: elect.New(%v, %q): locker and key are required", lockkit.ErrInvalid, l, key)
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
			if ctx.Err() != nil || errors.Is(err, lockkit.ErrClosed) {
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
			rctx, cancel := context.WithTimeout(context.Background(), resignTimeout)
			_ = lease.Release(rctx) // resign, waking the other candidates
			cancel()
			return
		}
	}
}

// Leader reports whether the Campaign holds its key now, and the term (the
// fencing token of its lease). A lost lease is reported as soon as the
// Locker detects it: at once through its renewal, or when its validity
// runs out (Lease.Err reports it then, even while a renewal hangs).
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
	return l.Token(), since, true
}

// Stop ends the campaign and resigns if it leads, waking the other
// candidates. It waits for that, bounded by ctx, and returns ctx.Err() if
// ctx ends first.
func (c *Campaign) Stop(ctx context.Context) error {
	c.stop()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
