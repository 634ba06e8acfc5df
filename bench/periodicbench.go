package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/periodic"
)

// periodicReplica is one periodic.Scheduler replica's round trips, split by
// whether it enqueued the tick or was refused.
type periodicReplica struct {
	skew          time.Duration
	won, lost     int64
	wonRT, lostRT int64

	mu      sync.Mutex
	ctr     *counter
	lastPre int64
	lastWon bool
	started bool
}

// pre is called before each enqueue attempt: the round trips since the
// previous attempt belong to it.
func (r *periodicReplica) pre() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closeTick()
	r.lastPre, r.lastWon, r.started = r.ctr.rts.Load(), false, true
}

func (r *periodicReplica) closeTick() {
	if !r.started {
		return
	}
	n := r.ctr.rts.Load() - r.lastPre
	if r.lastWon {
		r.won++
		r.wonRT += n
	} else {
		r.lost++
		r.lostRT += n
	}
}

type periodicResult struct {
	ticks    int
	period   time.Duration
	replicas []*periodicReplica
	tasks    int // tasks in the queue afterwards
	perTick  int // most tasks of one tick
}

// periodicRoundTrips runs three periodic.Scheduler replicas of one "@every
// 100ms" entry, the clocks 0, 150 and 400 ms behind, for b.cronTicks ticks,
// counting each replica's round trips per tick it enqueued and per tick it
// was refused.
func (b *bench) periodicRoundTrips(ctx context.Context, env *asynqEnv) (periodicResult, error) {
	const period = 100 * time.Millisecond
	res := periodicResult{ticks: b.cronTicks, period: period}
	q := env.queue("periodic")
	var scheds []*periodic.Scheduler
	defer func() {
		for _, s := range scheds {
			s.Shutdown()
		}
	}()
	for _, skew := range []time.Duration{0, 150 * time.Millisecond, 400 * time.Millisecond} {
		c, ctr := b.client()
		if err := c.Ping(ctx).Err(); err != nil {
			return res, err
		}
		r := &periodicReplica{skew: skew, ctr: ctr}
		res.replicas = append(res.replicas, r)
		s := periodic.NewSchedulerFromRedisClient(c, &asynq.SchedulerOpts{
			PreEnqueueFunc: func(*asynq.Task, []asynq.Option) { r.pre() },
			PostEnqueueFunc: func(_ *asynq.TaskInfo, err error) {
				if err == nil {
					r.mu.Lock()
					r.lastWon = true
					r.mu.Unlock()
				}
			},
		}, periodic.WithClock(func() time.Time { return time.Now().Add(-skew) }), periodic.WithPrefix(b.prefix))
		if _, err := s.Register("@every 100ms", asynq.NewTask("bench:periodic", nil), asynq.Queue(q)); err != nil {
			return res, err
		}
		scheds = append(scheds, s)
	}
	for _, s := range scheds {
		if err := s.Start(); err != nil {
			return res, err
		}
	}
	select {
	case <-time.After(time.Duration(res.ticks)*period + 500*time.Millisecond):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	for _, s := range scheds {
		s.Shutdown()
	}
	scheds = nil
	for _, r := range res.replicas {
		r.mu.Lock()
		r.closeTick()
		r.started = false
		r.mu.Unlock()
	}
	infos, err := env.insp.ListPendingTasks(q, asynq.PageSize(100000))
	if err != nil {
		return res, err
	}
	res.tasks = len(infos)
	seen := map[string]int{}
	for _, ti := range infos {
		tick := ti.ID[strings.LastIndexByte(ti.ID, ':')+1:]
		seen[tick]++
		res.perTick = max(res.perTick, seen[tick])
	}
	env.deleteQueue(q)
	return res, nil
}

func (r *report) periodicTable() string {
	x := r.periodicRes
	if len(x.replicas) == 0 {
		return ""
	}
	var w strings.Builder
	fmt.Fprintf(&w, "`periodic.Scheduler` (the drop-in for asynq's Scheduler) on three replicas, each with its own client, "+
		"one entry `@every 100ms`, for about %d ticks; the replicas' clocks are 0, 150 and 400 ms behind. Every replica "+
		"tries to enqueue every tick; asynq refuses all but the first (the task ID is the entry's and the tick's). "+
		"Round trips are counted from one enqueue attempt of a replica to its next; the first attempt of each "+
		"client also loads asynq's script and registers the queue.\n\n", x.ticks)
	var rows [][]string
	for i, p := range x.replicas {
		rows = append(rows, []string{fmt.Sprintf("replica-%d", i), fmt.Sprintf("%s behind", p.skew), fmt.Sprint(p.won),
			ratioOrDash(p.wonRT, int(p.won)), fmt.Sprint(p.lost), ratioOrDash(p.lostRT, int(p.lost))})
	}
	table(&w, []string{"replica", "clock", "ticks it enqueued", "round trips per tick enqueued (goal ≤ 2)", "ticks refused", "round trips per tick refused (goal ≤ 1)"}, rows)
	fmt.Fprintf(&w, "Tasks in the queue afterwards: %d; most tasks of one tick: %d (must be 1).\n\n", x.tasks, x.perTick)
	return w.String()
}
