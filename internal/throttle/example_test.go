package throttle_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/throttle"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

// A Throttle spends a key's budget of starts: here 2 per minute, shared by
// every process on the same Redis.
func ExampleThrottle() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	starts, _ := throttle.New(srv.Client(), 2, time.Minute)
	for i := range 3 {
		wait, err := starts.Take(ctx, "send-digest")
		fmt.Println(i+1, err, wait == 0)
	}
	// Output:
	// 1 <nil> true
	// 2 <nil> true
	// 3 <nil> false
}

// A Throttle on a Locker's Redis and prefix shares the budgets of every
// process using them.
func ExampleNew_locker() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	locker, _ := srv.Locker(lockkit.WithPrefix("jobs:"))
	defer locker.Close(ctx)

	starts, _ := throttle.New(srv.Client(), 1, time.Minute, throttle.WithPrefix("jobs:"))
	wait, _ := starts.Take(ctx, "rebuild-index")
	fmt.Println("first start allowed:", wait == 0)
	// Output:
	// first start allowed: true
}
