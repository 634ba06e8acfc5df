package lockkit

import (
	"context"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// Lease is a held claim on a key, returned by a Locker. It is renewed
// automatically until Release (unless AcquireOptions.NoRenew). When it can no
// longer be renewed it is lost: Lost() closes and contexts from Context are
// cancelled with a cause matching ErrLost. A Lease is safe for concurrent use.
type Lease struct {
	c *lockcore.Lease
}

// LeaseFromContext returns the lease whose Context (or Do) made ctx, to read
// its fencing token inside the work; also inside a job that the middleware,
// singleton or cronguard adapters run under a lease.
func LeaseFromContext(ctx context.Context) (*Lease, bool) {
	c, ok := lockcore.LeaseFromContext(ctx)
	if !ok {
		return nil, false
	}
	return &Lease{c: c}, true
}

// Token returns the fencing token: it is greater than the token of every
// earlier lease on the same key, whoever held it. Pass it to the resource the
// lease protects so that the resource can reject writes from a stale holder.
func (l *Lease) Token() int64 { return l.c.Token() }

// Context returns a context derived from parent that is also cancelled when the
// lease is lost (context.Cause matches ErrLost) or released (the cause matches
// ErrNotHeld), and that carries the lease (see LeaseFromContext). Call the
// returned cancel function when done with it.
func (l *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	return l.c.Context(parent)
}

// Lost returns a channel that is closed when the lease is lost (not when it is
// released).
func (l *Lease) Lost() <-chan struct{} { return l.c.Lost() }

// Err returns nil while the lease is held or after a normal release, and the
// loss cause (matching ErrLost) once it is lost, or once its validity ran
// out (its last TTL, less a safety margin, counted from when the command
// that set it was sent) even before the Locker has marked it lost.
func (l *Lease) Err() error { return l.c.Err() }

// Release gives the lease up and wakes waiters. It stops renewal first, so the
// lease is no longer renewed even if the call fails. It returns an error
// matching ErrNotHeld if the lease was already released, expired or lost; in
// that case no other owner's lease is touched. A release that Redis ran but
// whose reply was lost and retried still returns nil.
func (l *Lease) Release(ctx context.Context) error { return l.c.Release(ctx) }

// Extend resets the lease's TTL to ttl (zero keeps the current TTL) in one
// owner-checked call; later renewals use the new TTL, every ttl/3 unless the
// lease was acquired with NoRenew. It returns an error matching ErrNotHeld
// (and marks the lease lost) if the lease is no longer held, or ErrInvalid for
// a ttl below 100ms or above 100 years. Calls on one lease are serialized.
//
// The lease counts as valid until the TTL that Redis applied last runs out,
// measured from when it was sent: a renewal in flight when Extend is called
// never makes the holder believe in a longer TTL than Redis keeps.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error { return l.c.Extend(ctx, ttl) }
