package cronguard

import "github.com/jobguard/jobguard/middleware"

// The guard's settings and policies that a cron entry uses, declared and
// documented in package middleware (which has the others: WithShadow,
// WithHoldAtLeast, WithThrottle with ActionSkip, WithAsyncRelease),
// reachable from here. What they mean for a tick:
//   - WithPolicy says what a tick does while an earlier tick of the entry
//     still runs on any replica. Skip (the default) skips it
//     (EventDuplicate), as cron.SkipIfStillRunning does for one process; a
//     replica firing that tick later, after the earlier run ended, runs it:
//     still once. WaitInOrder(max, Skip()) makes it wait up to max, woken
//     when the key is released, waiting ticks running one at a time in the
//     order they fired (EventWaited), as cron.DelayIfStillRunning does, with
//     a bound (Wait(max, Skip()) lets them go in any order); a tick still
//     waiting after max is skipped. KeepNewest makes it wait as long as the
//     earlier run lasts and then run, keeping only the newest waiting tick
//     (an older one is skipped, EventDuplicate; Temporal calls it
//     BufferOne). Preempt(grace) cancels the earlier run (its ctx's cause
//     matches ErrPreempted and lockkit.ErrLost; its fencing token is
//     superseded by the new run's) and runs once it has returned, or after
//     grace (Temporal's CancelOther). A policy that requeues, fails for a
//     retry or coalesces is refused (ErrInvalid): cron runs a tick once.
//   - WithLimit(n) lets up to n ticks of the entry run at once across the
//     fleet (the key is a semaphore of n slots); the epoch still lets each
//     tick run once, and a tick that finds n runs going is skipped.
//   - WithTTL: the lease is renewed every TTL/3 while the job runs, and the
//     entry of a replica that dies mid-run is free again at most this long
//     after its last renewal.
//   - WithObserver: Tick(ctx) gives the tick inside the observer.
var (
	WithPolicy   = middleware.WithPolicy
	WithLimit    = middleware.WithLimit
	WithTTL      = middleware.WithTTL
	WithObserver = middleware.WithObserver

	Skip        = middleware.Skip
	Wait        = middleware.Wait
	WaitInOrder = middleware.WaitInOrder
	KeepNewest  = middleware.KeepNewest
	Preempt     = middleware.Preempt
)
