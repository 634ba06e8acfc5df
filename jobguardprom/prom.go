// Package jobguardprom exports jobguard's events as Prometheus metrics,
// registered on the prometheus.Registerer you pass (never the global one
// implicitly). It is a Go module of its own, so that the Prometheus client
// is in the build of no one who does not use it.
//
//	m, err := jobguardprom.New(registry, jobguardprom.WithLockers(locker))
//	locker, err := lockkit.NewRedis(rdb, lockkit.WithObserver(m.LockObserver())) // renewal failures
//	mw, err := singleton.Middleware(locker, singleton.WithObserver(m.Observer()))
//	guard, err := cronguard.New(locker, cronguard.WithObserver(m.Observer()))
//
// Metrics (labels name a task type or a cron entry, never a key: keys hold
// tenant ids):
//
//	jobguard_lease_wait_seconds{name}            histogram: how long a run waited for its key
//	jobguard_lease_hold_seconds{name}            histogram: how long a run held its key
//	jobguard_runs_total{name,outcome}            runs that took their key: outcome ok, failed, lost, preempted
//	jobguard_duplicates_total{name,action}       jobs that did not run: action skip, requeue or fail
//	jobguard_requeues_total{name}                duplicates put back by the adapter
//	jobguard_leases_lost_total{name}             runs whose lease was lost (their ctx was cancelled), not preempted
//	jobguard_errors_total{name}                  jobs that could not be guarded (Redis errors, bad keys)
//	jobguard_renew_failures_total                renewals that failed while the lease was still valid
//	jobguard_cron_ticks_total{entry,outcome}     cron ticks: ran, claimed (ran on another replica), skipped, error
//	jobguard_leases_held                         leases the given Lockers hold now (WithLockers)
//	jobguard_shadowed_total{name,action}         jobs run under WithShadow that the policy would not have run
//
// grafana/jobguard.json is a dashboard of these metrics (docs/operations.md
// names each panel's query).
package jobguardprom

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// Option configures the metrics.
type Option func(*config)

type config struct {
	namespace string
	buckets   []float64
	lockers   []interface{ Held() int } // WithLockers
}

// WithNamespace sets the metric name prefix. Defaults to "jobguard".
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// defaultBuckets are the buckets, in seconds, of the two histograms unless
// WithBuckets is given (WithBuckets' doc lists them).
var defaultBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200}

// WithBuckets sets the buckets of the two histograms, in seconds. Defaults
// to .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
// 1800, 3600 and 7200: from 5 ms to 2 hours, since guarded jobs often run
// for minutes (Prometheus' DefBuckets end at 10 s).
func WithBuckets(b ...float64) Option { return func(c *config) { c.buckets = b } }

// WithLockers makes jobguard_leases_held sum the leases these Lockers hold
// when scraped: any value whose Held method reports how many leases it
// holds, as *lockkit.Locker's does. Defaults to no such gauge.
func WithLockers(ls ...interface{ Held() int }) Option {
	return func(c *config) { c.lockers = append(c.lockers, ls...) }
}

// Metrics holds the collectors; its observers feed them.
type Metrics struct {
	wait, hold                              *prometheus.HistogramVec
	runs, dups, requeues, lost, errs, ticks *prometheus.CounterVec
	shadowed                                *prometheus.CounterVec
	renewFailures                           prometheus.Counter
}

// New creates the metrics and registers them on reg. It returns an error
// for a nil reg, an empty namespace, or a registration that fails (such as
// a second New on the same registry with the same namespace).
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("jobguardprom: New: registerer is nil")
	}
	c := config{namespace: "jobguard", buckets: defaultBuckets}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.namespace == "" {
		return nil, errors.New("jobguardprom: WithNamespace(\"\")")
	}
	ns := c.namespace
	m := &Metrics{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "lease_wait_seconds",
			Help: "How long a run waited for its key before it ran.", Buckets: c.buckets}, []string{"name"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "lease_hold_seconds",
			Help: "How long a run held its key.", Buckets: c.buckets}, []string{"name"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "runs_total",
			Help: "Runs that took their key, by outcome: ok, failed (the job returned an error), lost (the lease was lost), preempted (a newer job of the key preempted it, as asked)."}, []string{"name", "outcome"}),
		dups: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "duplicates_total",
			Help: "Jobs that did not run because their key was held, covered, superseded or throttled, by action."}, []string{"name", "action"}),
		shadowed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "shadowed_total",
			Help: "Jobs that ran under WithShadow although the policy would not have run them then, by what it would have done."}, []string{"name", "action"}),
		requeues: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "requeues_total",
			Help: "Duplicates the adapter put back to run later."}, []string{"name"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "leases_lost_total",
			Help: "Runs whose lease was lost while they ran (their context was cancelled); a preemption is not a loss."}, []string{"name"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "errors_total",
			Help: "Jobs that could not be guarded: Redis errors, keys that cannot be derived, failed releases, panics."}, []string{"name"}),
		ticks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "cron_ticks_total",
			Help: "Cron ticks by outcome: ran, claimed (ran on another replica), skipped (an earlier tick still ran), error."}, []string{"entry", "outcome"}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "renew_failures_total",
			Help: "Lease renewals that failed while the lease was still valid."}),
	}
	cs := []prometheus.Collector{m.wait, m.hold, m.runs, m.dups, m.shadowed, m.requeues, m.lost, m.errs, m.ticks, m.renewFailures}
	if len(c.lockers) > 0 {
		lockers := c.lockers
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "leases_held",
			Help: "Leases the process's Lockers hold now."}, func() float64 {
			n := 0
			for _, l := range lockers {
				n += l.Held()
			}
			return float64(n)
		}))
	}
	for _, col := range cs {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("jobguardprom: register: %w", err)
		}
	}
	return m, nil
}

// Observer returns the middleware.Observer to give singleton.WithObserver,
// cronguard.WithObserver or middleware.WithObserver.
func (m *Metrics) Observer() middleware.Observer {
	return func(ctx context.Context, e middleware.Event) {
		name := e.Job.Name
		_, cron := cronguard.Tick(ctx)
		if !cron && e.Kind == middleware.EventError && errors.Is(e.Err, cronguard.ErrNoTick) {
			cron = true // a firing that names no tick, so has none in ctx
		}
		tick := func(outcome string) {
			if cron {
				m.ticks.WithLabelValues(name, outcome).Inc()
			}
		}
		switch e.Kind {
		case middleware.EventAcquired:
			m.wait.WithLabelValues(name).Observe(e.Wait.Seconds())
			tick("ran")
		case middleware.EventReleased:
			m.hold.WithLabelValues(name).Observe(e.Duration.Seconds())
			outcome := "ok"
			switch {
			case errors.Is(e.Err, middleware.ErrPreempted):
				outcome = "preempted"
			case errors.Is(e.Err, lockkit.ErrLost):
				outcome = "lost"
			case e.Err != nil:
				outcome = "failed"
			}
			m.runs.WithLabelValues(name, outcome).Inc()
		case middleware.EventDuplicate:
			m.dups.WithLabelValues(name, e.Action.String()).Inc()
			tick("skipped")
		case middleware.EventShadowed:
			m.shadowed.WithLabelValues(name, e.Action.String()).Inc()
		case middleware.EventClaimed:
			tick("claimed")
		case middleware.EventRequeued:
			m.requeues.WithLabelValues(name).Inc()
		case middleware.EventLost:
			m.lost.WithLabelValues(name).Inc()
		case middleware.EventError:
			m.errs.WithLabelValues(name).Inc()
			if e.Token == 0 {
				// The tick did not run; an error of a run that started (a
				// panic, a failed release) is the tick counted as ran.
				tick("error")
			}
		}
	}
}

// LockObserver returns the observer to give lockkit.WithObserver: it counts
// renewal failures, which have no job name.
func (m *Metrics) LockObserver() func(lockkit.Event) {
	return func(e lockkit.Event) {
		if e.Kind == lockkit.LeaseRenewFailed {
			m.renewFailures.Inc()
		}
	}
}
