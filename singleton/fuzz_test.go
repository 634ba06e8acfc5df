package singleton_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

// FuzzKeyByFields checks that any payload, task type and field names give
// either a non-empty key, the same one every time, under "asynq:<type>:", or
// an error matching ErrKey and asynq.SkipRetry (the task is archived): never a
// panic, never an empty key, never the handler run without a key. Field names
// the option rejects (empty, repeated, or not a path: an empty member, a
// stray backslash) fail at construction with ErrInvalid.
func FuzzKeyByFields(f *testing.F) {
	f.Add("report", []byte(`{"tenant_id":"acme","n":1}`), "tenant_id", "", false)
	f.Add("report", []byte(`{"tenant_id":"acme","region":7}`), "region", "tenant_id", true)
	f.Add("report", []byte(`{"t": {"a": 1,  "b": [1, 2]}}`), "t", "", false)
	f.Add("report", []byte(`{"tenant_id":null}`), "tenant_id", "", false)
	f.Add("report", []byte(`{"tenant_id":""}`), "tenant_id", "", false)
	f.Add("report", []byte(`{"tenant":"acme"}`), "tenant_id", "", false)
	f.Add("report", []byte(`{"a":1,"a":2}`), "a", "a", true)
	f.Add("report", []byte(`[1,2]`), "0", "", false)
	f.Add("report", []byte(`null`), "x", "", false)
	f.Add("report", []byte(``), "x", "", false)
	f.Add("report", []byte("{\"\xff\":\"\xfe\"}"), "\xff", "", false)
	f.Add("", []byte(`{"":1}`), "", "", false)
	f.Add("a:b", []byte(`{"k":1e400,"j":"caf\u00e9"}`), "k", "j", true)
	f.Add("report", []byte(`{"tenant":{"id":"acme"}}`), "tenant.id", "tenant", true)
	f.Add("report", []byte(`{"a.b":1,"a":{"b":2}}`), "a.b", `a\.b`, true)
	f.Add("report", []byte(`{"a":[{"b":1}]}`), "a.b", "a..b", true)

	locker := lockkittest.New(f)

	f.Fuzz(func(t *testing.T, typ string, payload []byte, field1, field2 string, two bool) {
		fields := []string{field1}
		if two {
			fields = append(fields, field2)
		}
		var key string
		mw, err := singleton.Middleware(locker, singleton.KeyByFields(fields...),
			singleton.WithObserver(func(_ context.Context, e middleware.Event) {
				if e.Kind == middleware.EventAcquired {
					key = e.Job.Key
				}
			}))
		if err != nil {
			if !errors.Is(err, singleton.ErrInvalid) {
				t.Fatalf("KeyByFields(%q): error %v does not match ErrInvalid", fields, err)
			}
			notPath := strings.Contains(err.Error(), "of the path is empty") || strings.Contains(err.Error(), "a backslash must be followed")
			if field1 != "" && (!two || (field2 != "" && field2 != field1)) && !notPath {
				t.Fatalf("KeyByFields(%q) rejected: %v", fields, err)
			}
			return
		}
		derive := func() (string, error) {
			key = ""
			ran := false
			err := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran = true; return nil })).
				ProcessTask(context.Background(), asynq.NewTask(typ, payload))
			if ran != (err == nil) {
				t.Fatalf("handler ran: %v, error: %v", ran, err)
			}
			return key, err
		}
		got, err := derive()
		if err != nil {
			if !errors.Is(err, singleton.ErrKey) || !errors.Is(err, asynq.SkipRetry) {
				t.Fatalf("error %v does not match ErrKey and asynq.SkipRetry", err)
			}
			return
		}
		if got == "" {
			t.Fatal("empty key")
		}
		if !strings.HasPrefix(got, "asynq:"+typ+":") {
			t.Fatalf("key %q does not start with %q", got, "asynq:"+typ+":")
		}
		if again, err := derive(); err != nil || again != got {
			t.Fatalf("second derivation gave %q, %v; first %q", again, err, got)
		}
	})
}
