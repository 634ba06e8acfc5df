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

// A middleware whose policy requeues, run by a server whose config lacks
// singleton.IsFailure and singleton.RetryDelay, reports it once with an
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
			lease, err := e.locker().TryAcquire(context.Background(), "asynq:report", &lockkit.AcquireOptions{TTL: time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { _ = lease.Release(context.Background()) })
			ev := &events{}
			mw, err := singleton.Middleware(e.locker(),
				singleton.WithPolicy(middleware.Requeue(time.Second)), singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
			require.NoError(t, err)
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
			require.ErrorContains(t, reported()[0], "IsFailure: singleton.IsFailure")
			require.ErrorContains(t, reported()[0], "RetryDelayFunc: singleton.RetryDelay")
			require.ErrorContains(t, reported()[0], "singleton.ServerConfig")
		})
	}
}
