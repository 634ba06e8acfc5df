package singleton

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/debounce"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
)

// Debounce makes a Client enqueue each task as the newest request of its key
// (latest wins): a burst of tasks with one key runs once, the newest task,
// once no task of the key was enqueued for quiet, and no later than maxWait
// after the burst's first enqueue (zero: no such bound). Each task is
// scheduled (asynq.ProcessAt) for when it would be due, rounded up to a
// whole second (asynq schedules in seconds), and carries its generation
// (the task header "jobguard-debounce-gen"); Middleware, keyed the same way, completes an older task of the burst
// without running it (middleware.ReasonSuperseded, reported as
// EventDuplicate and logged) when a newer one is pending or ran. A burst
// ends when its newest task starts. The generation comes from Redis, so the
// newest task wins however enqueues race across processes. quiet must be
// between a millisecond and 100 years, maxWait zero or between quiet
// and 100 years; Debounce excludes Unique. Use it with
// middleware.KeepNewest or middleware.Preempt, so that the newest task
// waits for a run of the key still going instead of being skipped.
//
// The requests are kept in locker's Redis under its prefix (a
// request record on the Locker's Redis), where the Middleware's Locker,
// which must be on the same Redis and prefix, claims them; nil is refused
// (ErrInvalid) by NewClient and means the Guard's Locker under
// Guard.Client.
func Debounce(locker *lockkit.Locker, quiet, maxWait time.Duration) ClientOption {
	return clientOpt(func(c *config) { c.debounce = &debounceSpec{locker: locker, quiet: quiet, maxWait: maxWait} })
}

type debounceSpec struct {
	locker         *lockkit.Locker
	quiet, maxWait time.Duration
	requests       *debounce.Debouncer // on locker's Redis and prefix, made by validate
}

func (d *debounceSpec) validate() error {
	switch {
	case d.locker == nil:
		return fmt.Errorf("%w: Debounce: locker is nil", ErrInvalid)
	case d.quiet < time.Millisecond || d.quiet > lockcore.MaxTTL:
		return fmt.Errorf("%w: Debounce: quiet %s must be between 1ms and %s", ErrInvalid, d.quiet, lockcore.MaxTTL)
	case d.maxWait != 0 && (d.maxWait < d.quiet || d.maxWait > lockcore.MaxTTL):
		return fmt.Errorf("%w: Debounce: maxWait %s must be zero or between quiet (%s) and %s", ErrInvalid, d.maxWait, d.quiet, lockcore.MaxTTL)
	}
	core, err := lockcore.Of("Debounce", d.locker)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	client, prefix := core.Redis()
	d.requests, err = debounce.New(client, debounce.WithPrefix(prefix))
	return err
}

// debounce records the task with ID id in queue as its key's newest
// request and returns its generation and when to process it.
func (d *debounceSpec) debounce(ctx context.Context, key, queue, id string) (int64, time.Time, error) {
	req, err := d.requests.Debounce(ctx, key, debounceID(queue, id), d.quiet, d.maxWait)
	if err != nil {
		return 0, time.Time{}, err
	}
	return req.Gen, wholeSecond(time.Now().Add(req.Wait)), nil
}

// debounceGen returns the generation in t's asynqkey.DebounceGenHeader, or
// zero.
func debounceGen(t *asynq.Task) int64 {
	v, err := strconv.ParseInt(t.Headers()[asynqkey.DebounceGenHeader], 10, 64)
	if err != nil || v <= 0 {
		return 0
	}
	return v
}

// debounceID names the request of task id in queue ("<queue>\n<id>"): a
// key's tasks may be in several queues.
func debounceID(queue, id string) string { return queue + "\n" + id }

// genKey is the context key of a debounced task's generation (see
// debounceGen), which admitNewest reads.
type genKey struct{}

// admitNewest is the guard's check (guard.WithAdmit) of a debounced
// task, whose generation process put in ctx: the task runs only if it is its
// key's newest request, which ends the key's burst (debounce.Debouncer.Claim),
// or if the newest request's task does not exist (its enqueue failed, or it
// was archived before it started): then it runs in its place. Otherwise it
// completes without running (ReasonSuperseded, ActionSkip).
func (m *guarded) admitNewest(ctx context.Context, job guard.Job) error {
	gen, _ := ctx.Value(genKey{}).(int64)
	if gen <= 0 {
		return nil
	}
	fail := func(err error) error { return fmt.Errorf("claim %q: %w", job.Key, err) }
	newest, ok, err := m.requests.Claim(ctx, job.Key, gen, false)
	if err != nil {
		return fail(err)
	}
	if ok {
		return nil
	}
	pending := true
	if m.inspector != nil && !newest.Claimed {
		if pending, err = m.newestPending(ctx, newest); err != nil {
			return fail(err)
		}
	}
	if !pending {
		// The newest request's work does not exist: this task runs instead,
		// unless that request was claimed meanwhile (it ran and is gone).
		again, ok, err := m.requests.Claim(ctx, job.Key, gen, true)
		if err != nil {
			return fail(err)
		}
		if ok {
			return nil
		}
		newest = again
	}
	state := "is pending"
	if newest.Claimed {
		state = "ran or runs"
	}
	cause := fmt.Errorf("a newer request of the key, %q (generation %d), %s", newest.ID, newest.Gen, state)
	return &guard.DuplicateError{Reason: guard.ReasonSuperseded, Action: guard.ActionSkip, Cause: cause}
}

// newestPending tells whether the task of newest, a newer request of the
// task's key, exists in its queue (the task's own, for a request named by a
// task ID alone) with that request's generation.
func (m *guarded) newestPending(ctx context.Context, newest debounce.Request) (bool, error) {
	queue, id, ok := strings.Cut(newest.ID, "\n")
	if !ok {
		queue, _ = asynq.GetQueueName(ctx)
		id = newest.ID
	}
	info, err := m.inspector.GetTaskInfo(queue, id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading the newest task %q in queue %q: %w", id, queue, err)
	case info.State == asynq.TaskStateArchived:
		// Archived before it started (it claimed nothing): it will not run.
		return false, nil
	}
	return info.Headers[asynqkey.DebounceGenHeader] == strconv.FormatInt(newest.Gen, 10), nil
}
