package singleton_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// keyHeaderOf is the asynqkey.KeyHeader a Client writes for key, derived with the
// key options named opts.
func keyHeaderOf(key, opts string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8]) + " " + opts
}

// A Client keyed by tenant and a Middleware keyed by type (its default) do
// not agree: the middleware drops none of the tenants' tasks as duplicates of
// each other. Each fails with ErrKeyMismatch naming both key options and is
// archived, where it shows; an error event reports it. A task of a plain
// asynq.Client (no asynqkey.KeyHeader) and one of a Client with the middleware's key
// options run as before.
func TestKeyMismatchArchivesTheTaskLoudly(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		ev := &events{}
		mw, err := singleton.Middleware(e.locker(), singleton.WithObserver(ev.observe))
		require.NoError(t, err)
		errs := &errorLog{}
		cfg := e.config(4)
		cfg.ErrorHandler = errs
		var ran atomic.Int32
		e.start(cfg, mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran.Add(1); return nil })))

		byTenant, err := singleton.NewClient(e.Client, e.RDB, singleton.KeyByFields("tenant_id"))
		require.NoError(t, err)
		var ids []string
		for _, tenant := range []string{"acme", "globex", "initech"} {
			info, err := byTenant.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"`+tenant+`"}`)), asynq.Queue(e.Queue))
			require.NoError(t, err)
			require.Equal(t, keyHeaderOf(`asynq:report:tenant_id="`+tenant+`"`, `KeyByFields("tenant_id")`), info.Headers[asynqkey.KeyHeader])
			ids = append(ids, info.ID)
		}
		for _, id := range ids {
			var ti *asynq.TaskInfo
			require.Eventually(t, func() bool {
				ti, err = e.Inspector.GetTaskInfo(e.Queue, id)
				return err == nil && ti.State == asynq.TaskStateArchived
			}, 10*time.Second, 10*time.Millisecond, "the task is archived, not completed as a duplicate")
			require.Contains(t, ti.LastErr, `keyed by KeyByFields("tenant_id")`)
			require.Contains(t, ti.LastErr, "keys it by KeyByType()")
		}
		require.Zero(t, ran.Load(), "no task ran under a key other than the Client's")
		require.True(t, errs.any(func(err error) bool {
			return errors.Is(err, singleton.ErrKeyMismatch) && errors.Is(err, asynq.SkipRetry)
		}), errs.String())
		mismatches := 0
		for _, err := range ev.errs(middleware.EventError) {
			if errors.Is(err, singleton.ErrKeyMismatch) {
				mismatches++
			}
		}
		require.Equal(t, 3, mismatches)

		e.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)))
		require.Eventually(t, func() bool { return ran.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "a plain task runs")
		byType, err := singleton.NewClient(e.Client, e.RDB, singleton.KeyByType())
		require.NoError(t, err)
		info, err := byType.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(e.Queue))
		require.NoError(t, err)
		require.NotContains(t, info.Headers, asynqkey.KeyHeader, "a key by type groups any key the Middleware derives")
		require.Eventually(t, func() bool { return ran.Load() == 2 }, 10*time.Second, 5*time.Millisecond,
			"a task keyed as the middleware keys it runs")
	})
}

// Every path of a Client keyed finer than the type writes the same asynqkey.KeyHeader, and a
// copy made by Requeue keeps it, so the copy runs under the same check.
func TestKeyHeaderOnEveryClientPathAndRequeueCopy(t *testing.T) {
	onEachRedis(t, func(t *testing.T, r connect) {
		e := newEnvOn(t, r)
		l := e.locker()
		want := keyHeaderOf(`asynq:report:tenant_id="acme"`, `KeyByFields("tenant_id")`)
		modes := map[string][]singleton.ClientOption{
			"keys":          nil,
			"Unique":        {singleton.Unique(l, singleton.UntilExecuted, time.Hour)},
			"Debounce":      {singleton.Debounce(l, time.Millisecond, time.Second)},
			"ParkAtEnqueue": {singleton.ParkAtEnqueue(l, time.Hour)},
		}
		for name, opts := range modes {
			c, err := singleton.NewClient(e.Client, e.RDB, append(opts, singleton.KeyByFields("tenant_id"))...)
			require.NoError(t, err)
			info, err := c.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(e.Queue), asynq.ProcessIn(time.Hour))
			require.NoError(t, err, name)
			require.Equal(t, want, info.Headers[asynqkey.KeyHeader], name)
			require.NoError(t, e.Inspector.DeleteTask(e.Queue, info.ID))
		}

		lease, err := l.TryAcquire(context.Background(), `asynq:report:tenant_id="acme"`, nil)
		require.NoError(t, err)
		mw, err := singleton.Middleware(l, singleton.KeyByFields("tenant_id"),
			singleton.WithPolicy(middleware.Requeue(time.Hour)), singleton.WithRedis(e.RDB))
		require.NoError(t, err)
		ran := make(chan *asynq.Task, 1)
		e.start(e.config(2), mw(asynq.HandlerFunc(func(_ context.Context, task *asynq.Task) error {
			ran <- task
			return nil
		})))
		c, err := singleton.NewClient(e.Client, e.RDB, singleton.KeyByFields("tenant_id"))
		require.NoError(t, err)
		_, err = c.Enqueue(asynq.NewTask("report", []byte(`{"tenant_id":"acme"}`)), asynq.Queue(e.Queue), asynq.MaxRetry(0))
		require.NoError(t, err)
		var copied *asynq.TaskInfo
		require.Eventually(t, func() bool {
			tasks, err := e.Inspector.ListScheduledTasks(e.Queue)
			if err != nil || len(tasks) != 1 {
				return false
			}
			copied = tasks[0]
			return true
		}, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, want, copied.Headers[asynqkey.KeyHeader])
		require.NoError(t, lease.Release(context.Background()))
		require.NoError(t, e.Inspector.RunTask(e.Queue, copied.ID))
		require.Equal(t, want, recv(t, ran, 10*time.Second).Headers()[asynqkey.KeyHeader])
	})
}

// logLines is a slog.Handler that keeps every record's message and level.
type logLines struct {
	mu    sync.Mutex
	lines []slog.Record
}

func (h *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (h *logLines) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, r.Clone())
	return nil
}
func (h *logLines) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logLines) WithGroup(string) slog.Handler      { return h }

func (h *logLines) with(msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.lines {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

// A task that completes without running is logged at Info through the
// middleware's logger, with the reason and the holder of the key.
func TestSkippedTaskIsLogged(t *testing.T) {
	e := newEnvOn(t, standalone)
	l := e.locker()
	lease, err := coretest.Of(t, l).TryAcquire(context.Background(), "asynq:report", nil)
	require.NoError(t, err)
	logs := &logLines{}
	mw, err := singleton.Middleware(l, singleton.WithLogger(slog.New(logs)))
	require.NoError(t, err)
	var ran atomic.Int32
	e.start(e.config(2), mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran.Add(1); return nil })))
	e.Enqueue(asynq.NewTask("report", nil))
	e.Drained(10 * time.Second)
	require.Zero(t, ran.Load())
	require.NoError(t, lease.Release(context.Background()))

	lines := logs.with("singleton: task completed without running")
	require.Len(t, lines, 1)
	require.Equal(t, slog.LevelInfo, lines[0].Level)
	attrs := map[string]string{}
	lines[0].Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	require.Equal(t, "asynq:report", attrs["key"])
	require.Equal(t, "held", attrs["reason"])
	require.Equal(t, lease.Owner(), attrs["by_owner"])
}

// KeyByFields("tenant.id") reads the nested member on both sides: the
// Client stamps each task with the key the middleware derives, every task
// runs (none is archived for a key it cannot derive), one per tenant at a
// time, and a payload with the field at the top level gets the same key.
func TestKeyByNestedFieldRunsEveryTask(t *testing.T) {
	e := newEnvOn(t, standalone)
	keys := singleton.KeyByFields("tenant.id")
	ev := &events{}
	mw, err := singleton.Middleware(e.locker(), keys, singleton.WithPolicy(middleware.Requeue(50*time.Millisecond)),
		singleton.WithRedis(e.RDB), singleton.WithObserver(ev.observe))
	require.NoError(t, err)
	tr := newTracker()
	e.start(singleton.ServerConfig(e.config(4)), mw(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		lease, ok := lockcore.LeaseFromContext(ctx)
		require.True(t, ok)
		tr.start(lease.Key())
		defer tr.end(lease.Key(), string(task.Payload()))
		time.Sleep(10 * time.Millisecond) // the work
		return nil
	})))
	client, err := singleton.NewClient(e.Client, e.RDB, keys)
	require.NoError(t, err)
	payloads := []string{`{"tenant":{"id":"acme"},"n":1}`, `{"tenant":{"id":"globex"},"n":2}`, `{"tenant":{"id":"acme"},"n":3}`, `{"tenant.id":"acme","n":4}`}
	for _, p := range payloads {
		info, err := client.Enqueue(asynq.NewTask("report", []byte(p)), asynq.Queue(e.Queue))
		require.NoError(t, err)
		tenant := "acme"
		if p == payloads[1] {
			tenant = "globex"
		}
		require.Equal(t, keyHeaderOf(`asynq:report:tenant.id="`+tenant+`"`, `KeyByFields("tenant.id")`), info.Headers[asynqkey.KeyHeader])
	}
	e.Drained(20 * time.Second)
	require.Len(t, tr.completed(), len(payloads), "every task ran once")
	require.Equal(t, map[string]int{`asynq:report:tenant.id="acme"`: 1, `asynq:report:tenant.id="globex"`: 1}, tr.peaks(),
		"each tenant's key, one run at a time")
	require.Empty(t, ev.errs(middleware.EventError))
	require.Zero(t, e.QueueInfo().Archived)
}
