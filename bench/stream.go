package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// streamResult is Coalesce under a steady stream of enqueues.
type streamResult struct {
	tasks, keys int
	interval    time.Duration // between two enqueues
	window      time.Duration // the handler's time: one run window
	runs        int
	covered     int
	// violations counts covered tasks with no run of their key that began
	// after their enqueue: the rule says there are none.
	violations int
	maxOverlap int
	runStats
	left string
}

// stream enqueues b.streamTasks tasks over b.burstKeys keys, one every
// b.streamInterval, with singleton.Client while one server processes them
// behind singleton.Middleware with middleware.Coalesce(), and checks every
// covered task against the runs of its key.
func (b *bench) stream(ctx context.Context, env *asynqEnv) (streamResult, error) {
	res := streamResult{tasks: b.streamTasks, keys: b.burstKeys, interval: b.streamInterval, window: b.streamWork}
	srvClient, srvCtr := b.client()
	lockClient, lockCtr := b.client()
	q := env.queue("stream")
	locker, err := lockkit.NewRedis(lockClient, lockkit.WithPrefix(b.prefix+"stream:"))
	if err != nil {
		return res, err
	}
	defer locker.Close(ctx)

	var (
		mu       sync.Mutex
		starts   = map[string][]time.Time{} // key → run starts
		enqueued = map[string]time.Time{}   // task ID → when its enqueue began
		keyOf    = map[string]string{}      // task ID → key
		covered  []string
		running  = map[string]int{}
	)
	t := newTally(b.streamTasks)
	guard, err := singleton.Middleware(locker, singleton.KeyByFields("k"), singleton.WithPolicy(middleware.Coalesce()),
		singleton.WithObserver(func(_ context.Context, e middleware.Event) {
			if e.Kind == middleware.EventDuplicate {
				mu.Lock()
				covered = append(covered, e.Job.ID)
				mu.Unlock()
				t.add()
			}
		}))
	if err != nil {
		return res, err
	}
	h := guard(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		var p struct {
			K string `json:"k"`
		}
		if err := json.Unmarshal(task.Payload(), &p); err != nil {
			return err
		}
		mu.Lock()
		starts[p.K] = append(starts[p.K], time.Now())
		running[p.K]++
		res.maxOverlap = max(res.maxOverlap, running[p.K])
		mu.Unlock()
		time.Sleep(b.streamWork)
		mu.Lock()
		running[p.K]--
		res.runs++
		mu.Unlock()
		t.add()
		return nil
	}))
	client, err := singleton.NewClient(env.enqueuer, env.enqRedis)
	if err != nil {
		return res, err
	}
	enqErr := make(chan error, 1)
	go func() {
		tick := time.NewTicker(b.streamInterval)
		defer tick.Stop()
		for i := range b.streamTasks {
			k := fmt.Sprintf("key-%d", i%b.burstKeys)
			at := time.Now()
			info, err := client.EnqueueContext(ctx, asynq.NewTask("bench:stream", fmt.Appendf(nil, `{"k":%q}`, k)), asynq.Queue(q))
			if err != nil {
				enqErr <- err
				return
			}
			mu.Lock()
			enqueued[info.ID], keyOf[info.ID] = at, k
			mu.Unlock()
			<-tick.C
		}
		enqErr <- nil
	}()
	st, err := env.serve(ctx, srvClient, srvCtr, lockCtr, serverConfig(q, b.concurrency), h, t, b.burstTimeout)
	if err != nil {
		return res, err
	}
	if err := <-enqErr; err != nil {
		return res, err
	}
	res.runStats = st
	mu.Lock()
	defer mu.Unlock()
	res.covered = len(covered)
	for _, id := range covered {
		later := false
		for _, s := range starts[keyOf[id]] {
			later = later || s.After(enqueued[id])
		}
		if !later {
			res.violations++
		}
	}
	if res.left, err = env.left(q); err != nil {
		return res, err
	}
	env.deleteQueue(q)
	return res, nil
}

func (r *report) streamSection() string {
	var w strings.Builder
	x := r.streamRes
	fmt.Fprintf(&w, "%d tasks over %d keys (round robin), enqueued one every %s with `singleton.Client` while one server with "+
		"`Concurrency: %d` processes them behind `singleton.Middleware(locker, singleton.KeyByFields(\"k\"), "+
		"singleton.WithPolicy(middleware.Coalesce()))`, with a %s handler (one run window). Every task that completed "+
		"without running is checked against the runs of its key: one of them must have begun after the task's enqueue.\n\n",
		x.tasks, x.keys, x.interval, r.concurrency, x.window)
	perWindow := "-"
	if x.wall > 0 {
		perWindow = fmt.Sprintf("%.2f", float64(x.runs)/float64(x.keys)/(float64(x.wall)/float64(x.window)))
	}
	table(&w, []string{"tasks", "ran", "completed without running", "covered tasks with no later run (must be 0)",
		"runs per key per run window (goal ≤ 2)", "most runs of one key at once", "wall", "Redis commands per task", "queue after"},
		[][]string{{fmt.Sprint(x.tasks), fmt.Sprint(x.runs), fmt.Sprint(x.covered), fmt.Sprint(x.violations), perWindow,
			fmt.Sprint(x.maxOverlap), msec(x.wall), perTask(x.srv.add(x.lock).cmds, x.tasks), x.left}})
	return w.String()
}
