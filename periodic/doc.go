// Package periodic is a drop-in for asynq's Scheduler and
// PeriodicTaskManager that every replica can run: each tick of each entry is
// enqueued exactly once across them, where asynq's enqueue it once per
// replica.
//
//	scheduler := periodic.NewScheduler(redisOpt, &asynq.SchedulerOpts{Location: loc}) // was asynq.NewScheduler
//	_, err := scheduler.Register("*/5 * * * *", asynq.NewTask("digest:send", nil))
//
// How: a tick's task gets a deterministic asynq task ID, made of its entry's
// identity and the tick (asynq.TaskID), and is kept for a window after it
// completes (asynq.Retention). Every replica tries to enqueue it; asynq
// accepts the first enqueue and refuses the others with ErrTaskIDConflict
// while the task exists, so the claim and the enqueue are one atomic step in
// asynq's own script: no replica can claim a tick and die before enqueueing
// it, and a replica that dies leaves the others to enqueue its ticks. A
// replica whose clock is behind fires later and is refused; replicas must
// fire each tick within the window (WithWindow, 1 minute by default). A task that
// ends without completing (asynq.RevokeTask, as a Preempt or Requeue policy
// returns) is deleted at once, so each tick also has a mark in Redis: a
// replica claims the tick in it (for 5 s, or a quarter of the window if
// shorter), enqueues it, and marks it enqueued, for the window plus the
// retention; a replica that fires a marked tick does not enqueue it, and one
// that finds it claimed waits until it is marked or the claim lapses (its
// claimant died) and it claims it itself. A claimant sends no enqueue later
// than four fifths of the claim's life after it sent the claim.
// Replicas must share the prefix (WithPrefix) of these marks.
//
// An entry's identity is derived from its config: the spec, the time zone,
// the task's type, payload and headers and the enqueue options. Replicas
// with the same config agree on it without coordination. While replicas
// disagree (a config change rolling out, within one SyncInterval of a
// PeriodicTaskManager), the old and the new config are two entries: a tick
// may be enqueued once under each, never twice under one.
//
// "@every d" (and "@every d offset o") ticks at the multiples of d since the
// Unix epoch (plus o), the same on every replica. CatchUp enqueues, when a
// Scheduler starts, the ticks that every replica missed within a window.
package periodic
