// Command lockdemo shows lockkit leases: two lockers (as on two machines)
// share one Redis, take turns on a key, and get rising fencing tokens; a
// holder paused past its lease has its late write refused (lockkit/fence).
// With no REDIS_ADDR it uses an embedded miniredis.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/fence"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

func main() {
	var rdb *redis.Client
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		rdb = redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
	} else {
		store, err := inprocess.Start()
		if err != nil {
			log.Fatal(err)
		}
		defer store.Close()
		rdb = store.Client()
		fmt.Println("REDIS_ADDR not set: using an embedded miniredis at", rdb.Options().Addr)
	}
	ctx := context.Background()

	var wg sync.WaitGroup
	for _, name := range []string{"machine-a", "machine-b"} {
		locker, err := lockkit.NewRedis(rdb, lockkit.WithOwner(name), lockkit.WithPrefix("lockdemo:"))
		if err != nil {
			log.Fatal(err)
		}
		defer locker.Close(ctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 {
				err := lockkit.Do(ctx, locker, "nightly-report", &lockkit.AcquireOptions{Fair: true}, func(ctx context.Context) error {
					fmt.Printf("%s runs nightly-report (round %d)\n", name, i+1)
					time.Sleep(20 * time.Millisecond) // the work
					return nil
				})
				if err != nil {
					log.Fatal(err)
				}
			}
		}()
	}
	wg.Wait()

	a, _ := lockkit.NewRedis(rdb, lockkit.WithOwner("machine-a"), lockkit.WithPrefix("lockdemo:"))
	b, _ := lockkit.NewRedis(rdb, lockkit.WithOwner("machine-b"), lockkit.WithPrefix("lockdemo:"))
	defer a.Close(ctx)
	defer b.Close(ctx)
	la, err := a.TryAcquire(ctx, "invoice-42", nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "invoice-42", nil)
	var conflict *lockkit.ConflictError
	if errors.As(err, &conflict) {
		fmt.Printf("machine-b cannot take invoice-42: held by %s for %s more\n", conflict.Owner, conflict.TTL.Round(time.Second))
	}
	fmt.Printf("machine-a holds invoice-42 with fencing token %d\n", la.Token())
	if err := la.Release(ctx); err != nil {
		log.Fatal(err)
	}
	lb, err := b.TryAcquire(ctx, "invoice-42", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("machine-b holds invoice-42 with fencing token %d (greater: %v)\n", lb.Token(), lb.Token() > la.Token())
	_ = lb.Release(ctx)

	staleWrite(ctx, rdb, a, b)
}

// staleWrite shows fenced writes (package lockkit/fence): machine-a's
// lease runs out while it is paused (here: it is not renewed), machine-b
// takes the key and writes, and machine-a's late write is refused.
func staleWrite(ctx context.Context, rdb *redis.Client, a, b *lockkit.Locker) {
	w, err := fence.New(rdb, fence.WithPrefix("lockdemo:"))
	if err != nil {
		log.Fatal(err)
	}
	la, err := a.TryAcquire(ctx, "invoice-43", &lockkit.AcquireOptions{TTL: 200 * time.Millisecond, NoRenew: true})
	if err != nil {
		log.Fatal(err)
	}
	paused := fence.Token{Key: "invoice-43", Value: la.Token()}
	fmt.Println("machine-a takes invoice-43 and pauses past its lease")
	lb, err := b.Acquire(ctx, "invoice-43", nil) // once machine-a's lease has run out
	if err != nil {
		log.Fatal(err)
	}
	defer lb.Release(ctx)
	if err := w.Set(ctx, fence.Token{Key: "invoice-43", Value: lb.Token()}, "lockdemo:invoice-43:status", "paid by machine-b", 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println("machine-b takes invoice-43 and writes its status")
	err = w.Set(ctx, paused, "lockdemo:invoice-43:status", "paid by machine-a", 0)
	fmt.Printf("machine-a, back, writes: stale: %v (%v)\n", errors.Is(err, fence.ErrStale), err)
	fmt.Println("invoice-43's status:", rdb.Get(ctx, "lockdemo:invoice-43:status").Val())
}
