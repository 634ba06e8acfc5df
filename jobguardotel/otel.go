// Package jobguardotel reports jobguard's guarded runs to OpenTelemetry:
// spans and metrics through the OpenTelemetry Go API only (the SDK is the
// application's choice), with the global providers unless others are given.
// The tracer and the meter have the instrumentation scope
// "github.com/jobguard/jobguard/jobguardotel", the package's import path,
// by which an SDK View can select its instruments. It is a Go module of its
// own, so that OpenTelemetry is in the build of no one who does not use it.
//
//	tel, err := jobguardotel.New() // otel.GetTracerProvider(), otel.GetMeterProvider()
//	mw, err := singleton.Middleware(locker, singleton.WithObserver(tel.Observer()))
//
// # Spans
//
// Each guarded delivery gets a child span of the span in its context,
// "jobguard.acquire <name>", from when the guard began to take the key to
// when it decided: it took the key (jobguard.outcome "acquired", with the
// fencing token), the job is a duplicate ("duplicate", with
// jobguard.action), its cron tick ran elsewhere ("claimed"), or an error
// kept it from running ("error", span status Error). What happens after,
// while the job runs, is recorded as events on the span of the context, the
// task's own: jobguard.lease_lost, jobguard.preempted (middleware.Preempt),
// jobguard.released, jobguard.requeued, jobguard.duplicate.
//
// A child span for the acquire rather than a span per run: asynq users
// already trace each task (one span per delivery, from their tracing
// middleware), so a span per run would double it; and an observer cannot
// put a new span into the handler's context, so the work's own spans could
// not nest under it. The acquire is the time jobguard adds to a task: its
// own span shows it.
//
// Attributes follow the messaging semantic conventions for asynq tasks
// (messaging.system "asynq", messaging.destination.name the queue,
// messaging.message.id the task ID, messaging.operation.type "process"),
// plus jobguard.job.name, jobguard.fencing_token, jobguard.outcome and, for
// cron, jobguard.cron.tick. Keys are never recorded: they hold tenant ids,
// and error messages carry "<key>" in their place.
//
// # Metrics
//
//	jobguard.lease.wait       histogram, s: how long a run waited for its key
//	jobguard.lease.hold       histogram, s: how long a run held its key
//	jobguard.duplicates       counter: jobs that did not run (jobguard.job.name, jobguard.action)
//	jobguard.leases.lost      counter: runs whose lease was lost, not preempted (jobguard.job.name)
//	jobguard.preemptions      counter: runs a newer job preempted, as asked (jobguard.job.name)
package jobguardotel

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/middleware"
)

// scopeName is the instrumentation scope of the tracer and the meter (the
// package doc states it).
const scopeName = "github.com/jobguard/jobguard/jobguardotel"

// Option configures New.
type Option func(*config)

type config struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// WithTracerProvider sets the tracer provider. Defaults to
// otel.GetTracerProvider() at New.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithMeterProvider sets the meter provider. Defaults to
// otel.GetMeterProvider() at New.
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// Telemetry turns guard events into spans and metrics.
type Telemetry struct {
	tracer     trace.Tracer
	wait, hold metric.Float64Histogram
	dups, lost metric.Int64Counter
	preempted  metric.Int64Counter
	shadowed   metric.Int64Counter
}

// New returns the Telemetry. It returns an error if an instrument cannot be
// created.
func New(opts ...Option) (*Telemetry, error) {
	c := config{}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	meter := c.mp.Meter(scopeName)
	t := &Telemetry{tracer: c.tp.Tracer(scopeName)}
	var errs []error
	var err error
	t.wait, err = meter.Float64Histogram("jobguard.lease.wait", metric.WithUnit("s"), metric.WithDescription("How long a run waited for its key."))
	errs = append(errs, err)
	t.hold, err = meter.Float64Histogram("jobguard.lease.hold", metric.WithUnit("s"), metric.WithDescription("How long a run held its key."))
	errs = append(errs, err)
	t.dups, err = meter.Int64Counter("jobguard.duplicates", metric.WithDescription("Jobs that did not run: their key was held, covered, superseded or throttled."))
	errs = append(errs, err)
	t.lost, err = meter.Int64Counter("jobguard.leases.lost", metric.WithDescription("Runs whose lease was lost while they ran; a preemption is not a loss."))
	errs = append(errs, err)
	t.preempted, err = meter.Int64Counter("jobguard.preemptions", metric.WithDescription("Runs that a newer job of their key preempted, as asked (middleware.Preempt)."))
	errs = append(errs, err)
	t.shadowed, err = meter.Int64Counter("jobguard.shadowed", metric.WithDescription("Jobs that ran under WithShadow although the policy would not have run them then, by what it would have done."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("jobguardotel: %w", err)
	}
	return t, nil
}

// attrs returns the attributes of e's job.
func attrs(ctx context.Context, e middleware.Event) []attribute.KeyValue {
	kv := []attribute.KeyValue{attribute.String("jobguard.job.name", e.Job.Name)}
	if id, ok := asynq.GetTaskID(ctx); ok {
		kv = append(kv, attribute.String("messaging.system", "asynq"), attribute.String("messaging.message.id", id),
			attribute.String("messaging.operation.type", "process"))
		if q, ok := asynq.GetQueueName(ctx); ok {
			kv = append(kv, attribute.String("messaging.destination.name", q))
		}
	}
	if tick, ok := cronguard.Tick(ctx); ok {
		kv = append(kv, attribute.String("jobguard.cron.tick", tick.UTC().Format(time.RFC3339Nano)))
	}
	return kv
}

// Observer returns the middleware.Observer to give singleton.WithObserver,
// cronguard.WithObserver or middleware.WithObserver.
func (t *Telemetry) Observer() middleware.Observer {
	return func(ctx context.Context, e middleware.Event) {
		name := attribute.String("jobguard.job.name", e.Job.Name)
		parent := trace.SpanFromContext(ctx)
		acquire := func(outcome string, extra ...attribute.KeyValue) trace.Span {
			kv := append(attrs(ctx, e), attribute.String("jobguard.outcome", outcome))
			_, span := t.tracer.Start(ctx, "jobguard.acquire "+e.Job.Name, trace.WithSpanKind(trace.SpanKindInternal),
				trace.WithTimestamp(time.Now().Add(-e.Wait)), trace.WithAttributes(append(kv, extra...)...))
			return span
		}
		switch e.Kind {
		case middleware.EventAcquired:
			acquire("acquired", attribute.Int64("jobguard.fencing_token", e.Token)).End()
			t.wait.Record(ctx, e.Wait.Seconds(), metric.WithAttributes(name))
		case middleware.EventDuplicate, middleware.EventClaimed:
			outcome := "duplicate"
			if e.Kind == middleware.EventClaimed {
				outcome = "claimed"
			}
			action := attribute.String("jobguard.action", e.Action.String())
			span := acquire(outcome, action)
			if e.Err != nil {
				span.SetAttributes(attribute.String("jobguard.reason", errString(e.Err, e.Job.Key)))
			}
			span.End()
			parent.AddEvent("jobguard.duplicate", trace.WithAttributes(action, attribute.String("jobguard.outcome", outcome)))
			if e.Kind == middleware.EventDuplicate {
				t.dups.Add(ctx, 1, metric.WithAttributes(name, action))
			}
		case middleware.EventShadowed:
			action := attribute.String("jobguard.action", e.Action.String())
			parent.AddEvent("jobguard.shadowed", trace.WithAttributes(action))
			t.shadowed.Add(ctx, 1, metric.WithAttributes(name, action))
		case middleware.EventRequeued:
			parent.AddEvent("jobguard.requeued", trace.WithAttributes(attribute.String("jobguard.delay", e.Delay.String())))
		case middleware.EventLost:
			parent.AddEvent("jobguard.lease_lost", trace.WithAttributes(attribute.Int64("jobguard.fencing_token", e.Token),
				attribute.String("error.message", errString(e.Err, e.Job.Key))))
			t.lost.Add(ctx, 1, metric.WithAttributes(name))
		case middleware.EventPreempted:
			parent.AddEvent("jobguard.preempted", trace.WithAttributes(attribute.Int64("jobguard.fencing_token", e.Token)))
			t.preempted.Add(ctx, 1, metric.WithAttributes(name))
		case middleware.EventReleased:
			parent.AddEvent("jobguard.released", trace.WithAttributes(attribute.Int64("jobguard.fencing_token", e.Token),
				attribute.Float64("jobguard.hold_seconds", e.Duration.Seconds())))
			t.hold.Record(ctx, e.Duration.Seconds(), metric.WithAttributes(name))
		case middleware.EventError:
			if e.Token == 0 { // kept the job from running: the acquire failed
				span := acquire("error")
				span.SetStatus(codes.Error, errString(e.Err, e.Job.Key))
				span.End()
			} else {
				parent.AddEvent("jobguard.error", trace.WithAttributes(attribute.String("error.message", errString(e.Err, e.Job.Key))))
			}
		}
	}
}

// errString is err's message with key, which lockkit and the middleware
// quote in their errors, replaced by "<key>": keys hold tenant ids.
func errString(err error, key string) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	if key == "" {
		return msg
	}
	quoted := strconv.Quote(key)
	msg = strings.ReplaceAll(msg, quoted[1:len(quoted)-1], "<key>") // as %q writes it
	return strings.ReplaceAll(msg, key, "<key>")
}
