package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit/inprocess"
	"github.com/jobguard/jobguard/periodic"
)

// startPeriodic is the asynq drop-in to copy: periodic.NewScheduler in place
// of asynq.NewScheduler, with the same Register calls. However many
// replicas run it on rdb, each tick's task is enqueued once. clock is the
// replica's clock (time.Now in production).
func startPeriodic(rdb redis.UniversalClient, spec, queue string, clock func() time.Time) (*periodic.Scheduler, error) {
	s := periodic.NewSchedulerFromRedisClient(rdb, &asynq.SchedulerOpts{Location: time.UTC}, periodic.WithClock(clock))
	if _, err := s.Register(spec, asynq.NewTask(taskType, nil), asynq.Queue(queue)); err != nil {
		return nil, err
	}
	return s, s.Start()
}

// runPeriodic runs cfg.Replicas periodic.Scheduler replicas of one "@every
// 1s" entry, each with its clock up to cfg.Jitter behind, for cfg.Ticks
// ticks, and prints how many tasks the queue holds for each tick.
func runPeriodic(ctx context.Context, w io.Writer, cfg config) error {
	switch {
	case cfg.Replicas < 1 || cfg.Replicas > 26:
		return fmt.Errorf("replicas must be between 1 and 26, not %d", cfg.Replicas)
	case cfg.Ticks < 1:
		return fmt.Errorf("ticks must be at least 1, not %d", cfg.Ticks)
	case cfg.Jitter < 0 || cfg.Jitter >= time.Second:
		return fmt.Errorf("jitter must be between 0 and 1s, not %s", cfg.Jitter)
	}
	rdb, closeRedis, err := openRedis(ctx, cfg.Addr, w)
	if err != nil {
		return err
	}
	defer closeRedis()
	id := make([]byte, 4)
	_, _ = crand.Read(id)
	queue := "periodic-demo-" + hex.EncodeToString(id)
	inspector := asynq.NewInspectorFromRedisClient(rdb)
	defer func() { _ = inspector.DeleteQueue(queue, true) }()

	var scheds []*periodic.Scheduler
	defer func() {
		for _, s := range scheds {
			s.Shutdown()
		}
	}()
	start := time.Now()
	for i := range cfg.Replicas {
		skew := cfg.Jitter * time.Duration(i) / time.Duration(max(cfg.Replicas-1, 1))
		s, err := startPeriodic(rdb, "@every 1s", queue, func() time.Time { return time.Now().Add(-skew) })
		if err != nil {
			return err
		}
		scheds = append(scheds, s)
	}
	fmt.Fprintf(w, "%d replicas of periodic.Scheduler, \"@every 1s\", clocks 0 to %s behind\n", cfg.Replicas, cfg.Jitter)
	wait := time.Until(start.Truncate(time.Second).Add(time.Duration(cfg.Ticks+1)*time.Second + cfg.Jitter + 200*time.Millisecond))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
	}
	for _, s := range scheds {
		s.Shutdown()
	}
	scheds = nil
	infos, err := inspector.ListPendingTasks(queue, asynq.PageSize(10000))
	if err != nil {
		return fmt.Errorf("list queue %q: %w", queue, err)
	}
	perTick := map[int64]int{}
	for _, ti := range infos {
		ms, err := strconv.ParseInt(ti.ID[strings.LastIndexByte(ti.ID, ':')+1:], 10, 64)
		if err != nil {
			return fmt.Errorf("task %q: %w", ti.ID, err)
		}
		perTick[ms]++
	}
	ticks := make([]int64, 0, len(perTick))
	for ms := range perTick {
		ticks = append(ticks, ms)
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i] < ticks[j] })
	fmt.Fprintf(w, "%-10s  %s\n", "tick (UTC)", "tasks enqueued")
	bad := 0
	for _, ms := range ticks {
		fmt.Fprintf(w, "%-10s  %d\n", time.UnixMilli(ms).UTC().Format("15:04:05"), perTick[ms])
		if perTick[ms] != 1 {
			bad++
		}
	}
	fmt.Fprintf(w, "%d ticks, %d tasks (asynq.Scheduler on %d replicas would have enqueued %d)\n", len(ticks), len(infos), cfg.Replicas, len(ticks)*cfg.Replicas)
	if bad > 0 || len(ticks) < cfg.Ticks {
		return fmt.Errorf("%d ticks with other than one task, %d of %d ticks enqueued", bad, len(ticks), cfg.Ticks)
	}
	return nil
}

// openRedis connects to addr, or to an embedded miniredis when addr is
// empty (saying so on w). Call the returned func when done.
func openRedis(ctx context.Context, addr string, w io.Writer) (*redis.Client, func(), error) {
	var rdb *redis.Client
	var done func()
	if addr == "" {
		store, err := inprocess.Start()
		if err != nil {
			return nil, nil, err
		}
		rdb, done = store.Client(), func() { _ = store.Close() }
		addr = rdb.Options().Addr
		fmt.Fprintln(w, "REDIS_ADDR not set: using an embedded miniredis")
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: addr})
		done = func() { _ = rdb.Close() }
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		done()
		return nil, nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	return rdb, done, nil
}
