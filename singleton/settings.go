package singleton

import (
	"context"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/middleware"
)

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
//   - WithLimit: servers that give a key different limits (a rolling
//     deploy) never let it run more tasks at once than the smallest limit
//     among its running tasks allows (see WithLimitFunc); above 1 a task
//     enqueued with ParkAtEnqueue is refused, and so is ParkAtEnqueue by
//     Guard.Client.
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
//
// WithLimitFunc is middleware.WithLimitFunc in asynq's terms (below).
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

// WithLimitFunc gives each task its own limit: fn(ctx, t) is how many tasks
// of t's key may run at once while t runs (premium tenants 10, the others
// 1), called once per delivery after the key is derived, with the
// handler's ctx. It is middleware.WithLimitFunc in asynq's terms, which
// says how servers and tasks that give one key different limits share it:
// the key never runs more tasks at once than the smallest limit among its
// running tasks allows, and nobody deadlocks. Tasks of several types whose
// key options derive the same key share it, each with its own limit. fn
// returning less than 1 or more than 10,000 fails that task as a key that
// cannot be derived does: an error matching ErrInvalid and asynq.SkipRetry
// (asynq archives it) that names the task type, the key and the value,
// reported as an EventError and in the decision log (under WithShadow the
// task runs and the error is reported). A task enqueued with ParkAtEnqueue
// whose limit is above 1 is refused (ErrInvalid), and Guard.Client refuses
// ParkAtEnqueue; a duplicate is parked for its key (Requeue) only when its
// limit is 1, and the end of any run of the key starts it. New and
// Middleware refuse it with Coalesce, KeepNewest and Preempt, and a nil fn
// (ErrInvalid). It replaces a WithLimit given before it. Defaults to none:
// every task has WithLimit's limit.
func WithLimitFunc(fn func(ctx context.Context, t *asynq.Task) int) ServerOption {
	return limitOpt{fn: fn}
}

// WithExtraKeys makes each task hold other keys besides its own while its
// handler runs, each under its own limit: fn(ctx, t) maps each key to how
// many tasks may hold it at once ({"api:github": 20} for every task that
// calls that API, whatever its own key), called once per delivery after
// the key is derived, with the handler's ctx. It is
// middleware.WithExtraKeys in asynq's terms, which says how the keys are
// taken (all or none; under Skip, Fail and Requeue the task's own key
// first, then the others in the order of their names, each tried once;
// under Wait all of them in the order of their names, so that no two tasks
// deadlock) and what each policy does when one is full: under Requeue such
// a task is not parked, and comes back after the policy's delay. The keys are given as they are (the Locker's prefix
// applies; PerQueue does not). A map with an empty key, the task's own
// key, or a limit outside 1 to 10,000 fails that task as a key that cannot
// be derived does: an error matching ErrInvalid and asynq.SkipRetry (asynq
// archives it) naming the task type, the key and the bad value, reported
// as an EventError and in the decision log. New and Middleware refuse a
// nil fn, and Coalesce, KeepNewest, Preempt and WaitInOrder (ErrInvalid).
// Defaults to none: a task holds its own key only.
func WithExtraKeys(fn func(ctx context.Context, t *asynq.Task) map[string]int) ServerOption {
	return extraOpt{fn: fn}
}

// extraOpt is WithExtraKeys: the guard's WithExtraKeys, whose function
// finds the task in its ctx (taskKey).
type extraOpt struct {
	fn func(ctx context.Context, t *asynq.Task) map[string]int
}

func (o extraOpt) Apply(s *guard.Settings) {
	if _, ok := s.Adapter.(*config); !ok {
		applyServer(s, nil) // refused: an option of this package
		return
	}
	var fn func(context.Context, guard.Job) map[string]int
	if o.fn != nil {
		fn = func(ctx context.Context, _ guard.Job) map[string]int {
			t, _ := ctx.Value(taskKey{}).(*asynq.Task)
			return o.fn(ctx, t)
		}
	}
	guard.WithExtraKeys(fn).Apply(s)
}

// limitOpt is WithLimitFunc: the guard's WithLimitFunc, whose function finds
// the task in its ctx (taskKey).
type limitOpt struct {
	fn func(ctx context.Context, t *asynq.Task) int
}

func (o limitOpt) Apply(s *guard.Settings) {
	if _, ok := s.Adapter.(*config); !ok {
		applyServer(s, nil) // refused: an option of this package
		return
	}
	var fn func(context.Context, guard.Job) int
	if o.fn != nil {
		fn = func(ctx context.Context, _ guard.Job) int {
			t, _ := ctx.Value(taskKey{}).(*asynq.Task)
			return o.fn(ctx, t)
		}
	}
	guard.WithLimitFunc(fn).Apply(s)
}

// taskKey is the ctx key under which the middleware gives WithLimitFunc's
// and WithExtraKeys's functions the task.
type taskKey struct{}
