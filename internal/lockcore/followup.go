package lockcore

import "time"

// FollowUp says what an acquire does about the key's other runs. It is one
// of Coalesce, KeepNewest and Preempt; a nil FollowUp is a plain lease,
// which takes a free slot or waits for one and leaves other runs alone.
type FollowUp interface {
	followUp()
}

// Coalesce makes the acquire give way to a run of the key that began after
// the call's first attempt reached Redis (server time), or after Since if
// that is earlier: it fails with a *CoveredError (matching ErrCovered) when
// such a run succeeded (Lease.Run or Lease.Succeed on a Coalesce lease,
// remembered for CoverFor), holds the key now, or when another Coalesce
// Acquire already waits for the key (it will begin later; a plain waiter
// may give up, so it covers nothing) or another Coalesce acquire with Park
// is parked for it.
//
// Otherwise the key is taken as usual; Acquire waits for it and is then the
// one follow-up that others fold into, and a TryAcquire with Park that finds
// the key held parks as that follow-up (it covers later calls while it stays
// in the parked queue; one that took its reservation over is the key's run,
// which no follow-up covers). A call whose Label a holder carries (a
// delivery of the running work) is not covered by that run and becomes no
// follow-up: it covers nothing, and its parked entry replaces the parked
// follow-up carrying its own Label.
//
// Coalesce needs a Limit of 1 and no Fair; ErrInvalid otherwise.
type Coalesce struct {
	// Since is when the work to be covered was asked for (an enqueue), on
	// the Redis server's clock: only a run that began after it covers the
	// call. Zero, or a time after the call's first attempt reached Redis,
	// means that first attempt. Before 1970 is an error. Defaults to zero.
	Since time.Time
	// CoverFor is how long the success of this lease's run is remembered.
	// Zero means DefaultCoverFor (24h); negative or above MaxTTL is an
	// error.
	CoverFor time.Duration
	// Final says that the caller's work is not tried again if this call's
	// run fails (a task with no retries left): the call covers no other
	// Coalesce call, neither while its run holds the key nor while it waits
	// or is parked for it, so that a failure loses no other call's work.
	// Its own run's success still covers as usual. Defaults to false.
	Final bool
}

// KeepNewest makes an Acquire the key's one pending follow-up while it
// waits: a later KeepNewest or Preempt acquire of the key takes its place,
// and this one fails at once with ErrSuperseded (the newest follow-up runs,
// older ones give up).
//
// With AcquireOptions.Park, a TryAcquire that finds the key held parks as
// the key's follow-up instead: a later KeepNewest or Preempt acquire of the
// key takes its place and removes it from the parked queue
// (ConflictError.Superseded names it), and the replaced job's next acquire
// with Park carrying its Label fails with ErrSuperseded, once (it is
// remembered for ten minutes; an acquire without Park, such as a pass-on's
// adopt, leaves the mark). A parked follow-up that a release reserved the
// key for is the key's next run: TakeReservation takes it over and replaces no one.
//
// A call whose Label a holder carries (a delivery of the running work)
// neither replaces the follow-up nor becomes it, for the whole of an
// Acquire; one whose Label the parked follow-up carries (the same job parked
// under a new Park id) takes its place without marking it. TryAcquire
// without Park ignores KeepNewest.
type KeepNewest struct {
	// Order is the call's place in its key's order (a task's place taken
	// when it was enqueued, such as a per-key sequence): a call with a
	// lower order than the key's live follow-up, or than the latest
	// KeepNewest or Preempt run that took the key with an order
	// (remembered for ten minutes after that run took the key, and while
	// it is renewed), fails at once with ErrSuperseded: it neither takes a
	// newer call's place nor preempts a newer run. A waiting call whose
	// process stalled past its waiter TTL (4 poll intervals), so that a
	// call with a lower order took its place (and maybe ran), takes the
	// place back. Calls with the same order (deliveries of one task) are
	// not older than each other. Zero means none: the call, and a
	// comparison with a run or follow-up without one, goes by arrival at
	// Redis. Negative is an error. Defaults to zero.
	Order int64
}

// Preempt makes an Acquire end the runs that hold the key so that it gets
// the key: their leases are lost with a cause matching ErrPreempted (and
// ErrLost) and are no longer renewed, so their fencing tokens are superseded
// by this call's. A holder acquired with Preempt learns it within
// milliseconds (pub/sub), any other at its next renewal attempt. The call
// then waits for them to release, at most Grace.
//
// A Preempt acquire keeps the newest as KeepNewest does: while it waits it
// is the key's one pending follow-up, which a later KeepNewest or Preempt
// acquire replaces (this one then fails with ErrSuperseded), and with
// AcquireOptions.Park a TryAcquire that finds the key held parks as that
// follow-up. TryAcquire preempts no one.
//
// Preempt needs a Limit of 1 and no Fair; ErrInvalid otherwise.
type Preempt struct {
	// Order is the call's place in its key's order, as KeepNewest.Order: a
	// call older than the key's follow-up or latest ordered run fails with
	// ErrSuperseded and preempts no one. Zero means none; negative is an
	// error. Defaults to zero.
	Order int64
	// Grace bounds how long the acquire waits for the runs it preempted to
	// release: after it, their holders are removed and the call takes the
	// key. Zero means their remaining TTL (at most TTL, as they are no
	// longer renewed); negative or above MaxTTL is an error.
	Grace time.Duration
}

func (Coalesce) followUp()   {}
func (KeepNewest) followUp() {}
func (Preempt) followUp()    {}

// Parking queues an acquire's job for the key while the key is held, and
// lets the lease's release hand the key to the jobs so queued.
//
// A release that leaves the key with no holder and no waiter it is handed
// to reserves the key for the oldest parked job, as a reservation (see
// AcquireOptions.Reserve) carrying that job's Label, owned by "parked:" and
// its id, for that job's Hold; Run or Release of a lease acquired with
// OnParked then passes the job's id to OnParked, which should start the
// job: its acquire with TakeReservation and the same Label takes the reservation
// over. A release whose reply was lost and that go-redis sent again reports
// the same id while the reservation lives; so does the Locker's own repeat
// of a release whose call failed (the reply lost, or late past the
// caller's ctx): the job is passed to OnParked all the same. An acquire
// with OnParked whose call failed after it may have taken the key has the
// holder it left released by the Locker, which reserves the key for the
// oldest parked job and passes it to OnParked, as the lease's release would.
type Parking struct {
	// ID, when not empty, is the id of the caller's job to start later (a
	// queued task's queue and ID, say): an acquire that finds the key held
	// records it in the key's parked queue, once (a later park of the same
	// id keeps its place). A job that takes the key itself leaves the
	// queue, and so does one whose acquire finds its Label completed
	// (ErrCompleted); a parked id is kept for ten minutes after its last
	// park. It
	// needs AcquireOptions.Label and a Limit of 1; ErrInvalid otherwise.
	// Empty means the acquire does not park; its release still hands the
	// key to parked jobs through OnParked.
	ID string
	// Hold is how long the reservation a release makes for this parked job
	// lasts before the job takes it over. Zero means DefaultParkHold (5s);
	// negative or above MaxTTL is an error.
	Hold time.Duration
	// OnParked, when set, is called with the key and the id of the parked
	// job for which this lease's release reserved the key, on a goroutine of
	// its own once the release returned (for a release held by HoldAtLeast,
	// once the hold ended: the Locker reserves the key for the job then,
	// unless it was closed meanwhile): it should start the job, and return
	// soon, as Close waits for it. Nil means the release leaves parked
	// jobs queued.
	OnParked func(key, id string)
}
