package jobguardprom_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/internal/asynqtest"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/jobguardprom"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// value returns the value of the metric name with labels from reg: a
// counter's or gauge's value, a histogram's sample count.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

// Real runs on a real asynq server and real cron replicas, then a scrape of
// the registry.
func TestMetricsAfterRealRuns(t *testing.T) {
	e := asynqtest.NewEnv(t, asynqtest.Standalone(t, 13))
	reg := prometheus.NewRegistry()
	var locker *lockkit.Locker
	m, err := jobguardprom.New(reg, jobguardprom.WithLockers(lockerRef{&locker}))
	require.NoError(t, err)
	locker, err = lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix), lockkit.WithObserver(m.LockObserver()))
	require.NoError(t, err)
	defer locker.Close(context.Background())

	mw, err := singleton.Middleware(locker, singleton.WithObserver(m.Observer()))
	require.NoError(t, err)
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var once sync.Once
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("sync", func(context.Context, *asynq.Task) error {
		first := false
		once.Do(func() { first = true })
		if first {
			started <- struct{}{}
			<-release
		}
		return nil
	})
	mux.HandleFunc("broken", func(context.Context, *asynq.Task) error { return errors.New("boom") })
	srv := asynq.NewServerFromRedisClient(e.RDB, asynqtest.Config(e.Queue, 4))
	require.NoError(t, srv.Start(mux))
	defer srv.Shutdown()

	e.Enqueue(asynq.NewTask("sync", nil))
	<-started
	require.Equal(t, 1.0, value(t, reg, "jobguard_leases_held", nil), "the running task's lease")
	for range 3 {
		e.Enqueue(asynq.NewTask("sync", nil))
	}
	require.Eventually(t, func() bool {
		return value(t, reg, "jobguard_duplicates_total", map[string]string{"name": "sync", "action": "skip"}) == 3
	}, 10*time.Second, 10*time.Millisecond)
	close(release)
	e.Enqueue(asynq.NewTask("broken", nil), asynq.MaxRetry(0)) // archived after its one run
	require.Eventually(t, func() bool {
		return value(t, reg, "jobguard_runs_total", map[string]string{"name": "broken", "outcome": "failed"}) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return value(t, reg, "jobguard_runs_total", map[string]string{"name": "sync", "outcome": "ok"}) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 1.0, value(t, reg, "jobguard_lease_hold_seconds", map[string]string{"name": "sync"}))
	require.Equal(t, 1.0, value(t, reg, "jobguard_lease_wait_seconds", map[string]string{"name": "sync"}))
	require.Equal(t, 0.0, value(t, reg, "jobguard_leases_held", nil))

	// Two cron replicas fire the same tick: one runs it, the other finds it claimed.
	tick := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	for _, owner := range []string{"replica-a", "replica-b"} {
		l, err := lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix), lockkit.WithOwner(owner))
		require.NoError(t, err)
		defer l.Close(context.Background())
		g, err := cronguard.New(l, cronguard.WithSeconds(), cronguard.WithObserver(m.Observer()),
			cronguard.WithClock(func() time.Time { return tick.Add(10 * time.Millisecond) }))
		require.NoError(t, err)
		w, err := g.Wrap("digest", "* * * * * *")
		require.NoError(t, err)
		cron.NewChain(w).Then(cron.FuncJob(func() {})).Run()
	}
	require.Equal(t, 1.0, value(t, reg, "jobguard_cron_ticks_total", map[string]string{"entry": "digest", "outcome": "ran"}))
	require.Equal(t, 1.0, value(t, reg, "jobguard_cron_ticks_total", map[string]string{"entry": "digest", "outcome": "claimed"}))

	// A tick whose job panics is one tick, counted as ran; the panic is an
	// error of that run.
	l, err := lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix), lockkit.WithOwner("replica-a"))
	require.NoError(t, err)
	defer l.Close(context.Background())
	g, err := cronguard.New(l, cronguard.WithSeconds(), cronguard.WithObserver(m.Observer()),
		cronguard.WithClock(func() time.Time { return tick.Add(10 * time.Millisecond) }))
	require.NoError(t, err)
	w, err := g.Wrap("panics", "* * * * * *")
	require.NoError(t, err)
	cron.NewChain(cron.Recover(cron.DiscardLogger), w).Then(cron.FuncJob(func() { panic("boom") })).Run()
	require.Equal(t, 1.0, value(t, reg, "jobguard_cron_ticks_total", map[string]string{"entry": "panics", "outcome": "ran"}))
	require.Equal(t, 0.0, value(t, reg, "jobguard_cron_ticks_total", map[string]string{"entry": "panics", "outcome": "error"}))
	require.Equal(t, 1.0, value(t, reg, "jobguard_errors_total", map[string]string{"name": "panics"}))
	require.Equal(t, 1.0, value(t, reg, "jobguard_runs_total", map[string]string{"name": "panics", "outcome": "failed"}), "a panicking run is a run")

	// A firing that cannot be matched to a tick (here: before the
	// schedule's one activation) is a tick counted as error; its job did
	// not run.
	g, err = cronguard.New(l, cronguard.WithObserver(m.Observer()),
		cronguard.WithParser(onceParser{tick.Add(time.Hour)}),
		cronguard.WithClock(func() time.Time { return tick }))
	require.NoError(t, err)
	w, err = g.Wrap("launch", "launch")
	require.NoError(t, err)
	ran := false
	cron.NewChain(w).Then(cron.FuncJob(func() { ran = true })).Run()
	require.False(t, ran)
	require.Equal(t, 1.0, value(t, reg, "jobguard_cron_ticks_total", map[string]string{"entry": "launch", "outcome": "error"}))
	require.Equal(t, 1.0, value(t, reg, "jobguard_errors_total", map[string]string{"name": "launch"}))

	// No label holds a key.
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			for _, lp := range mt.GetLabel() {
				require.NotContains(t, []string{"key"}, lp.GetName(), f.GetName())
			}
		}
	}

	_, err = jobguardprom.New(reg)
	require.Error(t, err, "the same metrics twice on one registry")
	_, err = jobguardprom.New(nil)
	require.Error(t, err)
}

// onceParser parses every spec as one activation at its time.
type onceParser struct{ at time.Time }

func (p onceParser) Parse(string) (cron.Schedule, error) { return p, nil }

func (p onceParser) Next(t time.Time) time.Time {
	if t.Before(p.at) {
		return p.at
	}
	return time.Time{}
}

// lockerRef lets the gauge read a Locker made after the metrics.
type lockerRef struct{ l **lockkit.Locker }

func (r lockerRef) Held() int {
	if *r.l == nil {
		return 0
	}
	return (*r.l).Held()
}

// bucketCounts returns the cumulative counts of the histogram name by upper
// bound.
func bucketCounts(t *testing.T, reg *prometheus.Registry, name string) map[float64]uint64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() == name {
			require.Len(t, f.GetMetric(), 1)
			out := map[float64]uint64{}
			for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
				out[b.GetUpperBound()] = b.GetCumulativeCount()
			}
			return out
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// The default buckets, from 5 ms to 2 hours, tell a 20-minute run from a
// 2-hour one; WithBuckets replaces them.
func TestHoldBucketsFitLongJobs(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := jobguardprom.New(reg)
	require.NoError(t, err)
	obs := m.Observer()
	obs(context.Background(), middleware.Event{Kind: middleware.EventReleased, Job: middleware.Job{Name: "report:build"}, Duration: 20 * time.Minute})
	b := bucketCounts(t, reg, "jobguard_lease_hold_seconds")
	require.Equal(t, uint64(0), b[600], "a 20-minute run is above the 10-minute bucket")
	require.Equal(t, uint64(1), b[1800], "and within the 30-minute one")
	var bounds []float64
	for le := range b {
		bounds = append(bounds, le)
	}
	slices.Sort(bounds)
	require.Equal(t, []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200}, bounds,
		"WithBuckets' documented default")

	reg = prometheus.NewRegistry()
	m, err = jobguardprom.New(reg, jobguardprom.WithBuckets(1, 60))
	require.NoError(t, err)
	m.Observer()(context.Background(), middleware.Event{Kind: middleware.EventReleased, Job: middleware.Job{Name: "report:build"}, Duration: 20 * time.Minute})
	b = bucketCounts(t, reg, "jobguard_lease_hold_seconds")
	require.Equal(t, map[float64]uint64{1: 0, 60: 0}, b)
}

// A preemption (middleware.Preempt) is asked for: it is counted as the run's
// outcome "preempted", not as a lost lease, which stays the signal to alert
// on; a key released by an operator is a lost lease.
func TestPreemptionIsNotALostLease(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := jobguardprom.New(reg)
	require.NoError(t, err)
	l := lockkittest.New(t)
	g, err := middleware.New(l, middleware.WithPolicy(middleware.Preempt(0)), middleware.WithObserver(m.Observer()))
	require.NoError(t, err)
	ctx := context.Background()
	job := middleware.Job{Key: "k", Name: "sync"}
	block := func(started chan<- struct{}) func(context.Context) error {
		return func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return context.Cause(ctx)
		}
	}

	started, done := make(chan struct{}), make(chan middleware.Outcome)
	go func() { done <- g.Run(ctx, job, block(started)) }()
	<-started
	require.True(t, g.Run(ctx, job, func(context.Context) error { return nil }).Ran)
	require.ErrorIs(t, (<-done).Err, lockcore.ErrPreempted)
	require.Equal(t, 1.0, value(t, reg, "jobguard_runs_total", map[string]string{"name": "sync", "outcome": "preempted"}))
	require.Equal(t, 0.0, value(t, reg, "jobguard_runs_total", map[string]string{"name": "sync", "outcome": "lost"}))
	require.Equal(t, 0.0, value(t, reg, "jobguard_leases_lost_total", map[string]string{"name": "sync"}))

	started = make(chan struct{})
	go func() { done <- g.Run(ctx, job, block(started)) }()
	<-started
	n, err := l.ForceRelease(ctx, "k", lockkit.Select{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	out := <-done
	require.ErrorIs(t, out.Err, lockkit.ErrLost)
	require.NotErrorIs(t, out.Err, lockcore.ErrPreempted)
	require.Equal(t, 1.0, value(t, reg, "jobguard_runs_total", map[string]string{"name": "sync", "outcome": "lost"}))
	require.Equal(t, 1.0, value(t, reg, "jobguard_leases_lost_total", map[string]string{"name": "sync"}))
	require.Equal(t, 1.0, value(t, reg, "jobguard_runs_total", map[string]string{"name": "sync", "outcome": "preempted"}))
}

// Under WithShadow a job the policy would not run runs anyway and is
// counted by what the policy would have done.
func TestShadowedJobsAreCounted(t *testing.T) {
	e := asynqtest.NewEnv(t, asynqtest.Standalone(t, 13))
	reg := prometheus.NewRegistry()
	m, err := jobguardprom.New(reg)
	require.NoError(t, err)
	l, err := lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix))
	require.NoError(t, err)
	defer l.Close(context.Background())
	g, err := middleware.New(l, middleware.WithShadow(), middleware.WithPolicy(middleware.Requeue(0)), middleware.WithObserver(m.Observer()))
	require.NoError(t, err)
	job := middleware.Job{Key: "k", Name: "sync"}
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan middleware.Outcome)
	go func() {
		done <- g.Run(context.Background(), job, func(context.Context) error { close(started); <-release; return nil })
	}()
	<-started
	require.True(t, g.Run(context.Background(), job, func(context.Context) error { return nil }).Ran)
	close(release)
	require.True(t, (<-done).Ran)
	require.Equal(t, 1.0, value(t, reg, "jobguard_shadowed_total", map[string]string{"name": "sync", "action": "requeue"}))
	require.Equal(t, 0.0, value(t, reg, "jobguard_duplicates_total", map[string]string{"name": "sync"}))
	require.Equal(t, 1.0, value(t, reg, "jobguard_runs_total", map[string]string{"name": "sync", "outcome": "ok"}),
		"only the run under the lease is a run of the key")
}
