package singleton_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// go-redis v9.17's process-wide clock goroutine is go-redis's, not a leak.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.startGlobalTimeCache.func1"))
}

func TestMiddlewareRejectsInvalidOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	keyFn := func(context.Context, *asynq.Task) (string, error) { return "k", nil }
	cases := []struct {
		name string
		opts []singleton.ServerOption
		want string
	}{
		{"no fields", []singleton.ServerOption{singleton.KeyByFields()}, "KeyByFields(): no field given"},
		{"empty field", []singleton.ServerOption{singleton.KeyByFields("tenant_id", "")}, `KeyByFields("tenant_id", ""): field name is empty`},
		{"field twice", []singleton.ServerOption{singleton.KeyByFields("a", "a")}, `KeyByFields("a", "a"): field "a" is given twice`},
		{"empty path step", []singleton.ServerOption{singleton.KeyByFields("tenant..id")}, `KeyByFields("tenant..id"): field "tenant..id": member 2 of the path is empty (write \. for a dot in a member's name)`},
		{"path ends with a dot", []singleton.ServerOption{singleton.KeyByFields("tenant.")}, `field "tenant.": member 2 of the path is empty`},
		{"path starts with a dot", []singleton.ServerOption{singleton.KeyByFields(".id")}, `field ".id": member 1 of the path is empty`},
		{"trailing backslash", []singleton.ServerOption{singleton.KeyByFields(`tenant\`)}, `field "tenant\\": a backslash must be followed by '.' or another backslash`},
		{"unknown escape", []singleton.ServerOption{singleton.KeyByFields(`ten\ant`)}, `field "ten\\ant": a backslash must be followed by '.' or another backslash`},
		{"nil key func", []singleton.ServerOption{singleton.KeyFunc(nil)}, "KeyFunc(nil): func is nil"},
		{"two key options", []singleton.ServerOption{singleton.KeyByType(), singleton.KeyFunc(keyFn)}, "KeyByType(), KeyFunc(fn): give one key option"},
		{"no types", []singleton.ServerOption{singleton.ForTypes()}, "ForTypes(): no task type given"},
		{"empty type", []singleton.ServerOption{singleton.ForTypes("a", " ")}, `ForTypes(" "): task type is empty`},
		{"nil redis", []singleton.ServerOption{singleton.WithRedis(nil)}, "WithRedis(nil): client is nil"},
		{"limit", []singleton.ServerOption{singleton.WithLimit(0)}, "WithLimit(0): must be between 1 and 10000"},
		{"ttl", []singleton.ServerOption{singleton.WithTTL(time.Millisecond)}, "WithTTL(1ms): must be zero (the Locker's) or between 100ms and"},
		{"negative wait", []singleton.ServerOption{singleton.WithPolicy(middleware.Wait(-time.Second, middleware.Skip()))}, "Wait: the wait -1s must be positive"},
		{"requeue without redis", []singleton.ServerOption{singleton.WithPolicy(middleware.Requeue(time.Second))},
			"WithPolicy(Requeue(1s)): a policy that requeues needs WithRedis(client)"},
		{"wait then requeue without redis", []singleton.ServerOption{singleton.WithPolicy(middleware.Wait(time.Second, middleware.Requeue(0)))},
			"a policy that requeues needs WithRedis(client)"},
		{"throttled follow-ups without redis", []singleton.ServerOption{singleton.WithPolicy(middleware.Coalesce()), singleton.WithThrottle(1, time.Second, middleware.ActionSkip)},
			"a throttled follow-up is requeued, which needs WithRedis(client)"},
	}
	l := lockkittest.New(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mw, err := singleton.Middleware(l, c.opts...)
			require.Nil(t, mw)
			require.ErrorIs(t, err, singleton.ErrInvalid)
			require.ErrorIs(t, err, lockkit.ErrInvalid, "one errors.Is for every jobguard validation error")
			require.ErrorContains(t, err, c.want)
		})
	}
	_, err := singleton.Middleware(nil)
	require.ErrorIs(t, err, singleton.ErrInvalid)
	require.ErrorContains(t, err, "locker is nil")

	for _, opts := range [][]singleton.ServerOption{
		nil,
		{nil},
		{singleton.WithPolicy(middleware.Requeue(time.Second)), singleton.WithRedis(rdb)},
		{singleton.KeyByFields("tenant_id", "region"), singleton.PerQueue(), singleton.ForTypes("report"), singleton.WithLimit(3), singleton.WithTTL(time.Minute)},
	} {
		_, err := singleton.Middleware(l, opts...)
		require.NoError(t, err)
	}
}

// keyOf runs t through a middleware built with opts on a fresh Locker
// and returns the key the lease was taken on, or the handler's error.
func keyOf(t *testing.T, ctx context.Context, task *asynq.Task, opts ...singleton.ServerOption) (string, error) {
	t.Helper()
	var key string
	opts = append(opts, singleton.WithObserver(func(_ context.Context, e middleware.Event) {
		if e.Kind == middleware.EventAcquired {
			key = e.Job.Key
		}
	}))
	mw, err := singleton.Middleware(lockkittest.New(t), opts...)
	require.NoError(t, err)
	ran := false
	err = mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran = true; return nil })).ProcessTask(ctx, task)
	require.Equal(t, err == nil, ran, "the handler runs exactly when a key was derived")
	return key, err
}

func TestKeyDerivation(t *testing.T) {
	payload := []byte(`{"tenant_id": "acme", "region": 7, "n": 1}`)
	origin := asynq.NewTaskWithHeaders("report", nil, map[string]string{asynqkey.LabelHeader: "task-1"})
	keyFn := func(_ context.Context, t *asynq.Task) (string, error) { return "custom:" + t.Type(), nil }
	cases := []struct {
		name string
		task *asynq.Task
		opts []singleton.ServerOption
		want string
	}{
		{"type by default", asynq.NewTask("report", payload), nil, "asynq:report"},
		{"type", asynq.NewTask("report", payload), []singleton.ServerOption{singleton.KeyByType()}, "asynq:report"},
		{"payload", asynq.NewTask("report", []byte("abc")), []singleton.ServerOption{singleton.KeyByPayload()},
			"asynq:report:payload:ba7816bf8f01cfea414140de5dae2223"},
		{"one field", asynq.NewTask("report", payload), []singleton.ServerOption{singleton.KeyByFields("tenant_id")}, `asynq:report:tenant_id="acme"`},
		{"two fields in the given order", asynq.NewTask("report", payload), []singleton.ServerOption{singleton.KeyByFields("region", "tenant_id")},
			`asynq:report:region=7,tenant_id="acme"`},
		{"object field is compacted", asynq.NewTask("report", []byte(`{"t": {"a": 1,  "b": [1, 2]}}`)), []singleton.ServerOption{singleton.KeyByFields("t")},
			`asynq:report:t={"a":1,"b":[1,2]}`},
		{"object members sorted", asynq.NewTask("report", []byte(`{"t": {"b": 1, "a": 2}}`)), []singleton.ServerOption{singleton.KeyByFields("t")},
			`asynq:report:t={"a":2,"b":1}`},
		{"escaped unicode is one key with UTF-8", asynq.NewTask("report", []byte(`{"t": "caf\u00e9"}`)), []singleton.ServerOption{singleton.KeyByFields("t")},
			`asynq:report:t="café"`},
		{"HTML-escaped characters are one key with plain ones", asynq.NewTask("report", []byte(`{"t": "a\u003cb\u0026c"}`)), []singleton.ServerOption{singleton.KeyByFields("t")},
			`asynq:report:t="a<b&c"`},
		{"numbers by value", asynq.NewTask("report", []byte(`{"t": 1.0, "u": 1e2, "v": 0.50}`)), []singleton.ServerOption{singleton.KeyByFields("t", "u", "v")},
			`asynq:report:t=1,u=100,v=0.5`},
		{"a number and a string differ", asynq.NewTask("report", []byte(`{"t": "42"}`)), []singleton.ServerOption{singleton.KeyByFields("t")},
			`asynq:report:t="42"`},
		{"a dotted name is a path into nested objects", asynq.NewTask("report", []byte(`{"tenant": {"id": "acme", "n": 2}, "n": 1}`)),
			[]singleton.ServerOption{singleton.KeyByFields("tenant.id")}, `asynq:report:tenant.id="acme"`},
		{"a path of three members", asynq.NewTask("report", []byte(`{"a": {"b": {"c": 7}}}`)), []singleton.ServerOption{singleton.KeyByFields("a.b.c", "a.b")},
			`asynq:report:a.b.c=7,a.b={"c":7}`},
		{"a top-level member named with the dots, when the path leads nowhere", asynq.NewTask("report", []byte(`{"tenant.id": "acme"}`)),
			[]singleton.ServerOption{singleton.KeyByFields("tenant.id")}, `asynq:report:tenant.id="acme"`},
		{"an escaped dot is part of the member's name", asynq.NewTask("report", []byte(`{"tenant.id": "acme", "tenant": {"id": "globex"}}`)),
			[]singleton.ServerOption{singleton.KeyByFields(`tenant\.id`)}, `asynq:report:tenant\.id="acme"`},
		{"an escaped backslash", asynq.NewTask("report", []byte(`{"a\\b": 1}`)), []singleton.ServerOption{singleton.KeyByFields(`a\\b`)}, `asynq:report:a\\b=1`},
		{"task ID of a requeued copy", origin, []singleton.ServerOption{singleton.KeyByTaskID()}, "asynq:report:id:task-1"},
		{"func", asynq.NewTask("report", nil), []singleton.ServerOption{singleton.KeyFunc(keyFn)}, "custom:report"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, err := keyOf(t, context.Background(), c.task, c.opts...)
			require.NoError(t, err)
			require.Equal(t, c.want, key)
		})
	}
}

func TestKeyErrorsNameTheTaskAndTheReason(t *testing.T) {
	fields := singleton.KeyByFields("tenant_id")
	cases := []struct {
		name    string
		payload string
		opts    []singleton.ServerOption
		want    string
	}{
		{"not JSON", `tenant=acme`, []singleton.ServerOption{fields}, "payload is not a JSON object: invalid character"},
		{"JSON array", `[1,2]`, []singleton.ServerOption{fields}, "payload is not a JSON object: json: cannot unmarshal array"},
		{"JSON null", `null`, []singleton.ServerOption{fields}, "payload is not a JSON object: null"},
		{"empty payload", ``, []singleton.ServerOption{fields}, "payload is not a JSON object: unexpected end of JSON input"},
		{"missing field", `{"tenant":"acme"}`, []singleton.ServerOption{fields}, `payload has no field "tenant_id"`},
		{"missing path", `{"tenant":"acme"}`, []singleton.ServerOption{singleton.KeyByFields("tenant.id")},
			`payload has no field "tenant.id" (member "id" of member "tenant"), nor a top-level member named "tenant.id"`},
		{"path and top-level member both", `{"tenant":{"id":"acme"},"tenant.id":"globex"}`, []singleton.ServerOption{singleton.KeyByFields("tenant.id")},
			`field "tenant.id" is ambiguous: the payload has both the path (member "id" of member "tenant") and a top-level member named "tenant.id" (write "tenant\\.id" for the top-level member)`},
		{"null field", `{"tenant_id":null}`, []singleton.ServerOption{fields}, `field "tenant_id" is null`},
		{"empty field", `{"tenant_id":""}`, []singleton.ServerOption{fields}, `field "tenant_id" is empty`},
		{"func error", `{}`, []singleton.ServerOption{singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) {
			return "", errors.New("no region in payload")
		})}, "no region in payload"},
		{"func empty key", `{}`, []singleton.ServerOption{singleton.KeyFunc(func(context.Context, *asynq.Task) (string, error) { return "", nil })}, "the key is empty"},
		{"task ID outside a server", `{}`, []singleton.ServerOption{singleton.KeyByTaskID()}, "no task ID in the context"},
		{"queue outside a server", `{}`, []singleton.ServerOption{singleton.PerQueue()}, "no queue name in the context"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := keyOf(t, context.Background(), asynq.NewTask("report:build", []byte(c.payload)), c.opts...)
			require.ErrorIs(t, err, singleton.ErrKey)
			require.ErrorIs(t, err, asynq.SkipRetry, "asynq archives the task instead of retrying it")
			require.ErrorContains(t, err, `task "report:build"`)
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestForTypesLeavesOtherTypesUnguarded(t *testing.T) {
	l := lockkittest.New(t)
	var events []middleware.EventKind
	mw, err := singleton.Middleware(l, singleton.ForTypes("report"), singleton.KeyByFields("tenant_id"),
		singleton.WithObserver(func(_ context.Context, e middleware.Event) { events = append(events, e.Kind) }))
	require.NoError(t, err)
	ran := 0
	h := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran++; return nil }))
	// "email" has no tenant_id, but it is not guarded, so it runs.
	require.NoError(t, h.ProcessTask(context.Background(), asynq.NewTask("email", []byte("not json"))))
	require.Empty(t, events)
	require.NoError(t, h.ProcessTask(context.Background(), asynq.NewTask("report", []byte(`{"tenant_id":1}`))))
	require.Equal(t, []middleware.EventKind{middleware.EventAcquired, middleware.EventReleased}, events)
	require.Equal(t, 2, ran)
}

func TestDuplicateOutcomeOutsideAServer(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	cases := []struct {
		policy middleware.Policy
		check  func(t *testing.T, err error)
	}{
		{middleware.Skip(), func(t *testing.T, err error) { require.NoError(t, err) }},
		{middleware.Fail(), func(t *testing.T, err error) {
			require.ErrorIs(t, err, middleware.ErrDuplicate)
			require.ErrorIs(t, err, lockkit.ErrNotAcquired)
			require.NotErrorIs(t, err, asynq.SkipRetry)
		}},
		{middleware.Requeue(time.Second), func(t *testing.T, err error) {
			// Without a server there is nothing to put back: the duplicate error
			// is returned for the caller to act on.
			var dup *middleware.DuplicateError
			require.ErrorAs(t, err, &dup)
			require.Equal(t, middleware.ActionRequeue, dup.Action)
			var re *singleton.RequeueError
			require.ErrorAs(t, err, &re)
			require.GreaterOrEqual(t, re.Delay, time.Second, "the policy's delay")
			require.LessOrEqual(t, re.Delay, 1500*time.Millisecond, "plus up to 50% jitter")
			require.False(t, singleton.ServerConfig(asynq.Config{}).IsFailure(err))
		}},
	}
	for _, c := range cases {
		t.Run(c.policy.String(), func(t *testing.T) {
			l := lockkittest.New(t)
			holder, err := l.TryAcquire(context.Background(), "asynq:report", nil)
			require.NoError(t, err)
			defer holder.Release(context.Background())
			mw, err := singleton.Middleware(l, singleton.WithPolicy(c.policy), singleton.WithRedis(rdb))
			require.NoError(t, err)
			err = mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
				t.Error("a duplicate ran")
				return nil
			})).ProcessTask(context.Background(), asynq.NewTask("report", nil))
			c.check(t, err)
		})
	}
}

// A handler's own errors pass through unchanged, even when they are duplicate
// errors of a guard nested inside.
func TestHandlerErrorsPassThrough(t *testing.T) {
	mw, err := singleton.Middleware(lockkittest.New(t))
	require.NoError(t, err)
	inner := &middleware.DuplicateError{Action: middleware.ActionFail}
	for _, want := range []error{errors.New("boom"), inner, asynq.SkipRetry} {
		got := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return want })).
			ProcessTask(context.Background(), asynq.NewTask("report", nil))
		require.ErrorIs(t, got, want)
	}
}

// ServerConfig's IsFailure and RetryDelayFunc take a requeued duplicate,
// also wrapped, and leave every other error to the config's own functions
// (asynq's defaults when nil).
func TestServerConfigHooksCompose(t *testing.T) {
	requeue := &singleton.RequeueError{Duplicate: &middleware.DuplicateError{Action: middleware.ActionRequeue}, Delay: 1234 * time.Millisecond}
	failDup := &middleware.DuplicateError{Action: middleware.ActionFail}
	other := errors.New("boom")
	wrapped := fmt.Errorf("outer: %w", requeue)

	isFailure := singleton.ServerConfig(asynq.Config{}).IsFailure
	require.False(t, isFailure(requeue))
	require.False(t, isFailure(wrapped))
	require.True(t, isFailure(failDup), "Fail counts as a failure: asynq's normal retry applies")
	require.True(t, isFailure(other))

	var asked []error
	mine := singleton.ServerConfig(asynq.Config{IsFailure: func(err error) bool { asked = append(asked, err); return false }}).IsFailure
	require.False(t, mine(requeue))
	require.False(t, mine(other))
	require.Equal(t, []error{other}, asked, "next is asked about every error but a requeue")

	task := asynq.NewTask("report", nil)
	delay := singleton.ServerConfig(asynq.Config{}).RetryDelayFunc
	require.Equal(t, 1234*time.Millisecond, delay(3, requeue, task))
	require.Equal(t, 1234*time.Millisecond, delay(3, wrapped, task))
	require.GreaterOrEqual(t, delay(0, other, task), 15*time.Second, "asynq's default backoff")
	fixed := singleton.ServerConfig(asynq.Config{RetryDelayFunc: func(n int, _ error, _ *asynq.Task) time.Duration { return time.Duration(n) * time.Minute }}).RetryDelayFunc
	require.Equal(t, 2*time.Minute, fixed(2, failDup, task))
	require.Equal(t, 1234*time.Millisecond, fixed(2, requeue, task))
}

// The TTL and the logger given once at the Locker are what the middleware
// uses; singleton.WithTTL and WithLogger override them for it.
func TestSettingsComeFromTheLocker(t *testing.T) {
	var lockerLog, ownLog strings.Builder
	l := lockkittest.New(t, lockkit.WithTTL(2*time.Second),
		lockkit.WithLogger(slog.New(slog.NewTextHandler(&lockerLog, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	var seen []middleware.EventKind
	run := func(opts ...singleton.ServerOption) time.Duration {
		mw, err := singleton.Middleware(l, opts...)
		require.NoError(t, err)
		var ttl time.Duration
		err = mw(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			info, err := l.Inspect(ctx, "asynq:report")
			require.NoError(t, err)
			require.Len(t, info.Holders, 1)
			ttl = info.Holders[0].TTL
			return errors.New("smtp down")
		})).ProcessTask(context.Background(), asynq.NewTask("report", nil))
		require.EqualError(t, err, "smtp down")
		return ttl
	}
	require.InDelta(t, 2, run().Seconds(), 0.1, "the Locker's TTL")
	require.Contains(t, lockerLog.String(), `level=WARN msg="jobguard: released" key=asynq:report job=report`)
	require.Contains(t, lockerLog.String(), `err="smtp down"`)
	lockerLog.Reset()

	ttl := run(singleton.WithTTL(5*time.Second), singleton.WithLogger(slog.New(slog.NewTextHandler(&ownLog, nil))),
		singleton.WithObserver(func(_ context.Context, e middleware.Event) { seen = append(seen, e.Kind) }))
	require.InDelta(t, 5, ttl.Seconds(), 0.1, "the middleware's own TTL")
	require.Contains(t, ownLog.String(), `err="smtp down"`)
	require.Empty(t, lockerLog.String())
	require.Equal(t, []middleware.EventKind{middleware.EventAcquired, middleware.EventReleased}, seen)
}

func TestNewClientRejectsInvalidDebounce(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	ac := asynq.NewClientFromRedisClient(rdb)
	l := lockkittest.New(t)
	for want, opts := range map[string][]singleton.ClientOption{
		"Debounce: locker is nil":                {singleton.Debounce(nil, time.Second, 0)},
		"Debounce: quiet 0s must be between":     {singleton.Debounce(l, 0, 0)},
		"Debounce: maxWait 1ms must be zero or":  {singleton.Debounce(l, time.Second, time.Millisecond)},
		"Debounce and Unique exclude each other": {singleton.Debounce(l, time.Second, 0), singleton.Unique(l, singleton.UntilExecuted, 0)},
	} {
		_, err := singleton.NewClient(ac, rdb, opts...)
		require.ErrorIs(t, err, singleton.ErrInvalid)
		require.ErrorContains(t, err, want)
	}
	_, err := singleton.NewClient(ac, rdb, singleton.Debounce(l, time.Second, 10*time.Second))
	require.NoError(t, err)
}

func TestNewClientRejectsInvalidParkAtEnqueue(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	ac := asynq.NewClientFromRedisClient(rdb)
	l := lockkittest.New(t)
	for want, opts := range map[string][]singleton.ClientOption{
		"ParkAtEnqueue: locker is nil":                       {singleton.ParkAtEnqueue(nil, 0)},
		"ParkAtEnqueue: backstop 500ms must be between 1s":   {singleton.ParkAtEnqueue(l, 500*time.Millisecond)},
		"ParkAtEnqueue: backstop -1s must be between 1s":     {singleton.ParkAtEnqueue(l, -time.Second)},
		"ParkAtEnqueue excludes Unique and Debounce":         {singleton.ParkAtEnqueue(l, 0), singleton.Unique(l, singleton.UntilExecuted, 0)},
		"ParkAtEnqueue excludes Unique and Debounce: it run": {singleton.Debounce(l, time.Second, 0), singleton.ParkAtEnqueue(l, 0)},
	} {
		_, err := singleton.NewClient(ac, rdb, opts...)
		require.ErrorIs(t, err, singleton.ErrInvalid)
		require.ErrorContains(t, err, want)
	}
	_, err := singleton.NewClient(ac, rdb, singleton.ParkAtEnqueue(l, time.Second))
	require.NoError(t, err)
}
