package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/opsview"
	"github.com/jobguard/jobguard/singleton"
)

const (
	tenants    = 3
	perTenant  = 4
	cacheWarms = 6
	// maxRunTime bounds the demo (with -serve, until its summary).
	maxRunTime = 30 * time.Second
	// serveEvery is how often -serve enqueues the burst again.
	serveEvery = 3 * time.Second
)

// options are the command's flags.
type options struct {
	serve bool   // keep running after the summary until ctx ends
	addr  string // the operator page's address; "" means 127.0.0.1:0
}

// result is what a run saw.
type result struct {
	Ran, Skipped, Requeued map[string]int // per task type
	CopiesRan              int            // runs of copies re-enqueued by Requeue
	MaxOverlap             map[string]int // per key: the most runs at once
	Archived, Failed       int
}

// demo is the state shared by both machines' handlers and observers.
type demo struct {
	w  io.Writer
	mu sync.Mutex
	result
	running map[string]int
}

// run runs the demo on rdb, writing what happens to w, and returns what it
// saw. It fails if a key ever ran more than once at a time, if a task was
// archived or counted as failed, or if the tasks are not done within 30s.
// With opts.serve it then keeps running, enqueuing the burst again every
// serveEvery, until parent ends.
func run(parent context.Context, w io.Writer, rdb redis.UniversalClient, opts options) (*result, error) {
	ctx, cancel := context.WithTimeout(parent, maxRunTime)
	defer cancel()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	clean := func() { _ = insp.DeleteQueue(queue, true) }
	clean() // leftovers of an interrupted run
	defer clean()

	d := &demo{w: w, running: map[string]int{}, result: result{
		Ran: map[string]int{}, Skipped: map[string]int{}, Requeued: map[string]int{}, MaxOverlap: map[string]int{},
	}}
	if err := d.enqueue(ctx, asynq.NewClientFromRedisClient(rdb)); err != nil {
		return nil, err
	}

	fmt.Fprintf(w, "start machine-a and machine-b, %d workers each\n", workers)
	for _, machine := range []string{"machine-a", "machine-b"} {
		srv, locker, err := startMachine(rdb, machine, d.observer(machine),
			d.handler(machine, 300*time.Millisecond), d.handler(machine, 100*time.Millisecond))
		if err != nil {
			return nil, err
		}
		defer locker.Close(context.Background()) // after the server's shutdown (deferred later, so run earlier)
		defer srv.Shutdown()
	}

	stopView, err := serveOpsView(rdb, w, opts.addr)
	if err != nil {
		return nil, err
	}
	defer stopView()

	if err := d.wait(ctx, insp); err != nil {
		return nil, err
	}
	d.mu.Lock()
	res := d.result
	d.mu.Unlock()
	if err := res.report(w); err != nil || !opts.serve {
		if err == nil {
			fmt.Fprintln(w, "the operator view stops with the demo: go run ./examples/worker -serve keeps both machines and the view up until Ctrl-C")
		}
		return &res, err
	}
	return &res, d.serve(parent, asynq.NewClientFromRedisClient(rdb))
}

// serve enqueues the burst every serveEvery until ctx ends, so that the
// operator page has keys to show.
func (d *demo) serve(ctx context.Context, client *asynq.Client) error {
	fmt.Fprintf(d.w, "serving until Ctrl-C: a burst every %s\n", serveEvery)
	tick := time.NewTicker(serveEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(d.w, "stopping")
			return nil
		case <-tick.C:
			if err := d.enqueue(ctx, client); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// enqueue enqueues the burst of tasks: duplicate cache:warm tasks, and
// report:build tasks spread over the tenants, every other one with
// MaxRetry(0).
func (d *demo) enqueue(ctx context.Context, client *asynq.Client) error {
	fmt.Fprintf(d.w, "enqueue %d duplicate cache:warm tasks (key: the type; duplicates skipped)\n", cacheWarms)
	for range cacheWarms {
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("cache:warm", nil), asynq.Queue(queue)); err != nil {
			return err
		}
	}
	fmt.Fprintf(d.w, "enqueue %d report:build tasks for %d tenants (key: tenant_id; duplicates parked until their key frees; half with MaxRetry(0))\n",
		tenants*perTenant, tenants)
	for n := range tenants * perTenant {
		payload := fmt.Sprintf(`{"tenant_id":"tenant-%d","n":%d}`, n%tenants, n)
		opts := []asynq.Option{asynq.Queue(queue)}
		if n%2 == 0 {
			opts = append(opts, asynq.MaxRetry(0))
		}
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("report:build", []byte(payload)), opts...); err != nil {
			return err
		}
	}
	return nil
}

// wait polls the queue until every task is accounted for (run or skipped)
// and none is left in it, or ctx ends.
func (d *demo) wait(ctx context.Context, insp *asynq.Inspector) error {
	done := func() (bool, error) {
		qi, err := insp.GetQueueInfo(queue)
		if err != nil {
			return false, err
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		d.Archived, d.Failed = qi.Archived, qi.FailedTotal
		accounted := d.Ran["report:build"] == tenants*perTenant && d.Ran["cache:warm"]+d.Skipped["cache:warm"] == cacheWarms
		return accounted && qi.Pending+qi.Active+qi.Scheduled+qi.Retry+qi.Archived == 0, nil
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the tasks were not done in time: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// report writes the summary of res to w and returns an error if a key ran
// more than once at a time or a task was archived or counted as failed.
func (res *result) report(w io.Writer) error {
	fmt.Fprintln(w, "summary:")
	fmt.Fprintf(w, "  cache:warm    ran %d, skipped %d\n", res.Ran["cache:warm"], res.Skipped["cache:warm"])
	fmt.Fprintf(w, "  report:build  ran %d (%d of them copies of parked MaxRetry(0) tasks), parked %d times\n",
		res.Ran["report:build"], res.CopiesRan, res.Requeued["report:build"])
	fmt.Fprintf(w, "  archived %d, failed %d\n", res.Archived, res.Failed)
	fmt.Fprintln(w, "most runs of one key at once (must be 1):")
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(res.MaxOverlap)) {
		fmt.Fprintf(w, "  %-28s %d\n", key, res.MaxOverlap[key])
		if res.MaxOverlap[key] != 1 {
			errs = append(errs, fmt.Errorf("%s ran %d times at once", key, res.MaxOverlap[key]))
		}
	}
	if res.Archived+res.Failed > 0 {
		errs = append(errs, fmt.Errorf("%d task(s) archived, %d failed", res.Archived, res.Failed))
	}
	return errors.Join(errs...)
}

// observer reports the guard events of one machine.
func (d *demo) observer(machine string) middleware.Observer {
	return func(_ context.Context, e middleware.Event) {
		d.mu.Lock()
		defer d.mu.Unlock()
		switch {
		case e.Kind == middleware.EventDuplicate && e.Action == middleware.ActionSkip:
			d.Skipped[e.Job.Name]++
			fmt.Fprintf(d.w, "%-10s skipped   %s: %s is held by %s\n", machine, e.Job.Name, e.Job.Key, holderOf(machine, e.Holder))
		case e.Kind == middleware.EventRequeued:
			d.Requeued[e.Job.Name]++
			fmt.Fprintf(d.w, "%-10s parked    %s: %s is held; starts when the key frees (asynq's backstop retry: %s)\n",
				machine, e.Job.Name, e.Job.Key, e.Delay.Round(time.Second))
		case e.Kind == middleware.EventError:
			fmt.Fprintf(d.w, "%-10s error     %s: %v\n", machine, e.Job.Name, e.Err)
		}
	}
}

// holderOf names the holder of a key as seen from machine: the Locker's
// owner ID is the machine's name, so a holder with machine's own name is
// another task running on the same machine.
func holderOf(machine, holder string) string {
	if holder == machine {
		return "another task on " + machine + " (this machine)"
	}
	return "a task on " + holder
}

// handler is one machine's task handler: it records the run and works for
// work (or until ctx ends).
func (d *demo) handler(machine string, work time.Duration) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) error {
		key := t.Type()
		var p struct {
			Tenant string `json:"tenant_id"`
			N      int    `json:"n"`
		}
		if t.Type() == "report:build" {
			if err := json.Unmarshal(t.Payload(), &p); err != nil {
				return err
			}
			key += " tenant=" + p.Tenant
		}
		copied := t.Headers()["jobguard-origin-id"] != "" // a copy Requeue enqueued carries its first task's ID
		d.mu.Lock()
		d.running[key]++
		d.MaxOverlap[key] = max(d.MaxOverlap[key], d.running[key])
		note := ""
		if copied {
			note = " (a requeued copy)"
		}
		fmt.Fprintf(d.w, "%-10s runs      %s%s\n", machine, key, note)
		d.mu.Unlock()

		select {
		case <-time.After(work):
		case <-ctx.Done():
		}

		d.mu.Lock()
		d.running[key]--
		d.Ran[t.Type()]++
		if copied {
			d.CopiesRan++
		}
		d.mu.Unlock()
		return ctx.Err()
	}
}

// serveOpsView serves the operator page (opsview) on a free local port while
// the demo runs and prints its URL: the keys the two machines hold, with
// owners, task IDs and their state in asynq, fencing tokens and TTLs, and the
// tasks that completed without running (singleton's decision log). It is read-only, as by default;
// opsview.WithRelease adds release buttons.
func serveOpsView(rdb redis.UniversalClient, w io.Writer, addr string) (func(), error) {
	view, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(lockPrefix), lockkit.WithOwner("ops-view"))
	if err != nil {
		return nil, err
	}
	state, err := singleton.TaskState(asynq.NewInspectorFromRedisClient(rdb), "")
	if err != nil {
		return nil, err
	}
	h, err := opsview.New(view, opsview.WithRefresh(500*time.Millisecond),
		opsview.WithDecisionLog(rdb, ""), // "": the stream the middleware writes
		opsview.WithTaskState(state))
	if err != nil {
		return nil, err
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = view.Close(context.Background())
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/locks/", http.StripPrefix("/locks", h))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	fmt.Fprintf(w, "operator view: http://%s/locks/ (until the demo ends; -serve keeps it up until Ctrl-C)\n", ln.Addr())
	return func() {
		_ = srv.Close()
		<-done
		_ = view.Close(context.Background())
	}, nil
}
