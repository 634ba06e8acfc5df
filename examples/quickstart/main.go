// Command quickstart is the README's complete program: an asynq server
// whose report tasks run one per tenant at a time, and three tasks for it.
// It needs a Redis at REDIS_ADDR, which it prints; without REDIS_ADDR it
// exits with an error rather than use whatever listens on localhost:6379.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/singleton"
)

func main() {
	addr := os.Getenv("REDIS_ADDR") // the Redis every server shares, such as localhost:6379
	if addr == "" {
		log.Fatal("set REDIS_ADDR to the host:port of a Redis (it writes asynq's keys and the guard's there)")
	}
	fmt.Println("redis:", addr)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	g, err := singleton.New(rdb, singleton.KeyByFields("tenant_id"), singleton.WithPolicy(singleton.Requeue(time.Second)))
	check(err)
	defer g.Close(context.Background()) // after the server has stopped
	client, err := g.Client(asynq.NewClientFromRedisClient(rdb))
	check(err)
	for _, tenant := range []string{"acme", "acme", "globex"} {
		_, err := client.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"`+tenant+`"}`)))
		check(err)
	}
	cfg := asynq.Config{Concurrency: 4, DelayedTaskCheckInterval: 100 * time.Millisecond}
	g.Configure(&cfg) // a parked duplicate is no failure; the run that frees its key starts it
	mux := asynq.NewServeMux()
	mux.Use(g.Middleware) // one report per tenant at a time, across every server
	mux.HandleFunc("report", func(ctx context.Context, t *asynq.Task) error {
		fmt.Printf("building the report of %s\n", t.Payload())
		time.Sleep(300 * time.Millisecond) // acme's second report waits for its first
		return nil
	})
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	check(srv.Start(mux))
	time.Sleep(3 * time.Second)
	srv.Shutdown()
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
