package singleton_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// ServerConfig wraps the config's own IsFailure and RetryDelayFunc: a
// requeued duplicate is no failure and comes back after the policy's
// delay; every other error is still the config's own functions' to decide.
// The caller's config is not changed.
func TestServerConfigKeepsTheCallersHooks(t *testing.T) {
	var asked []string
	own := asynq.Config{
		Concurrency: 3,
		IsFailure:   func(err error) bool { asked = append(asked, "IsFailure"); return false },
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration {
			asked = append(asked, "RetryDelayFunc")
			return time.Minute
		},
	}
	cfg := singleton.ServerConfig(own)
	require.Equal(t, 3, cfg.Concurrency)
	re := &singleton.RequeueError{Duplicate: &middleware.DuplicateError{}, Delay: 7 * time.Second}
	require.False(t, cfg.IsFailure(re))
	require.Equal(t, 7*time.Second, cfg.RetryDelayFunc(1, re, nil))
	require.Empty(t, asked)
	other := errors.New("boom")
	require.False(t, cfg.IsFailure(other))
	require.Equal(t, time.Minute, cfg.RetryDelayFunc(1, other, nil))
	require.Equal(t, []string{"IsFailure", "RetryDelayFunc"}, asked)
	asked = nil
	require.False(t, own.IsFailure(re), "the caller's own functions are unchanged")
	require.Equal(t, time.Minute, own.RetryDelayFunc(1, re, nil))
	require.Equal(t, []string{"IsFailure", "RetryDelayFunc"}, asked)

	def := singleton.ServerConfig(asynq.Config{})
	require.True(t, def.IsFailure(other), "asynq's default IsFailure")
	require.False(t, def.IsFailure(re))
}

// A middleware whose policy requeues, run by a server whose config
// ServerConfig did not make, reports it once with an
// error event (logged at Warn) naming both hooks; with ServerConfig it
// reports nothing.
func TestRequeueWithoutHooksIsReported(t *testing.T) {
	for _, c := range []struct {
		name  string
		hooks bool
	}{{"missing", false}, {"ServerConfig", true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnvOn(t, standalone)
			// A parked duplicate comes back by itself when the holder's
			// lease would run out unrenewed: a short one, renewed.
			ev, mw := requeueBehindAHeldKey(t, e, time.Second)
			cfg := e.config(2)
			// The server's own: each error back after a second (asynq's
			// forwarder rounds to whole seconds).
			cfg.IsFailure = nil
			cfg.RetryDelayFunc = func(int, error, *asynq.Task) time.Duration { return time.Second }
			if c.hooks {
				cfg = singleton.ServerConfig(cfg)
			}
			e.start(cfg, mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })))
			e.Enqueue(asynq.NewTask("report", nil))

			reported := func() []error {
				var out []error
				for _, err := range ev.errs(middleware.EventError) {
					if errors.Is(err, singleton.ErrNoRetryHooks) {
						out = append(out, err)
					}
				}
				return out
			}
			if c.hooks {
				ev.waitRequeued(t, 3, "requeued three times, over more than a second")
				require.Empty(t, reported())
				return
			}
			require.Eventually(t, func() bool { return len(reported()) > 0 }, 10*time.Second, 5*time.Millisecond)
			n := ev.count(middleware.EventRequeued, 0)
			ev.waitRequeued(t, n+2)
			require.Len(t, reported(), 1, "reported once")
			require.ErrorContains(t, reported()[0], "IsFailure (")
			require.ErrorContains(t, reported()[0], "RetryDelayFunc (")
			require.ErrorContains(t, reported()[0], "singleton.ServerConfig")
		})
	}
}

// A server whose config lacks one of the hooks is reported at the first
// duplicate put back, however soon the test stops: a single duplicate,
// parked behind a key held for a minute, is put back once, and the error
// event names what is missing.
func TestMissingHookIsReportedAtTheFirstPutBack(t *testing.T) {
	for _, c := range []struct {
		name                 string
		isFailure, retryWith bool
		want, notWant        []string
	}{
		{"both missing", false, false, []string{"IsFailure (", "RetryDelayFunc ("}, nil},
		{"IsFailure missing", false, true, []string{"IsFailure ("}, []string{"RetryDelayFunc ("}},
		{"RetryDelay missing", true, false, []string{"RetryDelayFunc ("}, []string{"IsFailure ("}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnvOn(t, standalone)
			ev, mw := requeueBehindAHeldKey(t, e, time.Minute)
			cfg := e.config(2) // with both hooks
			if !c.isFailure {
				cfg.IsFailure = nil
			}
			if !c.retryWith {
				cfg.RetryDelayFunc = nil
			}
			e.start(cfg, mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })))
			e.Enqueue(asynq.NewTask("report", nil))

			var reported error
			require.Eventually(t, func() bool {
				for _, err := range ev.errs(middleware.EventError) {
					if errors.Is(err, singleton.ErrNoRetryHooks) {
						reported = err
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond)
			require.Equal(t, 1, ev.count(middleware.EventRequeued, 0), "at the first put back")
			for _, w := range c.want {
				require.ErrorContains(t, reported, w)
			}
			for _, w := range c.notWant {
				require.NotContains(t, reported.Error(), w)
			}
		})
	}
}

// requeueBehindAHeldKey holds the key of "report" tasks with a lease of
// ttl, renewed until the test ends, and returns a middleware that requeues
// duplicates after a second, with the events it reports.
func requeueBehindAHeldKey(t *testing.T, e *env, ttl time.Duration) (*events, asynq.MiddlewareFunc) {
	t.Helper()
	lease, err := e.locker().TryAcquire(context.Background(), "asynq:report", &lockkit.AcquireOptions{TTL: ttl})
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	ev := &events{}
	mw, err := singleton.Middleware(e.locker(),
		singleton.WithPolicy(middleware.Requeue(time.Second)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	return ev, mw
}
