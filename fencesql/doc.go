// Package fencesql makes writes to PostgreSQL that a stale lease holder
// cannot make: the SQL half of package lockkit/fence, with its Token,
// FromContext, ErrStale and StaleError.
//
// A lease cannot stop a process that outlives it (a long GC pause, a
// SIGSTOP, a partition, a handler that ignores its ctx): a second run takes
// the key and both write. A write through a Writer runs in one transaction
// that first raises the fence of the resource it writes (a row of the fence
// table) to the writer's token, then makes the write, then commits. When a
// newer token has already written to the resource, the transaction is
// rolled back before the write is made, and the call returns a
// *fence.StaleError (errors.Is(err, fence.ErrStale)) carrying the newest
// token.
//
//	w, err := fencesql.New(db) // one per *sql.DB
//	if err != nil { ... }
//	err = w.CreateTable(ctx) // once, or the DDL below in a migration
//
//	// In a job run under a lease: lockkit.Do, a Lease's Context, or a job
//	// of middleware, singleton (asynq) or cronguard (cron).
//	tok, err := fence.FromContext(ctx)
//	if err != nil {
//		return err // fence.ErrNoLease: the job runs under no lease
//	}
//	_, err = w.Exec(ctx, tok, "report:acme",
//		`UPDATE reports SET body = $1 WHERE tenant = $2`, body, "acme")
//	if errors.Is(err, fence.ErrStale) {
//		return err // a newer run has written the resource: this one is stale
//	}
//
// # Words
//
// A resource is what a write is fenced on: any non-empty name (a row, an
// entity, a table), chosen by the caller; writes of one resource must all
// name it alike. Its fence is the newest token that has written to it, kept
// in the fence table. A write is stale when its token is older than the
// fence; tokens equal to the fence write (a run writes as often as it
// needs). The other words (lease, key, fencing token) are lockkit's.
//
// # The fence table
//
// One row per resource written, with the newest token (the default name is
// jobguard_fence; WithTable changes it):
//
//	CREATE TABLE IF NOT EXISTS jobguard_fence (
//		resource text PRIMARY KEY,
//		token bigint NOT NULL
//	)
//
// CreateTable runs that statement; a migration of your own may run it
// instead. Rows are never deleted by this package: a row costs a few dozen
// bytes per resource, and deleting one lets a stale writer of the resource
// write again.
//
// # SQL and isolation
//
// The statements are PostgreSQL's (INSERT ... ON CONFLICT ... RETURNING,
// $n placeholders, PostgreSQL 9.5 or later); the package uses database/sql
// only, with any PostgreSQL driver (its tests use pgx's stdlib). The fence is raised by the first
// statement of the transaction:
//
//	INSERT INTO jobguard_fence AS f (resource, token) VALUES ($1, $2)
//	ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
//	WHERE f.token <= EXCLUDED.token
//	RETURNING f.token
//
// It locks the resource's row until the transaction ends, so writers of one
// resource run one at a time. At READ COMMITTED (PostgreSQL's default
// level, which the Writer uses unless WithTxOptions or the database's
// default_transaction_isolation says otherwise) a writer that waits for another
// compares its token with the token the other committed, and the write's
// statements, run after the fence, see what earlier writers of the resource
// committed. At REPEATABLE READ or SERIALIZABLE a writer that waited for
// another writer of its resource fails with PostgreSQL's serialization
// error (SQLSTATE 40001) instead, having changed nothing: call it again,
// and it writes or returns ErrStale.
//
// # What it does not protect
//
// Only writes made through a Writer are checked: a write made on the
// database directly, a write made through the Writer under another resource
// name, a side effect outside the transaction (an e-mail, an HTTP call) and
// a write to another store are not. Tokens of different lease keys are
// ordered by when their leases were taken, not strictly: write a resource
// under one lease key.
package fencesql
