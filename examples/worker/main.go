// Command worker runs two asynq servers in one process, as if on two
// machines, behind singleton.Middleware. It enqueues a burst of duplicate
// cache:warm tasks (keyed by type, duplicates skipped) and of report:build
// tasks for a few tenants (keyed by tenant_id, duplicates parked until their
// key frees, half of them with MaxRetry(0)), prints what ran, what was
// skipped or parked and the most runs of one key seen at once, then exits,
// and the operator page with it. With -serve it keeps
// both machines and the operator page running, enqueuing the burst again
// every few seconds, until Ctrl-C (SIGINT or SIGTERM); -h lists the flags.
//
// With no REDIS_ADDR it uses an embedded miniredis; otherwise the Redis at
// REDIS_ADDR, where it uses the queue "jobguard-demo" (deleted when it ends)
// and locks under the prefix "jobguard-demo:" (released when it ends; their
// bookkeeping keys expire on their own).
//
// startMachine is the setup to copy; demo.go holds the demo around it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

const (
	queue      = "jobguard-demo"
	lockPrefix = "jobguard-demo:"
	workers    = 4
)

func main() {
	var opts options
	flag.BoolVar(&opts.serve, "serve", false, "after the demo, keep the machines and the operator page running, enqueuing a burst every "+
		serveEvery.String()+", until Ctrl-C")
	flag.StringVar(&opts.addr, "addr", "127.0.0.1:0", "the address of the operator page (port 0: any free port)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags]\n\n"+
			"Runs two asynq servers behind singleton.Middleware on a burst of duplicate tasks, prints what ran,\n"+
			"and serves the operator page (opsview). Uses REDIS_ADDR, or an embedded miniredis without it.\n\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var rdb *redis.Client
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		rdb = redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		fmt.Println("redis:", addr)
	} else {
		store, err := inprocess.Start()
		if err != nil {
			log.Fatal(err)
		}
		defer store.Close()
		rdb = store.Client()
		fmt.Println("redis: embedded miniredis at", rdb.Options().Addr, "(set REDIS_ADDR to use another)")
	}
	if _, err := run(ctx, os.Stdout, rdb, opts); err != nil {
		log.Fatal(err)
	}
}

// startMachine starts the asynq server of the machine name, the part of this
// demo to copy. cache:warm runs once at a time across all machines, its
// duplicates skipped; report:build runs once at a time per tenant_id, its
// duplicates put back to run later. obs reports what the guards decide, and
// cacheWarm and reportBuild do the work.
//
// It returns the started server and its locker: shut the server down first,
// then close the locker.
func startMachine(rdb redis.UniversalClient, name string, obs middleware.Observer,
	cacheWarm, reportBuild asynq.Handler) (_ *asynq.Server, _ *lockkit.Locker, err error) {
	locker, err := lockkit.NewRedis(rdb, lockkit.WithOwner(name), lockkit.WithPrefix(lockPrefix))
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			_ = locker.Close(context.Background())
		}
	}()
	perType, err := singleton.Middleware(locker,
		singleton.ForTypes("cache:warm"),
		singleton.WithObserver(obs))
	if err != nil {
		return nil, nil, err
	}
	perTenant, err := singleton.Middleware(locker,
		singleton.ForTypes("report:build"),
		singleton.KeyByFields("tenant_id"),
		singleton.WithPolicy(singleton.Requeue(100*time.Millisecond)),
		singleton.WithRedis(rdb),
		singleton.WithObserver(obs))
	if err != nil {
		return nil, nil, err
	}
	mux := asynq.NewServeMux()
	mux.Use(perType, perTenant)
	mux.Handle("cache:warm", cacheWarm)
	mux.Handle("report:build", reportBuild)
	// ServerConfig: a parked duplicate is no failure and uses no retry. The
	// run that frees its key starts it; asynq's retry (the backstop) brings
	// it back by itself should nothing start it.
	srv := asynq.NewServerFromRedisClient(rdb, singleton.ServerConfig(asynq.Config{
		Concurrency: workers,
		Queues:      map[string]int{queue: 1},
		// Quick polling and shutdown, for a demo that lasts a few seconds.
		TaskCheckInterval:        50 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		ShutdownTimeout:          2 * time.Second,
		LogLevel:                 asynq.ErrorLevel,
	}))
	if err = srv.Start(mux); err != nil {
		return nil, nil, err
	}
	return srv, locker, nil
}
