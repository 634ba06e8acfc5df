package main

import (
	"context"
	"errors"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/redis/go-redis/v9"
)

// lockTTL is the lock TTL given to redislock; lockkit uses its default
// (30s, lockkit.WithTTL's default, the same 30s) and redsync its default expiry (8s).
const lockTTL = 30 * time.Second

// redislockRetry is the retry strategy of redislock's waiting Obtain: a retry
// every 100ms, as in the package's ExampleClient_Obtain_retry. redislock does
// not retry by default.
var redislockRetry = redislock.LinearBackoff(100 * time.Millisecond)

// waitDesc describes each library's waiting acquire, for the report.
var waitDesc = map[string]string{
	"lockkit":   "`Locker.Acquire` (handed over by the release; poll fallback 250ms)",
	"redislock": "`Obtain` with `LinearBackoff(100ms)` (from its example)",
	"redsync":   "`Mutex.LockContext`, defaults (32 tries, 50–250ms random delay)",
}

// libNames lists the libraries in report order.
var libNames = []string{"lockkit", "redislock", "redsync"}

type releaseFunc func(context.Context) error

// lib is one locking library bound to one go-redis client.
type lib struct {
	name   string
	client *redis.Client
	// try makes one acquire attempt on key.
	try func(ctx context.Context, key string) (releaseFunc, error)
	// wait blocks in the library's waiting acquire until key is acquired.
	wait  func(ctx context.Context, key string) (releaseFunc, error)
	close func()
}

// newLib returns the named library on client; its keys start with prefix.
func newLib(name string, client *redis.Client, prefix string) (*lib, error) {
	l, err := newLibOf(name, client, prefix)
	if err != nil {
		return nil, err
	}
	l.name, l.client = name, client
	return l, nil
}

func newLibOf(name string, client *redis.Client, prefix string) (*lib, error) {
	switch name {
	case "lockkit":
		l, err := lockkit.NewRedis(client, lockkit.WithPrefix(prefix))
		if err != nil {
			return nil, err
		}
		return lockkitLib(l), nil
	case "redislock":
		rl := redislock.New(client)
		obtain := func(ctx context.Context, key string, opt *redislock.Options) (releaseFunc, error) {
			lock, err := rl.Obtain(ctx, prefix+key, lockTTL, opt)
			if err != nil {
				return nil, err
			}
			return lock.Release, nil
		}
		return &lib{
			try: func(ctx context.Context, key string) (releaseFunc, error) { return obtain(ctx, key, nil) },
			wait: func(ctx context.Context, key string) (releaseFunc, error) {
				return obtain(ctx, key, &redislock.Options{RetryStrategy: redislockRetry})
			},
			close: func() {},
		}, nil
	case "redsync":
		rs := redsync.New(goredis.NewPool(client))
		lock := func(ctx context.Context, key string, wait bool) (releaseFunc, error) {
			m := rs.NewMutex(prefix + key)
			lockFn := m.TryLockContext
			if wait {
				lockFn = m.LockContext
			}
			if err := lockFn(ctx); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				ok, err := m.UnlockContext(ctx)
				if err == nil && !ok {
					err = errors.New("redsync: unlock failed")
				}
				return err
			}, nil
		}
		return &lib{
			try:   func(ctx context.Context, key string) (releaseFunc, error) { return lock(ctx, key, false) },
			wait:  func(ctx context.Context, key string) (releaseFunc, error) { return lock(ctx, key, true) },
			close: func() {},
		}, nil
	}
	return nil, errors.New("unknown library " + name)
}

// lockkitLib is lockkit's Locker l: TryAcquire and Acquire with nil options,
// and Release. Closing it closes l.
func lockkitLib(l *lockkit.Locker) *lib {
	lease := func(l *lockkit.Lease, err error) (releaseFunc, error) {
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
	return &lib{
		try:   func(ctx context.Context, key string) (releaseFunc, error) { return lease(l.TryAcquire(ctx, key, nil)) },
		wait:  func(ctx context.Context, key string) (releaseFunc, error) { return lease(l.Acquire(ctx, key, nil)) },
		close: func() { _ = l.Close(context.Background()) },
	}
}

// cycle acquires key once and releases it.
func (l *lib) cycle(ctx context.Context, key string) error {
	release, err := l.try(ctx, key)
	if err != nil {
		return err
	}
	return release(ctx)
}
