package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
	"github.com/jobguard/jobguard/middleware"
)

// A runtime of your own guards its jobs with a Guard: the second job of a
// key, run while the first holds it, is a duplicate, and the policy (Skip,
// the default) drops it.
func ExampleNew() {
	ctx := context.Background()
	store, err := inprocess.Start() // an embedded Redis; use lockkit.NewRedis(rdb) in production
	if err != nil {
		panic(err)
	}
	defer store.Close()
	locker, err := store.Locker()
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)
	g, err := middleware.New(locker, middleware.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	job := middleware.Job{Key: "tenant:42", Name: "report"}
	out := g.Run(ctx, job, func(ctx context.Context) error {
		inner := g.Run(ctx, job, func(context.Context) error { return nil })
		fmt.Println("second run:", inner.Duplicate.Reason == middleware.ReasonHeld, inner.Duplicate.Action)
		return nil
	})
	fmt.Println("first run:", out.Ran, out.Err)
	// Output:
	// second run: true skip
	// first run: true <nil>
}

// A combination that cannot work is refused when the Guard is built.
func ExampleWithLimit() {
	store, err := inprocess.Start()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	locker, err := store.Locker()
	if err != nil {
		panic(err)
	}
	defer locker.Close(context.Background())
	_, err = middleware.New(locker, middleware.WithPolicy(middleware.KeepNewest()), middleware.WithLimit(2))
	fmt.Println(err)
	// Output:
	// middleware: invalid option: WithLimit(2): KeepNewest runs one job per key at a time
}

// Each tenant runs one report at a time, and at most two reports call the
// shared API at once, whatever their tenants: a job holds its tenant's key
// and "api:github", all or none.
func ExampleWithExtraKeys() {
	ctx := context.Background()
	store, err := inprocess.Start()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	locker, err := store.Locker()
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)
	g, err := middleware.New(locker, middleware.WithExtraKeys(func(context.Context, middleware.Job) map[string]int {
		return map[string]int{"api:github": 2}
	}))
	if err != nil {
		panic(err)
	}
	report := func(tenant string) middleware.Job { return middleware.Job{Key: "tenant:" + tenant, Name: "report"} }
	g.Run(ctx, report("acme"), func(ctx context.Context) error {
		g.Run(ctx, report("globex"), func(ctx context.Context) error {
			third := g.Run(ctx, report("initech"), func(context.Context) error { return nil })
			var ce *lockkit.ConflictError
			errors.As(third.Err, &ce)
			fmt.Printf("initech ran: %t, %q full\n", third.Ran, ce.Key)
			info, _ := locker.Inspect(ctx, "tenant:initech")
			fmt.Println("initech's key held:", len(info.Holders) > 0)
			return nil
		})
		again := g.Run(ctx, report("acme"), func(context.Context) error { return nil })
		fmt.Printf("acme again: %t\n", again.Ran)
		return nil
	})
	after := g.Run(ctx, report("initech"), func(context.Context) error { return nil })
	fmt.Printf("initech later: %t\n", after.Ran)
	// Output:
	// initech ran: false, "api:github" full
	// initech's key held: false
	// acme again: false
	// initech later: true
}

// Each job gets its own limit: a premium tenant's key runs two jobs at
// once, another tenant's one.
func ExampleWithLimitFunc() {
	ctx := context.Background()
	store, err := inprocess.Start()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	locker, err := store.Locker()
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)
	premium := map[string]bool{"tenant:acme": true}
	g, err := middleware.New(locker, middleware.WithLimitFunc(func(_ context.Context, job middleware.Job) int {
		if premium[job.Key] {
			return 2
		}
		return 1
	}))
	if err != nil {
		panic(err)
	}
	for _, key := range []string{"tenant:acme", "tenant:globex"} {
		job := middleware.Job{Key: key, Name: "report"}
		g.Run(ctx, job, func(ctx context.Context) error {
			second := g.Run(ctx, job, func(ctx context.Context) error {
				third := g.Run(ctx, job, func(context.Context) error { return nil })
				fmt.Printf("%s: third run at once: %t\n", key, third.Ran)
				return nil
			})
			fmt.Printf("%s: second run at once: %t\n", key, second.Ran)
			return nil
		})
	}
	// Output:
	// tenant:acme: third run at once: false
	// tenant:acme: second run at once: true
	// tenant:globex: second run at once: false
}
