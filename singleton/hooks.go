package singleton

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/middleware"
)

// ErrNoRetryHooks is matched by the error event a middleware whose policy
// requeues reports, once, when the asynq servers it runs in lack
// IsFailure or RetryDelay in their asynq.Config (see ServerConfig): its
// requeued duplicates then count as failures and use up retries, or come
// back only after asynq's default retry delay.
var ErrNoRetryHooks = errors.New("singleton: the asynq server config lacks singleton.IsFailure or singleton.RetryDelay")

// hookGrace is how long after a duplicate was put back through asynq's
// retry the hooks must have seen one: asynq calls them as soon as the
// handler returns.
const hookGrace = time.Second

// ServerConfig returns a copy of cfg whose IsFailure and RetryDelayFunc are
// wrapped with IsFailure and RetryDelay, so that the duplicates a middleware
// puts back are retried free and after the policy's delay, while every
// other error is still decided by cfg's own functions (asynq's defaults
// when nil). Use it for every server that runs a middleware whose policy
// can requeue:
//
//	srv := asynq.NewServer(redisOpt, singleton.ServerConfig(asynq.Config{Concurrency: 10}))
func ServerConfig(cfg asynq.Config) asynq.Config {
	cfg.IsFailure = IsFailure(cfg.IsFailure)
	cfg.RetryDelayFunc = RetryDelay(cfg.RetryDelayFunc)
	return cfg
}

// hookCheck tells whether asynq called IsFailure and RetryDelay on the
// duplicates a middleware put back through its retry.
type hookCheck struct {
	isFailure, retryDelay atomic.Bool
	first                 atomic.Int64 // when the first duplicate was put back (Unix ns); 0 before
	warned                atomic.Bool
}

// saw records that a hook was called with e.
func (e *RequeueError) saw(hook func(*hookCheck) *atomic.Bool) {
	if e.hooks != nil {
		hook(e.hooks).Store(true)
	}
}

// putBack records that re is returned to asynq for a retry, and reports an
// error event, once, when a duplicate put back more than hookGrace ago was
// seen by neither or only one of the hooks.
func (m *guarded) putBack(ctx context.Context, re *RequeueError) {
	h := m.hooks
	re.hooks = h
	now := time.Now().UnixNano()
	h.first.CompareAndSwap(0, now)
	if (h.isFailure.Load() && h.retryDelay.Load()) || now-h.first.Load() < int64(hookGrace) || !h.warned.CompareAndSwap(false, true) {
		return
	}
	var missing []string
	if !h.isFailure.Load() {
		missing = append(missing, "IsFailure: singleton.IsFailure (each requeue counts as a failure and uses a retry)")
	}
	if !h.retryDelay.Load() {
		missing = append(missing, "RetryDelayFunc: singleton.RetryDelay (a requeued duplicate waits asynq's retry delay, not the policy's)")
	}
	err := fmt.Errorf("%w: asynq.Config lacks %s; build the servers' config with singleton.ServerConfig", ErrNoRetryHooks, strings.Join(missing, " and "))
	m.guard.Emit(ctx, middleware.Event{Kind: middleware.EventError, Job: re.Duplicate.Job, Err: err})
}
