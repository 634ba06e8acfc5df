// Package fence makes writes to Redis that a stale lease holder cannot make:
// each write carries the writer's fencing token, and Redis refuses it when
// a newer token has already written to the same key.
//
// A lease cannot stop a process that outlives it (a long GC pause, a
// SIGSTOP, a partition, a handler that ignores its ctx): a second run takes
// the key and both write. The lease's fencing token (lockkit's
// Lease.Token) is greater than every earlier token of its key; a write
// through a Writer succeeds only if its token is not older than the newest
// that has written to the key, and a write with an older token changes
// nothing and returns an error matching ErrStale (a *StaleError carrying
// the newest token).
//
//	w, err := fence.New(rdb) // one per process
//	if err != nil { ... }
//
//	// In a job run under a lease: lockkit.Do, a Lease's Context, or a job
//	// of middleware, singleton (asynq) or cronguard (cron).
//	tok, err := fence.FromContext(ctx)
//	if err != nil {
//		return err // ErrNoLease: the job runs under no lease
//	}
//	err = w.Set(ctx, tok, "report:acme", body, 0)
//	if errors.Is(err, fence.ErrStale) {
//		return err // a newer run of the key has written: this one is stale
//	}
//
// # Words
//
// A key's fence is the newest token that has written to it. A write is
// fenced when it goes through a Writer: Set, HSet, Del, Incr, IncrBy and
// XAdd, each one script (one round trip) that checks the token, writes and
// keeps the token in the fence. A write is stale when its token is older
// than the fence; tokens equal to the fence write (a run writes as often as
// it needs). The other words (lease, key, fencing token) are lockkit's.
//
// # Where the fence is kept
//
// Each key written has a fence key beside it, under the Writer's prefix
// ("jobguard:" unless WithPrefix): for a key with a Redis hash tag, such
// as "{acme}:report", "jobguard:fence:{acme}:report"; for a key without
// one, such as "report:acme", "jobguard:fence{report:acme}", whose hash tag
// is the whole key. Either way the fence is in the key's Cluster slot, so
// that one script reads and writes both. A key without a hash tag that
// contains '}' cannot be given one that hashes to its slot: it is refused
// (ErrInvalid) before anything is sent, on standalone Redis as on a
// Cluster, so that a program tested on one runs on the other.
//
// The fence lives as long as its key and a while after (the linger,
// WithLinger, 24h by default): a key without a TTL keeps a fence without
// one; a key with a TTL gives its fence that TTL plus the linger (never
// shortened by a later write); a deleted key (Del) leaves its fence for the
// linger. The fence costs a few dozen bytes per key written, and a stale
// writer paused for longer than the linger after its key expired or was
// deleted is no longer refused: the linger is the longest pause the fence
// absorbs after the key's end. A key without a TTL that goes without a Del
// (a plain DEL, an eviction) leaves its fence without one: delete such keys
// with Del, or give them a TTL.
//
// # Sent twice
//
// go-redis sends a command again when its reply is late or lost, and the
// script may then run twice. Each write call has an id of its own, and a
// write that went through leaves a record of its reply under that id for
// the client's retry window ((MaxRetries+1) × (ReadTimeout +
// MaxRetryBackoff), between a second and a minute): a repeat returns the
// first run's reply and writes nothing. An IncrBy sent twice adds once, an
// XAdd sent twice appends one entry, and a write that went through before
// a newer token's reports success when its repeat arrives after it. Two
// calls are two writes: two IncrBy calls with one token add twice.
//
// # What it does not protect
//
// Only writes that go through a Writer are checked: a write made with the
// client directly, a side effect outside Redis (an e-mail, an HTTP call)
// and a write to another store are not. Tokens of different lease keys
// are ordered by when their leases were taken (a token is at least the
// Redis server's time in microseconds), not strictly: write a key under
// one lease key.
package fence
