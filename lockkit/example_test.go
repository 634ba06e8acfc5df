package lockkit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

// Do runs a function under a lease: alone across every process sharing the
// Locker's store, renewed while it runs, released when it returns.
func ExampleDo() {
	ctx := context.Background()
	srv, _ := inprocess.Start() // a Redis in this process
	defer srv.Close()
	locker, _ := srv.Locker() // lockkit.NewRedis(rdb) across machines
	defer locker.Close(ctx)

	err := lockkit.Do(ctx, locker, "invoice:42", nil, func(ctx context.Context) error {
		fmt.Println("charging invoice 42")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// charging invoice 42
	// err: <nil>
}

// TryAcquire fails fast with a ConflictError that names the holder.
func ExampleLocker_tryAcquire() {
	ctx := context.Background()
	srv, _ := inprocess.Start() // a Redis in this process
	defer srv.Close()
	a, _ := srv.Locker(lockkit.WithOwner("machine-a"))
	b, _ := srv.Locker(lockkit.WithOwner("machine-b"))
	defer a.Close(ctx)
	defer b.Close(ctx)

	lease, _ := a.TryAcquire(ctx, "nightly-report", &lockkit.AcquireOptions{TTL: time.Minute})
	_, err := b.TryAcquire(ctx, "nightly-report", nil)
	var conflict *lockkit.ConflictError
	if errors.As(err, &conflict) {
		fmt.Println("held by", conflict.Owner, "- not acquired:", errors.Is(err, lockkit.ErrNotAcquired))
	}
	_ = lease.Release(ctx)
	_, _ = b.TryAcquire(ctx, "nightly-report", nil)
	info, _ := b.Inspect(ctx, "nightly-report")
	fmt.Println("now held by", info.Holders[0].Owner)
	// Output:
	// held by machine-a - not acquired: true
	// now held by machine-b
}

// A limit turns the lock into a counting semaphore: here at most two reports
// per tenant run at once.
func ExampleAcquireOptions_limit() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := srv.Locker()
	defer locker.Close(ctx)

	opt := &lockkit.AcquireOptions{Limit: 2}
	for i := range 3 {
		_, err := locker.TryAcquire(ctx, "tenant:42", opt)
		fmt.Printf("report %d acquired: %v\n", i+1, err == nil)
	}
	// Output:
	// report 1 acquired: true
	// report 2 acquired: true
	// report 3 acquired: false
}

// The work reads its lease's fencing token from its context and hands it to
// the resource, which refuses writes carrying an older token.
func ExampleLeaseFromContext() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := srv.Locker()
	defer locker.Close(ctx)

	var highest int64 // the resource's record of the newest token it accepted
	write := func(token int64) error {
		if token <= highest {
			return errors.New("stale holder")
		}
		highest = token
		return nil
	}
	err := lockkit.Do(ctx, locker, "ledger:42", nil, func(ctx context.Context) error {
		lease, _ := lockkit.LeaseFromContext(ctx)
		return write(lease.Token())
	})
	fmt.Println("write:", err)
	fmt.Println("a stale token:", write(highest-1))
	// Output:
	// write: <nil>
	// a stale token: stale holder
}

// Fencing tokens let the protected resource refuse a stale holder.
func ExampleLease_Token() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := srv.Locker()
	defer locker.Close(ctx)

	first, _ := locker.TryAcquire(ctx, "ledger", nil)
	_ = first.Release(ctx)
	second, _ := locker.TryAcquire(ctx, "ledger", nil)
	fmt.Println("second token is greater:", second.Token() > first.Token())
	// Output:
	// second token is greater: true
}

// Do on Redis: the work runs alone across every process sharing rdb.
// (Compiled, not run: it needs a Redis.)
func ExampleNewRedis() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	if err := processInvoice(context.Background(), rdb); err != nil {
		log.Fatal(err)
	}
}

// processInvoice is ExampleNewRedis's program.
func processInvoice(ctx context.Context, rdb redis.UniversalClient) error {
	locker, err := lockkit.NewRedis(rdb) // any redis.UniversalClient: standalone, Sentinel, Cluster
	if err != nil {
		return err
	}
	defer locker.Close(ctx)

	err = lockkit.Do(ctx, locker, "invoice:42", nil, func(ctx context.Context) error {
		// Runs alone across every process sharing rdb. The lease renews itself every TTL/3;
		// ctx is cancelled with a cause matching lockkit.ErrLost if it cannot be renewed.
		return process(ctx)
	})
	return err
}

// process is the work.
func process(ctx context.Context) error { return nil }

// A Locker on Redis Sentinel (or Cluster: give its addresses and no
// MasterName). (Compiled, not run: it needs the servers.)
func ExampleNewRedis_sentinel() {
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:      []string{"10.0.0.1:26379", "10.0.0.2:26379"}, // Sentinel addresses
		MasterName: "jobs",                                       // set for Sentinel; omit for Cluster
	})
	locker, err := lockkit.NewRedis(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())
}

// A Locker whose leases survive a Sentinel failover: each lease write
// waits until one replica has it (at most 100ms), and one that no replica
// acknowledged in time is not a lease. (Compiled, not run: it needs the
// servers.)
func ExampleWithReplicaAcks() {
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		SentinelAddrs: []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		MasterName:    "jobs",
	})
	locker, err := lockkit.NewRedis(rdb, lockkit.WithReplicaAcks(1, 100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())
	err = lockkit.Do(context.Background(), locker, "ledger:42", nil, process)
	if errors.Is(err, lockkit.ErrNotReplicated) {
		log.Print("no replica acknowledged the lease in time: not run, try again")
	}
}

// The fencing token reaches the store with the write, which refuses an older
// token. (Compiled, not run: store is a database.)
func ExampleLease_Token_store() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := srv.Locker()
	defer locker.Close(ctx)
	var store ledger
	balance := 100
	err := lockkit.Do(ctx, locker, "ledger:42", nil, func(ctx context.Context) error {
		lease, _ := lockkit.LeaseFromContext(ctx)
		// The store runs: UPDATE ledger SET balance = $1, fence = $2 WHERE id = 42 AND fence < $2
		return store.Write(ctx, balance, lease.Token())
	})
	if err != nil {
		log.Fatal(err)
	}
}

// ledger is the store of ExampleLease_Token_store.
type ledger struct{}

// Write stores balance if fence is newer than the stored one.
func (ledger) Write(ctx context.Context, balance int, fence int64) error { return nil }

// HoldAtLeast makes a fast job's key stay taken for a period after it began:
// at most one run per period across every process.
func ExampleAcquireOptions_holdAtLeast() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := srv.Locker()
	defer locker.Close(ctx)
	opt := &lockkit.AcquireOptions{HoldAtLeast: time.Minute}

	err := lockkit.Do(ctx, locker, "refresh-prices", opt, func(context.Context) error { return nil })
	fmt.Println("first run:", err)
	_, err = locker.TryAcquire(ctx, "refresh-prices", opt)
	fmt.Println("again within the minute:", errors.Is(err, lockkit.ErrNotAcquired))
	// Output:
	// first run: <nil>
	// again within the minute: true
}
