package singleton

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
)

// parkedHeader is the task header ("1") of a task that a Client with
// ParkAtEnqueue queued for its key: Middleware takes over the reservation
// made for it (guard.Work.Reserved), whatever its policy.
const parkedHeader = "jobguard-parked"

// ParkAtEnqueue makes Client queue each task for its key when it enqueues
// it, so that tasks of one key run one at a time, in the order they were
// enqueued, each delivered once. The key is derived by the key options, as
// the middleware derives it, on locker (use the middleware's Locker
// settings: the same Redis and prefix). The task carries parkedHeader.
//
//   - A task whose key is free reserves it (a reservation carrying the
//     task's ID, for backstop) and is enqueued as asked; the middleware takes
//     the reservation over when the task starts.
//   - A task whose key is held or reserved is parked for it
//     (the engine's parking) and enqueued to be processed backstop
//     from now (asynq.ProcessIn; the TaskInfo says "scheduled"). The run
//     that frees the key, in a Middleware with WithRedis, reserves it for
//     the oldest parked task and moves that task to the head of its
//     queue's pending list, as a Requeue'd duplicate is resumed.
//
// The backstop covers what could strand a parked task: the freeing run's
// process died, its Middleware has no WithRedis, or the reservation of a
// task that never started lapsed. asynq then delivers the task at its
// backstop and the middleware's policy applies if its key is still held:
// under middleware.Requeue (the policy to use with this option) it is
// parked again, keeping its place; under Skip it completes without
// running, as any duplicate does. It needs a Middleware with WithLimit(1)
// (the default): Guard.Client refuses it on a Guard with a higher limit or
// with WithLimitFunc (ErrInvalid), and a Middleware with a higher limit, or
// whose WithLimitFunc gives the task one, refuses a task parked at enqueue
// (an error matching ErrInvalid and asynq.SkipRetry, so asynq archives it;
// under WithShadow it runs, and the error is reported)
// and gives back its reservation and its entry in the key's parked queue,
// since under it no run would start the parked tasks nor remove them from
// that queue; each such refusal also drops the entries of tasks that will
// not come (deleted or archived). Zero backstop
// means 30 seconds; it must be between a
// second (asynq schedules in seconds) and 100 years.
//
// It queues work and folds none: every task parked at enqueue runs in its
// turn, whatever the middleware's policy. Each is delivered once if it
// starts within backstop of its enqueue; one still parked then is
// delivered again, and parked again in its place (with no retries left its
// copy takes the place), every 30 seconds until it starts, so for bursts
// deeper than a backstop's worth of runs give a longer backstop (which also lengthens the wait when a reservation
// lapses). For KeepNewest or Coalesce, enqueue without it: with WithRedis
// the middleware parks their one follow-up per key on delivery.
//
// A task enqueued with asynq.ProcessAt, asynq.ProcessIn or asynq.Group is
// enqueued as asked, neither reserved nor parked. When asynq refuses the
// enqueue, a reservation made for the task is given back, which starts the
// task parked behind it meanwhile, as the end of a run does; a parked entry
// stays, and the run that reaches it finds no task and passes the key on
// within 100 ms. A task whose ID (asynq.TaskID) another task has is not
// parked: asynq refuses it (asynq.ErrTaskIDConflict), at the cost of one
// more round trip for each task given an ID. ParkAtEnqueue excludes Unique
// and Debounce. It is a Client option: Middleware rejects it.
func ParkAtEnqueue(locker *lockkit.Locker, backstop time.Duration) ClientOption {
	return clientOpt(func(c *config) { c.park = &parkSpec{locker: locker, backstop: backstop} })
}

type parkSpec struct {
	locker   *lockkit.Locker
	core     *lockcore.RedisLocker // the engine under locker, set by validate
	backstop time.Duration
	resumer  *guarded // starts the task parked behind a reservation given back
}

func (p *parkSpec) validate(rdb redis.UniversalClient) error {
	if p.locker == nil {
		return fmt.Errorf("%w: ParkAtEnqueue: locker is nil", ErrInvalid)
	}
	p.resumer = &guarded{rdb: rdb, inspector: asynq.NewInspectorFromRedisClient(rdb)}
	g, err := guard.New(p.locker, guard.WithParking(p.resumer.parking()))
	if err != nil {
		return fmt.Errorf("%w: ParkAtEnqueue: %w", ErrInvalid, err)
	}
	p.resumer.guard = g
	if p.core, err = lockcore.Of("ParkAtEnqueue", p.locker); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	p.resumer.core = p.core
	if p.backstop == 0 {
		p.backstop = parkBackstop
	}
	if p.backstop < time.Second || p.backstop > lockcore.MaxTTL {
		return fmt.Errorf("%w: ParkAtEnqueue: backstop %s must be between 1s and %s", ErrInvalid, p.backstop, lockcore.MaxTTL)
	}
	return nil
}

// deferred reports whether opts schedule the task or group it, which
// ParkAtEnqueue leaves as asked.
func deferred(opts []asynq.Option) bool {
	return slices.ContainsFunc(opts, func(o asynq.Option) bool {
		t := o.Type()
		return t == asynq.ProcessAtOpt || t == asynq.ProcessInOpt || t == asynq.GroupOpt
	})
}

// parkEntry names a parked task in its key's parked queue: its queue, its
// ID and its origin; both are the origin in the entries parked now, which
// name the work (see parkID), and resume also reads an older entry that
// named a copy's ID.
func parkEntry(queue, id, origin string) string { return queue + "\n" + id + "\n" + origin }

// parkedWork splits a parked entry (parkEntry) into its queue, its task ID
// and its origin; ok is false for an entry of another form.
func parkedWork(entry string) (queue, id, origin string, ok bool) {
	parts := strings.SplitN(entry, "\n", 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// enqueueParked reserves key for task (ID id), or parks the task for it,
// and enqueues the task: now when it reserved the key, at the backstop when
// it parked.
func (c *Client) enqueueParked(ctx context.Context, task *asynq.Task, key, id, queue string, generated bool, opts []asynq.Option) (*asynq.TaskInfo, error) {
	p := c.park
	if !generated {
		// A duplicate ID must not leave an entry that would start the task
		// that has it.
		n, err := c.rdb.Exists(ctx, asynqkey.Task(queue, id)).Result()
		if err != nil {
			return nil, fmt.Errorf("singleton: task %q: checking its ID %q: %w", task.Type(), id, err)
		}
		if n > 0 {
			return c.c.EnqueueContext(ctx, task, opts...) // refused as a duplicate ID
		}
	}
	res, err := p.core.TryAcquire(ctx, key, &lockcore.AcquireOptions{TTL: p.backstop, Label: id, Reserve: true,
		Park: &lockcore.Parking{ID: parkEntry(queue, id, id), Hold: parkBackstop,
			OnParked: p.resumer.resume}}) // when given back
	var ce *lockcore.ConflictError
	switch {
	case err == nil:
	case errors.As(err, &ce) && ce.Parked >= 0:
		opts = append(slices.Clone(opts), asynq.ProcessIn(p.backstop))
	default:
		return nil, fmt.Errorf("singleton: task %q: parking on key %q: %w", task.Type(), key, err)
	}
	info, err := c.enqueueOwnID(ctx, task, id, queue, generated, opts)
	if err != nil && res != nil {
		c.giveBack(ctx, res, task, id, queue)
	}
	return info, err
}

// refuseParked returns the error that refuses job, a task parked at enqueue
// (ParkAtEnqueue) delivered to a middleware with WithLimit(n > 1), and gives
// back the reservation made for it and its entry in the key's parked queue
// (ForceRelease by its label): under such a limit no run resumes parked
// tasks or takes them out of the key's parked queue. It also drops the
// entries of tasks that will not come (dropGoneParked).
func (m *guarded) refuseParked(ctx context.Context, job guard.Job) error {
	limit := fmt.Sprintf("WithLimit(%d)", m.limit)
	if m.limitFunc {
		limit = fmt.Sprintf("WithLimitFunc gave %d", m.limitOf(job))
	}
	err := fmt.Errorf("%w: %s: task %q (key %q) was enqueued with ParkAtEnqueue, which needs a limit of 1 (%w)",
		ErrInvalid, limit, job.Name, job.Key, asynq.SkipRetry)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, ferr := m.core.ForceRelease(fctx, job.Key, lockcore.Select{Label: guard.WorkOf(job).Label}); ferr != nil {
		err = fmt.Errorf("%w; giving back its reservation: %w", err, ferr)
	} else if ferr := m.dropGoneParked(fctx, job.Key); ferr != nil {
		err = fmt.Errorf("%w; dropping the parked entries of deleted or archived tasks: %w", err, ferr)
	}
	return err
}

// dropGoneParked drops, from the first entries of key's parked queue (the
// 20 lockkit.Info.ParkedIDs lists), those of work with no delivery waiting
// or running (workState: deleted, archived or completed by an operator,
// say), so that under WithLimit(n > 1), where no run takes entries out of
// the queue, each refusal looks at the queue and it holds no more than the
// tasks still to come. An entry whose task is not enqueued yet (the Client
// parks before it enqueues) may be dropped too: the task is refused when
// it comes, as under this limit it would be anyway.
func (m *guarded) dropGoneParked(ctx context.Context, key string) error {
	if m.rdb == nil {
		return nil
	}
	info, err := m.core.Inspect(ctx, key)
	if err != nil {
		return err
	}
	for _, entry := range info.ParkedIDs {
		queue, id, origin, ok := parkedWork(entry)
		if !ok {
			continue
		}
		if state, _, err := workState(ctx, m.rdb, queue, origin, id); err != nil {
			return err
		} else if state != "" {
			continue
		}
		if _, err := m.core.ForceRelease(ctx, key, lockcore.Select{Label: origin}); err != nil {
			return err
		}
	}
	return nil
}
