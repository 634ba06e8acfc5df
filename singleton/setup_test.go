package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// New's Guard is the whole setup: the middleware keyed per tenant, the
// server hooks wrapping the program's own, and a Client keyed as the
// middleware is. A burst per tenant under Requeue runs every task once, one
// per tenant at a time, with the duplicates requeued through the hooks.
func TestNewSetsUpServerAndClient(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		g, err := singleton.New(e.RDB,
			singleton.WithLockerOptions(lockkit.WithPrefix(e.Prefix)),
			singleton.KeyByFields("tenant_id"),
			singleton.WithPolicy(middleware.Requeue(20*time.Millisecond)),
			singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, g.Close(context.Background())) })

		cfg := e.config(6)
		var userIsFailure atomic.Int32
		cfg.IsFailure = func(error) bool { userIsFailure.Add(1); return true }
		cfg.RetryDelayFunc = func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond }
		g.Configure(&cfg)
		tr := newTracker()
		mux := asynq.NewServeMux()
		mux.Use(g.Middleware)
		mux.HandleFunc("report", func(ctx context.Context, task *asynq.Task) error {
			tenant, n, err := reportOf(task)
			if err != nil {
				return err
			}
			label := fmt.Sprintf("%s-%d", tenant, n)
			tr.start(tenant)
			defer tr.end(tenant, label)
			select {
			case <-time.After(30 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			if n == 0 && tenant == "acme" && userIsFailure.Load() == 0 {
				return errors.New("first try fails") // the program's own IsFailure decides it
			}
			return nil
		})
		e.start(cfg, mux)

		client, err := g.Client(e.Client)
		require.NoError(t, err)
		want := map[string]int{}
		for n := range 5 {
			for _, tenant := range []string{"acme", "globex", "initech"} {
				info, err := client.Enqueue(asynq.NewTask("report", fmt.Appendf(nil, `{"tenant_id":%q,"n":%d}`, tenant, n)),
					asynq.Queue(e.Queue), asynq.MaxRetry(3))
				require.NoError(t, err)
				require.Equal(t, keyHeaderOf(`asynq:report:tenant_id="`+tenant+`"`, `KeyByFields("tenant_id")`), info.Headers[asynqkey.KeyHeader],
					"the Client derives the key with New's key options")
				want[fmt.Sprintf("%s-%d", tenant, n)] = 1
			}
		}
		want["acme-0"] = 2 // its first run failed, and asynq retried it
		require.Eventually(t, func() bool { return len(tr.completed()) == len(want) }, 20*time.Second, 10*time.Millisecond)
		e.Drained(10 * time.Second)
		require.Equal(t, want, tr.completed(), "every task ran once (acme-0 failed once)")
		for tenant, peak := range tr.peaks() {
			require.Equal(t, 1, peak, "tenant %s ran two tasks at once", tenant)
		}
		require.Positive(t, ev.count(middleware.EventDuplicate, middleware.ActionRequeue), "duplicates were requeued")
		require.Equal(t, int32(1), userIsFailure.Load(),
			"the program's own IsFailure decides its own error, and never sees a requeued duplicate")
		for _, err := range ev.errs(middleware.EventError) {
			require.NotErrorIs(t, err, singleton.ErrNoRetryHooks, "Configure set the hooks")
		}
	})
}

// A Unique option given no Locker uses the Guard's: the second enqueue of a
// tenant is refused while the first task still needs the key.
func TestGuardClientUsesTheGuardsLocker(t *testing.T) {
	e := newEnvOn(t, standalone)
	g, err := singleton.New(e.RDB, singleton.WithLockerOptions(lockkit.WithPrefix(e.Prefix)), singleton.KeyByFields("tenant_id"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close(context.Background())) })
	client, err := g.Client(e.Client, singleton.Unique(nil, singleton.UntilExecuted, time.Minute))
	require.NoError(t, err)
	task := asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`))
	first, err := client.Enqueue(task, asynq.Queue(e.Queue))
	require.NoError(t, err)
	_, err = client.Enqueue(task, asynq.Queue(e.Queue))
	var dup *singleton.DuplicateTaskError
	require.ErrorAs(t, err, &dup)
	require.Equal(t, first.ID, dup.ID)
	info, err := g.Locker().Inspect(context.Background(), `unique:asynq:report:tenant_id="acme"`)
	require.NoError(t, err)
	require.Len(t, info.Holders, 1, "the reservation is in the Guard's Locker")

	_, err = singleton.NewClient(e.Client, e.RDB, singleton.Unique(nil, singleton.UntilExecuted, time.Minute))
	require.ErrorIs(t, err, singleton.ErrInvalid, "NewClient has no Locker to fall back on")
	require.ErrorContains(t, err, "Unique: locker is nil")
}

// The kinds of options are types: New and Middleware take key options,
// the server's own and the guard's settings (middleware's options, the same
// values), NewClient key options and the Client's, Guard.Client only the
// Client's (a key option there is refused at run time: the Guard has its
// keys); middleware.New refuses this package's own options.
func TestOptionKinds(t *testing.T) {
	var serverOnly, keys, client []any
	for _, o := range []singleton.ServerOption{
		singleton.WithPolicy(singleton.Skip()), singleton.WithLimit(2), middleware.WithLimit(2),
		singleton.WithTTL(time.Second), singleton.WithLockerOptions(), singleton.WithAsyncRelease(), singleton.WithRedis(nil),
	} {
		serverOnly = append(serverOnly, o)
	}
	for _, o := range []singleton.Option{
		singleton.KeyByType(), singleton.KeyByTaskID(), singleton.KeyByPayload(), singleton.KeyByFields("a"),
		singleton.PerQueue(), singleton.ForTypes("a"),
	} {
		keys = append(keys, o)
	}
	for _, o := range []singleton.ClientOption{
		singleton.Unique(nil, singleton.UntilStarted, time.Second), singleton.Debounce(nil, time.Second, 0), singleton.ParkAtEnqueue(nil, 0),
	} {
		client = append(client, o)
	}
	for _, o := range serverOnly {
		_, isClient := o.(singleton.ClientOption)
		require.False(t, isClient, "%T is a server option only", o)
	}
	for _, o := range keys {
		_, isClient := o.(singleton.ClientOption)
		_, isServer := o.(singleton.ServerOption)
		require.True(t, isClient && isServer, "%T is a key option, of both sides", o)
	}
	for _, o := range client {
		_, isServer := o.(singleton.ServerOption)
		require.False(t, isServer, "%T is a Client option only", o)
	}

	_, err := singleton.New(nil)
	require.ErrorIs(t, err, singleton.ErrInvalid)
	var nilClient *redis.Client
	_, err = singleton.New(nilClient)
	require.ErrorIs(t, err, singleton.ErrInvalid)

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err = singleton.New(rdb, singleton.WithLimit(0))
	require.ErrorIs(t, err, singleton.ErrInvalid)
	l, err := lockkit.NewRedis(rdb)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	_, err = singleton.Middleware(l, singleton.WithLockerOptions(lockkit.WithPrefix("x:")))
	require.ErrorIs(t, err, singleton.ErrInvalid)
	require.ErrorContains(t, err, "WithLockerOptions")
	_, err = middleware.New(l, singleton.KeyByFields("tenant_id"))
	require.ErrorIs(t, err, middleware.ErrInvalid, "a singleton option is not middleware.New's")
	require.ErrorContains(t, err, "package singleton")
	_, err = singleton.Middleware(l, middleware.WithPolicy(middleware.Requeue(time.Second)))
	require.ErrorIs(t, err, singleton.ErrInvalid, "middleware's options are the server's: Requeue needs WithRedis")
	require.ErrorContains(t, err, "WithRedis")

	var cfg asynq.Config
	var called atomic.Bool
	cfg.IsFailure = func(error) bool { called.Store(true); return false }
	g, err := singleton.New(rdb)
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	g.Configure(&cfg)
	_, err = g.Client(asynq.NewClientFromRedisClient(rdb), singleton.KeyByTaskID())
	require.ErrorIs(t, err, singleton.ErrInvalid, "the Guard's Client derives keys with New's key options")
	require.False(t, cfg.IsFailure(errors.New("x")))
	require.True(t, called.Load(), "Configure wraps the program's IsFailure")
	require.NotNil(t, cfg.RetryDelayFunc)
	require.PanicsWithValue(t, "singleton: Guard.Configure(nil): pass the address of the asynq.Config", func() { g.Configure(nil) })
}

// A Guard whose middleware runs more than one task of a key at once
// (WithLimit(n > 1)) refuses a Client with ParkAtEnqueue when it is built:
// the middleware would refuse, and asynq archive, every task it enqueues.
// With the default limit the Client is built.
func TestGuardClientRefusesParkAtEnqueueUnderAHigherLimit(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	g, err := singleton.New(rdb, singleton.KeyByFields("tenant_id"), singleton.WithLimit(2),
		singleton.WithPolicy(middleware.Requeue(time.Second)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	_, err = g.Client(asynq.NewClientFromRedisClient(rdb), singleton.ParkAtEnqueue(nil, 0))
	require.ErrorIs(t, err, singleton.ErrInvalid)
	require.ErrorContains(t, err, "ParkAtEnqueue")
	require.ErrorContains(t, err, "WithLimit(2)")
	_, err = g.Client(asynq.NewClientFromRedisClient(rdb), singleton.Unique(nil, singleton.UntilExecuted, time.Minute))
	require.NoError(t, err, "other Client options are not concerned")

	one, err := singleton.New(rdb, singleton.KeyByFields("tenant_id"), singleton.WithPolicy(middleware.Requeue(time.Second)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = one.Close(context.Background()) })
	_, err = one.Client(asynq.NewClientFromRedisClient(rdb), singleton.ParkAtEnqueue(nil, 0))
	require.NoError(t, err)
}
