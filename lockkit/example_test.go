package lockkit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/lockkit"
)

// Do runs a function under a lease: alone across every process sharing the
// Locker's store, renewed while it runs, released when it returns.
func ExampleDo() {
	ctx := context.Background()
	locker, _ := lockkit.NewMemory() // lockkit.NewRedis(rdb) across machines
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
	a, _ := lockkit.NewMemory(lockkit.WithOwner("machine-a"))
	b, _ := a.NewPeer(lockkit.WithOwner("machine-b"))
	defer a.Close(ctx)
	defer b.Close(ctx)

	lease, _ := a.TryAcquire(ctx, "nightly-report", &lockkit.AcquireOptions{TTL: time.Minute})
	_, err := b.TryAcquire(ctx, "nightly-report", nil)
	var conflict *lockkit.ConflictError
	if errors.As(err, &conflict) {
		fmt.Println("held by", conflict.Owner, "- not acquired:", errors.Is(err, lockkit.ErrNotAcquired))
	}
	_ = lease.Release(ctx)
	lease, _ = b.TryAcquire(ctx, "nightly-report", nil)
	fmt.Println("now held by", lease.Owner())
	// Output:
	// held by machine-a - not acquired: true
	// now held by machine-b
}

// A limit turns the lock into a counting semaphore: here at most two reports
// per tenant run at once.
func ExampleAcquireOptions_limit() {
	ctx := context.Background()
	locker, _ := lockkit.NewMemory()
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
	locker, _ := lockkit.NewMemory()
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
	locker, _ := lockkit.NewMemory()
	defer locker.Close(ctx)

	first, _ := locker.TryAcquire(ctx, "ledger", nil)
	_ = first.Release(ctx)
	second, _ := locker.TryAcquire(ctx, "ledger", nil)
	fmt.Println("second token is greater:", second.Token() > first.Token())
	// Output:
	// second token is greater: true
}

// An epoch claims a unit of work once, even after the lease is released.
func ExampleAcquireOptions_epoch() {
	ctx := context.Background()
	locker, _ := lockkit.NewMemory()
	defer locker.Close(ctx)

	tick := time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC).Unix()
	for replica := range 2 {
		lease, err := locker.TryAcquire(ctx, "cron:backup", &lockkit.AcquireOptions{Epoch: tick, EpochTTL: time.Hour})
		if errors.Is(err, lockkit.ErrEpochUsed) {
			fmt.Printf("replica %d: tick already ran\n", replica)
			continue
		}
		fmt.Printf("replica %d: runs the tick\n", replica)
		_ = lease.Release(ctx)
	}
	// Output:
	// replica 0: runs the tick
	// replica 1: tick already ran
}
