package fencesql_test

import (
	"context"
	"database/sql"
	"errors"
	"log"

	"github.com/hibiken/asynq"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver; any PostgreSQL driver serves
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/fencesql"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/fence"
	"github.com/jobguard/jobguard/singleton"
)

// An asynq handler under singleton's middleware writes the tenant's report
// with the token of the lease its task runs under: a run whose lease ran
// out, back after a newer run wrote the report, changes nothing. (Compiled,
// not run: it needs PostgreSQL and Redis.)
func Example_asynq() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	w, err := fencesql.New(db)
	if err != nil {
		log.Fatal(err)
	}
	if err := w.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	g, err := singleton.New(rdb, singleton.KeyByFields("tenant_id"))
	if err != nil {
		log.Fatal(err)
	}
	mux := asynq.NewServeMux()
	mux.Use(g.Middleware)
	mux.HandleFunc("report", func(ctx context.Context, t *asynq.Task) error {
		tok, err := fence.FromContext(ctx) // ErrNoLease without g.Middleware
		if err != nil {
			return err
		}
		// A *fence.StaleError when a newer run has written the tenant's report:
		// the transaction was rolled back, the report is the newer run's.
		_, err = w.Exec(ctx, tok, "report:"+tenantOf(t),
			`UPDATE reports SET body = $1 WHERE tenant = $2`, buildReport(t), tenantOf(t))
		return err
	})
}

// Several statements in one fenced transaction: they are committed with the
// fence, or not at all. (Compiled, not run: it needs PostgreSQL and Redis.)
func ExampleWriter_Write() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	w, err := fencesql.New(db, fencesql.WithTable("jobs.fence"))
	if err != nil {
		log.Fatal(err)
	}
	locker, err := lockkit.NewRedis(redis.NewClient(&redis.Options{Addr: "localhost:6379"}))
	if err != nil {
		log.Fatal(err)
	}
	err = lockkit.Do(ctx, locker, "invoices:acme", nil, func(ctx context.Context) error {
		tok, err := fence.FromContext(ctx)
		if err != nil {
			return err
		}
		return w.Write(ctx, tok, "invoices:acme", func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `UPDATE invoices SET sent = true WHERE tenant = $1 AND NOT sent`, "acme"); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO events (tenant, what) VALUES ($1, 'invoices sent')`, "acme")
			return err
		})
	})
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		log.Printf("a newer run (token %d) has sent acme's invoices", stale.Newest)
	}
}

func buildReport(*asynq.Task) string { return "..." }

func tenantOf(*asynq.Task) string { return "acme" }
