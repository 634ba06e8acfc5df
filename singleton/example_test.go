package singleton_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// One report per tenant at a time, across every server sharing the Redis: a
// duplicate is requeued and runs after the first, even with MaxRetry(0).
func Example() {
	mr := miniredis.NewMiniRedis() // any Redis; this one is embedded
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	g, err := singleton.New(rdb,
		singleton.KeyByFields("tenant_id"),                    // one report per tenant at a time
		singleton.WithPolicy(middleware.Requeue(time.Second)), // a duplicate runs once its key is free
	)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close(context.Background()) // after srv.Shutdown
	cfg := asynq.Config{
		Concurrency:              4,
		DelayedTaskCheckInterval: 100 * time.Millisecond, // requeued tasks come back promptly
		LogLevel:                 asynq.ErrorLevel,
	}
	g.Configure(&cfg) // a requeued duplicate is no failure and comes back after the policy's delay
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	done := make(chan struct{}, 2)
	mux := asynq.NewServeMux()
	mux.Use(g.Middleware)
	mux.HandleFunc("report:build", func(ctx context.Context, t *asynq.Task) error {
		var p struct {
			Tenant string `json:"tenant_id"`
		}
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return err
		}
		fmt.Println("building the report of", p.Tenant)
		time.Sleep(100 * time.Millisecond) // the work
		fmt.Println("built the report of", p.Tenant)
		done <- struct{}{}
		return nil
	})

	client, err := g.Client(asynq.NewClientFromRedisClient(rdb)) // keys each task as the middleware does
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		task := asynq.NewTask("report:build", []byte(`{"tenant_id":"acme"}`), asynq.MaxRetry(0))
		if _, err := client.Enqueue(task); err != nil {
			log.Fatal(err)
		}
	}
	if err := srv.Start(mux); err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	<-done
	<-done
	// Output:
	// building the report of acme
	// built the report of acme
	// building the report of acme
	// built the report of acme
}

// Called directly (no server needed), the wrapped handler shows the outcomes:
// a second task of the same tenant is skipped while the first runs, another
// tenant runs, and a payload without the field fails with ErrKey.
func ExampleKeyByFields() {
	store, err := inprocess.Start() // a Redis in this process
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	locker, err := store.Locker() // in production: lockkit.NewRedis(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())
	guard, err := singleton.Middleware(locker,
		singleton.KeyByFields("tenant_id"),
		singleton.WithObserver(func(_ context.Context, e middleware.Event) {
			if e.Kind == middleware.EventDuplicate {
				fmt.Printf("skipped: %s is running\n", e.Job.Key)
			}
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	var h asynq.Handler
	h = guard(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		fmt.Printf("running %s\n", t.Payload())
		if string(t.Payload()) == `{"tenant_id":"acme","n":1}` {
			_ = h.ProcessTask(ctx, asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":2}`)))
			_ = h.ProcessTask(ctx, asynq.NewTask("report", []byte(`{"tenant_id":"globex","n":3}`)))
		}
		return nil
	}))
	ctx := context.Background()
	fmt.Println("err:", h.ProcessTask(ctx, asynq.NewTask("report", []byte(`{"tenant_id":"acme","n":1}`))))
	err = h.ProcessTask(ctx, asynq.NewTask("report", []byte(`{"tenant":"acme"}`)))
	fmt.Println(errors.Is(err, singleton.ErrKey), errors.Is(err, asynq.SkipRetry))
	fmt.Println(err)
	// Output:
	// running {"tenant_id":"acme","n":1}
	// skipped: asynq:report:tenant_id="acme" is running
	// running {"tenant_id":"globex","n":3}
	// err: <nil>
	// true true
	// singleton: cannot derive key: task "report": payload has no field "tenant_id" (skip retry for the task)
}

// ServerConfig wraps a server's own IsFailure and RetryDelayFunc (nil means
// asynq's defaults): a requeued duplicate is no failure and comes back after
// the policy's delay; every other error is theirs to judge.
func ExampleServerConfig() {
	cfg := asynq.Config{
		IsFailure:      func(err error) bool { return !errors.Is(err, context.Canceled) },
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration { return time.Duration(n+1) * time.Minute },
	}
	cfg = singleton.ServerConfig(cfg) // after setting your own functions

	requeued := &singleton.RequeueError{Duplicate: &middleware.DuplicateError{Action: middleware.ActionRequeue}, Delay: 1500 * time.Millisecond}
	boom := errors.New("boom")
	fmt.Println(cfg.IsFailure(requeued), cfg.RetryDelayFunc(0, requeued, nil))
	fmt.Println(cfg.IsFailure(boom), cfg.RetryDelayFunc(0, boom, nil))
	// Output:
	// false 1.5s
	// true 1m0s
}

// The quick start: a server whose report:build tasks run one per tenant at a
// time across every server sharing rdb. (Compiled, not run: it serves until
// stopped.)
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	if err := serveReports(rdb); err != nil {
		log.Fatal(err)
	}
}

// serveReports runs the server of ExampleNew.
func serveReports(rdb redis.UniversalClient) error {
	g, err := singleton.New(rdb, // rdb: the Redis the asynq servers and clients use
		singleton.KeyByFields("tenant_id"),                    // one report per tenant at a time
		singleton.WithPolicy(middleware.Requeue(time.Second)), // a duplicate runs once its key is free
	)
	if err != nil {
		return err
	}
	defer g.Close(context.Background()) // after the server has stopped
	cfg := asynq.Config{Concurrency: 10}
	g.Configure(&cfg) // a requeued duplicate is no failure and comes back after the policy's delay
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	mux := asynq.NewServeMux()
	mux.Use(g.Middleware)
	mux.HandleFunc("report:build", buildReport)
	return srv.Run(mux)
}

// Middleware takes a Locker of the program's own, so that several
// middlewares (and lockkit.Do) share one Locker: here reports run one per
// tenant, and index rebuilds one at a time. (Compiled, not run.)
func ExampleMiddleware() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	locker, err := lockkit.NewRedis(rdb) // one per process; close it after srv.Shutdown()
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())
	perTenant, err := singleton.Middleware(locker, singleton.ForTypes("report:build"), singleton.KeyByFields("tenant_id"))
	if err != nil {
		log.Fatal(err)
	}
	oneAtATime, err := singleton.Middleware(locker, singleton.ForTypes("index:rebuild"))
	if err != nil {
		log.Fatal(err)
	}
	mux := asynq.NewServeMux()
	mux.Use(perTenant, oneAtATime)
	mux.HandleFunc("report:build", buildReport)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{})
	if err := srv.Run(mux); err != nil {
		log.Fatal(err)
	}
}

// buildReport is the report:build handler.
func buildReport(ctx context.Context, t *asynq.Task) error { return nil }

// A Client stamps each task with the Redis clock, so that under
// middleware.Coalesce one run covers every task enqueued before it began.
func ExampleNewClient() {
	mr := miniredis.NewMiniRedis() // any Redis; this one is embedded
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(rdb), rdb)
	if err != nil {
		log.Fatal(err)
	}
	info, err := client.Enqueue(asynq.NewTask("report:build", []byte(`{"tenant_id":"acme"}`)), asynq.Queue("reports"))
	if err != nil {
		log.Fatal(err)
	}
	_, stamped := info.Headers["jobguard-enqueued-at"] // the Redis server's time of the enqueue
	fmt.Println("queue:", info.Queue, "stamped:", stamped)
	// Output: queue: reports stamped: true
}

// Unique refuses a second task for a key while the first still needs it.
func ExampleUnique() {
	mr := miniredis.NewMiniRedis() // any Redis; this one is embedded
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	locker, err := lockkit.NewRedis(rdb) // the servers' Locker settings
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(rdb), rdb,
		singleton.KeyByFields("tenant_id"),                   // the middleware's key options
		singleton.Unique(locker, singleton.UntilExecuted, 0), // until the task has run
	)
	if err != nil {
		log.Fatal(err)
	}
	report := asynq.NewTask("report:build", []byte(`{"tenant_id":"acme"}`))
	first, err := client.Enqueue(report)
	fmt.Println("first:", err == nil)
	_, err = client.Enqueue(report)
	var dup *singleton.DuplicateTaskError
	fmt.Println("second refused:", errors.As(err, &dup) && dup.ID == first.ID, errors.Is(err, asynq.ErrDuplicateTask))
	// Output:
	// first: true
	// second refused: true true
}

// Debounce schedules each task as its key's newest request: of a burst, only
// the newest task will run, once the key was quiet for two seconds.
func ExampleDebounce() {
	mr := miniredis.NewMiniRedis() // any Redis; this one is embedded
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	locker, err := lockkit.NewRedis(rdb) // the servers' Locker settings
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(rdb), rdb,
		singleton.KeyByFields("tenant_id"), // the middleware's key options
		singleton.Debounce(locker, 2*time.Second, 30*time.Second),
	)
	if err != nil {
		log.Fatal(err)
	}
	var gens []string
	for range 3 {
		info, err := client.Enqueue(asynq.NewTask("report:build", []byte(`{"tenant_id":"acme"}`)))
		if err != nil {
			log.Fatal(err)
		}
		gens = append(gens, info.Headers["jobguard-debounce-gen"]) // the request's generation
		fmt.Println(info.State)
	}
	fmt.Println("newest last:", gens[0] < gens[1] && gens[1] < gens[2])
	// Output:
	// scheduled
	// scheduled
	// scheduled
	// newest last: true
}

// ParkAtEnqueue queues each task for its key: the first task of a key
// reserves it and is pending, the others wait parked (scheduled at the
// backstop) until the run before them ends and starts them.
func ExampleParkAtEnqueue() {
	mr := miniredis.NewMiniRedis() // any Redis; this one is embedded
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	locker, err := lockkit.NewRedis(rdb) // the servers' Locker settings
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	client, err := singleton.NewClient(asynq.NewClientFromRedisClient(rdb), rdb,
		singleton.KeyByFields("tenant_id"), // the middleware's key options
		singleton.ParkAtEnqueue(locker, 0), // started by the run before; 30 s backstop
	)
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		info, err := client.Enqueue(asynq.NewTask("report:build", []byte(`{"tenant_id":"acme"}`)))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(info.State)
	}
	// Output:
	// pending
	// scheduled
	// scheduled
}

// Premium tenants run two reports at once, the others one: the limit is a
// function of the task.
func ExampleWithLimitFunc() {
	store, err := inprocess.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	locker, err := store.Locker()
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())
	tierOf := func(t *asynq.Task) string {
		var p struct {
			Tier string `json:"tier"`
		}
		_ = json.Unmarshal(t.Payload(), &p)
		return p.Tier
	}
	mw, err := singleton.Middleware(locker,
		singleton.KeyByFields("tenant_id"),
		singleton.WithLimitFunc(func(_ context.Context, t *asynq.Task) int {
			if tierOf(t) == "premium" {
				return 2
			}
			return 1
		}),
		singleton.WithObserver(func(_ context.Context, e middleware.Event) {
			if e.Kind == middleware.EventDuplicate {
				fmt.Printf("skipped: %s has as many runs as its limit\n", e.Job.Key)
			}
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	var h asynq.Handler
	depth := 0
	h = mw(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		depth++
		defer func() { depth-- }()
		fmt.Printf("running %s (%d at once)\n", t.Payload(), depth)
		if depth < 3 {
			_ = h.ProcessTask(ctx, asynq.NewTask("report", t.Payload())) // the same tenant again
		}
		return nil
	}))
	_ = h.ProcessTask(context.Background(), asynq.NewTask("report", []byte(`{"tenant_id":"acme","tier":"premium"}`)))
	_ = h.ProcessTask(context.Background(), asynq.NewTask("report", []byte(`{"tenant_id":"globex","tier":"basic"}`)))
	// Output:
	// running {"tenant_id":"acme","tier":"premium"} (1 at once)
	// running {"tenant_id":"acme","tier":"premium"} (2 at once)
	// skipped: asynq:report:tenant_id="acme" has as many runs as its limit
	// running {"tenant_id":"globex","tier":"basic"} (1 at once)
	// skipped: asynq:report:tenant_id="globex" has as many runs as its limit
}

// Each tenant runs one report at a time (its key), and reports that call
// the GitHub API also hold "api:github", two at once across every tenant:
// the third such report is skipped although its tenant's key is free, and
// keeps no key.
func ExampleWithExtraKeys() {
	store, err := inprocess.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	locker, err := store.Locker()
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())
	mw, err := singleton.Middleware(locker,
		singleton.KeyByFields("tenant_id"),
		singleton.WithExtraKeys(func(_ context.Context, t *asynq.Task) map[string]int {
			return map[string]int{"api:github": 2}
		}),
		singleton.WithObserver(func(_ context.Context, e middleware.Event) {
			if e.Kind == middleware.EventDuplicate {
				fmt.Printf("skipped %s: %v\n", e.Job.Key, errors.Is(e.Err, lockkit.ErrNotAcquired))
			}
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	others := []string{"globex", "initech"} // delivered while the one before runs
	var h asynq.Handler
	h = mw(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		fmt.Printf("running %s\n", t.Payload())
		if len(others) > 0 {
			next := others[0]
			others = others[1:]
			_ = h.ProcessTask(ctx, asynq.NewTask("report", []byte(`{"tenant_id":"`+next+`"}`)))
		}
		return nil
	}))
	_ = h.ProcessTask(context.Background(), asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)))
	info, _ := locker.Inspect(context.Background(), `asynq:report:tenant_id="initech"`)
	fmt.Println("initech's key held afterwards:", len(info.Holders) > 0)
	// Output:
	// running {"tenant_id":"acme"}
	// running {"tenant_id":"globex"}
	// skipped asynq:report:tenant_id="initech": true
	// initech's key held afterwards: false
}

// Tasks of several types count against one key when their key option
// derives the same key for them: KeyFunc keys used as returned, so
// "tenant:<id>" is shared by reports and exports (the built-in key options
// start with the task type, so they never are). With WithLimit(1) a
// tenant runs one of its tasks at a time, whatever its type.
func ExampleKeyFunc_sharedAcrossTaskTypes() {
	store, err := inprocess.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	locker, err := store.Locker()
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())
	mw, err := singleton.Middleware(locker,
		singleton.KeyFunc(func(_ context.Context, t *asynq.Task) (string, error) {
			var p struct {
				Tenant string `json:"tenant_id"`
			}
			if err := json.Unmarshal(t.Payload(), &p); err != nil || p.Tenant == "" {
				return "", errors.New("no tenant_id")
			}
			return "tenant:" + p.Tenant, nil // the same for every task type
		}),
		singleton.WithObserver(func(_ context.Context, e middleware.Event) {
			if e.Kind == middleware.EventDuplicate {
				fmt.Printf("skipped %s: %s is held\n", e.Job.Name, e.Job.Key)
			}
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	var h asynq.Handler
	h = mw(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		fmt.Printf("running %s of %s\n", t.Type(), t.Payload())
		if t.Type() == "report" {
			_ = h.ProcessTask(ctx, asynq.NewTask("export", []byte(`{"tenant_id":"acme"}`)))
			_ = h.ProcessTask(ctx, asynq.NewTask("export", []byte(`{"tenant_id":"globex"}`)))
		}
		return nil
	}))
	_ = h.ProcessTask(context.Background(), asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)))
	// Output:
	// running report of {"tenant_id":"acme"}
	// skipped export: tenant:acme is held
	// running export of {"tenant_id":"globex"}
}
