package lockcore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

// An epoch claims a unit of work once, even after the lease is released.
func ExampleAcquireOptions_epoch() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := lockcore.NewRedis(srv.Client())
	defer locker.Close(ctx)

	tick := time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC).Unix()
	for replica := range 2 {
		lease, err := locker.TryAcquire(ctx, "cron:backup", &lockcore.AcquireOptions{Epoch: tick, EpochTTL: time.Hour})
		if errors.Is(err, lockcore.ErrEpochUsed) {
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

// Preempt: a newer acquire cancels the work holding the key (its ctx cause
// matches ErrPreempted and ErrLost) and gets the key once that work returns,
// with a higher fencing token.
func ExamplePreempt() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := lockcore.NewRedis(srv.Client())
	defer locker.Close(ctx)
	opt := &lockcore.AcquireOptions{FollowUp: lockcore.Preempt{}}

	old, _ := locker.Acquire(ctx, "rebuild-index", opt)
	done := make(chan error)
	go func() {
		done <- old.Run(ctx, func(ctx context.Context) error {
			<-ctx.Done() // a long rebuild, checking its ctx
			return context.Cause(ctx)
		})
	}()
	newer, _ := locker.Acquire(ctx, "rebuild-index", opt) // returns once the old run has returned
	err := <-done
	fmt.Println("old run:", errors.Is(err, lockcore.ErrPreempted), errors.Is(err, lockcore.ErrLost))
	fmt.Println("newer token:", newer.Token() > old.Token())
	_ = newer.Release(ctx)
	// Output:
	// old run: true true
	// newer token: true
}

// Parking queues jobs for a held key: the release of the lease that frees
// it reserves the key for the oldest parked job and hands its id to
// OnParked, whose job then adopts the reservation by its label.
func ExampleParking() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := lockcore.NewRedis(srv.Client())
	defer locker.Close(ctx)
	// OnParked runs on a goroutine of its own; here it hands the id over.
	started := make(chan string, 1)
	start := func(key, id string) { started <- id } // e.g. move a queued task to pending
	running, _ := locker.TryAcquire(ctx, "tenant:7", &lockcore.AcquireOptions{Label: "job-1", Park: &lockcore.Parking{OnParked: start}})
	for _, job := range []string{"job-2", "job-3"} {
		_, err := locker.TryAcquire(ctx, "tenant:7", &lockcore.AcquireOptions{Label: job, Park: &lockcore.Parking{ID: "queue/" + job}})
		fmt.Println(job, "parked:", errors.Is(err, lockcore.ErrNotAcquired))
	}
	_ = running.Release(ctx) // reserves the key for job-2 and calls start
	fmt.Println("start", <-started)
	next, err := locker.TryAcquire(ctx, "tenant:7", &lockcore.AcquireOptions{Label: "job-2", TakeReservation: true, Park: &lockcore.Parking{ID: "queue/job-2", OnParked: start}})
	fmt.Println("job-2 runs:", err == nil)
	_ = next.Release(ctx) // job-3 is next
	fmt.Println("start", <-started)
	// Output:
	// job-2 parked: true
	// job-3 parked: true
	// start queue/job-2
	// job-2 runs: true
	// start queue/job-3
}
