// Command bench compares lockkit with github.com/bsm/redislock and
// github.com/go-redsync/redsync/v4 against one Redis in one run, and measures
// lockkit's renewal of many leases. It prints markdown tables to stdout and,
// with -out, writes them with the environment and the method to a file.
//
// It is a separate module so that users of jobguard never download the
// libraries it compares. Run it with `make bench`, which starts a throwaway
// redis-server and writes BENCHMARKS.md, or:
//
//	REDIS_ADDR=127.0.0.1:6379 go run . -out ../BENCHMARKS.md
//
// Every key it writes starts with "jobguard-bench:<random>:" and is deleted
// at the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

type bench struct {
	addr       string
	cycles     int
	goroutines int
	rounds     int
	handoffs   int
	spread     time.Duration
	leases     int
	leaseTTL   time.Duration
	ticks      int
	warmTicks  int

	prefix  string
	admin   *redis.Client // INFO and cleanup; not counted
	clients []*redis.Client
}

// client returns a new client of the Redis under test with a counting hook.
func (b *bench) client() (*redis.Client, *counter) {
	c := redis.NewClient(&redis.Options{Addr: b.addr})
	ctr := &counter{}
	c.AddHook(ctr)
	b.clients = append(b.clients, c)
	return c, ctr
}

func main() {
	b := &bench{}
	out := flag.String("out", "", "also write the report (markdown) to this file")
	flag.StringVar(&b.addr, "addr", os.Getenv("REDIS_ADDR"), "Redis address (default $REDIS_ADDR)")
	flag.IntVar(&b.cycles, "cycles", 10000, "uncontended: acquire+release cycles per library per round")
	flag.IntVar(&b.goroutines, "goroutines", 8, "uncontended: goroutines of the concurrent run, each on its own key")
	flag.IntVar(&b.rounds, "rounds", 3, "uncontended: rounds; the table shows the median rate")
	flag.IntVar(&b.handoffs, "handoffs", 200, "contended: measured handoffs per library")
	flag.DurationVar(&b.spread, "handoff-spread", 100*time.Millisecond, "contended: the holder releases a uniformly random time in [0, spread) after the waiter's first attempt")
	flag.IntVar(&b.leases, "leases", 10000, "renewal: leases held by one Locker")
	flag.DurationVar(&b.leaseTTL, "lease-ttl", 3*time.Second, "renewal: lease TTL (renewed every TTL/3)")
	flag.IntVar(&b.ticks, "ticks", 5, "renewal: measured renewal ticks")
	flag.IntVar(&b.warmTicks, "warm-ticks", 3, "renewal: ticks skipped before measuring")
	flag.Parse()
	if b.addr == "" {
		fmt.Fprintln(os.Stderr, "bench: set REDIS_ADDR or -addr (`make bench` starts a redis-server and sets it)")
		os.Exit(2)
	}
	if b.cycles < b.goroutines || b.goroutines < 1 || b.rounds < 1 || b.handoffs < 1 || b.spread <= 0 ||
		b.leases < 1 || b.ticks < 1 || b.warmTicks < 0 || b.leaseTTL < 300*time.Millisecond {
		fmt.Fprintln(os.Stderr, "bench: invalid flag value")
		flag.Usage()
		os.Exit(2)
	}
	if err := b.run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func (b *bench) run(out string) error {
	ctx := context.Background()
	start := time.Now()
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	b.prefix = "jobguard-bench:" + hex.EncodeToString(id) + ":"
	b.admin = redis.NewClient(&redis.Options{Addr: b.addr})
	defer b.admin.Close()
	defer func() {
		for _, c := range b.clients {
			_ = c.Close()
		}
	}()
	defer b.cleanup()
	if err := b.admin.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", b.addr, err)
	}

	r := &report{bench: b, env: environment(ctx, b.admin, b.addr)}
	var err error
	progress("uncontended acquire+release: %d cycles × %d rounds per library, 1 and %d goroutines", b.cycles, b.rounds, b.goroutines)
	if r.cycleRes, r.cold, err = b.uncontended(ctx); err != nil {
		return err
	}
	for _, name := range libNames {
		progress("contended handoff: %s, %d handoffs", name, b.handoffs)
		h, err := b.handoff(ctx, name)
		if err != nil {
			return err
		}
		r.handoffRes = append(r.handoffRes, h)
	}
	progress("renewal: %d leases, TTL %s", b.leases, b.leaseTTL)
	if r.renewalRes, err = b.renewal(ctx); err != nil {
		return err
	}
	r.elapsed = time.Since(start)

	doc := r.markdown()
	fmt.Print(doc)
	if out != "" {
		if err := os.WriteFile(out, []byte(doc), 0o644); err != nil {
			return err
		}
		progress("wrote %s", out)
	}
	return nil
}

// cleanup deletes every key of this run.
func (b *bench) cleanup() {
	ctx := context.Background()
	iter := b.admin.Scan(ctx, 0, b.prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for start := 0; start < len(keys); start += 1000 {
		b.admin.Del(ctx, keys[start:min(start+1000, len(keys))]...)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
