package singleton

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/internal/guard"
)

// ErrNoRetryHooks is matched by the error event a middleware whose policy
// requeues reports, once, when the asynq servers it runs in have an
// asynq.Config whose IsFailure or RetryDelayFunc ServerConfig did not
// wrap: its
// requeued duplicates then count as failures and use up retries, or come
// back only after asynq's default retry delay. It is reported as soon as
// asynq has put back the first duplicate without them, and the message
// names the hooks missing; checking costs one Redis read, until a put back
// was seen by both hooks.
var ErrNoRetryHooks = errors.New("singleton: the asynq server config was not made by singleton.ServerConfig")

// ServerConfig returns a copy of cfg whose IsFailure and RetryDelayFunc
// are wrapped, so that the duplicates a middleware puts back are retried
// free and after the policy's delay, while every other error is still
// decided by cfg's own functions (asynq's defaults when nil): set those
// first, then call ServerConfig. Use it for every server that runs a
// middleware whose policy can requeue:
//
//	srv := asynq.NewServer(redisOpt, singleton.ServerConfig(asynq.Config{Concurrency: 10}))
//
// The IsFailure it sets reports a duplicate put back by Requeue as no
// failure, so that asynq neither increments its Retried count nor counts
// it in the queue's failure stats (a nil cfg.IsFailure: every other
// non-nil error is a failure). Without it a requeued duplicate that still
// has retries left is retried as a failure and uses one retry; once none
// is left Requeue enqueues a copy, so it is still never archived for being
// a duplicate. The RetryDelayFunc it sets retries such a duplicate after
// its RequeueError.Delay (a nil cfg.RetryDelayFunc: every other error
// after asynq.DefaultRetryDelayFunc). asynq moves due retries back to
// their queue every asynq.Config.DelayedTaskCheckInterval (5s by default)
// and schedules them in whole seconds, so a shorter requeue delay waits
// that long.
func ServerConfig(cfg asynq.Config) asynq.Config {
	cfg.IsFailure = isFailure(cfg.IsFailure)
	cfg.RetryDelayFunc = retryDelay(cfg.RetryDelayFunc)
	return cfg
}

// hookCheck tells whether asynq called isFailure and retryDelay on the
// duplicates a middleware put back through its retry.
type hookCheck struct {
	isFailure, retryDelay atomic.Bool // a hook saw a put back
	checking              atomic.Bool // a put back is being checked
	warned                atomic.Bool
}

// putBackSeen records which hooks saw one put back.
type putBackSeen struct{ isFailure, retryDelay atomic.Bool }

// saw records that a hook was called with e.
func (e *RequeueError) saw(hook func(*hookCheck) *atomic.Bool, seen func(*putBackSeen) *atomic.Bool) {
	if e.hooks != nil {
		hook(e.hooks).Store(true)
	}
	if e.seen != nil {
		seen(e.seen).Store(true)
	}
}

// putBack records that re, for task id of queue, is returned to asynq for
// a retry. Until a put back was seen by both hooks, it checks one put back
// at a time, once asynq is done with the delivery (its ctx ends after
// asynq's retry was written, and the hooks run before that write): when
// the task waits in its retry set and a hook did not see it, asynq retried
// it without that hook, and an error event reports it, once. A delivery
// that asynq did not retry (shutdown, a lost worker lease) proves nothing:
// the next put back is checked.
func (m *guarded) putBack(ctx context.Context, re *RequeueError, queue, id string) {
	h := m.hooks
	re.hooks = h
	if (h.isFailure.Load() && h.retryDelay.Load()) || h.warned.Load() || m.rdb == nil || !h.checking.CompareAndSwap(false, true) {
		return
	}
	seen := &putBackSeen{}
	re.seen = seen
	job := re.Duplicate.Job
	context.AfterFunc(ctx, func() {
		defer h.checking.Store(false)
		cctx, cancel := context.WithTimeout(context.Background(), resumeTimeout)
		defer cancel()
		// The state first: asynq calls the hooks before it writes it.
		states, err := readTaskStates(cctx, m.rdb, queue, []string{id})
		if err != nil || states[0] != "retry" || (seen.isFailure.Load() && seen.retryDelay.Load()) || !h.warned.CompareAndSwap(false, true) {
			return
		}
		var missing []string
		if !seen.isFailure.Load() {
			missing = append(missing, "IsFailure (each requeue counts as a failure and uses a retry)")
		}
		if !seen.retryDelay.Load() {
			missing = append(missing, "RetryDelayFunc (a requeued duplicate waits asynq's retry delay, not the policy's)")
		}
		err = fmt.Errorf("%w: %s unwrapped; build the servers' config with singleton.ServerConfig (or Guard.Configure)", ErrNoRetryHooks, strings.Join(missing, " and "))
		guard.Emit(m.guard, cctx, guard.Event{Kind: guard.EventError, Job: job, Err: err})
	})
}
