// Command scheduler runs three replicas of one cron schedule in one process,
// as three machines would, and shows that each tick runs once across them.
//
// Every replica has its own lockkit.RedisLocker and robfig/cron Cron with the
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
package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// config is what one run of the demo does.
type config struct {
	// Addr is the Redis address; empty starts an embedded miniredis.
	Addr string
	// Replicas is how many replicas run the schedule (1 to 26).
	Replicas int
	// Ticks is how many ticks every replica must see before the demo stops.
	Ticks int
	// Spec is the schedule, with a seconds field.
	Spec string
	// Jitter is how late, at most, a replica fires a tick (at random).
	Jitter time.Duration
}

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
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
}

// run starts cfg.Replicas replicas of the entry, waits until each has seen
// cfg.Ticks ticks (or ctx ends), stops them and writes the per-tick summary
// to w. It returns an error if a tick did not enqueue exactly one task.
func run(ctx context.Context, w io.Writer, cfg config) error {
	if cfg.Replicas < 1 || cfg.Replicas > 26 {
		return fmt.Errorf("replicas must be between 1 and 26, not %d", cfg.Replicas)
	}
	if cfg.Ticks < 1 {
		return fmt.Errorf("ticks must be at least 1, not %d", cfg.Ticks)
	}
	if cfg.Jitter < 0 {
		return fmt.Errorf("jitter must not be negative, not %s", cfg.Jitter)
	}
	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor).Parse(cfg.Spec)
	if err != nil {
		return fmt.Errorf("spec %q: %w", cfg.Spec, err)
	}
	first := sched.Next(time.Now())
	interval := sched.Next(first).Sub(first)
	out := &syncWriter{w: w}

	addr := cfg.Addr
	if addr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return err
		}
		defer mr.Close()
		addr = mr.Addr()
		fmt.Fprintln(out, "REDIS_ADDR not set: using an embedded miniredis")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", addr, err)
	}

	// One run's keys and queue, so that runs sharing a Redis do not mix.
	id := make([]byte, 4)
	_, _ = crand.Read(id)
	prefix := "scheduler-demo:" + hex.EncodeToString(id) + ":"
	queue := "scheduler-demo-" + hex.EncodeToString(id)
	client := asynq.NewClientFromRedisClient(rdb)
	inspector := asynq.NewInspectorFromRedisClient(rdb)
	defer func() { _ = inspector.DeleteQueue(queue, true) }()

	sum := newSummary(cfg.Replicas)
	var (
		crons   []*cron.Cron
		lockers []*lockkit.RedisLocker
	)
	stopAll := func() {
		for _, c := range crons {
			<-c.Stop().Done() // waits for the running jobs
		}
		crons = nil
		for _, l := range lockers {
			_ = l.Close(context.Background())
		}
		lockers = nil
	}
	defer stopAll()
	fmt.Fprintf(out, "%d replicas of %q on %q, each firing up to %s late; one asynq task per run into queue %q\n",
		cfg.Replicas, entryName, cfg.Spec, cfg.Jitter, queue)
	for i := range cfg.Replicas {
		name := fmt.Sprintf("replica-%c", 'a'+i)
		locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix), lockkit.WithOwner(name))
		if err != nil {
			return err
		}
		lockers = append(lockers, locker)
		logger := cron.PrintfLogger(log.New(out, name+": ", 0)) // errors only
		guard, err := cronguard.New(locker, cronguard.WithSeconds(), cronguard.WithLogger(logger),
			cronguard.WithObserver(sum.observer(name)))
		if err != nil {
			return err
		}
		c := cron.New(cron.WithSeconds(), cron.WithLogger(logger),
			cron.WithChain(cron.Recover(logger), jitter(cfg.Jitter)))
		_, err = guard.Add(c, entryName, cfg.Spec, cronguard.Func(func(ctx context.Context) error {
			tick, _ := cronguard.Tick(ctx)
			payload, err := json.Marshal(taskPayload{Tick: tick.UTC().Format(time.RFC3339Nano), By: name})
			if err != nil {
				return err
			}
			_, err = client.EnqueueContext(ctx, asynq.NewTask(taskType, payload), asynq.Queue(queue))
			return err
		}))
		if err != nil {
			return err
		}
		crons = append(crons, c)
	}
	for _, c := range crons {
		c.Start()
	}

	fmt.Fprintf(out, "%-10s  %-10s  %-7s  %s\n", "tick (UTC)", "ran on", "skipped", "tasks enqueued")
	timeout := time.NewTimer(time.Duration(cfg.Ticks+3)*interval + time.Until(first))
	defer timeout.Stop()
	var (
		shown        []tickResult
		runs, tasks  int
		wrongTickErr error
	)
	for len(shown) < cfg.Ticks {
		var r tickResult
		select {
		case r = <-sum.done:
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout.C:
			return fmt.Errorf("only %d of %d ticks were seen by every replica in time", len(shown), cfg.Ticks)
		}
		n, err := tasksFor(inspector, queue, r.tick)
		if err != nil {
			return err
		}
		ranOn := strings.Join(r.ran, ",")
		if ranOn == "" {
			ranOn = "-"
		}
		fmt.Fprintf(out, "%-10s  %-10s  %-7d  %d\n", r.tick.UTC().Format("15:04:05"), ranOn, r.skipped, n)
		shown = append(shown, r)
		runs += len(r.ran)
		tasks += n
		if n != 1 && wrongTickErr == nil {
			wrongTickErr = fmt.Errorf("tick %s enqueued %d tasks", r.tick.UTC().Format(time.RFC3339), n)
		}
	}
	stopAll()
	fmt.Fprintf(out, "%d ticks, %d runs, %d tasks (unguarded, %d replicas would have enqueued %d)\n",
		len(shown), runs, tasks, cfg.Replicas, cfg.Replicas*len(shown))
	return errors.Join(wrongTickErr, sum.err())
}

type taskPayload struct {
	Tick string `json:"tick"`
	By   string `json:"by"`
}

// tasksFor counts the tasks in queue enqueued for tick.
func tasksFor(in *asynq.Inspector, queue string, tick time.Time) (int, error) {
	infos, err := in.ListPendingTasks(queue, asynq.PageSize(10000))
	if err != nil {
		return 0, fmt.Errorf("list queue %q: %w", queue, err)
	}
	want := tick.UTC().Format(time.RFC3339Nano)
	n := 0
	for _, info := range infos {
		var p taskPayload
		if json.Unmarshal(info.Payload, &p) == nil && p.Tick == want {
			n++
		}
	}
	return n, nil
}

// jitter makes a replica fire each tick up to max late, at random, as a
// replica whose clock is behind or whose scheduler is busy would.
func jitter(max time.Duration) cron.JobWrapper {
	return func(j cron.Job) cron.Job {
		if max <= 0 {
			return j
		}
		return cron.FuncJob(func() {
			time.Sleep(rand.N(max))
			j.Run()
		})
	}
}

// summary gathers what every replica did with each tick.
type summary struct {
	replicas int
	done     chan tickResult

	mu     sync.Mutex
	ticks  map[int64]*tickResult
	errors []error
}

type tickResult struct {
	tick    time.Time
	ran     []string
	skipped int
	seen    int
}

func newSummary(replicas int) *summary {
	return &summary{replicas: replicas, done: make(chan tickResult, 64), ticks: make(map[int64]*tickResult)}
}

// observer returns the observer of one replica. A run counts when it ends
// (its task is in the queue by then); a skip when it is decided.
func (s *summary) observer(replica string) middleware.Observer {
	return func(ctx context.Context, e middleware.Event) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if e.Err != nil && (e.Kind == middleware.EventError || e.Kind == middleware.EventReleased) {
			s.errors = append(s.errors, fmt.Errorf("%s: %w", replica, e.Err))
		}
		tick, ok := cronguard.Tick(ctx)
		if !ok {
			return
		}
		r := s.ticks[e.Job.Epoch]
		if r == nil {
			r = &tickResult{tick: tick}
			s.ticks[e.Job.Epoch] = r
		}
		switch e.Kind {
		case middleware.EventReleased:
			r.ran = append(r.ran, replica)
		case middleware.EventClaimed, middleware.EventDuplicate:
			r.skipped++
		case middleware.EventError:
		default:
			return
		}
		r.seen++
		if r.seen == s.replicas {
			res := *r
			sort.Strings(res.ran)
			select {
			case s.done <- res:
			default: // nobody is reading any more
			}
		}
	}
}

func (s *summary) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errors...)
}

// syncWriter serialises writes from the replicas' goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
