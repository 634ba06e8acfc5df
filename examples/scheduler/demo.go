package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
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

// schedule checks cfg and returns the schedule its Spec describes.
func (cfg config) schedule() (cron.Schedule, error) {
	if cfg.Replicas < 1 || cfg.Replicas > 26 {
		return nil, fmt.Errorf("replicas must be between 1 and 26, not %d", cfg.Replicas)
	}
	if cfg.Ticks < 1 {
		return nil, fmt.Errorf("ticks must be at least 1, not %d", cfg.Ticks)
	}
	if cfg.Jitter < 0 {
		return nil, fmt.Errorf("jitter must not be negative, not %s", cfg.Jitter)
	}
	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor).Parse(cfg.Spec)
	if err != nil {
		return nil, fmt.Errorf("spec %q: %w", cfg.Spec, err)
	}
	return sched, nil
}

// run starts cfg.Replicas replicas of the entry, waits until each has seen
// cfg.Ticks ticks (or ctx ends), stops them and writes the per-tick summary
// to w. It returns an error if a tick did not enqueue exactly one task.
func run(ctx context.Context, w io.Writer, cfg config) error {
	sched, err := cfg.schedule()
	if err != nil {
		return err
	}
	first := sched.Next(time.Now())
	interval := sched.Next(first).Sub(first)
	out := &syncWriter{w: w}

	rdb, closeRedis, err := openRedis(ctx, cfg.Addr, out)
	if err != nil {
		return err
	}
	defer closeRedis()

	// One run's keys and queue, so that runs sharing a Redis do not mix.
	id := make([]byte, 4)
	_, _ = crand.Read(id)
	prefix := "scheduler-demo:" + hex.EncodeToString(id) + ":"
	queue := "scheduler-demo-" + hex.EncodeToString(id)
	inspector := asynq.NewInspectorFromRedisClient(rdb)
	defer func() { _ = inspector.DeleteQueue(queue, true) }()

	sum := newSummary(cfg.Replicas)
	var (
		crons   []*cron.Cron
		lockers []*lockkit.Locker
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
		c, locker, err := startReplica(rdb, replica{
			Name: name, Spec: cfg.Spec, Queue: queue, Prefix: prefix, Log: out,
			Observer: sum.observer(name), Late: jitter(cfg.Jitter),
		})
		if err != nil {
			return err
		}
		crons = append(crons, c)
		lockers = append(lockers, locker)
	}

	timeout := time.NewTimer(time.Duration(cfg.Ticks+3)*interval + time.Until(first))
	defer timeout.Stop()
	t, err := sum.show(ctx, out, cfg.Ticks, timeout.C, inspector, queue)
	if err != nil {
		return err
	}
	stopAll()
	fmt.Fprintf(out, "%d ticks, %d runs, %d tasks (unguarded, %d replicas would have enqueued %d)\n",
		t.ticks, t.runs, t.tasks, cfg.Replicas, cfg.Replicas*t.ticks)
	return errors.Join(t.wrongTick, sum.err())
}

// totals is what the shown ticks add up to.
type totals struct {
	ticks, runs, tasks int
	wrongTick          error // the first tick that did not enqueue exactly one task
}

// show writes a row for each tick once every replica has decided on it, with
// the count of the tasks queue holds for it, until it has shown ticks rows.
// It fails if ctx ends or timeout fires first.
func (s *summary) show(ctx context.Context, out io.Writer, ticks int, timeout <-chan time.Time,
	inspector *asynq.Inspector, queue string) (totals, error) {
	fmt.Fprintf(out, "%-10s  %-10s  %-7s  %s\n", "tick (UTC)", "ran on", "skipped", "tasks enqueued")
	var t totals
	for t.ticks < ticks {
		var r tickResult
		select {
		case r = <-s.done:
		case <-ctx.Done():
			return t, ctx.Err()
		case <-timeout:
			return t, fmt.Errorf("only %d of %d ticks were seen by every replica in time", t.ticks, ticks)
		}
		n, err := tasksFor(inspector, queue, r.tick)
		if err != nil {
			return t, err
		}
		ranOn := strings.Join(r.ran, ",")
		if ranOn == "" {
			ranOn = "-"
		}
		fmt.Fprintf(out, "%-10s  %-10s  %-7d  %d\n", r.tick.UTC().Format("15:04:05"), ranOn, r.skipped, n)
		t.ticks++
		t.runs += len(r.ran)
		t.tasks += n
		if n != 1 && t.wrongTick == nil {
			t.wrongTick = fmt.Errorf("tick %s enqueued %d tasks", r.tick.UTC().Format(time.RFC3339), n)
		}
	}
	return t, nil
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

// tickResult is what the replicas did with one tick.
type tickResult struct {
	tick    time.Time
	ran     []string // the replicas that ran it
	skipped int      // how many replicas skipped it
	seen    int      // how many replicas have decided on it
}

// newSummary returns a summary of replicas replicas. It sends each tick on
// done once every replica has decided on it.
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
		r := s.ticks[tick.UnixMilli()]
		if r == nil {
			r = &tickResult{tick: tick}
			s.ticks[tick.UnixMilli()] = r
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

// err returns the errors the replicas reported, joined.
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

// Write writes p to the underlying writer, one call at a time.
func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
