package singleton

import "github.com/jobguard/jobguard/middleware"

// The guard's settings and policies, declared and documented in package
// middleware, reachable from here so that the asynq side needs one import:
//
//	g, err := singleton.New(rdb, singleton.KeyByFields("tenant_id"), singleton.WithPolicy(singleton.Requeue(time.Second)))
//
// What they mean for asynq tasks, besides what middleware says:
//   - WithPolicy: a policy that can requeue (Requeue, a Wait ending in
//     Requeue, and Coalesce, KeepNewest or Preempt with WithThrottle) needs
//     WithRedis, which New gives; a requeued duplicate is parked for its key
//     and started by the run that frees it (see WithRedis). Defaults to Skip.
//   - WithLimit: every server must use the same limit for a key; above 1 a
//     task enqueued with ParkAtEnqueue is refused, and so is ParkAtEnqueue
//     by Guard.Client.
//   - WithThrottle: ActionRequeue puts a throttled task back to run when the
//     key's next start opens, which needs WithRedis.
//   - WithTTL: asynq re-delivers a crashed worker's task only after its own
//     30 s worker lease has expired and its recoverer has run, so with the
//     Locker's 30 s the key is free by then.
//   - WithLogger: besides the guard's lines, every task that completes
//     without running is logged at Info with the reason and, where known,
//     the run or task that covers it: at most one line per key per second,
//     the next one counting the lines left out.
//   - WithObserver: the events include EventRequeued (Event.Delay) and
//     EventError for a key that cannot be derived.
//   - WithShadow: nothing is archived either: a task the middleware would
//     refuse (ErrKey, ErrKeyMismatch, or parked at enqueue under
//     WithLimit(n > 1), whose reservation is given back) runs too, without a
//     lease, reported as an EventShadowed with ActionFail and the refusal as
//     Event.Err, and with WithRedis in the decision log (reason
//     would_archive). It is counted by jobguardprom (shadowed_total) and
//     jobguardotel (jobguard.shadowed).
var (
	WithPolicy       = middleware.WithPolicy
	WithLimit        = middleware.WithLimit
	WithThrottle     = middleware.WithThrottle
	WithHoldAtLeast  = middleware.WithHoldAtLeast
	WithAsyncRelease = middleware.WithAsyncRelease
	WithTTL          = middleware.WithTTL
	WithLogger       = middleware.WithLogger
	WithObserver     = middleware.WithObserver
	WithShadow       = middleware.WithShadow

	Skip        = middleware.Skip
	Fail        = middleware.Fail
	Requeue     = middleware.Requeue
	Wait        = middleware.Wait
	WaitInOrder = middleware.WaitInOrder
	Coalesce    = middleware.Coalesce
	KeepNewest  = middleware.KeepNewest
	Preempt     = middleware.Preempt
)

// The actions of WithThrottle (middleware's Action values).
const (
	ActionSkip    = middleware.ActionSkip
	ActionRequeue = middleware.ActionRequeue
)
