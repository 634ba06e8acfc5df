package periodic_test

import (
	"log"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/periodic"
)

// The asynq Scheduler every replica runs: the same Register calls, one
// task per tick across the replicas. (Compiled, not run: it schedules until
// stopped.)
func ExampleNewScheduler() {
	redisOpt := asynq.RedisClientOpt{Addr: "localhost:6379"}
	scheduler := periodic.NewScheduler(redisOpt, &asynq.SchedulerOpts{Location: time.UTC}) // was asynq.NewScheduler
	if _, err := scheduler.Register("*/5 * * * *", asynq.NewTask("digest:send", nil)); err != nil {
		log.Fatal(err)
	}
	if _, err := scheduler.Register("@every 30s", asynq.NewTask("metrics:flush", nil)); err != nil {
		log.Fatal(err) // aligned: :00 and :30 of every minute, on every replica
	}
	if err := scheduler.Run(); err != nil {
		log.Fatal(err)
	}
}

// The PeriodicTaskManager every replica runs, with a catch-up of the ticks
// missed while all replicas were down. (Compiled, not run.)
func ExampleNewPeriodicTaskManager() {
	var provider asynq.PeriodicTaskConfigProvider // yours: a file, a database...
	mgr, err := periodic.NewPeriodicTaskManager(asynq.PeriodicTaskManagerOpts{
		RedisConnOpt:               asynq.RedisClientOpt{Addr: "localhost:6379"},
		PeriodicTaskConfigProvider: provider,
		SyncInterval:               time.Minute,
	}, periodic.CatchUp(time.Hour, periodic.CatchUpLatest))
	if err != nil {
		log.Fatal(err)
	}
	if err := mgr.Run(); err != nil {
		log.Fatal(err)
	}
}
