package fencesql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/fencesql"
	"github.com/jobguard/jobguard/fencesql/internal/testpg"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/fence"
)

func TestMain(m *testing.M) { os.Exit(testpg.Run(m)) }

// setup returns a database on a schema of the test's own, with the fence
// table and a table of reports (the data the tests write), and a Writer
// built with opts.
func setup(t *testing.T, opts ...fencesql.Option) (*sql.DB, *fencesql.Writer) {
	t.Helper()
	db := testpg.DB(t)
	w, err := fencesql.New(db, opts...)
	require.NoError(t, err)
	require.NoError(t, w.CreateTable(context.Background()))
	_, err = db.Exec(`CREATE TABLE reports (tenant text PRIMARY KEY, body text NOT NULL)`)
	require.NoError(t, err)
	return db, w
}

// writeReport writes tenant's report under the resource "report:<tenant>".
func writeReport(ctx context.Context, w *fencesql.Writer, tok fence.Token, tenant, body string) error {
	_, err := w.Exec(ctx, tok, "report:"+tenant,
		`INSERT INTO reports (tenant, body) VALUES ($1, $2) ON CONFLICT (tenant) DO UPDATE SET body = EXCLUDED.body`, tenant, body)
	return err
}

// report reads tenant's report ("" when there is none).
func report(t *testing.T, db *sql.DB, tenant string) string {
	t.Helper()
	return queryOne[string](t, db, `SELECT body FROM reports WHERE tenant = $1`, tenant)
}

// fenceOf reads resource's fence (0 when it has none).
func fenceOf(t *testing.T, db *sql.DB, resource string) int64 {
	t.Helper()
	return queryOne[int64](t, db, `SELECT token FROM jobguard_fence WHERE resource = $1`, resource)
}

// queryOne returns the value of the one column of the row query returns,
// the zero value when it returns none.
func queryOne[T any](t *testing.T, db *sql.DB, query string, arg any) T {
	t.Helper()
	var v T
	err := db.QueryRow(query, arg).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return v
	}
	require.NoError(t, err)
	return v
}

// requireStale checks that err is a *fence.StaleError for resource, token
// tok and newest token newest.
func requireStale(t *testing.T, err error, resource string, tok fence.Token, newest int64) {
	t.Helper()
	require.ErrorIs(t, err, fence.ErrStale)
	var stale *fence.StaleError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, fence.StaleError{Key: resource, Lease: tok.Key, Token: tok.Value, Newest: newest}, *stale)
}

// A holder whose lease expired writes after a second holder took the key
// and wrote: its write is refused with a *fence.StaleError carrying the
// second's token, and the row holds the second's write. The leases are
// lockkit's on a real Redis; the first is not renewed (NoRenew), and the
// second holder's Acquire waits for its expiry.
func TestStaleHolderIsRefused(t *testing.T) {
	ctx := context.Background()
	db, w := setup(t)
	c := testredis.Client(t)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(testredis.Prefix(t, c)), lockkit.WithPollInterval(10*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })

	first, err := l.TryAcquire(ctx, "report:acme", &lockkit.AcquireOptions{TTL: 100 * time.Millisecond, NoRenew: true})
	require.NoError(t, err)
	firstCtx, cancel := first.Context(ctx)
	defer cancel()
	t1, err := fence.FromContext(firstCtx)
	require.NoError(t, err)
	require.NoError(t, writeReport(firstCtx, w, t1, "acme", "first"))

	wait, cancelWait := context.WithTimeout(ctx, 10*time.Second)
	defer cancelWait()
	second, err := l.Acquire(wait, "report:acme", nil) // once the first lease expired
	require.NoError(t, err)
	defer second.Release(ctx)
	secondCtx, cancel2 := second.Context(ctx)
	defer cancel2()
	t2, err := fence.FromContext(secondCtx)
	require.NoError(t, err)
	require.Greater(t, t2.Value, t1.Value)
	require.NoError(t, writeReport(secondCtx, w, t2, "acme", "second"))

	// The first holder is back and writes, ignoring its lease's
	// cancellation: refused, by Exec and by Write, whose fn is not called.
	stale := context.WithoutCancel(firstCtx)
	requireStale(t, writeReport(stale, w, t1, "acme", "stale"), "report:acme", t1, t2.Value)
	err = w.Write(stale, t1, "report:acme", func(ctx context.Context, tx *sql.Tx) error {
		t.Error("a stale write's fn was called")
		return nil
	})
	requireStale(t, err, "report:acme", t1, t2.Value)
	require.Equal(t, "second", report(t, db, "acme"), "the row holds the second holder's write")
	require.Equal(t, t2.Value, fenceOf(t, db, "report:acme"))
	require.NoError(t, writeReport(secondCtx, w, t2, "acme", "second again"), "the newest token writes again")
	require.Equal(t, "second again", report(t, db, "acme"))
}

// Writes with interleaved tokens, one after another: those whose token is
// not older than every earlier write's land, in order; the others are
// refused and change nothing; the row holds the newest token's write.
func TestInterleavedTokens(t *testing.T) {
	ctx := context.Background()
	db, w := setup(t)
	var landed []string
	newest := int64(0)
	for _, v := range []int64{30, 10, 40, 10, 50, 90, 20, 60, 90} {
		tok := fence.Token{Key: "report:acme", Value: v}
		err := writeReport(ctx, w, tok, "acme", fmt.Sprint(v))
		if v < newest {
			requireStale(t, err, "report:acme", tok, newest)
			continue
		}
		require.NoError(t, err, "token %d", v)
		newest = v
		landed = append(landed, fmt.Sprint(v))
	}
	require.Equal(t, []string{"30", "40", "50", "90", "90"}, landed)
	require.Equal(t, "90", report(t, db, "acme"))
	require.Equal(t, int64(90), fenceOf(t, db, "report:acme"))
	require.Equal(t, int64(0), fenceOf(t, db, "report:globex"), "each resource has a fence of its own")
	require.NoError(t, writeReport(ctx, w, fence.Token{Value: 1}, "globex", "1"))
}

// Writers of one resource run at once with tokens in no order: every write
// lands or is refused with a newer token; the writes that land do so in
// the order of their tokens (a history table written in the same
// transactions says which landed, in commit order); the row holds the
// newest token's write.
func TestConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	db, w := setup(t)
	_, err := db.Exec(`CREATE TABLE history (id bigserial PRIMARY KEY, token bigint NOT NULL)`)
	require.NoError(t, err)
	tokens := []int64{7, 3, 12, 1, 9, 5, 11, 2, 8, 4, 10, 6, 12, 5}
	start := make(chan struct{})
	errs := make([]error, len(tokens))
	var wg sync.WaitGroup
	for i, v := range tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = w.Write(ctx, fence.Token{Value: v}, "report:acme", func(ctx context.Context, tx *sql.Tx) error {
				// The history's id is drawn under the fence's row lock: its
				// order is the order in which the writes commit.
				if _, err := tx.ExecContext(ctx, `INSERT INTO history (token) VALUES ($1)`, v); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, `INSERT INTO reports (tenant, body) VALUES ('acme', $1)
					ON CONFLICT (tenant) DO UPDATE SET body = EXCLUDED.body`, fmt.Sprint(v))
				return err
			})
		}()
	}
	close(start)
	wg.Wait()
	landed := 0
	for i, err := range errs {
		if err == nil {
			landed++
			continue
		}
		var stale *fence.StaleError
		require.ErrorAs(t, err, &stale, "token %d", tokens[i])
		require.Greater(t, stale.Newest, tokens[i])
	}
	rows, err := db.Query(`SELECT token FROM history ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var history []int64
	for rows.Next() {
		var v int64
		require.NoError(t, rows.Scan(&v))
		history = append(history, v)
	}
	require.NoError(t, rows.Err())
	require.Len(t, history, landed)
	for i := 1; i < len(history); i++ {
		require.LessOrEqual(t, history[i-1], history[i], "a write with an older token landed after a newer one: %v", history)
	}
	require.Equal(t, "12", report(t, db, "acme"))
	require.Equal(t, int64(12), fenceOf(t, db, "report:acme"))
}

// holdFence starts a write of resource with token v whose fn blocks until
// release is closed, and returns once it holds the fence's row lock; the
// write's body is v. done receives the write's error.
func holdFence(t *testing.T, w *fencesql.Writer, v int64, release <-chan struct{}) (done <-chan error) {
	t.Helper()
	holding := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- w.Write(context.Background(), fence.Token{Value: v}, "report:acme", func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO reports (tenant, body) VALUES ('acme', $1)
				ON CONFLICT (tenant) DO UPDATE SET body = EXCLUDED.body`, fmt.Sprint(v))
			close(holding)
			<-release
			return err
		})
	}()
	select {
	case <-holding:
	case err := <-errc:
		t.Fatalf("the write holding the fence returned: %v", err)
	}
	return errc
}

// waitForLockWaiter waits until a statement on the fence table waits for a
// lock in db's database.
func waitForLockWaiter(t *testing.T, db *sql.DB) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%jobguard_fence%'`).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond, "no writer waits for the fence's row lock")
}

// A writer of a resource that another writer holds waits for it, then
// compares its token with the one the other committed: an older token is
// refused, a newer one writes after it.
func TestWaiterComparesWithTheCommittedToken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		waiter int64
		want   string
	}{
		{name: "older", waiter: 4, want: "5"},
		{name: "newer", waiter: 6, want: "6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db, w := setup(t)
			release := make(chan struct{})
			holder := holdFence(t, w, 5, release)
			waiter := make(chan error, 1)
			go func() { waiter <- writeReport(ctx, w, fence.Token{Value: tc.waiter}, "acme", fmt.Sprint(tc.waiter)) }()
			waitForLockWaiter(t, db)
			close(release)
			require.NoError(t, <-holder)
			err := <-waiter
			if tc.waiter < 5 {
				requireStale(t, err, "report:acme", fence.Token{Value: tc.waiter}, 5)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.want, report(t, db, "acme"))
		})
	}
}

// A writer waiting for the fence's row lock stops when its ctx ends (as a
// job's does when its lease is lost), having changed nothing.
func TestWaiterStopsWithItsCtx(t *testing.T) {
	db, w := setup(t)
	release := make(chan struct{})
	holder := holdFence(t, w, 5, release)
	ctx, cancel := context.WithCancel(context.Background())
	waiter := make(chan error, 1)
	go func() { waiter <- writeReport(ctx, w, fence.Token{Value: 6}, "acme", "6") }()
	waitForLockWaiter(t, db)
	cancel()
	err := <-waiter
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, `fencesql: Exec("report:acme"): raising the fence in jobguard_fence`)
	close(release)
	require.NoError(t, <-holder)
	require.Equal(t, "5", report(t, db, "acme"))
	require.Equal(t, int64(5), fenceOf(t, db, "report:acme"))
}

// At REPEATABLE READ a writer that waited for another writer of its
// resource fails with a serialization error (SQLSTATE 40001), having
// changed nothing; called again, it writes.
func TestRepeatableReadWaiterFails(t *testing.T) {
	ctx := context.Background()
	db, w := setup(t, fencesql.WithTxOptions(sql.TxOptions{Isolation: sql.LevelRepeatableRead}))
	release := make(chan struct{})
	holder := holdFence(t, w, 5, release)
	waiter := make(chan error, 1)
	go func() { waiter <- writeReport(ctx, w, fence.Token{Value: 6}, "acme", "6") }()
	waitForLockWaiter(t, db)
	close(release)
	require.NoError(t, <-holder)
	err := <-waiter
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "40001", pgErr.Code, "%v", err)
	require.NotErrorIs(t, err, fence.ErrStale)
	require.Equal(t, "5", report(t, db, "acme"))
	require.NoError(t, writeReport(ctx, w, fence.Token{Value: 6}, "acme", "6"))
	require.Equal(t, "6", report(t, db, "acme"))
}

// Tokens equal to the fence write: a run writes as often as it needs.
func TestEqualTokensWrite(t *testing.T) {
	ctx := context.Background()
	db, w := setup(t)
	tok := fence.Token{Key: "report:acme", Value: 7}
	require.NoError(t, writeReport(ctx, w, tok, "acme", "once"))
	require.NoError(t, writeReport(ctx, w, tok, "acme", "twice"))
	require.Equal(t, "twice", report(t, db, "acme"))
}

// A write whose fn fails, panics, or whose query fails is rolled back with
// its fence: an older token writes after it.
func TestFailedWriteRaisesNoFence(t *testing.T) {
	ctx := context.Background()
	db, w := setup(t)
	tok := fence.Token{Value: 9}
	update := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO reports (tenant, body) VALUES ('acme', '9')`)
		return err
	}
	errBoom := errors.New("boom")
	err := w.Write(ctx, tok, "report:acme", func(ctx context.Context, tx *sql.Tx) error {
		require.NoError(t, update(ctx, tx))
		return errBoom
	})
	require.Same(t, errBoom, err, "fn's error is returned as is")

	require.PanicsWithValue(t, "fn panicked", func() {
		_ = w.Write(ctx, tok, "report:acme", func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, update(ctx, tx))
			panic("fn panicked")
		})
	})
	require.Zero(t, db.Stats().InUse, "the panicking write's connection was given back")

	_, err = w.Exec(ctx, tok, "report:acme", `INSERT INTO no_such_table VALUES (1)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the query's error is wrapped")
	require.Contains(t, err.Error(), `fencesql: Exec("report:acme")`)

	require.Equal(t, "", report(t, db, "acme"))
	require.Equal(t, int64(0), fenceOf(t, db, "report:acme"))
	require.NoError(t, writeReport(ctx, w, fence.Token{Value: 5}, "acme", "5"))
	require.Equal(t, "5", report(t, db, "acme"))
}

// CreateTable may run again, and WithTable puts the fence in a table of
// the caller's, in a schema of its choice.
func TestCreateTable(t *testing.T) {
	ctx := context.Background()
	db := testpg.DB(t)
	jobs := fmt.Sprintf("jobs_%d", time.Now().UnixNano()) // a schema of this run's
	_, err := db.Exec(`CREATE SCHEMA ` + jobs)
	require.NoError(t, err)
	w, err := fencesql.New(db, fencesql.WithTable(jobs+".Fence"))
	require.NoError(t, err)
	require.NoError(t, w.CreateTable(ctx))
	require.NoError(t, w.CreateTable(ctx), "CreateTable again")
	_, err = w.Exec(ctx, fence.Token{Value: 3}, "report:acme", `SELECT 1`)
	require.NoError(t, err)
	var tok int64
	require.NoError(t, db.QueryRow(`SELECT token FROM `+jobs+`.fence WHERE resource = 'report:acme'`).Scan(&tok))
	require.Equal(t, int64(3), tok)

	missing, err := fencesql.New(db, fencesql.WithTable("missing"))
	require.NoError(t, err)
	_, err = missing.Exec(ctx, fence.Token{Value: 3}, "report:acme", `SELECT 1`)
	require.ErrorContains(t, err, `fencesql: Exec("report:acme"): raising the fence in missing`)
}

// Bad input is refused with ErrInvalid and a message naming the problem,
// before anything is sent (the database here does not exist).
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	defer db.Close()
	for _, tc := range []struct {
		name string
		opts []fencesql.Option
		want string
	}{
		{"dash", []fencesql.Option{fencesql.WithTable("job-fence")}, `WithTable "job-fence" is no table name`},
		{"digit", []fencesql.Option{fencesql.WithTable("1fence")}, `WithTable "1fence"`},
		{"empty", []fencesql.Option{fencesql.WithTable("")}, `WithTable ""`},
		{"three parts", []fencesql.Option{fencesql.WithTable("a.b.c")}, `WithTable "a.b.c"`},
		{"quote", []fencesql.Option{fencesql.WithTable(`f"; DROP TABLE x; --`)}, `is no table name`},
		{"too long", []fencesql.Option{fencesql.WithTable(strings.Repeat("f", 64))}, `at most 63 bytes`},
		{"read-only", []fencesql.Option{fencesql.WithTxOptions(sql.TxOptions{ReadOnly: true})}, `WithTxOptions is read-only`},
	} {
		t.Run("New/"+tc.name, func(t *testing.T) {
			_, err := fencesql.New(db, tc.opts...)
			require.ErrorIs(t, err, fencesql.ErrInvalid)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err = fencesql.New(nil)
	require.ErrorIs(t, err, fencesql.ErrInvalid)
	require.ErrorContains(t, err, "db is nil")
	_, err = fencesql.New(db, nil, fencesql.WithTable("jobs.fence_2")) // a nil option is ignored
	require.NoError(t, err)

	w, err := fencesql.New(db)
	require.NoError(t, err)
	fn := func(context.Context, *sql.Tx) error { return nil }
	ok := fence.Token{Value: 1}
	for _, tc := range []struct {
		name     string
		tok      fence.Token
		resource string
		fn       func(context.Context, *sql.Tx) error
		want     string
	}{
		{"zero token", fence.Token{}, "r", fn, "token 0 is no fencing token"},
		{"negative token", fence.Token{Value: -3}, "r", fn, "token -3 is no fencing token"},
		{"empty resource", ok, "", fn, "resource is empty"},
		{"long resource", ok, strings.Repeat("r", 1025), fn, "resource is 1025 bytes long, more than 1024"},
		{"NUL", ok, "a\x00b", fn, "resource must be UTF-8 without NUL bytes"},
		{"not UTF-8", ok, "a\xffb", fn, "resource must be UTF-8 without NUL bytes"},
		{"nil fn", ok, "r", nil, `Write("r"): fn is nil`},
	} {
		t.Run("Write/"+tc.name, func(t *testing.T) {
			err := w.Write(ctx, tc.tok, tc.resource, tc.fn)
			require.ErrorIs(t, err, fencesql.ErrInvalid)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err = w.Exec(ctx, ok, "r", " \n")
	require.ErrorIs(t, err, fencesql.ErrInvalid)
	require.ErrorContains(t, err, `Exec("r"): query is empty`)
	_, err = w.Exec(ctx, fence.Token{}, "r", "SELECT 1")
	require.ErrorIs(t, err, fencesql.ErrInvalid)
	require.ErrorContains(t, err, `Exec("r"): token 0`)
}
