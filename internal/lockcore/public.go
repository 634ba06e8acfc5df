package lockcore

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// unwrap returns the RedisLocker under a *lockkit.Locker; package
// lockkit sets it in its init (SetUnwrap), as it alone knows its type.
var unwrap func(l any) (*RedisLocker, bool)

// SetUnwrap is called once, by package lockkit's init, with the function
// that returns the RedisLocker under a *lockkit.Locker.
func SetUnwrap(f func(l any) (*RedisLocker, bool)) { unwrap = f }

// Of returns the RedisLocker under l, the *lockkit.Locker an adapter
// (middleware, singleton, cronguard, periodic, opsview, lockkit's own
// packages) was given. It returns an error matching ErrInvalid, naming
// what for and l's type, when l is not a *lockkit.Locker (nil
// included): what those packages do needs the engine under one.
func Of(what string, l any) (*RedisLocker, error) {
	if unwrap != nil {
		if rl, ok := unwrap(l); ok && rl != nil {
			return rl, nil
		}
	}
	return nil, fmt.Errorf("%w: %s needs a *lockkit.Locker (lockkit.NewRedis, inprocess or lockkittest), and the Locker is %T", ErrInvalid, what, l)
}

// RetryWindow is how long after a command's first run go-redis may run it
// again with client (see retryWindow): packages that keep state beside the
// leases keep the record of a call that long, so that a repeat finds it.
func RetryWindow(client redis.UniversalClient) time.Duration { return retryWindow(client) }
