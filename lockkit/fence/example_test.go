package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/fence"
	"github.com/jobguard/jobguard/lockkit/inprocess"
	"github.com/jobguard/jobguard/singleton"
)

// A holder whose lease ran out writes after the next holder has: its write
// is refused, and the data keeps the next holder's.
func Example() {
	ctx := context.Background()
	srv, _ := inprocess.Start() // a Redis in this process; use yours
	defer srv.Close()
	locker, _ := srv.Locker()
	defer locker.Close(ctx)
	w, _ := fence.New(srv.Client())

	// The first holder is paused past its lease (here: not renewed).
	first, _ := locker.TryAcquire(ctx, "report:acme", &lockkit.AcquireOptions{TTL: 100 * time.Millisecond, NoRenew: true})
	stale := fence.Token{Key: "report:acme", Value: first.Token()}
	// The second takes the key once the first's lease has expired, and writes.
	second, _ := locker.Acquire(ctx, "report:acme", nil)
	defer second.Release(ctx)
	_ = w.Set(ctx, fence.Token{Key: "report:acme", Value: second.Token()}, "report:acme", "second run's report", 0)

	// The first is back and writes: refused.
	err := w.Set(ctx, stale, "report:acme", "first run's report", 0)
	var refused *fence.StaleError
	fmt.Println("stale:", errors.Is(err, fence.ErrStale), errors.As(err, &refused) && refused.Newest == second.Token())
	fmt.Println("data:", srv.Client().Get(ctx, "report:acme").Val())
	// Output:
	// stale: true true
	// data: second run's report
}

// The work reads its lease's token from its ctx in one line, and writes
// with it.
func ExampleFromContext() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := srv.Locker()
	defer locker.Close(ctx)
	w, _ := fence.New(srv.Client())

	err := lockkit.Do(ctx, locker, "invoices", nil, func(ctx context.Context) error {
		tok, err := fence.FromContext(ctx)
		if err != nil {
			return err
		}
		n, err := w.Incr(ctx, tok, "invoices:sent")
		fmt.Println("invoices sent:", n)
		return err
	})
	fmt.Println("err:", err)
	_, err = fence.FromContext(ctx) // outside the work: no lease
	fmt.Println(errors.Is(err, fence.ErrNoLease))
	// Output:
	// invoices sent: 1
	// err: <nil>
	// true
}

// Fenced writes of every kind, with one token.
func ExampleWriter() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	rdb := srv.Client()
	w, err := fence.New(rdb, fence.WithLinger(time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	tok := fence.Token{Key: "tenant:acme", Value: 1795000000000000} // from FromContext

	_ = w.Set(ctx, tok, "{acme}:status", "building", time.Minute)
	_ = w.HSet(ctx, tok, "{acme}:report", "rows", 42, "pages", 3)
	total, _ := w.IncrBy(ctx, tok, "{acme}:reports", 1)
	_, _ = w.XAdd(ctx, tok, "{acme}:events", "event", "report built")
	_ = w.Del(ctx, tok, "{acme}:status")
	fmt.Println(total, rdb.HGet(ctx, "{acme}:report", "rows").Val(), rdb.XLen(ctx, "{acme}:events").Val(), rdb.Exists(ctx, "{acme}:status").Val())
	// Output:
	// 1 42 1 0
}

// An asynq handler under singleton's middleware writes with the token of
// the lease its task runs under. (Compiled, not run: it needs a Redis.)
func Example_asynq() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	g, err := singleton.New(rdb, singleton.KeyByFields("tenant_id"))
	if err != nil {
		log.Fatal(err)
	}
	w, err := fence.New(rdb)
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
		// A newer run of the tenant's report has written: this one is stale,
		// and its write changed nothing.
		return w.Set(ctx, tok, "report:"+tenantOf(t), buildReport(t), 0)
	})
}

// A cron job under cronguard writes with the token of its tick's lease.
// (Compiled, not run: it needs a Redis.)
func Example_cron() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	locker, err := lockkit.NewRedis(rdb)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := cronguard.New(locker)
	if err != nil {
		log.Fatal(err)
	}
	w, err := fence.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	c := cron.New()
	_, err = guard.Add(c, "daily-digest", "0 6 * * *", cronguard.Func(func(ctx context.Context) error {
		tok, err := fence.FromContext(ctx)
		if err != nil {
			return err
		}
		_, err = w.XAdd(ctx, tok, "digests", "day", time.Now().Format(time.DateOnly))
		return err
	}))
	if err != nil {
		log.Fatal(err)
	}
	c.Start()
}

func buildReport(*asynq.Task) string { return "..." }

func tenantOf(*asynq.Task) string { return "acme" }
