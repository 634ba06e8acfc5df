// Command scheduler runs three replicas of one cron schedule in one process,
// as three machines would, and shows that each tick runs once across them.
//
// Every replica has its own *lockkit.Locker and robfig/cron Cron with the
// same cronguard entry, which enqueues one asynq task per tick: the task
// asynq's own Scheduler would enqueue once per replica. Each replica fires
// each tick up to 300ms late, at random, as replicas with skewed clocks and
// busy schedulers do, and the job takes about a millisecond, so a lock
// released when the job returns would let the late replicas run the tick
// again. After five ticks it prints, per tick, the replica that ran it, how
// many skipped it and how many tasks the queue holds for it, and exits.
//
//	go run ./examples/scheduler               # an embedded miniredis unless REDIS_ADDR is set
//	go run ./examples/scheduler -ticks 10 -replicas 5
//	go run ./examples/scheduler -periodic     # asynq's periodic tasks: periodic.Scheduler on every replica
//
// startReplica is the setup to copy; demo.go holds the demo around it. With
// -periodic, the replicas run periodic.Scheduler, the drop-in for
// asynq.Scheduler (startPeriodic in periodic.go): each "@every 1s" tick is
// enqueued once although every replica fires it, the last with its clock
// -jitter behind.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

const (
	entryName = "enqueue-report"
	taskType  = "report:build"
)

func main() {
	cfg := config{Addr: os.Getenv("REDIS_ADDR")}
	flag.IntVar(&cfg.Replicas, "replicas", 3, "replicas of the schedule (1 to 26)")
	flag.IntVar(&cfg.Ticks, "ticks", 5, "ticks to run before exiting")
	flag.StringVar(&cfg.Spec, "spec", "* * * * * *", "cron spec with a seconds field")
	flag.DurationVar(&cfg.Jitter, "jitter", 300*time.Millisecond, "how late, at most, a replica fires a tick (at random)")
	usePeriodic := flag.Bool("periodic", false, "run the asynq periodic-task drop-in (periodic.Scheduler) instead")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	demo := run
	if *usePeriodic {
		demo = runPeriodic
	}
	if err := demo(ctx, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
}

// replica is one replica of the schedule, as one machine runs it.
type replica struct {
	Name   string    // the lock owner, named in logs and events
	Spec   string    // the schedule, with a seconds field
	Queue  string    // the queue each tick's task goes to
	Prefix string    // the prefix of the lock keys
	Log    io.Writer // where cron and the guard log errors

	// Observer and Late serve the demo: Observer sees every decision of the
	// guard, and Late fires each tick late, as a replica with a skewed clock
	// would.
	Observer middleware.Observer
	Late     cron.JobWrapper
}

// taskPayload is the payload of the task a run enqueues.
type taskPayload struct {
	Tick string `json:"tick"` // the tick, in RFC 3339 with nanoseconds, UTC
	By   string `json:"by"`   // the replica that ran it
}

// startReplica starts r on rdb, the part of this demo to copy: a locker, a
// cronguard Guard and a cron.Cron whose entry enqueues one taskType task per
// tick. However many replicas share rdb and r.Prefix, each tick runs on one
// of them.
//
// It returns the started Cron and its locker: stop the Cron and wait for its
// running jobs first, then close the locker.
func startReplica(rdb redis.UniversalClient, r replica) (_ *cron.Cron, _ *lockkit.Locker, err error) {
	locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(r.Prefix), lockkit.WithOwner(r.Name))
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			_ = locker.Close(context.Background())
		}
	}()
	logger := cron.PrintfLogger(log.New(r.Log, r.Name+": ", 0)) // errors only
	guard, err := cronguard.New(locker, cronguard.WithSeconds(), cronguard.WithLogger(logger),
		cronguard.WithObserver(r.Observer))
	if err != nil {
		return nil, nil, err
	}
	c := cron.New(cron.WithSeconds(), cron.WithLogger(logger),
		cron.WithChain(cron.Recover(logger), r.Late))
	client := asynq.NewClientFromRedisClient(rdb)
	_, err = guard.Add(c, entryName, r.Spec, cronguard.Func(func(ctx context.Context) error {
		tick, _ := cronguard.Tick(ctx)
		payload, err := json.Marshal(taskPayload{Tick: tick.UTC().Format(time.RFC3339Nano), By: r.Name})
		if err != nil {
			return err
		}
		_, err = client.EnqueueContext(ctx, asynq.NewTask(taskType, payload), asynq.Queue(r.Queue))
		return err
	}))
	if err != nil {
		return nil, nil, err
	}
	c.Start()
	return c, locker, nil
}
