package cronguard_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
	"github.com/jobguard/jobguard/middleware"
)

// Three replicas of one schedule share a Redis: each tick runs once.
func Example() {
	mr := miniredis.NewMiniRedis() // an embedded Redis; use yours
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	var (
		mu   sync.Mutex
		runs = map[int64]int{} // tick (Unix seconds) → runs in the fleet
		ran  = make(chan struct{}, 100)
	)
	var crons []*cron.Cron
	for _, replica := range []string{"a", "b", "c"} { // as on three machines
		locker, err := lockkit.NewRedis(rdb, lockkit.WithOwner(replica))
		if err != nil {
			log.Fatal(err)
		}
		defer locker.Close(context.Background())
		guard, err := cronguard.New(locker, cronguard.WithSeconds())
		if err != nil {
			log.Fatal(err)
		}
		c := cron.New(cron.WithSeconds(), cron.WithChain(cron.Recover(cron.DefaultLogger)))
		_, err = guard.Add(c, "send-digest", "* * * * * *", cronguard.Func(func(ctx context.Context) error {
			tick, _ := cronguard.Tick(ctx) // the scheduled time this run is for
			mu.Lock()
			runs[tick.Unix()]++
			mu.Unlock()
			ran <- struct{}{}
			return nil // ctx is cancelled (cause lockkit.ErrLost) if the lease is lost
		}))
		if err != nil {
			log.Fatal(err) // ErrInvalid (a name empty or taken, a spec that does not parse), never a panic
		}
		c.Start()
		crons = append(crons, c)
	}

	for range 3 {
		<-ran
	}
	for _, c := range crons {
		<-c.Stop().Done() // waits for running jobs
	}
	once := true
	for _, n := range runs {
		once = once && n == 1
	}
	fmt.Println("each tick ran once:", once)
	// Output: each tick ran once: true
}

// One entry's wrapper in a chain. The replicas here share a Redis embedded
// in the process and read fixed clocks so that the output is stable.
func ExampleGuard_Wrap() {
	tick := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	srv, _ := inprocess.Start()
	defer srv.Close()
	a, _ := srv.Locker(lockkit.WithOwner("a")) // in production: lockkit.NewRedis(rdb)
	b, _ := srv.Locker(lockkit.WithOwner("b"))
	defer a.Close(context.Background())
	defer b.Close(context.Background())

	report := func(replica string) middleware.Observer {
		return func(ctx context.Context, e middleware.Event) {
			t, _ := cronguard.Tick(ctx)
			switch e.Kind {
			case middleware.EventAcquired:
				fmt.Printf("%s runs the %s tick\n", replica, t.UTC().Format("15:04:05"))
			case middleware.EventClaimed:
				fmt.Printf("%s skips the %s tick: it ran on another replica\n", replica, t.UTC().Format("15:04:05"))
			}
		}
	}
	for _, r := range []struct {
		name   string
		locker *lockkit.Locker
		now    time.Time // the replica's clock when its cron fires
	}{
		{"a", a, tick.Add(time.Millisecond)},
		{"b", b, tick.Add(300 * time.Millisecond)}, // fires 300ms later, after a's run ended
	} {
		guard, err := cronguard.New(r.locker, cronguard.WithSeconds(),
			cronguard.WithClock(func() time.Time { return r.now }), cronguard.WithObserver(report(r.name)))
		if err != nil {
			log.Fatal(err)
		}
		w, err := guard.Wrap("send-digest", "*/10 * * * * *")
		if err != nil {
			log.Fatal(err)
		}
		job := cron.NewChain(cron.Recover(cron.DefaultLogger), w).Then(cron.FuncJob(func() {}))
		job.Run() // what cron does at 09:00:00 on each replica
	}
	// Output:
	// a runs the 09:00:00 tick
	// b skips the 09:00:00 tick: it ran on another replica
}

// Add in a program: one digest per five minutes across every replica
// sharing rdb. (Compiled, not run: it schedules until stopped.)
func ExampleGuard_Add() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	if err := scheduleDigests(rdb); err != nil {
		log.Fatal(err)
	}
	select {}
}

// scheduleDigests starts the Cron of ExampleGuard_Add.
func scheduleDigests(rdb redis.UniversalClient) error {
	locker, err := lockkit.NewRedis(rdb) // one per process, on the Redis every replica shares
	if err != nil {
		return err
	}
	defer locker.Close(context.Background())
	guard, err := cronguard.New(locker, cronguard.WithSeconds())
	if err != nil {
		return err
	}
	c := cron.New(cron.WithSeconds(), cron.WithChain(cron.Recover(cron.DefaultLogger)))
	_, err = guard.Add(c, "send-digest", "0 */5 * * * *", cronguard.Func(func(ctx context.Context) error {
		tick, _ := cronguard.Tick(ctx) // the scheduled time this run is for
		return sendDigest(ctx, tick)   // ctx is cancelled (cause lockkit.ErrLost) if the lease is lost
	}))
	if err != nil {
		return err // ErrInvalid (a name empty or taken, a spec that does not parse), never a panic
	}
	c.Start()
	return nil
}

// sendDigest is the job.
func sendDigest(ctx context.Context, tick time.Time) error { return nil }
