// Package lockkit provides leases on keys: owner-checked locks and counting
// semaphores in Redis that renew themselves while work runs and tell the work
// when they are lost.
//
// A Locker hands out a *Lease per key, shared between processes through
// Redis (standalone, Sentinel or Cluster). Package
// lockkit/inprocess runs it on a Redis embedded in the process, for a
// single-process deployment; lockkit/lockkittest gives tests one.
//
//	locker, err := lockkit.NewRedis(rdb, lockkit.WithTTL(30*time.Second))
//	if err != nil { ... }
//	defer locker.Close(ctx)
//
//	err = lockkit.Do(ctx, locker, "report:tenant-42", nil, func(ctx context.Context) error {
//		// Runs alone across every process sharing rdb. ctx is cancelled with a
//		// cause matching ErrLost if the lease cannot be renewed.
//		return build(ctx)
//	})
//
// What a lease gives:
//   - TryAcquire makes one attempt; a held key returns a *ConflictError
//     (errors.Is ErrNotAcquired) naming the holder and its TTL. Acquire waits,
//     bounded by ctx; a release wakes waiters at once through pub/sub, with a
//     bounded poll as the fallback for missed wake-ups and expired holders.
//   - Release and Extend check the owner in one script call each and never
//     touch another owner's lease (ErrNotHeld).
//   - One renewer goroutine per Locker renews every held lease every TTL/3 in
//     pipelined batches. A lease that cannot be renewed before its TTL runs out
//     is lost: Lease.Lost closes and contexts from Lease.Context are cancelled
//     with a cause matching ErrLost, a little before Redis would expire it.
//   - Every acquire returns a fencing token (Lease.Token) greater than any
//     earlier token of the key; resources that must never see a stale holder
//     check it.
//   - AcquireOptions.Limit allows N holders of a key at once (never more
//     than the smallest limit among its holders, when callers disagree);
//     AcquireOptions.Fair serves waiters in arrival order;
//     AcquireOptions.HoldAtLeast keeps a key taken for a period.
//   - Inspect and Keys show holders and waiters; CancelRun asks runs to stop
//     and keeps the key held until they return (an operator's release);
//     ForceRelease removes holders at once (all, one owner's, or one fencing
//     token's: Select).
//   - Close stops the renewer and releases every lease the Locker holds.
//
// # Words
//
// A key names what one run at a time (or Limit runs) may do. A lease is a
// held claim on a key, with a TTL that renewal keeps from running out; its
// holder is the process (owner, WithOwner) that holds it, and its label
// (AcquireOptions.Label) names the work it holds the key for (for asynq, the
// task's ID that its requeued copies keep). A fencing token
// (Lease.Token) grows with every acquire of a key. A waiter waits for a key
// (Acquire). A reservation is a lease that nothing renews, taken for work
// that has not started yet (a task parked at enqueue, a Unique task); the
// work takes it over when it starts (Holder.Reserved). An operator's
// release either cancels a run (CancelRun: the key stays held until it
// returns) or frees the key at once (ForceRelease). The same words are used
// in middleware, singleton, cronguard, the logs, the metrics, the Redis
// records and the Lua scripts; middleware adds the words of jobs (job,
// duplicate, policy, action, event).
//
// The adapters build on a *Locker: middleware (conflict policies,
// follow-ups, events), singleton (asynq), cronguard (robfig/cron) and
// opsview (an operator's page). Package lockkit/elect elects a leader on a
// Locker.
package lockkit
