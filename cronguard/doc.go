// Package cronguard makes a robfig/cron v3 schedule that runs on several
// replicas run each tick once across the fleet, with leases from lockkit and
// the guard, policies and events of middleware.
//
//	locker, err := lockkit.NewRedis(rdb)
//	if err != nil { ... }
//	guard, err := cronguard.New(locker, cronguard.WithSeconds())
//	if err != nil { ... }
//	c := cron.New(cron.WithSeconds(), cron.WithChain(cron.Recover(cron.DefaultLogger)))
//	_, err = guard.Add(c, "send-digest", "0 */5 * * * *", cronguard.Func(func(ctx context.Context) error {
//		return sendDigest(ctx) // ctx is cancelled (cause lockkit.ErrLost) if the lease is lost
//	}))
//	if err != nil { ... }
//	c.Start()
//
// For one entry, Guard.Wrap(name, spec) (or the package-level Wrap) returns a
// cron.JobWrapper: cron.NewChain(cron.Recover(l), w).Then(job). Put it last in
// the chain so that it sees the job itself (and its RunContext method).
//
// # Once per tick
//
// cron calls Job.Run without saying which scheduled time fired, so a run
// names its tick from the entry's schedule: the latest activation at or
// before now. cron fires an activation when its clock reads it, so a run that
// starts late (a busy process, a delay in the chain), by less than the
// interval to the next activation, still names the activation that fired it,
// and replicas whose clocks are skewed name the same tick: they only fire it
// at real times up to the skew apart. The tolerance (WithTolerance, default
// 2s, at most half the entry's shortest interval) is the skew
// the fleet absorbs.
//
// The tick, in Unix milliseconds, is the lockkit epoch of the entry's key
// "cron:<name>": the first replica claims it and runs the job; every other
// replica of that tick finds it claimed (EventClaimed) and skips,
// even after a 1 ms run has released the lease, because the claim is kept for
// 2 × interval + 2 × tolerance and only a later tick can replace it. The
// epoch is checked before the lease, so a late replica of a tick that is
// still running is also told the tick ran (EventClaimed), not that it
// overlaps. The lease is labelled with the tick in UTC, RFC 3339
// (lockkit's Holder.Label, such as "2026-11-29T03:00:00Z"): what `jobguard
// inspect` and opsview show beside the holder. Entries need schedules
// anchored to fixed times: cron's own @every counts from each replica's
// start, so Add aligns "@every d" to the multiples of d since the Unix
// epoch, and Wrap refuses it. The Guard parses specs itself: a seconds field
// needs WithSeconds, whatever the Cron was given.
//
// Each entry has its own name: a Guard's Add and Wrap refuse a name it
// already has (ErrDuplicateEntry), since two entries of one name would share
// the claims and each tick would run only one of them. Every claim keeps a
// hash of the entry's spec and time zone (kept with the claim),
// so a replica that finds the entry claimed with another spec reports it,
// once per entry: an EventError matching ErrSpecMismatch, logged at Error.
// It costs no round trip more.
//
// # Daylight saving time
//
// On the day the schedule's time zone changes its UTC offset, robfig/cron may
// fire a spec twice (New_York "30 1 * * *" at 01:30 EDT and at 01:30 EST),
// at a shifted time (Chatham "45 2 * * *" at 03:45) or not at all. Runs name
// the activations cron fires, the same on every replica, whichever day the
// entry was added; a replica whose Cron started just after a change may fire
// a time the others skip, and that run names the activation before it. The
// shortest interval a tolerance must be shorter than leaves out intervals
// across a change.
//
// # Overlap across the fleet
//
// WithPolicy says what a tick does while an earlier tick of the entry still
// runs on any replica, with the policies every jobguard adapter takes (see
// WithPolicy here for what each does to a tick): Skip (the default),
// WaitInOrder(max, Skip()) and Wait(max, Skip()), KeepNewest, Preempt;
// WithLimit(n) lets up to n ticks run at once. Policies a tick cannot
// follow (requeue, fail for a retry, coalesce) are refused by New.
//
// # Long runs, failures, events
//
// The lease is renewed every TTL/3 (WithTTL, 30s) while the job runs and is
// released when it returns or panics; a replica that dies mid-run frees the
// entry within the TTL. A Func job's ctx is cancelled if the lease is lost.
// Panics are reported and re-raised after the release, for cron.Recover.
// Every run reports to the middleware.Observer values of WithObserver, with
// Tick(ctx) available to them: EventAcquired and EventReleased (ran; its Err
// is the job's error), EventClaimed (skipped: the tick ran on another
// replica), EventDuplicate (skipped: overlap), EventWaited, EventLost,
// EventPreempted (Preempt) and
// EventError (Redis errors, panics, a run not matched to a tick). The logger
// (WithLogger, a cron.Logger) gets errors at Error and the rest at Info.
//
// # Redis cost
//
// With the default overlap, a tick costs each replica one round trip (the
// acquire script) when another replica runs it, and two (acquire, release)
// on the replica that runs it, plus one pipelined renewal per TTL/3 shared by
// every lease of the Locker while it runs.
package cronguard
