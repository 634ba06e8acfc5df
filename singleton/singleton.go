package singleton

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/debounce"
	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/invalid"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// copyHeader is the task header that a copy enqueued by Requeue carries: an
// ID of the enqueue that made it. A conflict on the copy's task ID is taken
// for that enqueue's own earlier run (go-redis sends a script again after a
// lost reply) only when the task there carries the same value.
const copyHeader = "jobguard-copy"

// Errors returned by the guard. Compare with errors.Is.
var (
	// ErrKey is matched by the error a task fails with when its key cannot be
	// derived: the payload is not JSON, a field is missing or empty, a KeyFunc
	// failed or returned "". The error also matches asynq.SkipRetry, so asynq
	// archives the task, and its message names the task type and the reason.
	// Under WithShadow the task runs instead, and the error is reported.
	ErrKey = errors.New("singleton: cannot derive key")
	// ErrInvalid is matched by every error Middleware returns for an invalid
	// option; it also matches lockkit.ErrInvalid. The message names the option
	// and the bad value.
	ErrInvalid = invalid.New("singleton: invalid option")
)

// ServerOption configures the server side (New, Middleware): a key option
// (KeyByType, KeyByTaskID, KeyByPayload, KeyByFields, KeyFunc, PerQueue,
// ForTypes), which New also hands to Guard.Client; WithRedis,
// WithDecisionLog, WithLockerOptions; or one of the guard's settings, which
// are package middleware's options (WithPolicy, WithLimit, WithThrottle,
// WithShadow, ... below). It is middleware.Option: middleware.New refuses
// this package's own with ErrInvalid.
type ServerOption = middleware.Option

// ClientOption configures what a Client does at enqueue: Unique, Debounce or
// ParkAtEnqueue, and for NewClient the key options.
type ClientOption interface{ applyClient(*config) }

// Option is an option of both sides, which New, Middleware and NewClient
// take: a key option (KeyByType, KeyByTaskID, KeyByPayload, KeyByFields,
// KeyFunc, PerQueue, ForTypes), so that the server and the Client derive the
// same key, or WithDecisionLog.
type Option interface {
	ServerOption
	ClientOption
}

// keyOpt is a key option: the server and the Client derive keys with it.
type keyOpt func(*config)

func (o keyOpt) Apply(s *guard.Settings) { applyServer(s, o) }
func (o keyOpt) applyClient(c *config)   { o(c) }

// serverOpt is an option of the server side only.
type serverOpt func(*config)

func (o serverOpt) Apply(s *guard.Settings) { applyServer(s, o) }

// clientOpt is an option of the Client only.
type clientOpt func(*config)

func (o clientOpt) applyClient(c *config) { o(c) }

// applyServer applies one of this package's server options to the config
// that s collects for; another package's constructor refuses it.
func applyServer(s *guard.Settings, f func(*config)) {
	c, ok := s.Adapter.(*config)
	if !ok {
		s.Refuse(errors.New("an option of package singleton (a key option, ForTypes, PerQueue, WithRedis, WithDecisionLog, WithLimitFunc or WithLockerOptions) is not an option of this constructor"))
		return
	}
	f(c)
}

// serverConfig applies opts to a new config; c.guard holds the guard's
// settings among them.
func serverConfig(opts []ServerOption) *config {
	c := &config{}
	c.guard = &guard.Settings{Adapter: c}
	for _, o := range opts {
		if o != nil {
			o.Apply(c.guard)
		}
	}
	return c
}

type keyFunc func(ctx context.Context, t *asynq.Task) (string, error)

type keySpec struct {
	name string // the option as the user wrote it, for errors
	fn   keyFunc
	err  error
}

type config struct {
	keys     []keySpec
	perQueue bool
	types    []string
	typesSet bool
	guard    *guard.Settings // what the server options collected for the guard
	rdb      redis.UniversalClient
	rdbSet   bool
	unique   *uniqueSpec // a Client option
	debounce *debounceSpec
	park     *parkSpec

	lockerOpts    []lockkit.Option // WithLockerOptions: New's only
	lockerOptsSet bool
	decisions     int // WithDecisionLog
	decisionsSet  bool
}

// WithRedis sets the Redis that the asynq servers use. Requeue enqueues the
// copy of a duplicate with no retries left through it (with an asynq.Client
// and Inspector made from it, which hold no goroutines and are never closed).
// With it, duplicates under Requeue and the follow-ups of KeepNewest and
// Coalesce are parked for their key (a *RequeueError that asynq retries
// after a backstop of 30 seconds, or the policy's delay if longer, sooner
// for the next in line of a key whose holder's lease would run out
// unrenewed; build the servers' asynq.Config with ServerConfig) and
// started by the run that frees the key, instead of waiting on a worker. Required when the policy can requeue; must not be
// nil. Defaults to none.
func WithRedis(client redis.UniversalClient) ServerOption {
	return serverOpt(func(c *config) { c.rdb, c.rdbSet = client, true })
}

// ForTypes guards only the tasks of the listed types; tasks of other types
// run unguarded. At least one non-empty type is required. Defaults to every
// task the middleware wraps.
func ForTypes(types ...string) Option {
	return keyOpt(func(c *config) { c.types, c.typesSet = append(c.types, types...), true })
}

// PerQueue scopes the key to the queue the task came from: "@<queue>" is
// appended to whatever key the key option derives, so the same work in two
// queues does not conflict. Defaults to off (one key across all queues).
func PerQueue() Option { return keyOpt(func(c *config) { c.perQueue = true }) }

// Middleware returns an asynq.MiddlewareFunc that runs each task under a lease
// on its key, taken from locker. Use it with mux.Use(m) for every handler of a
// ServeMux or as m(handler) around one handler; mux.Use(a, b) runs a(b(h)).
//
// Without options the key is the task type, a duplicate is skipped, one task
// per key runs at a time, and the lease TTL and the logger are the Locker's
// (see lockkit.WithTTL and lockkit.WithLogger). Middleware returns an error
// matching ErrInvalid, naming the option and the value, for a nil locker or
// an invalid option; it never panics on options.
//
// A re-delivery of a task whose earlier delivery still holds the key (same
// task ID, or the original of a Requeue copy) is never a duplicate: it waits
// for that run, whatever the policy, bounded by its ctx. If that run succeeded
// after asynq had given up on it, the work is done and the re-delivery
// completes without running (middleware.ReasonCompleted); otherwise it runs.
// A task completes without running only then and, under Skip, when another
// task holds its key. A Redis error or an acquire whose outcome is unknown
// fails the task, so asynq retries it.
//
// The wrapped handler returns: the handler's own error when it ran (annotated
// with the loss cause if the lease was lost); nil for a skipped duplicate; a
// *middleware.DuplicateError for Fail; a *RequeueError (wrapping the
// *middleware.DuplicateError) for Requeue while the task has retries left; an
// error matching *RequeueError, middleware.ErrDuplicate and asynq.RevokeTask
// after Requeue enqueued a copy; an error matching ErrKey and
// asynq.SkipRetry for a key that cannot be derived; an error matching
// ErrKeyMismatch and asynq.SkipRetry for a task whose Client recorded
// another key than the one derived (the Client had other key options); an error matching
// ErrInvalid and asynq.SkipRetry for a task enqueued with ParkAtEnqueue
// under a limit above 1, and for a task whose WithLimitFunc limit is out of
// range (under WithShadow these run, and the error is reported: see
// WithShadow); for a handler that
// failed because a newer task preempted it (middleware.Preempt), an error
// matching middleware.ErrPreempted and asynq.RevokeTask, so the task is neither
// retried nor archived; for a handler that failed after an operator
// cancelled its run (lockkit's Locker.CancelRun: the key stays held until
// the handler returns, then goes to the next task), an error matching
// lockkit.ErrCancelled and asynq.RevokeTask (its Unique reservation ends
// with the run); a lockkit error when the
// lease could not be taken (Redis unreachable), which asynq retries.
func Middleware(locker *lockkit.Locker, opts ...ServerOption) (asynq.MiddlewareFunc, error) {
	if locker == nil {
		return nil, fmt.Errorf("%w: Middleware: locker is nil", ErrInvalid)
	}
	c := serverConfig(opts)
	m, err := c.build(locker)
	if err != nil {
		return nil, err
	}
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			return m.process(ctx, next, t)
		})
	}, nil
}

// build validates c and returns the middleware it describes.
func (c *config) build(locker *lockkit.Locker) (*guarded, error) {
	if c.lockerOptsSet {
		return nil, fmt.Errorf("%w: WithLockerOptions: it is an option of New, which makes the Locker; Middleware is given one", ErrInvalid)
	}
	m, err := c.buildKeys()
	if err != nil {
		return nil, err
	}
	return c.buildGuard(m, locker)
}

// buildKeys validates the key and type options.
func (c *config) buildKeys() (*guarded, error) {
	m := &guarded{perQueue: c.perQueue, key: keyByType}
	switch len(c.keys) {
	case 0:
	case 1:
		if c.keys[0].err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, c.keys[0].name, c.keys[0].err)
		}
		m.key, m.keyName = c.keys[0].fn, c.keys[0].name
	default:
		names := make([]string, len(c.keys))
		for i, k := range c.keys {
			names[i] = k.name
		}
		return nil, fmt.Errorf("%w: %s: give one key option", ErrInvalid, strings.Join(names, ", "))
	}
	if c.typesSet {
		if len(c.types) == 0 {
			return nil, fmt.Errorf("%w: ForTypes(): no task type given", ErrInvalid)
		}
		m.types = make(map[string]bool, len(c.types))
		for _, t := range c.types {
			if strings.TrimSpace(t) == "" {
				return nil, fmt.Errorf("%w: ForTypes(%q): task type is empty", ErrInvalid, t)
			}
			m.types[t] = true
		}
	}
	return m, nil
}

// buildGuard adds the guard to m.
func (c *config) buildGuard(m *guarded, locker *lockkit.Locker) (*guarded, error) {
	if c.rdbSet && c.rdb == nil {
		return nil, fmt.Errorf("%w: WithRedis(nil): client is nil", ErrInvalid)
	}
	opts := []guard.Option{c.guard}
	if c.rdb != nil {
		m.inspector = asynq.NewInspectorFromRedisClient(c.rdb)
		m.rdb = c.rdb
	}
	if c.rdb != nil {
		opts = append(opts[:len(opts):len(opts)], guard.WithParking(m.parking()), guard.WithDone(m.ranBefore))
	}
	core, err := lockcore.Of("Middleware", locker)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	m.core = core
	client, prefix := core.Redis()
	m.requests, _ = debounce.New(client, debounce.WithPrefix(prefix)) // a Locker's client is not nil
	opts = append(opts[:len(opts):len(opts)], guard.WithAdmit(m.admitNewest))
	g, err := guard.New(locker, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	set := guard.ConfigOf(g)
	if set.Throttled && set.ThrottleThen == guard.ActionRequeue && c.rdb == nil {
		return nil, fmt.Errorf("%w: WithThrottle(..., requeue): requeueing needs WithRedis(client) to re-enqueue tasks that have no retries left", ErrInvalid)
	}
	if set.Throttled && c.rdb == nil && guard.ModeOf(set.Policy) != guard.ModeAction {
		// A follow-up throttled when it gets the key is put back whatever
		// the throttle's action (other tasks folded into it or gave way).
		return nil, fmt.Errorf("%w: WithThrottle with WithPolicy(%s): a throttled follow-up is requeued, which needs WithRedis(client) to re-enqueue tasks that have no retries left", ErrInvalid, set.Policy)
	}
	if guard.ActionOf(set.Policy) == guard.ActionRequeue && c.rdb == nil {
		return nil, fmt.Errorf("%w: WithPolicy(%s): a policy that requeues needs WithRedis(client) to re-enqueue duplicates that have no retries left", ErrInvalid, set.Policy)
	}
	m.guard, m.limit, m.limitFunc, m.extraKeys, m.shadow = g, set.Limit, set.LimitFunc, set.ExtraKeys, set.Shadow
	m.decisions = defaultDecisionLogLen
	if c.decisionsSet {
		switch {
		case c.decisions < 0:
			return nil, fmt.Errorf("%w: WithDecisionLog(%d): want 0 (none) or more entries", ErrInvalid, c.decisions)
		case c.decisions > 0 && c.rdb == nil:
			return nil, fmt.Errorf("%w: WithDecisionLog(%d): the log is written to the servers' Redis, which needs WithRedis(client)", ErrInvalid, c.decisions)
		}
		m.decisions = c.decisions
	}
	m.skips, m.hooks = newSkipLog(set.Logger), &hookCheck{}
	if c.rdb != nil {
		m.client = asynq.NewClientFromRedisClient(c.rdb)
	}
	return m, nil
}

// guarded is a built guard.
type guarded struct {
	guard     *guard.Guard
	core      *lockcore.RedisLocker // the engine under the guard's Locker
	key       keyFunc
	keyName   string // the key option as written; "" for the default
	perQueue  bool
	types     map[string]bool // nil: every type
	client    *asynq.Client
	inspector *asynq.Inspector
	requests  *debounce.Debouncer   // debounced tasks' requests, beside the leases
	rdb       redis.UniversalClient // asynq's Redis, with WithRedis
	limit     int                   // the WithLimit value; 0 when not given
	limitFunc bool                  // WithLimitFunc: each task's limit is its own
	extraKeys bool                  // WithExtraKeys: each task holds keys of its own besides its key
	shadow    bool                  // WithShadow: refused tasks run too
	skips     *skipLog
	hooks     *hookCheck
	decisions int // entries of the decision log kept; 0: none
	// onPreempted, in tests, is called before a preempted run's decision
	// looks for the task that preempted it.
	onPreempted func()
	// onResumeWait, in tests, is called each time a resume waits for the
	// parked task to be put back or enqueued.
	onResumeWait func()
}

func (m *guarded) process(ctx context.Context, next asynq.Handler, t *asynq.Task) error {
	if m.types != nil && !m.types[t.Type()] {
		return next.ProcessTask(ctx, t)
	}
	id, _ := asynq.GetTaskID(ctx)
	origin := t.Headers()[asynqkey.LabelHeader]
	if origin == "" {
		origin = id
	}
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, ok := asynq.GetMaxRetry(ctx)
	job := guard.With(guard.Job{Name: t.Type(), ID: id}, guard.Work{Label: origin, EnqueuedAt: enqueuedAt(t), Order: taskOrder(t), Reserved: t.Headers()[parkedHeader] != "", Final: ok && retried >= maxRetry})
	key, err := m.keyOf(ctx, t)
	if err != nil {
		return m.refuse(ctx, next, t, job, fmt.Errorf("%w: task %q: %w (%w)", ErrKey, t.Type(), err, asynq.SkipRetry))
	}
	job.Key = key
	if err := m.checkKey(t, job, key); err != nil {
		return m.refuse(ctx, next, t, job, err)
	}
	if m.limitFunc {
		n, err := guard.LimitOf(m.guard, context.WithValue(ctx, taskKey{}, t), job)
		if err != nil {
			return m.refuse(ctx, next, t, job, fmt.Errorf("%w: task %q: %w (%w)", ErrInvalid, t.Type(), err, asynq.SkipRetry))
		}
		w := guard.WorkOf(job)
		w.Limit = n
		job = guard.With(job, w)
	}
	if m.extraKeys {
		keys, err := guard.ExtraKeysOf(m.guard, context.WithValue(ctx, taskKey{}, t), job)
		if err != nil {
			return m.refuse(ctx, next, t, job, fmt.Errorf("%w: task %q: %w (%w)", ErrInvalid, t.Type(), err, asynq.SkipRetry))
		}
		w := guard.WorkOf(job)
		w.Extra = keys
		job = guard.With(job, w)
	}
	if guard.WorkOf(job).Reserved && m.limitOf(job) > 1 {
		return m.refuse(ctx, next, t, job, m.refuseParked(ctx, job))
	}
	if gen := debounceGen(t); gen > 0 {
		ctx = context.WithValue(ctx, genKey{}, gen)
	}
	res := m.startReservation(ctx, t, key, origin)
	out := m.guard.Run(ctx, job, func(ctx context.Context) error {
		m.started(ctx, t, key, origin)
		err := next.ProcessTask(ctx, t)
		if err == nil {
			if keep := m.takenBack(ctx, job, retried); keep > 0 {
				// asynq will deliver the task again although its work is
				// done: its success is recorded until that delivery.
				if lease, ok := lockcore.LeaseFromContext(ctx); ok {
					lease.CompleteOnSuccess(keep)
				}
			}
		}
		return err
	})
	m.endReservation(ctx, t, key, origin, res, out)
	if out.Duplicate != nil && !out.Duplicate.Parked {
		m.passOn(ctx, out.Duplicate, key, origin)
	}
	if out.Duplicate == nil {
		m.logCutShort(ctx, t, job, out)
		if out.Ran && errors.Is(out.Err, lockcore.ErrCancelled) {
			// An operator cancelled the run (lockkit's Locker.CancelRun):
			// the task is done, neither retried nor archived.
			return fmt.Errorf("singleton: task %q (key %q): an operator cancelled its run: %w (%w)", t.Type(), key, out.Err, asynq.RevokeTask)
		}
		if out.Ran && errors.Is(out.Err, lockcore.ErrPreempted) {
			// A newer task of the key took over: this one is done, neither
			// retried nor archived.
			return fmt.Errorf("singleton: task %q (key %q) was preempted by a newer task: %w (%w)", t.Type(), key, out.Err, asynq.RevokeTask)
		}
		return out.Err
	}
	switch out.Duplicate.Action {
	case guard.ActionSkip:
		m.skips.log(ctx, out.Duplicate)
		m.recordSkip(ctx, t, out.Duplicate)
		return nil
	case guard.ActionRequeue:
		return m.requeue(ctx, t, out.Duplicate)
	default:
		return out.Duplicate
	}
}

// limitOf is job's holder limit: its own (WithLimitFunc) or WithLimit's.
func (m *guarded) limitOf(job guard.Job) int {
	if n := guard.WorkOf(job).Limit; n > 0 {
		return n
	}
	return m.limit
}

// refuse fails t (job), which the middleware refuses with err, an error
// matching asynq.SkipRetry (asynq archives the task): err is reported as
// an EventError and added to the decision log (reason archived, cause err:
// one XADD, the task does not run). Under WithShadow t runs instead,
// without a lease, and what would have happened is reported: an
// EventShadowed with ActionFail and err, and a decision log entry (reason
// would_archive, cause err).
func (m *guarded) refuse(ctx context.Context, next asynq.Handler, t *asynq.Task, job guard.Job, err error) error {
	if !m.shadow {
		guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventError, Job: job, Err: err})
		if m.logsDecisions() {
			e := entryOf(ctx, t, job, decisionlog.ReasonArchived)
			e.Cause = err.Error()
			m.addDecision(ctx, job, e)
		}
		return err
	}
	guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventShadowed, Job: job, Action: guard.ActionFail, Err: err})
	if m.logsDecisions() {
		e := entryOf(ctx, t, job, decisionlog.ReasonWouldArchive)
		e.Cause = err.Error()
		m.addDecision(ctx, job, e)
	}
	return next.ProcessTask(ctx, t)
}
