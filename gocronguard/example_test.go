package gocronguard_test

import (
	"context"
	"log"

	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/gocronguard"
	"github.com/jobguard/jobguard/lockkit"
)

// Every scheduler of the fleet runs each second's report once, however far
// apart their clocks are (within the 1s tolerance). (Compiled, not run.)
func ExampleNewLocker() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	locker, err := lockkit.NewRedis(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())
	gl, err := gocronguard.NewLocker(locker, gocronguard.WithSchedule("report", "* * * * * *"))
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
	if err != nil {
		log.Fatal(err)
	}
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() { /* build the report */ }), gocron.WithName("report"))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	select {}
}
