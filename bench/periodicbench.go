package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/periodickey"
	"github.com/jobguard/jobguard/periodic"
)

// periodicReplica is one periodic.Scheduler replica's round trips, each
// counted for the tick it names: the tick's mark key (".../tick:<ms>",
// claimed before the enqueue and set after it) or its task ID ("periodic:<entry
// id>:<ms>", in asynq's enqueue). Round trips that name no tick (asynq's
// queue registration, a script load) are counted apart.
type periodicReplica struct {
	skew time.Duration

	mu       sync.Mutex
	rts      map[int64]int64 // tick (ms) → round trips
	other    int64           // round trips that name no tick
	enqueued map[int64]bool  // ticks it enqueued

	// Totals by tick enqueued or not, from rts and enqueued (totals).
	won, lost     int64
	wonRT, lostRT int64
}

// sent counts one round trip of cmds.
func (r *periodicReplica) sent(cmds ...redis.Cmder) {
	tick, ok := int64(0), false
	for _, c := range cmds {
		for _, a := range c.Args() {
			s, _ := a.(string)
			if tick, ok = periodickey.Tick(s); ok {
				break
			}
		}
		if ok {
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !ok {
		r.other++
		return
	}
	r.rts[tick]++
}

// totals splits the round trips between the ticks the replica enqueued and
// the others it sent round trips for.
func (r *periodicReplica) totals() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for tick, n := range r.rts {
		if r.enqueued[tick] {
			r.won++
			r.wonRT += n
		} else {
			r.lost++
			r.lostRT += n
		}
	}
}

// tickHook counts a replica's round trips by tick (periodicReplica.sent).
type tickHook struct{ r *periodicReplica }

func (h tickHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h tickHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.r.sent(cmd)
		return next(ctx, cmd)
	}
}

func (h tickHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.r.sent(cmds...)
		return next(ctx, cmds)
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
		c, _ := b.client()
		if err := c.Ping(ctx).Err(); err != nil {
			return res, err
		}
		r := &periodicReplica{skew: skew, rts: map[int64]int64{}, enqueued: map[int64]bool{}}
		c.AddHook(tickHook{r})
		res.replicas = append(res.replicas, r)
		s := periodic.NewSchedulerFromRedisClient(c, &asynq.SchedulerOpts{
			PostEnqueueFunc: func(info *asynq.TaskInfo, err error) {
				if err != nil {
					return
				}
				tick, perr := strconv.ParseInt(info.ID[strings.LastIndexByte(info.ID, ':')+1:], 10, 64)
				if perr == nil {
					r.mu.Lock()
					r.enqueued[tick] = true
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
		r.totals()
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
		"A replica claims the tick in its mark before it enqueues (a tick enqueued, or revoked, on another replica is "+
		"not enqueued again), enqueues, and marks the tick (with the last tick enqueued, one pipeline): 3 round "+
		"trips for a tick it enqueues (2 before the claim, which keeps a revoked tick from being enqueued "+
		"again, so the goal of 2 is not met); a replica that finds the mark stops there, 1 round trip (one more "+
		"each 25 ms it finds the tick claimed by another). Each round trip counts for the tick it "+
		"names (the tick's mark key, or its task ID in asynq's enqueue); those that name none (asynq's queue "+
		"registration) are counted apart. A tick is the replica's \"enqueued\" when asynq accepted its task, "+
		"\"not enqueued\" otherwise (the mark found, or asynq refused the task ID). Replicas behind the others "+
		"enqueue the ticks before the others started.\n\n", x.ticks)
	var rows [][]string
	won := 0
	for i, p := range x.replicas {
		won += int(p.won)
		rows = append(rows, []string{fmt.Sprintf("replica-%d", i), fmt.Sprintf("%s behind", p.skew), fmt.Sprint(p.won),
			ratioOrDash(p.wonRT, int(p.won)), fmt.Sprint(p.lost), ratioOrDash(p.lostRT, int(p.lost)), fmt.Sprint(p.other)})
	}
	table(&w, []string{"replica", "clock", "ticks it enqueued", "round trips per tick enqueued (goal ≤ 2)", "ticks not enqueued", "round trips per tick not enqueued (goal ≤ 1)", "round trips naming no tick"}, rows)
	fmt.Fprintf(&w, "Ticks enqueued by the replicas: %d; tasks in the queue afterwards: %d (must be the same); most tasks of one tick: %d (must be 1).\n\n", won, x.tasks, x.perTick)
	return w.String()
}
