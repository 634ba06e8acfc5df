package singleton

import (
	"context"
	"fmt"
	"reflect"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
)

// Guard is the asynq setup made in one call by New: a Locker on the Redis
// the servers use, the middleware, the server hooks, and Clients that derive
// keys as the middleware does.
//
//	g, err := singleton.New(rdb, singleton.KeyByFields("tenant_id"), singleton.WithPolicy(middleware.Requeue(time.Second)))
//	if err != nil { ... }
//	defer g.Close(context.Background()) // after srv.Shutdown
//	cfg := asynq.Config{Concurrency: 10}
//	g.Configure(&cfg)
//	srv := asynq.NewServerFromRedisClient(rdb, cfg)
//	mux := asynq.NewServeMux()
//	mux.Use(g.Middleware)
//	client, err := g.Client(asynq.NewClientFromRedisClient(rdb))
type Guard struct {
	m      *guarded
	locker *lockkit.Locker
	rdb    redis.UniversalClient
	keys   []ClientOption // the key options given to New, for Client
}

// New returns a Guard whose Locker is lockkit.NewRedis(rdb) with its
// defaults, and whose middleware is Middleware's with opts and
// WithRedis(rdb) (unless opts give another WithRedis). rdb is the Redis the
// asynq servers and clients use. Without options a task's key is its type
// and a duplicate is skipped, as with Middleware.
//
// New returns an error matching ErrInvalid, naming the option and the
// value, for a nil rdb or an invalid option, and the Locker's error if it
// cannot be made. Close the Guard after every server using it has shut down.
func New(rdb redis.UniversalClient, opts ...ServerOption) (*Guard, error) {
	if rdb == nil || reflect.ValueOf(rdb).IsNil() {
		return nil, fmt.Errorf("%w: New: redis client is nil", ErrInvalid)
	}
	c := serverConfig(opts)
	var keys []ClientOption
	for _, o := range opts {
		if k, ok := o.(keyOpt); ok {
			keys = append(keys, k)
		}
	}
	lockerOpts := c.lockerOpts
	c.lockerOpts, c.lockerOptsSet = nil, false // New's own: build refuses them
	if !c.rdbSet {
		c.rdb, c.rdbSet = rdb, true
	}
	locker, err := lockkit.NewRedis(rdb, lockerOpts...)
	if err != nil {
		return nil, err
	}
	m, err := c.build(locker)
	if err != nil {
		_ = locker.Close(context.Background())
		return nil, err
	}
	return &Guard{m: m, locker: locker, rdb: rdb, keys: keys}, nil
}

// WithLockerOptions sets the options of the Locker that New makes
// (lockkit.WithPrefix, lockkit.WithTTL, lockkit.WithLogger, ...). Only New
// takes it: Middleware, given a Locker, refuses it (ErrInvalid). Defaults to
// lockkit's defaults.
func WithLockerOptions(opts ...lockkit.Option) ServerOption {
	return serverOpt(func(c *config) {
		c.lockerOpts, c.lockerOptsSet = append(c.lockerOpts, opts...), true
	})
}

// Middleware runs next under the Guard's lease for each task, as the
// asynq.MiddlewareFunc that Middleware returns does: mux.Use(g.Middleware),
// or g.Middleware(handler) around one handler.
func (g *Guard) Middleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		return g.m.process(ctx, next, t)
	})
}

// Configure sets cfg's IsFailure and RetryDelayFunc as ServerConfig does,
// wrapping the functions cfg already has, so that the duplicates the
// middleware puts back are retried free and after the policy's delay. Call
// it for the asynq.Config of every server that runs the middleware, before
// making the server. cfg must not be nil: Configure(nil) panics, as a
// mistake in the program's setup.
func (g *Guard) Configure(cfg *asynq.Config) {
	if cfg == nil {
		panic("singleton: Guard.Configure(nil): pass the address of the asynq.Config")
	}
	*cfg = ServerConfig(*cfg)
}

// Client returns a Client that enqueues with c and derives each task's key
// with the key options given to New, so that a task's key at enqueue is the
// one the middleware derives. A Unique, Debounce or ParkAtEnqueue option
// given a nil Locker uses the Guard's. It returns an error matching
// ErrInvalid for a nil c or an invalid option, and for ParkAtEnqueue on a
// Guard whose middleware has WithLimit(n > 1), which would refuse every
// task the Client enqueues (see ParkAtEnqueue), or WithLimitFunc, which
// may.
func (g *Guard) Client(c *asynq.Client, opts ...ClientOption) (*Client, error) {
	for _, o := range opts {
		if _, ok := o.(keyOpt); ok {
			return nil, fmt.Errorf("%w: Guard.Client: a key option: the Client derives keys with the ones given to New", ErrInvalid)
		}
	}
	all := append(g.keys[:len(g.keys):len(g.keys)], opts...)
	client, err := newClient(c, g.m.rdb, g.locker, all, &g.m.decisions) // the Redis the servers use (WithRedis)
	if err == nil && client.park != nil && g.m.limit > 1 {
		return nil, fmt.Errorf("%w: ParkAtEnqueue with the Guard's WithLimit(%d): it needs WithLimit(1), under which a run starts the next parked task; the middleware would refuse every task the Client enqueues", ErrInvalid, g.m.limit)
	}
	if err == nil && client.park != nil && g.m.limitFunc {
		return nil, fmt.Errorf("%w: ParkAtEnqueue with the Guard's WithLimitFunc: it needs WithLimit(1), under which a run starts the next parked task; the middleware would refuse every task the Client enqueues whose limit is above 1", ErrInvalid)
	}
	return client, err
}

// Locker returns the Guard's Locker, for lockkit's own uses (lockkit.Do,
// the operator tools) in the same process.
func (g *Guard) Locker() *lockkit.Locker { return g.locker }

// Close closes the Guard's Locker (*lockkit.Locker.Close), bounded by
// ctx: it releases the leases still held. Call it after every server using
// the Guard has shut down.
func (g *Guard) Close(ctx context.Context) error { return g.locker.Close(ctx) }

// defaultLocker gives a Unique, Debounce or ParkAtEnqueue option that names
// no Locker the Guard's.
func (c *config) defaultLocker(l *lockkit.Locker) {
	if c.unique != nil && c.unique.locker == nil {
		c.unique.locker = l
	}
	if c.debounce != nil && c.debounce.locker == nil {
		c.debounce.locker = l
	}
	if c.park != nil && c.park.locker == nil {
		c.park.locker = l
	}
}
