package jobguardotel_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobguard/jobguard/internal/asynqtest"
	"github.com/jobguard/jobguard/jobguardotel"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

func attr(kvs []attribute.KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value.Emit(), true
		}
	}
	return "", false
}

// Real asynq runs under a tracing middleware (one span per delivery, as a
// user's), recorded with the SDK's in-memory span recorder and manual
// metric reader.
func TestSpansAndMetrics(t *testing.T) {
	e := asynqtest.NewEnv(t, asynqtest.Standalone(t, 14))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := jobguardotel.New(jobguardotel.WithTracerProvider(tp), jobguardotel.WithMeterProvider(mp))
	require.NoError(t, err)

	locker, err := lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix), lockkit.WithTTL(600*time.Millisecond))
	require.NoError(t, err)
	defer locker.Close(context.Background())
	mw, err := singleton.Middleware(locker, singleton.WithObserver(tel.Observer()))
	require.NoError(t, err)
	tracing := func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			ctx, span := tp.Tracer("user").Start(ctx, "asynq "+task.Type())
			defer span.End()
			return next.ProcessTask(ctx, task)
		})
	}
	running := make(chan struct{}, 1)
	lost := make(chan error, 1)
	var once sync.Once
	mux := asynq.NewServeMux()
	mux.Use(tracing, mw)
	mux.HandleFunc("sync", func(ctx context.Context, _ *asynq.Task) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		running <- struct{}{}
		<-ctx.Done() // until an operator releases the key
		lost <- context.Cause(ctx)
		return ctx.Err()
	})
	srv := asynq.NewServerFromRedisClient(e.RDB, asynqtest.Config(e.Queue, 4))
	require.NoError(t, srv.Start(mux))
	defer srv.Shutdown()

	first := e.Enqueue(asynq.NewTask("sync", nil))
	<-running
	e.Enqueue(asynq.NewTask("sync", nil)) // a duplicate while the first runs
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if v, _ := attr(s.Attributes(), "jobguard.outcome"); v == "duplicate" {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	n, err := locker.ForceRelease(context.Background(), "asynq:sync", lockkit.Select{})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.ErrorIs(t, <-lost, lockkit.ErrLost)
	require.Eventually(t, func() bool { return len(taskSpans(rec, first.ID)) == 2 }, 10*time.Second, 10*time.Millisecond)

	// The first delivery: its acquire span is a child of its task span.
	spans := taskSpans(rec, first.ID)
	var acq, task sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "jobguard.acquire sync" {
			acq = s
		} else {
			task = s
		}
	}
	require.NotNil(t, acq)
	require.NotNil(t, task)
	require.Equal(t, task.SpanContext().SpanID(), acq.Parent().SpanID())
	require.Equal(t, trace.SpanKindInternal, acq.SpanKind())
	require.Equal(t, "github.com/jobguard/jobguard/jobguardotel", acq.InstrumentationScope().Name, "the documented scope")
	for k, want := range map[string]string{"messaging.system": "asynq", "messaging.destination.name": e.Queue,
		"messaging.message.id": first.ID, "jobguard.outcome": "acquired", "jobguard.job.name": "sync"} {
		got, ok := attr(acq.Attributes(), k)
		require.True(t, ok, k)
		require.Equal(t, want, got, k)
	}
	_, ok := attr(acq.Attributes(), "jobguard.fencing_token")
	require.True(t, ok)
	var events []string
	for _, ev := range task.Events() {
		events = append(events, ev.Name)
	}
	require.Contains(t, events, "jobguard.lease_lost")
	require.Contains(t, events, "jobguard.released")

	// Metrics.
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	sums := map[string]int64{}
	hists := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, "github.com/jobguard/jobguard/jobguardotel", sm.Scope.Name, "the documented scope")
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sums[m.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					hists[m.Name] += p.Count
				}
			}
		}
	}
	require.Equal(t, int64(1), sums["jobguard.duplicates"])
	require.Equal(t, int64(1), sums["jobguard.leases.lost"])
	require.GreaterOrEqual(t, hists["jobguard.lease.wait"], uint64(1))
	require.GreaterOrEqual(t, hists["jobguard.lease.hold"], uint64(1))
	require.NoError(t, tp.Shutdown(context.Background()))
	require.NoError(t, mp.Shutdown(context.Background()))
}

// taskSpans returns the ended spans of the delivery of task id: its task
// span and the spans under it.
func taskSpans(rec *tracetest.SpanRecorder, id string) []sdktrace.ReadOnlySpan {
	var trace []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if v, ok := attr(s.Attributes(), "messaging.message.id"); ok && v == id {
			for _, p := range rec.Ended() {
				if p.SpanContext().TraceID() == s.SpanContext().TraceID() {
					trace = append(trace, p)
				}
			}
			return trace
		}
	}
	return nil
}

// Keys hold tenant ids: the error messages recorded on spans and events
// name "<key>" instead, even where lockkit and the middleware quote the key.
func TestKeysAreNotRecorded(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tel, err := jobguardotel.New(jobguardotel.WithTracerProvider(tp))
	require.NoError(t, err)
	ctx := context.Background()
	l := lockkittest.New(t, lockkit.WithOwner("worker-a"))
	g, err := middleware.New(l, middleware.WithObserver(tel.Observer()))
	require.NoError(t, err)
	for _, key := range []string{"tenant:acme-corp-secret", `sync:{"tenant_id":"acme-corp-secret"}`} {
		held, err := l.TryAcquire(ctx, key, nil)
		require.NoError(t, err)
		ctx, span := tp.Tracer("test").Start(ctx, "task")
		out := g.Run(ctx, middleware.Job{Key: key, Name: "sync"}, func(context.Context) error { return nil })
		span.End()
		require.NotNil(t, out.Duplicate)
		require.NoError(t, held.Release(ctx))
	}
	var seen bool
	for _, s := range rec.Ended() {
		texts := []string{s.Status().Description}
		for _, kv := range s.Attributes() {
			texts = append(texts, kv.Value.Emit())
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				texts = append(texts, kv.Value.Emit())
			}
		}
		for _, text := range texts {
			require.NotContains(t, text, "acme-corp-secret", "span %s", s.Name())
			seen = seen || strings.Contains(text, "<key>")
		}
	}
	require.True(t, seen, "the reasons were recorded, with <key> in place of the key")
}

// A preemption (middleware.Preempt) is asked for: it has its own counter and
// span event, and jobguard.leases.lost, the signal to alert on, counts only
// real losses such as a key released by an operator.
func TestPreemptionIsNotALostLease(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := jobguardotel.New(jobguardotel.WithTracerProvider(tp), jobguardotel.WithMeterProvider(mp))
	require.NoError(t, err)
	l := lockkittest.New(t)
	g, err := middleware.New(l, middleware.WithPolicy(middleware.Preempt(0)), middleware.WithObserver(tel.Observer()))
	require.NoError(t, err)
	job := middleware.Job{Key: "k", Name: "sync"}
	run := func(name string, end func()) []string {
		ctx, span := tp.Tracer("user").Start(context.Background(), name)
		started, done := make(chan struct{}), make(chan middleware.Outcome)
		go func() {
			done <- g.Run(ctx, job, func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				return context.Cause(ctx)
			})
		}()
		<-started
		end()
		<-done
		span.End()
		var events []string
		for _, ev := range rec.Ended()[len(rec.Ended())-1].Events() {
			events = append(events, ev.Name)
		}
		return events
	}
	events := run("preempted", func() {
		require.True(t, g.Run(context.Background(), job, func(context.Context) error { return nil }).Ran)
	})
	require.Contains(t, events, "jobguard.preempted")
	require.NotContains(t, events, "jobguard.lease_lost")
	events = run("released by an operator", func() {
		_, err := l.ForceRelease(context.Background(), "k", lockkit.Select{})
		require.NoError(t, err)
	})
	require.Contains(t, events, "jobguard.lease_lost")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					sums[m.Name] += p.Value
				}
			}
		}
	}
	require.Equal(t, int64(1), sums["jobguard.preemptions"])
	require.Equal(t, int64(1), sums["jobguard.leases.lost"])
}

// Under WithShadow a job the policy would not run runs anyway: a span event
// on the job's span and jobguard.shadowed by the action the policy would
// have taken.
func TestShadowedJobsAreCounted(t *testing.T) {
	e := asynqtest.NewEnv(t, asynqtest.Standalone(t, 14))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := jobguardotel.New(jobguardotel.WithTracerProvider(tp), jobguardotel.WithMeterProvider(mp))
	require.NoError(t, err)
	l, err := lockkit.NewRedis(e.RDB, lockkit.WithPrefix(e.Prefix))
	require.NoError(t, err)
	defer l.Close(context.Background())
	g, err := middleware.New(l, middleware.WithShadow(), middleware.WithObserver(tel.Observer()))
	require.NoError(t, err)
	job := middleware.Job{Key: "k", Name: "sync"}
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan middleware.Outcome)
	go func() {
		done <- g.Run(context.Background(), job, func(context.Context) error { close(started); <-release; return nil })
	}()
	<-started
	ctx, span := tp.Tracer("user").Start(context.Background(), "second")
	require.True(t, g.Run(ctx, job, func(context.Context) error { return nil }).Ran)
	span.End()
	close(release)
	require.True(t, (<-done).Ran)
	var events []string
	for _, ev := range rec.Ended()[len(rec.Ended())-1].Events() {
		events = append(events, ev.Name)
	}
	require.Contains(t, events, "jobguard.shadowed")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var shadowed int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "jobguard.shadowed" {
				for _, p := range d.DataPoints {
					action, _ := p.Attributes.Value("jobguard.action")
					require.Equal(t, "skip", action.AsString())
					shadowed += p.Value
				}
			}
		}
	}
	require.Equal(t, int64(1), shadowed)
}
