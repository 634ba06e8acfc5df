package singleton

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
)

// Lifetime says how long a reservation that Client makes keeps a key.
type Lifetime int

// Lifetimes of a reservation.
const (
	// UntilExecuted keeps the key from the enqueue until the task has run
	// successfully, failed for the last time (asynq archives it or was told
	// to skip its retries), completed without running, or was revoked. A
	// failure that asynq retries keeps it.
	UntilExecuted Lifetime = iota + 1
	// UntilStarted keeps the key from the enqueue until the task starts: a
	// duplicate may be enqueued while the task runs.
	UntilStarted
)

var lifetimeNames = [...]string{"", "until-executed", "until-started"}

// String returns "until-executed" or "until-started".
func (l Lifetime) String() string {
	if l > 0 && int(l) < len(lifetimeNames) {
		return lifetimeNames[l]
	}
	return fmt.Sprintf("Lifetime(%d)", int(l))
}

func lifetimeOf(s string) Lifetime {
	for i, n := range lifetimeNames {
		if i > 0 && n == s {
			return Lifetime(i)
		}
	}
	return 0
}

// uniqueHeaderName is the task header in which Client records the Lifetime and
// the TTL (ms) of a task's reservation, such as "until-executed 86400000";
// the middleware takes over and ends the reservation by it.
const uniqueHeaderName = "jobguard-unique"

// defaultReserveTTL bounds a reservation when Unique is given no TTL: a
// reservation whose task is never processed ends after it.
const defaultReserveTTL = 24 * time.Hour

// enqueueGrace is how long a reservation whose task is not found yet counts
// as an enqueue in flight rather than as abandoned (a quarter of the
// reservation's TTL if that is shorter).
const enqueueGrace = 5 * time.Second

// ErrDuplicate is matched by every duplicate error of this package: the
// middleware's (it is middleware.ErrDuplicate) and a refused enqueue's
// (*DuplicateTaskError).
var ErrDuplicate = guard.ErrDuplicate

// DuplicateTaskError is returned by Client.Enqueue when the task's key is
// reserved by another task that still exists. It matches ErrDuplicate and
// asynq.ErrDuplicateTask.
type DuplicateTaskError struct {
	Key string // the task's key
	// ID, Queue and State name the task that holds the reservation; State
	// is asynq's ("pending", "active", "scheduled", "retry", ...).
	ID, Queue, State string
}

// Error implements error.
func (e *DuplicateTaskError) Error() string {
	return fmt.Sprintf("singleton: duplicate task: key %q is reserved by task %s in queue %q (%s)", e.Key, e.ID, e.Queue, e.State)
}

// Is reports whether target is ErrDuplicate or asynq.ErrDuplicateTask.
func (e *DuplicateTaskError) Is(target error) bool {
	return target == ErrDuplicate || target == asynq.ErrDuplicateTask
}

// Unique makes Client reserve each task's key when it enqueues it, on
// locker (use the Locker settings of the middleware: the same Redis and
// prefix). The key is derived by the key options, as the middleware derives
// it. An enqueue whose key is reserved by a task that still exists is
// refused with a *DuplicateTaskError; a reservation whose task no longer
// exists (deleted, archived, completed, its queue deleted) is taken over.
// life says when the reservation ends (zero means UntilExecuted); ttl bounds
// it, so that a reservation whose task is never processed ends: at least
// 100ms, at most 100 years; zero means 24 hours. A reservation is made just
// before its task is enqueued, so one whose task is not found is taken
// over only once it is 5 seconds old (a quarter of ttl if that is shorter): until then its enqueue may be
// in flight. It is a Client option: Middleware rejects it.
func Unique(locker *lockkit.Locker, life Lifetime, ttl time.Duration) ClientOption {
	return clientOpt(func(c *config) { c.unique = &uniqueSpec{locker: locker, life: life, ttl: ttl} })
}

type uniqueSpec struct {
	locker *lockkit.Locker
	core   *lockcore.RedisLocker // the engine under locker, set by validate
	life   Lifetime
	ttl    time.Duration
}

func (u *uniqueSpec) validate() error {
	if u.locker == nil {
		return fmt.Errorf("%w: Unique: locker is nil", ErrInvalid)
	}
	core, err := lockcore.Of("Unique", u.locker)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	u.core = core
	if u.life == 0 {
		u.life = UntilExecuted
	}
	if u.life < 0 || int(u.life) >= len(lifetimeNames) {
		return fmt.Errorf("%w: Unique: unknown Lifetime %d", ErrInvalid, int(u.life))
	}
	if u.ttl == 0 {
		u.ttl = defaultReserveTTL
	}
	if u.ttl < lockcore.MinTTL || u.ttl > lockcore.MaxTTL {
		return fmt.Errorf("%w: Unique: ttl %s must be between %s and %s", ErrInvalid, u.ttl, lockcore.MinTTL, lockcore.MaxTTL)
	}
	return nil
}

// reservationLabel names a task's reservation: its queue and the ID of the
// first task of its chain (a Requeue copy ends its original's reservation),
// "<queue>/<id>" with '%' and '/' in the queue written %25 and %2F, so that
// the first '/' ends the queue whatever the ID holds (splitLabel).
func reservationLabel(queue, origin string) string { return labelQueue.Replace(queue) + "/" + origin }

// labelQueue and labelQueueBack write and read the queue of a reservation
// label.
var (
	labelQueue     = strings.NewReplacer("%", "%25", "/", "%2F")
	labelQueueBack = strings.NewReplacer("%2F", "/", "%25", "%")
)

// identity is the task ID and queue of a task being enqueued, given to the
// key functions through the context.
type identity struct{ id, queue string }

type identityKey struct{}

// taskIdentity returns the task ID and queue from an asynq handler's ctx, or
// from the ctx of an enqueue by Client.
func taskIdentity(ctx context.Context) (id, queue string) {
	id, _ = asynq.GetTaskID(ctx)
	queue, _ = asynq.GetQueueName(ctx)
	if v, ok := ctx.Value(identityKey{}).(identity); ok {
		if id == "" {
			id = v.id
		}
		if queue == "" {
			queue = v.queue
		}
	}
	return id, queue
}

// newTaskID returns a random task ID.
func newTaskID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// optionValues returns the task ID and queue that opts set, if any.
func optionValues(opts []asynq.Option) (id, queue string) {
	for _, o := range opts {
		switch o.Type() {
		case asynq.TaskIDOpt:
			id, _ = o.Value().(string)
		case asynq.QueueOpt:
			queue, _ = o.Value().(string)
		}
	}
	return id, queue
}

// reserve reserves the key of a task with ID id in queue, taking over a
// reservation whose task no longer exists. It returns the reservation.
func (c *Client) reserve(ctx context.Context, key, id, queue string) (*lockcore.Lease, error) {
	u := c.unique
	opt := &lockcore.AcquireOptions{Label: reservationLabel(queue, id), Reserve: true, TTL: u.ttl}
	for attempt := 0; ; attempt++ {
		res, err := u.core.TryAcquire(ctx, asynqkey.Reservation(key), opt)
		if err == nil {
			return res, nil
		}
		var ce *lockcore.ConflictError
		if !errors.As(err, &ce) {
			if !errors.Is(err, lockcore.ErrNotAcquired) {
				// The reservation may have been made (its reply lost): no
				// task comes with it, so it must not refuse the caller's
				// retry. A reservation of a task with this ID that exists
				// (an earlier enqueue of it) is that task's, and stays.
				fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				if state, serr := c.taskState(fctx, queue, id); serr == nil && state == "" {
					_, _ = u.core.ForceRelease(fctx, asynqkey.Reservation(key), lockcore.Select{Label: opt.Label})
				}
				cancel()
			}
			return nil, fmt.Errorf("singleton: reserving key %q: %w", key, err)
		}
		holderQueue, holderID := splitLabel(ce.Label)
		state, delivery, err := c.holderState(ctx, holderQueue, holderID)
		if q, legacyID, ok := legacyLabel(ce.Label); ok && err == nil && state == "" && q != holderQueue {
			// A reservation of an earlier version, whose label's queue held
			// '/' unescaped.
			var legacyState string
			if legacyState, delivery, err = c.holderState(ctx, q, legacyID); legacyState != "" {
				state, holderQueue = legacyState, q
			}
		}
		if state != "" {
			holderID = delivery
		}
		if err != nil {
			return nil, fmt.Errorf("singleton: reserving key %q: reading the state of task %s: %w", key, holderID, err)
		}
		if state == "" {
			// A reservation is made before its task is enqueued: a young one
			// whose task is not there yet is an enqueue in flight.
			now, err := c.now(ctx)
			if err != nil {
				return nil, err
			}
			if now.Sub(time.UnixMicro(ce.Token)) < min(enqueueGrace, u.ttl/4) {
				state = "enqueuing"
			}
		}
		if state != "" || attempt > 0 {
			if state == "" {
				state = "unknown"
			}
			return nil, &DuplicateTaskError{Key: key, ID: holderID, Queue: holderQueue, State: state}
		}
		// The reserving task is gone: its reservation must not block the key.
		if _, err := u.core.ForceRelease(ctx, asynqkey.Reservation(key), lockcore.Select{Label: ce.Label}); err != nil {
			return nil, fmt.Errorf("singleton: reserving key %q: %w", key, err)
		}
	}
}

// holderState is the state (taskState) of the task first enqueued as origin
// in queue, or of the Requeue copy that stands for it (deliveriesOf, and the
// copy asynqkey.Copy names), with that delivery's ID: they are read at once
// (deliveryStatesCmd), so that a copy replacing another between two reads
// cannot hide them all.
func (c *Client) holderState(ctx context.Context, queue, origin string) (state, id string, err error) {
	return workState(ctx, c.rdb, queue, origin)
}

// workState is the state (taskState) of the work first enqueued as origin
// in queue on rdb, asynq's Redis: of the first of its deliveries
// (deliveriesOf, the copy asynqkey.Copy names, and ids) that still needs its key,
// with that delivery's ID, or "" and origin when none does. The states are
// read at once (deliveryStatesCmd), so that a copy replacing another
// between two reads cannot hide them all.
func workState(ctx context.Context, rdb redis.UniversalClient, queue, origin string, ids ...string) (state, id string, err error) {
	args := []any{asynqkey.Queue(queue)}
	for _, id := range deliveriesOf(origin) {
		args = append(args, id)
	}
	for _, id := range ids {
		args = append(args, id)
	}
	vals, err := deliveryStatesCmd.Run(ctx, rdb, []string{asynqkey.Copy(queue, origin)}, args...).StringSlice()
	if err != nil {
		return "", origin, err
	}
	for i := 0; i+1 < len(vals); i += 2 {
		if s := liveState(vals[i+1]); s != "" {
			return s, vals[i], nil
		}
	}
	return "", origin, nil
}

// deliveryStatesCmd reads the asynq states of the deliveries of one work:
// the tasks ARGV[2..] and the copies KEYS[1] (asynqkey.Copy) names (the
// latest, and the one it replaces: nameCopyCmd). ARGV[1] is the queue's key
// prefix. Returns {id, state, ...}, the state "" for a task that does not
// exist.
var deliveryStatesCmd = redis.NewScript(copiesLua + `
local ids = {}
for i = 2, #ARGV do
	ids[#ids + 1] = ARGV[i]
end
add_copies(ids, KEYS[1])
local out = {}
for _, id in ipairs(ids) do
	out[#out + 1] = id
	out[#out + 1] = redis.call("HGET", ARGV[1] .. "t:" .. id, "state") or ""
end
return out
`)

// legacyLabel splits a reservation label as earlier versions made it
// ("<queue>/<id>", the queue unescaped) at its last '/'; ok when it holds
// more than one.
func legacyLabel(label string) (queue, id string, ok bool) {
	i := strings.LastIndexByte(label, '/')
	if i < 0 || strings.IndexByte(label, '/') == i {
		return "", "", false
	}
	return label[:i], label[i+1:], true
}

// splitLabel splits a reservation label (reservationLabel) into queue and
// task ID.
func splitLabel(label string) (queue, id string) {
	q, id, ok := strings.Cut(label, "/")
	if !ok {
		return "", label
	}
	return labelQueueBack.Replace(q), id
}

// taskState returns the asynq state of a task that still needs its
// reservation ("pending", "active", "scheduled", "retry", "aggregating"),
// or "" when it does not (it does not exist, or is archived or completed).
// It reads asynq's task hash directly (the key of asynq's base.TaskKey and
// its "state" field): one round trip bounded by ctx, where
// Inspector.GetTaskInfo takes two and ignores ctx. The uniqueness tests
// check the states it reads against real asynq servers.
func (c *Client) taskState(ctx context.Context, queue, id string) (string, error) {
	states, err := c.taskStates(ctx, queue, []string{id})
	if err != nil {
		return "", err
	}
	return states[0], nil
}

// taskStates is taskState of each of ids in queue, read at once (MULTI: the
// tasks' keys share the queue's hash tag).
func (c *Client) taskStates(ctx context.Context, queue string, ids []string) ([]string, error) {
	return readTaskStates(ctx, c.rdb, queue, ids)
}

// readTaskStates is Client.taskStates on rdb, asynq's Redis.
func readTaskStates(ctx context.Context, rdb redis.UniversalClient, queue string, ids []string) ([]string, error) {
	cmds := make([]*redis.StringCmd, len(ids))
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGet(ctx, asynqkey.Task(queue, id), asynqkey.StateField)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	states := make([]string, len(ids))
	for i, cmd := range cmds {
		state, err := cmd.Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, err
		default:
			states[i] = liveState(state)
		}
	}
	return states, nil
}

// liveState is asynq state s of a task if the task still needs its
// reservation, else "" (archived, completed, or "": gone).
func liveState(s string) string {
	if s == "archived" || s == "completed" {
		return ""
	}
	return s
}

// uniqueOf reads t's uniqueHeaderName: the reservation's Lifetime and TTL, or
// zero when the task was not enqueued with Unique.
func uniqueOf(t *asynq.Task) (Lifetime, time.Duration) {
	life, ttl, _ := strings.Cut(t.Headers()[uniqueHeaderName], " ")
	ms, err := strconv.ParseInt(ttl, 10, 64)
	d := time.Duration(ms) * time.Millisecond
	if err != nil || d < lockcore.MinTTL || d > lockcore.MaxTTL {
		d = defaultReserveTTL
	}
	return lifetimeOf(life), d
}

// uniqueHeader is the uniqueHeaderName value for life and ttl.
func uniqueHeader(life Lifetime, ttl time.Duration) string {
	return life.String() + " " + strconv.FormatInt(ttl.Milliseconds(), 10)
}

// startReservation is called when a task is delivered: UntilExecuted
// takes the reservation over, so that it is renewed while the task runs, and
// returns the lease. (UntilStarted's ends when the run starts: started.)
func (m *guarded) startReservation(ctx context.Context, t *asynq.Task, key, origin string) *lockcore.Lease {
	life, _ := uniqueOf(t)
	if life != UntilExecuted {
		return nil
	}
	_, queue := taskIdentity(ctx)
	label := reservationLabel(queue, origin)
	res, err := m.core.TryAcquire(ctx, asynqkey.Reservation(key), &lockcore.AcquireOptions{Label: label, TakeReservation: true})
	var ce *lockcore.ConflictError
	switch {
	case err == nil:
		return res
	case errors.Is(err, lockcore.ErrNotAcquired) || errors.As(err, &ce):
		// Gone (its TTL passed) or held by another task: nothing to take over.
		return nil
	}
	// The take-over's outcome is unknown (its reply was lost): the Locker
	// removes what it may have taken, the reservation with it. The task
	// still needs the key: reserve it again, as its enqueue did.
	m.reserveAgain(ctx, t, key, origin, label)
	return nil
}

// reserveAgain reserves key for the task labelled label, detached for the
// reservation's TTL, after a take-over whose outcome is unknown: a holder with
// the label (the reservation taken over, or the reservation itself if the
// adopt never ran) is freed first, so that the new reservation is not the
// one the Locker removes for the failed adopt.
func (m *guarded) reserveAgain(ctx context.Context, t *asynq.Task, key, origin, label string) {
	_, ttl := uniqueOf(t)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	opt := &lockcore.AcquireOptions{Label: label, Reserve: true, TTL: ttl}
	var err error
	for range 2 {
		if _, err = m.core.TryAcquire(fctx, asynqkey.Reservation(key), opt); err == nil {
			return
		}
		var ce *lockcore.ConflictError
		if !errors.As(err, &ce) || ce.Label != label {
			break // another task took the key meanwhile, or Redis fails
		}
		if _, err = m.core.ForceRelease(fctx, asynqkey.Reservation(key), lockcore.Select{Label: label}); err != nil {
			break
		}
	}
	m.reservationError(ctx, t, key, origin, err)
}

// started is called when the task's run starts, holding its key: an
// UntilStarted reservation ends. A delivery that does not run (a duplicate
// requeued, say) keeps it.
func (m *guarded) started(ctx context.Context, t *asynq.Task, key, origin string) {
	if life, _ := uniqueOf(t); life == UntilStarted {
		_, queue := taskIdentity(ctx)
		m.freeReservation(ctx, t, key, origin, reservationLabel(queue, origin))
	}
}

// endReservation is called when the middleware is done with a task that
// ran, or did not, with outcome out: an UntilExecuted reservation ends when
// asynq will not run the task again, and otherwise stays for its TTL.
func (m *guarded) endReservation(ctx context.Context, t *asynq.Task, key, origin string, res *lockcore.Lease, out guard.Outcome) {
	life, ttl := uniqueOf(t)
	if life == UntilStarted && !out.Ran && m.doneWith(ctx, out) {
		// It never started and never will (it completed without running):
		// its reservation ends now, as a start would have ended it.
		_, queue := taskIdentity(ctx)
		m.freeReservation(ctx, t, key, origin, reservationLabel(queue, origin))
		return
	}
	if life != UntilExecuted {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	done := m.doneWith(ctx, out)
	var err error
	switch {
	case res != nil && done:
		err = res.Release(fctx)
	case res != nil:
		err = res.Reserve(fctx, ttl)
	case done:
		_, queue := taskIdentity(ctx)
		m.freeReservation(ctx, t, key, origin, reservationLabel(queue, origin))
	}
	if err != nil && !errors.Is(err, lockcore.ErrNotHeld) {
		m.reservationError(ctx, t, key, origin, err)
	}
}

func (m *guarded) freeReservation(ctx context.Context, t *asynq.Task, key, origin, label string) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := m.core.ForceRelease(fctx, asynqkey.Reservation(key), lockcore.Select{Label: label}); err != nil {
		m.reservationError(ctx, t, key, origin, err)
	}
}

func (m *guarded) reservationError(ctx context.Context, t *asynq.Task, key, origin string, err error) {
	guard.Emit(m.guard, ctx, guard.Event{Kind: guard.EventError, Job: guard.With(guard.Job{Key: key, Name: t.Type()}, guard.Work{Label: origin}),
		Err: fmt.Errorf("singleton: the reservation of task %s: %w", origin, err)})
}

// doneWith reports whether asynq is done with a task after out: it will not
// run it again.
func (m *guarded) doneWith(ctx context.Context, out guard.Outcome) bool {
	if out.Duplicate != nil {
		switch out.Duplicate.Action {
		case guard.ActionSkip:
			return true
		case guard.ActionRequeue:
			return false // it runs later (a copy ends the same reservation)
		}
	}
	if out.Err == nil {
		return true
	}
	if errors.Is(out.Err, asynq.SkipRetry) || (out.Ran && errors.Is(out.Err, lockcore.ErrCancelled)) {
		return true // archived, or revoked after an operator cancelled the run
	}
	if errors.Is(out.Err, asynq.RevokeTask) {
		// Revoked: deleted, never run again. A Requeue copy is the exception:
		// it runs later, and ends the reservation then.
		_, requeued := requeueOf(out.Err)
		return !requeued
	}
	if ctx.Err() != nil {
		// asynq gave up on the run (shutdown, worker lease, deadline): it
		// may put the task back without counting a retry. The reservation
		// stays; an enqueue of the key takes it over once the task is gone.
		return false
	}
	retried, ok1 := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	return ok1 && ok2 && retried >= maxRetry
}
