package opsview_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/opsview"
)

func TestEndpoints(t *testing.T) {
	ctx := context.Background()
	l := lockkittest.New(t, lockkit.WithOwner("worker-a"))
	lease, err := coretest.Of(t, l).TryAcquire(ctx, "tenant:42", &lockcore.AcquireOptions{Label: "task-1"})
	require.NoError(t, err)
	_, err = l.TryAcquire(ctx, "report", nil)
	require.NoError(t, err)
	_, err = coretest.Of(t, l).TryAcquire(ctx, "tenant:42", &lockcore.AcquireOptions{Label: "task-2", Reserve: true, Park: &lockcore.Parking{ID: "task-2"}})
	require.ErrorIs(t, err, lockkit.ErrNotAcquired) // parked for the key

	ro, err := opsview.New(l)
	require.NoError(t, err)
	rw, err := opsview.New(l, opsview.WithRelease(), opsview.WithRefresh(time.Second))
	require.NoError(t, err)
	get := func(h http.Handler, path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w
	}
	w := get(ro, "/")
	require.Equal(t, http.StatusOK, w.Code)
	require.Contains(t, w.Body.String(), "<title>jobguard locks</title>")

	w = get(ro, "/api/locks?pattern=tenant:*")
	require.Equal(t, http.StatusOK, w.Code)
	var reply struct {
		Locks []struct {
			Key     string
			Parked  int
			Holders []struct {
				Owner, Label string
				Token        int64
			}
		}
		Release bool
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &reply))
	require.False(t, reply.Release)
	require.Len(t, reply.Locks, 1)
	require.Equal(t, "tenant:42", reply.Locks[0].Key)
	require.Equal(t, 1, reply.Locks[0].Parked)
	require.Equal(t, "worker-a", reply.Locks[0].Holders[0].Owner)
	require.Equal(t, "task-1", reply.Locks[0].Holders[0].Label)
	require.Equal(t, lease.Token(), reply.Locks[0].Holders[0].Token)

	post := func(h http.Handler, header bool, form url.Values) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/api/release", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if header {
			r.Header.Set("X-Jobguard-Action", "release")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	require.Equal(t, http.StatusForbidden, post(ro, true, url.Values{"key": {"tenant:42"}}).Code, "read-only by default")
	require.Equal(t, http.StatusForbidden, post(rw, false, url.Values{"key": {"tenant:42"}}).Code, "a cross-site form cannot release")
	require.Equal(t, http.StatusBadRequest, post(rw, true, url.Values{}).Code)
	// A release asks the run to stop: the key stays held, shown as
	// cancelling, until the run returns; its ctx is cancelled.
	work, stop := lease.Context(ctx)
	defer stop()
	w = post(rw, true, url.Values{"key": {"tenant:42"}})
	require.Equal(t, http.StatusOK, w.Code)
	require.JSONEq(t, `{"key":"tenant:42","released":1,"force":false}`, w.Body.String())
	require.Eventually(t, func() bool { return work.Err() != nil }, 5*time.Second, 5*time.Millisecond)
	require.ErrorIs(t, context.Cause(work), lockkit.ErrCancelled)
	require.NoError(t, lease.Err(), "the run still holds the key")
	w = get(rw, "/api/locks?pattern=tenant:*")
	require.Contains(t, w.Body.String(), `"cancelling":true`)
	require.Equal(t, http.StatusBadRequest, post(rw, true, url.Values{"key": {"tenant:42"}, "force": {"yes"}}).Code)
	// Free anyway (force=1) removes it at once.
	w = post(rw, true, url.Values{"key": {"tenant:42"}, "force": {"1"}})
	require.Equal(t, http.StatusOK, w.Code)
	require.JSONEq(t, `{"key":"tenant:42","released":1,"force":true}`, w.Body.String())
	require.ErrorIs(t, lease.Release(ctx), lockkit.ErrNotHeld)
	require.Equal(t, http.StatusNotFound, get(rw, "/nope").Code)
	require.Equal(t, http.StatusMethodNotAllowed, get(rw, "/api/release").Code)

	for _, bad := range [][]opsview.Option{{opsview.WithRefresh(time.Millisecond)}, {opsview.WithPattern("")}} {
		_, err := opsview.New(l, bad...)
		require.ErrorIs(t, err, opsview.ErrInvalid)
		require.ErrorIs(t, err, lockkit.ErrInvalid)
	}
	_, err = opsview.New(nil)
	require.ErrorIs(t, err, opsview.ErrInvalid)
}

// Every response of the handler forbids framing by another site (a page
// elsewhere cannot overlay it and trick an operator into releasing a key);
// WithFrameAncestors allows the origins it names.
func TestFramingDenied(t *testing.T) {
	ctx := context.Background()
	l := lockkittest.New(t, lockkit.WithOwner("worker-a"))
	_, err := l.TryAcquire(ctx, "tenant:42", nil)
	require.NoError(t, err)
	h, err := opsview.New(l, opsview.WithRelease())
	require.NoError(t, err)
	reqs := map[string]func() *http.Request{
		"page":           func() *http.Request { return httptest.NewRequest(http.MethodGet, "/", nil) },
		"page HEAD":      func() *http.Request { return httptest.NewRequest(http.MethodHead, "/", nil) },
		"page POST":      func() *http.Request { return httptest.NewRequest(http.MethodPost, "/", nil) },
		"locks":          func() *http.Request { return httptest.NewRequest(http.MethodGet, "/api/locks", nil) },
		"locks POST":     func() *http.Request { return httptest.NewRequest(http.MethodPost, "/api/locks", nil) },
		"release GET":    func() *http.Request { return httptest.NewRequest(http.MethodGet, "/api/release", nil) },
		"release no hdr": func() *http.Request { return httptest.NewRequest(http.MethodPost, "/api/release?key=tenant:42", nil) },
		"release no key": func() *http.Request { return releaseRequest(url.Values{}) },
		"release":        func() *http.Request { return releaseRequest(url.Values{"key": {"tenant:42"}}) },
		"not found":      func() *http.Request { return httptest.NewRequest(http.MethodGet, "/nope", nil) },
	}
	for name, req := range reqs {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req())
		require.Equal(t, "DENY", w.Header().Get("X-Frame-Options"), name)
		require.Contains(t, w.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'", name)
	}

	h, err = opsview.New(l, opsview.WithFrameAncestors("https://admin.example.com", "'self'"))
	require.NoError(t, err)
	for name, req := range reqs {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req())
		require.Empty(t, w.Header().Get("X-Frame-Options"), name)
		require.Contains(t, w.Header().Get("Content-Security-Policy"), "frame-ancestors https://admin.example.com 'self'", name)
	}
	for _, bad := range []string{"", "https://a.example.com; script-src *", "https://a.example.com b", "'none'"} {
		_, err := opsview.New(l, opsview.WithFrameAncestors(bad))
		require.ErrorIs(t, err, opsview.ErrInvalid, "%q", bad)
	}
}

func releaseRequest(form url.Values) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/api/release", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("X-Jobguard-Action", "release")
	return r
}

// Keys, owners and labels come from task IDs: the page shows them with their
// control bytes escaped (printable.String), so a parked holder such as
// "parked:default\n<id>" cannot break a row, while the key the page sends
// back to release stays the key.
func TestControlBytesShownEscaped(t *testing.T) {
	ctx := context.Background()
	l := lockkittest.New(t, lockkit.WithOwner("parked:default\nid-1\nid-2"))
	_, err := coretest.Of(t, l).TryAcquire(ctx, "job:\x1b[2J\nforged", &lockcore.AcquireOptions{Label: "id\r\n\u202e"})
	require.NoError(t, err)
	h, err := opsview.New(l)
	require.NoError(t, err)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/locks", nil))
	require.Equal(t, http.StatusOK, w.Code)
	var reply struct {
		Locks []struct {
			Key     string
			KeyText string `json:"key_text"`
			Holders []struct {
				OwnerText string `json:"owner_text"`
				LabelText string `json:"label_text"`
			}
		}
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &reply))
	require.Len(t, reply.Locks, 1)
	require.Equal(t, "job:\x1b[2J\nforged", reply.Locks[0].Key)
	require.Equal(t, `job:\x1b[2J\nforged`, reply.Locks[0].KeyText)
	require.Equal(t, `parked:default\nid-1\nid-2`, reply.Locks[0].Holders[0].OwnerText)
	require.Equal(t, `id\r\n\u202e`, reply.Locks[0].Holders[0].LabelText)

	// The page shows only the escaped forms.
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	page := w.Body.String()
	for _, raw := range []string{`text("td", lock.key,`, "[h.owner,", "h.label ||", "h.owner +", "h.label +", "+ key"} {
		require.NotContains(t, page, raw, "the page shows a raw field")
	}
	for _, esc := range []string{"lock.key_text", "h.owner_text", "h.label_text"} {
		require.Contains(t, page, esc)
	}
}

// The page's Confirm sends the fencing token it showed: the release acts
// only on that holder. When the key changed hands since, it fails with a
// clear error naming the change, and the new holder keeps the key.
func TestReleasePinnedToTheTokenShown(t *testing.T) {
	ctx := context.Background()
	l := lockkittest.New(t, lockkit.WithOwner("worker-a"))
	h, err := opsview.New(l, opsview.WithRelease())
	require.NoError(t, err)
	seen, err := l.TryAcquire(ctx, "tenant:42", nil)
	require.NoError(t, err)
	// The run the operator saw ends; another takes the key before Confirm.
	require.NoError(t, seen.Release(ctx))
	now, err := l.TryAcquire(ctx, "tenant:42", nil)
	require.NoError(t, err)
	shown := strconv.FormatInt(seen.Token(), 10)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, releaseRequest(url.Values{"key": {"tenant:42"}, "token": {shown}, "force": {"1"}}))
	require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
	require.Contains(t, w.Body.String(), "token "+shown)
	require.Contains(t, w.Body.String(), strconv.FormatInt(now.Token(), 10), "names the holder now")
	require.NoError(t, now.Err())
	info, err := l.Inspect(ctx, "tenant:42")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1, "the new holder keeps the key")

	// The token shown releases its holder.
	w = httptest.NewRecorder()
	h.ServeHTTP(w, releaseRequest(url.Values{"key": {"tenant:42"}, "token": {strconv.FormatInt(now.Token(), 10)}, "force": {"1"}}))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.JSONEq(t, `{"key":"tenant:42","released":1,"force":true}`, w.Body.String())
	w = httptest.NewRecorder()
	h.ServeHTTP(w, releaseRequest(url.Values{"key": {"tenant:42"}, "token": {"x"}}))
	require.Equal(t, http.StatusBadRequest, w.Code, w.Body.String())
}

// WithTaskState shows each holder's task state (escaped) and a link to the
// task: an http or https URL or an absolute path; any other link is dropped.
func TestTaskStateOfHolders(t *testing.T) {
	ctx := context.Background()
	l := lockkittest.New(t, lockkit.WithOwner("worker-a"))
	links := map[string]string{
		"t-web": "https://ops.example.com/asynqmon/queues/default/tasks/t-web", "t-path": "/asynqmon/queues/default/tasks/t-path",
		"t-js": "javascript:alert(1)", "t-proto": "//evil.example.com/x", "t-ctl": "/a\nb",
	}
	for label := range links {
		_, err := coretest.Of(t, l).TryAcquire(ctx, "key:"+label, &lockcore.AcquireOptions{Label: label})
		require.NoError(t, err)
	}
	_, err := l.TryAcquire(ctx, "key:none", nil)
	require.NoError(t, err)
	var asked []string
	var mu sync.Mutex
	h, err := opsview.New(l, opsview.WithTaskState(func(_ context.Context, id string) (string, string) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, id)
		return "active\x1b[2J", links[id]
	}))
	require.NoError(t, err)
	var reply struct {
		Locks []struct {
			Key     string
			Holders []struct {
				Label string
				State string `json:"task_state"`
				Link  string `json:"task_link"`
			}
		}
	}
	require.Equal(t, http.StatusOK, getJSON(t, h, "/api/locks", &reply).Code)
	require.Len(t, reply.Locks, 6)
	for _, lock := range reply.Locks {
		hd := lock.Holders[0]
		if hd.Label == "" {
			require.Empty(t, hd.State, "no label, no task")
			continue
		}
		require.Equal(t, `active\x1b[2J`, hd.State, "escaped")
		switch hd.Label {
		case "t-web", "t-path":
			require.Equal(t, links[hd.Label], hd.Link)
		default:
			require.Empty(t, hd.Link, hd.Label)
		}
	}
	require.Len(t, asked, 5, "asked once per holder with a label")
}

// A Unique record (singleton's "unique:<key>", a reservation for a task
// enqueued and not yet run) is shown on the row of the key it belongs to,
// not as a row of its own with buttons of its own; a key that is not held
// gets a row for its record. A reservation names its task by queue and
// ID, and so does a parked task, not by the raw parked entry. A
// "unique:" key held by a run is an ordinary key.
func TestReservationsShowOnTheirKeysRow(t *testing.T) {
	ctx := context.Background()
	l := lockkittest.New(t, lockkit.WithOwner("report-worker-7d9f8c6b5-x2k4p"))
	core := coretest.Of(t, l)
	held, free := `asynq:report:build:tenant_id="acme"`, `asynq:report:build:tenant_id="globex"`
	_, err := core.TryAcquire(ctx, held, &lockcore.AcquireOptions{Label: "task-1"})
	require.NoError(t, err)
	for key, label := range map[string]string{held: "default/task-2", free: "critical%2Feu/task-3"} {
		_, err = core.TryAcquire(ctx, "unique:"+key, &lockcore.AcquireOptions{Label: label, Reserve: true})
		require.NoError(t, err)
	}
	// A task parked behind a run of "parked".
	_, err = core.TryAcquire(ctx, "parked", &lockcore.AcquireOptions{Label: "task-0"})
	require.NoError(t, err)
	_, err = core.TryAcquire(ctx, "parked", &lockcore.AcquireOptions{Label: "task-4", Reserve: true, Park: &lockcore.Parking{ID: "default\ntask-4\ntask-4"}})
	require.ErrorIs(t, err, lockkit.ErrNotAcquired)
	// A run's release reserved "handed" for the task parked behind it.
	first, err := core.TryAcquire(ctx, "handed", &lockcore.AcquireOptions{Label: "task-0", Park: &lockcore.Parking{OnParked: func(string, string) {}}})
	require.NoError(t, err)
	_, err = core.TryAcquire(ctx, "handed", &lockcore.AcquireOptions{Label: "task-5", Reserve: true, Park: &lockcore.Parking{ID: "default\ntask-5\ntask-0"}})
	require.ErrorIs(t, err, lockkit.ErrNotAcquired)
	require.NoError(t, first.Release(ctx))
	_, err = l.TryAcquire(ctx, "unique:run", nil)
	require.NoError(t, err)

	h, err := opsview.New(l, opsview.WithRelease())
	require.NoError(t, err)
	type task struct{ Queue, Task, Origin, ID string }
	type holder struct {
		Token    int64
		Reserved bool
		For      *task
	}
	var reply struct {
		Locks []struct {
			Key          string
			Holders      []holder
			Reservations []holder
			Record       string
			ParkedTasks  []task `json:"parked_tasks"`
		}
	}
	require.Equal(t, http.StatusOK, getJSON(t, h, "/api/locks", &reply).Code)
	var keys []string
	for _, lock := range reply.Locks {
		keys = append(keys, lock.Key)
		switch lock.Key {
		case held:
			require.Len(t, lock.Holders, 1)
			require.False(t, lock.Holders[0].Reserved)
			require.Len(t, lock.Reservations, 1)
			require.True(t, lock.Reservations[0].Reserved)
			require.Equal(t, &task{Queue: "default", Task: "task-2", ID: "default/task-2"}, lock.Reservations[0].For)
			require.Equal(t, "unique:"+held, lock.Record)
		case free:
			require.Empty(t, lock.Holders, "the key itself is not held")
			require.Len(t, lock.Reservations, 1)
			require.Equal(t, &task{Queue: "critical/eu", Task: "task-3", ID: "critical%2Feu/task-3"}, lock.Reservations[0].For)
		case "parked":
			require.Equal(t, []task{{Queue: "default", Task: "task-4", ID: `default\ntask-4\ntask-4`}}, lock.ParkedTasks)
		case "handed":
			require.Len(t, lock.Holders, 1)
			require.True(t, lock.Holders[0].Reserved)
			require.Equal(t, &task{Queue: "default", Task: "task-5", Origin: "task-0", ID: `default\ntask-5\ntask-0`}, lock.Holders[0].For)
		case "unique:run":
			require.Len(t, lock.Holders, 1)
			require.Empty(t, lock.Reservations)
		}
	}
	slices.Sort(keys)
	require.Equal(t, []string{held, free, "handed", "parked", "unique:run"}, keys, "no row of its own for a reservation")
}

// The page of a Locker on a Sentinel-managed master follows the master the
// sentinels name: after a failover it lists what the promoted replica has,
// the lease acknowledged before it and one taken after it.
func TestPageFollowsASentinelFailover(t *testing.T) {
	ctx := context.Background()
	m := testredis.StartServer(t)
	r := testredis.StartReplica(t, m)
	s := testredis.StartSentinel(t, m, "jobs")
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{SentinelAddrs: []string{s.Addr()}, MasterName: "jobs"})
	t.Cleanup(func() { _ = rdb.Close() })
	acked, err := lockkit.NewRedis(rdb, lockkit.WithOwner("worker-s"), lockkit.WithReplicaAcks(1, time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = acked.Close(ctx) })
	// After the failover the promoted replica has no replica of its own
	// until the sentinels turn the old master into one: the page's
	// Locker, and the one taking the key after the failover, do not wait
	// for replicas.
	l, err := lockkit.NewRedis(rdb, lockkit.WithOwner("worker-p"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	page, err := opsview.New(l)
	require.NoError(t, err)
	keys := func() []string {
		w := httptest.NewRecorder()
		page.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/locks", nil))
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		var reply struct{ Locks []struct{ Key string } }
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &reply))
		var names []string
		for _, k := range reply.Locks {
			names = append(names, k.Key)
		}
		slices.Sort(names)
		return names
	}
	_, err = acked.TryAcquire(ctx, "before", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"before"}, keys())

	s.Failover(r)
	// The client learns of the switch from the sentinel (+switch-master).
	port := "tcp_port:" + strings.TrimPrefix(r.Addr(), "127.0.0.1:")
	require.Eventually(t, func() bool {
		info, err := rdb.Info(ctx, "server").Result()
		return err == nil && strings.Contains(info, port)
	}, 10*time.Second, 20*time.Millisecond, "the client is on the promoted replica")
	_, err = l.TryAcquire(ctx, "after", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"after", "before"}, keys())
}
