package jobguardprom_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/internal/asynqtest"
	"github.com/jobguard/jobguard/jobguardprom"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// The Grafana dashboard's queries name only metrics that a real run
// exports: after an asynq server runs, requeues and skips tasks, a run's
// lease is released by an operator, a shadowed job runs, a job cannot be
// guarded and a cron tick runs, every metric each panel queries has samples.
func TestDashboardQueriesHaveMetrics(t *testing.T) {
	b, err := os.ReadFile("grafana/jobguard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	require.NotEmpty(t, dash.Panels)

	e := asynqtest.NewEnv(t, asynqtest.Standalone(t, 13))
	reg := prometheus.NewRegistry()
	var locker *lockkit.Locker
	m, err := jobguardprom.New(reg, jobguardprom.WithLockers(lockerRef{&locker}))
	require.NoError(t, err)
	// A short TTL: the released run hears of it at its next renewal (TTL/3).
	locker, err = lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix), lockkit.WithObserver(m.LockObserver()), lockkit.WithTTL(900*time.Millisecond))
	require.NoError(t, err)
	defer locker.Close(context.Background())
	ctx := context.Background()

	// An asynq server under Requeue: one task runs while two duplicates are
	// parked and run after it.
	mw, err := singleton.Middleware(locker, singleton.WithRedis(e.RDB), singleton.WithPolicy(middleware.Requeue(time.Second)),
		singleton.WithObserver(m.Observer()))
	require.NoError(t, err)
	release, started := make(chan struct{}), make(chan struct{}, 1)
	var runs atomic.Int32
	done := make(chan struct{}, 3)
	mux := asynq.NewServeMux()
	mux.Use(mw)
	mux.HandleFunc("sync", func(context.Context, *asynq.Task) error {
		if runs.Add(1) == 1 {
			started <- struct{}{}
			<-release
		}
		done <- struct{}{}
		return nil
	})
	srv := asynq.NewServerFromRedisClient(e.RDB, asynqtest.Config(e.Queue, 2))
	require.NoError(t, srv.Start(mux))
	defer srv.Shutdown()
	e.Enqueue(asynq.NewTask("sync", nil))
	<-started
	e.Enqueue(asynq.NewTask("sync", nil))
	require.Eventually(t, func() bool {
		return value(t, reg, "jobguard_requeues_total", map[string]string{"name": "sync"}) == 1
	}, 10*time.Second, 5*time.Millisecond)
	close(release)
	<-done
	<-done

	// Skip, an operator's release, shadow mode and a job with no key, on
	// guards of their own.
	g, err := middleware.New(locker, middleware.WithObserver(m.Observer()))
	require.NoError(t, err)
	shadow, err := middleware.New(locker, middleware.WithShadow(), middleware.WithObserver(m.Observer()))
	require.NoError(t, err)
	job := middleware.Job{Key: "k", Name: "report"}
	running, out := make(chan struct{}), make(chan middleware.Outcome)
	go func() {
		out <- g.Run(ctx, job, func(ctx context.Context) error { close(running); <-ctx.Done(); return context.Cause(ctx) })
	}()
	<-running
	require.NotNil(t, g.Run(ctx, job, func(context.Context) error { return nil }).Duplicate)
	require.True(t, shadow.Run(ctx, job, func(context.Context) error { return nil }).Ran)
	_, err = locker.ForceRelease(ctx, "k", lockkit.Select{})
	require.NoError(t, err)
	require.ErrorIs(t, (<-out).Err, lockkit.ErrLost)
	require.Error(t, g.Run(ctx, middleware.Job{Name: "report"}, func(context.Context) error { return nil }).Err)

	// A cron tick.
	cg, err := cronguard.New(locker, cronguard.WithSeconds(), cronguard.WithObserver(m.Observer()))
	require.NoError(t, err)
	w, err := cg.Wrap("digest", "* * * * * *")
	require.NoError(t, err)
	cron.NewChain(w).Then(cron.FuncJob(func() {})).Run()

	fams, err := reg.Gather()
	require.NoError(t, err)
	exported := map[string]bool{}
	for _, f := range fams {
		if len(f.GetMetric()) > 0 {
			exported[f.GetName()] = true
		}
	}
	name := regexp.MustCompile(`jobguard_[a-z_]+`)
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			found := name.FindAllString(tg.Expr, -1)
			require.NotEmpty(t, found, "%s: %s names no jobguard metric", p.Title, tg.Expr)
			for _, n := range found {
				n = strings.TrimSuffix(n, "_bucket")
				require.True(t, exported[n], "panel %q queries %s, which the run did not export (exported: %v)", p.Title, n, exported)
			}
		}
	}
}
