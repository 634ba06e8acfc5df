// Package lockcore is the lease engine under package lockkit: its Lua
// scripts, the Redis backend, the renewer, and every kind of lease the
// adapters (middleware, singleton, cronguard, periodic, opsview and
// lockkit's own packages) take: follow-ups (Coalesce, KeepNewest, Preempt),
// parking, reservations (Reserve, TakeReservation, Lease.Reserve), epochs, completion
// records and scan cursors. Package lockkit is the user's front over it: an
// adapter given a *lockkit.Locker reaches the RedisLocker under it with
// Of. Its sentinel errors are lockkit's values, and its messages keep the
// "lockkit:" prefix that users see.
//
// What follows describes the engine as the adapters see it.
//
// A Locker hands out a *Lease per key. RedisLocker shares leases between
// processes through Redis (standalone, Sentinel or Cluster). Package
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
//   - AcquireOptions.Limit allows N holders of a key at once (never more than
//     the smallest limit among its holders); AcquireOptions.Fair serves
//     waiters in arrival order; AcquireOptions.Epoch claims a unit of work once.
//   - AcquireOptions.FollowUp says what an acquire does about the key's other
//     runs: give way to a later run (Coalesce), keep only the newest pending
//     call (KeepNewest), or end the running one (Preempt).
//     AcquireOptions.Park queues jobs for a held key (Parking).
//   - Inspect and RedisLocker.Keys show holders and waiters; CancelRun asks
//     runs to stop and keeps the key held until they return (an operator's
//     release); ForceRelease removes holders at once (all, one owner's, one
//     fencing token's, or a reservation by its label: Select).
//   - Close stops the renewer and releases every lease the Locker holds.
//
// Beside leases, on the same Redis and prefix (RedisLocker.Redis) but
// apart from them: package lockkit/throttle keeps a budget of starts per
// key, lockkit/debounce the newest request of a burst. Package
// lockkit/elect elects a leader on any Locker.
package lockcore
