package fencesql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jobguard/jobguard/lockkit/fence"
)

// ErrInvalid is wrapped by every validation error (it is fence.ErrInvalid,
// lockkit's); the message names the call and the bad value. Stale writes
// return a *fence.StaleError, which matches fence.ErrStale.
var ErrInvalid = fence.ErrInvalid

// defaultTable is the name of the fence table when WithTable is not given.
const defaultTable = "jobguard_fence"

// maxResource is the longest resource name, in bytes: a btree index entry
// of PostgreSQL holds a little under 2.7 kB.
const maxResource = 1024

// Writer makes fenced writes to a PostgreSQL database through database/sql:
// each write is one transaction that raises the resource's fence to the
// writer's token, refusing the write (fence.ErrStale) when a newer token has
// written to the resource, then makes the write and commits (see the
// package doc). A Writer holds no goroutine and needs no closing; it is safe
// for concurrent use. Build it with New.
type Writer struct {
	db     *sql.DB
	table  string
	txOpts *sql.TxOptions

	create, raise, newest string
}

// Option configures a Writer.
type Option func(*Writer)

// WithTable sets the name of the fence table: an SQL identifier (letters,
// digits and underscores, not starting with a digit, at most 63 bytes),
// optionally qualified by a schema ("jobs.fence"); PostgreSQL folds it to
// lower case, as it does every unquoted name. Defaults to "jobguard_fence",
// in the connection's search_path.
func WithTable(name string) Option {
	return func(w *Writer) { w.table = name }
}

// WithTxOptions sets the options of the transactions of the writes, such as
// their isolation level (see the package doc for what each level does to
// writers of one resource). A read-only transaction is refused. Defaults to
// the zero sql.TxOptions: the database's default level, READ COMMITTED on
// PostgreSQL unless configured otherwise.
func WithTxOptions(opts sql.TxOptions) Option {
	return func(w *Writer) { w.txOpts = &opts }
}

// identifier matches a table name that needs no quoting: a name, or a
// schema and a name.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// New returns a Writer on db, which it does not close; it sends nothing to
// the database. It returns an error matching ErrInvalid for a nil db, a
// table name that is no identifier, or read-only WithTxOptions.
func New(db *sql.DB, opts ...Option) (*Writer, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: fencesql.New: db is nil", ErrInvalid)
	}
	w := &Writer{db: db, table: defaultTable}
	for _, o := range opts {
		if o != nil {
			o(w)
		}
	}
	if !identifier.MatchString(w.table) {
		return nil, fmt.Errorf("%w: fencesql.New: WithTable %q is no table name: letters, digits and underscores, not starting with a digit, at most 63 bytes, optionally schema.name", ErrInvalid, w.table)
	}
	if w.txOpts != nil && w.txOpts.ReadOnly {
		return nil, fmt.Errorf("%w: fencesql.New: WithTxOptions is read-only: a write needs a read-write transaction", ErrInvalid)
	}
	w.create = `CREATE TABLE IF NOT EXISTS ` + w.table + ` (resource text PRIMARY KEY, token bigint NOT NULL)`
	w.raise = `INSERT INTO ` + w.table + ` AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
RETURNING f.token`
	w.newest = `SELECT token FROM ` + w.table + ` WHERE resource = $1`
	return w, nil
}

// CreateTable creates the fence table if it does not exist (the DDL is in
// the package doc). It returns the database's error wrapped.
func (w *Writer) CreateTable(ctx context.Context) error {
	if _, err := w.db.ExecContext(ctx, w.create); err != nil {
		return fmt.Errorf("fencesql: CreateTable %s: %w", w.table, err)
	}
	return nil
}

// Write runs fn in a transaction fenced on resource with token t: it raises
// the resource's fence to t, runs fn with the transaction and commits. fn
// must neither commit nor roll back tx; it may run any statements, and they
// are committed only with the fence.
//
// When a newer token has written to resource, fn is not called, nothing
// changes, and Write returns a *fence.StaleError (fence.ErrStale) carrying
// the newest token. When fn returns an error or panics, the transaction
// (the fence with it) is rolled back, and Write returns fn's error as is
// or panics again. Other errors: ErrInvalid for a token that is not
// positive, an empty resource, one longer than 1024 bytes or not UTF-8 or
// holding a NUL byte, or a nil fn; the database's error wrapped (a commit
// that fails may or may not have committed).
func (w *Writer) Write(ctx context.Context, t fence.Token, resource string, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if fn == nil {
		return fmt.Errorf("%w: fencesql: Write(%q): fn is nil", ErrInvalid, resource)
	}
	return w.write(ctx, "Write", t, resource, fn)
}

// Exec runs query with args (PostgreSQL's $1, $2, ... placeholders) in a
// transaction fenced on resource with token t, as Write does, and returns
// its result once committed. Errors are those of Write (the query's error
// is returned wrapped, after the rollback), and ErrInvalid for an empty
// query.
func (w *Writer) Exec(ctx context.Context, t fence.Token, resource, query string, args ...any) (sql.Result, error) {
	if strings.TrimSpace(query) == "" {
		return nil, fmt.Errorf("%w: fencesql: Exec(%q): query is empty", ErrInvalid, resource)
	}
	var res sql.Result
	err := w.write(ctx, "Exec", t, resource, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		if res, err = tx.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("fencesql: Exec(%q): %w", resource, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// write is Write and Exec (op names the call in errors).
func (w *Writer) write(ctx context.Context, op string, t fence.Token, resource string, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	if err := checkWrite(op, t, resource); err != nil {
		return err
	}
	tx, err := w.db.BeginTx(ctx, w.txOpts)
	if err != nil {
		return fmt.Errorf("fencesql: %s(%q): begin: %w", op, resource, err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback() // the error that ended the transaction is the one to report
		}
	}()
	var fenced int64
	switch err := tx.QueryRowContext(ctx, w.raise, resource, t.Value).Scan(&fenced); {
	case errors.Is(err, sql.ErrNoRows): // the WHERE refused: a newer token has written
		var newest int64
		if err := tx.QueryRowContext(ctx, w.newest, resource).Scan(&newest); err != nil {
			return fmt.Errorf("fencesql: %s(%q): token %d is stale; reading the newest: %w", op, resource, t.Value, err)
		}
		return &fence.StaleError{Key: resource, Lease: t.Key, Token: t.Value, Newest: newest}
	case err != nil:
		return fmt.Errorf("fencesql: %s(%q): raising the fence in %s: %w", op, resource, w.table, err)
	}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fencesql: %s(%q): commit: %w", op, resource, err)
	}
	committed = true
	return nil
}

// checkWrite validates the token and resource of a write.
func checkWrite(op string, t fence.Token, resource string) error {
	switch {
	case t.Value <= 0:
		return fmt.Errorf("%w: fencesql: %s(%q): token %d is no fencing token: take it from fence.FromContext or a Lease's Token", ErrInvalid, op, resource, t.Value)
	case resource == "":
		return fmt.Errorf("%w: fencesql: %s: resource is empty", ErrInvalid, op)
	case len(resource) > maxResource:
		return fmt.Errorf("%w: fencesql: %s(%.40q...): resource is %d bytes long, more than %d", ErrInvalid, op, resource, len(resource), maxResource)
	case !utf8.ValidString(resource) || strings.IndexByte(resource, 0) >= 0:
		return fmt.Errorf("%w: fencesql: %s(%q): resource must be UTF-8 without NUL bytes, as PostgreSQL's text is", ErrInvalid, op, resource)
	}
	return nil
}
