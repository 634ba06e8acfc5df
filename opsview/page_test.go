package opsview_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/internal/logbuf"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/opsview"
)

type lockReply struct {
	Key     string
	Error   string
	Holders []struct {
		Token  int64
		HeldMs int64 `json:"held_ms"`
	}
}

type pageReply struct {
	Cursor, Next string
	Limit        int
	RefreshMs    int64 `json:"refresh_ms"`
	Locks        []lockReply
}

// getPage asks h for a page of the held keys.
func getPage(t *testing.T, h http.Handler, query string) (*httptest.ResponseRecorder, pageReply) {
	t.Helper()
	var r pageReply
	return getJSON(t, h, "/api/locks?"+query, &r), r
}

// getJSON GETs path from h and decodes a 200 reply into v.
func getJSON(t *testing.T, h http.Handler, path string, v any) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	if w.Code == http.StatusOK {
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), v))
	}
	return w
}

// allPages follows the pages' cursors from the first and returns every
// key shown, and how many pages it took. On a shared Redis with many keys a
// page can hold fewer keys than its size.
func allPages(t *testing.T, h http.Handler, query string) ([]lockReply, int) {
	t.Helper()
	var locks []lockReply
	cursor, pages := "", 0
	for {
		w, r := getPage(t, h, query+"&cursor="+url.QueryEscape(cursor))
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		pages++
		locks = append(locks, r.Locks...)
		if r.Next == "" {
			return locks, pages
		}
		require.Less(t, pages, 100_000)
		cursor = r.Next
	}
}

// keysOf returns the keys of locks, sorted, each once (SCAN may return a
// key twice when Redis resized its table meanwhile).
func keysOf(locks []lockReply) []string {
	var keys []string
	for _, l := range locks {
		keys = append(keys, l.Key)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// The page's API pages the held keys (100 by default) with a cursor, a
// bounded SCAN per page whatever the keyspace, and inspects only the page's
// keys; each holder says how long it has held its key. Following the
// cursors shows every held key. Bad parameters are refused with a message naming them.
func TestLocksArePaged(t *testing.T) {
	ctx := context.Background()
	l := redisLocker(t)
	var want []string
	for i := range 25 {
		k := fmt.Sprintf("tenant:%02d", i)
		_, err := l.TryAcquire(ctx, k, nil)
		require.NoError(t, err)
		want = append(want, k)
	}
	_, err := l.TryAcquire(ctx, "report", nil)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond) // the holders have held their keys a little while
	h, err := opsview.New(l)
	require.NoError(t, err)
	w, r := getPage(t, h, "pattern=tenant:*")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, 100, r.Limit, "a page's default size")
	require.Equal(t, int64(2000), r.RefreshMs, "WithRefresh's default, 2s")
	locks, _ := allPages(t, h, "pattern=tenant:*")
	require.Equal(t, want, keysOf(locks))
	for _, lock := range locks {
		require.GreaterOrEqual(t, lock.Holders[0].HeldMs, int64(15), lock.Key)
		require.Less(t, lock.Holders[0].HeldMs, int64(60_000), lock.Key)
	}

	small, err := opsview.New(l, opsview.WithScanBudget(5, 2))
	require.NoError(t, err)
	got, pages := allPages(t, small, "pattern=tenant:*&limit=10")
	require.Equal(t, want, keysOf(got))
	require.GreaterOrEqual(t, pages, 3)

	// A cursor out of range (past the end of the list, or so large that
	// the page's end overflows) is refused.
	for _, bad := range []string{"limit=0", "limit=x", "limit=1001", "limit=-1", "limit=9223372036854775807",
		"cursor=x", "cursor=7.0", "cursor=-1", "cursor=9223372036854775807", "cursor=9223372036854775807&limit=1000",
		"cursor=1000000", "cursor=99999999999999999999"} {
		w, _ := getPage(t, h, bad)
		require.Equal(t, http.StatusBadRequest, w.Code, bad)
		name, _, _ := strings.Cut(bad, "=")
		require.Contains(t, w.Body.String(), name, bad)
	}
	_, err = opsview.New(l, opsview.WithScanBudget(-1, 0))
	require.ErrorIs(t, err, opsview.ErrInvalid)
}

func must(h *opsview.Handler, err error) *opsview.Handler {
	if err != nil {
		panic(err)
	}
	return h
}

// failing fails the scripts that name one key (its Inspect), as a dropped
// connection would.
type failing struct{ bad string }

func (failing) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f failing) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if name == "evalsha" || name == "eval" {
			for _, a := range cmd.Args() {
				if s, ok := a.(string); ok && strings.Contains(s, f.bad) {
					err := fmt.Errorf("inspect %q: connection reset\x1b[2J", f.bad)
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (failing) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A key whose Inspect fails is one row showing its error (escaped); the
// other rows show as usual and the page is no error.
func TestOneFailedInspectShowsInItsRow(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	for _, k := range []string{"a", "b\n", "c"} {
		_, err := l.TryAcquire(ctx, k, nil)
		require.NoError(t, err)
	}
	vc := testredis.Client(t)
	vc.AddHook(failing{"b\n"})
	view, err := lockkit.NewRedis(vc, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = view.Close(ctx) })
	h, err := opsview.New(view, opsview.WithRelease())
	require.NoError(t, err)
	locks, _ := allPages(t, h, "")
	require.Equal(t, []string{"a", "b\n", "c"}, keysOf(locks))
	for _, lock := range locks {
		if lock.Key == "b\n" {
			require.Contains(t, lock.Error, "connection reset")
			require.NotContains(t, lock.Error, "\x1b", "escaped")
			require.Contains(t, lock.Error, `\x1b[2J`)
			require.Empty(t, lock.Holders)
			continue
		}
		require.Empty(t, lock.Error, lock.Key)
		require.Len(t, lock.Holders, 1, lock.Key)
	}
}

// Every release is logged at Info through the Locker's logger: the actor
// that the program's authentication put in the WithActorHeader header, the
// key, the tokens asked for and what came of it.
func TestReleasesAreAudited(t *testing.T) {
	ctx := context.Background()
	var logs logbuf.Buffer
	c := testredis.Client(t)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(testredis.Prefix(t, c)),
		lockkit.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	lease, err := l.TryAcquire(ctx, "tenant:7", nil)
	require.NoError(t, err)
	h, err := opsview.New(l, opsview.WithRelease(), opsview.WithActorHeader("X-Forwarded-User"))
	require.NoError(t, err)
	release := func(token int64) int {
		form := url.Values{"key": {"tenant:7"}, "token": {fmt.Sprint(token)}, "force": {"1"}}
		req := httptest.NewRequest(http.MethodPost, "/api/release", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Jobguard-Action", "release")
		req.Header.Set("X-Forwarded-User", "alice@example.com")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	require.Equal(t, http.StatusOK, release(lease.Token()))
	require.Equal(t, http.StatusConflict, release(lease.Token()), "released already")

	var records []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		if rec["msg"] == "opsview: release" {
			records = append(records, rec)
		}
	}
	require.Len(t, records, 2, logs.String())
	for _, rec := range records {
		require.Equal(t, "alice@example.com", rec["actor"])
		require.Equal(t, "tenant:7", rec["key"])
		require.Equal(t, "INFO", rec["level"])
		require.Equal(t, []any{float64(lease.Token())}, rec["tokens"])
	}
	require.EqualValues(t, 1, records[0]["released"])
	require.NotContains(t, records[0], "err")
	require.EqualValues(t, 0, records[1]["released"])
	require.Contains(t, records[1]["err"], "no longer holds it")
}

// redisLocker returns a Locker on the test's Redis, under a prefix of the
// test's own, closed when the test ends.
func redisLocker(t *testing.T) *lockkit.Locker {
	c := testredis.Client(t)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// scripts counts the Lua script calls sent to Redis (EVAL, with the
// script's source, and EVALSHA) and the bytes of every command sent.
type scripts struct{ eval, evalsha, bytes atomic.Int64 }

func (s *scripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *scripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.count(cmd)
		return next(ctx, cmd)
	}
}

func (s *scripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			s.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (s *scripts) count(cmd redis.Cmder) {
	switch strings.ToLower(cmd.Name()) {
	case "eval":
		s.eval.Add(1)
	case "evalsha":
		s.evalsha.Add(1)
	}
	n := 0
	for _, a := range cmd.Args() { // as RESP sends it: $<len>\r\n<arg>\r\n
		v := fmt.Sprint(a)
		n += len(v) + len(strconv.Itoa(len(v))) + 5
	}
	s.bytes.Add(int64(n))
}

func (s *scripts) reset() { s.eval.Store(0); s.evalsha.Store(0); s.bytes.Store(0) }

// A refresh runs a script only for the rows it shows, whatever the keys
// SCAN finds that are no longer held, and sends it by its SHA, not its
// source: with 3,000 keys released in the last seconds and 1 held, a 10-row
// page shows the held key with one script; the same with keys kept only by
// their records (Lease.Complete).
func TestRefreshInspectsOnlyTheRowsItShows(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	prefix := testredis.Prefix(t, c)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 3000; i += 16 {
				lease, err := l.TryAcquire(ctx, fmt.Sprintf("report:%04d", i), nil)
				if err == nil {
					err = lease.Release(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
	_, err = l.TryAcquire(ctx, "report:held", nil)
	require.NoError(t, err)

	view := redis.NewClient(c.Options())
	t.Cleanup(func() { _ = view.Close() })
	count := &scripts{}
	view.AddHook(count)
	vl, err := lockkit.NewRedis(view, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = vl.Close(ctx) })
	h := must(opsview.New(vl))
	getPage(t, h, "pattern=report:*&limit=10") // loads the scripts
	count.reset()
	w, r := getPage(t, h, "pattern=report:*&limit=10")
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	t.Logf("3,000 released, 1 held: %d EVAL, %d EVALSHA, %d bytes sent", count.eval.Load(), count.evalsha.Load(), count.bytes.Load())
	require.Equal(t, []string{"report:held"}, keysOf(r.Locks))
	require.Zero(t, count.eval.Load(), "scripts are sent by their SHA")
	require.Equal(t, int64(1), count.evalsha.Load(), "the row shown")
	require.Less(t, count.bytes.Load(), int64(300_000))

	// Keys whose holders left but whose records stay (completed labels)
	// keep their holders in the sorted form.
	for i := range 300 {
		lease, err := coretest.Of(t, l).TryAcquire(ctx, fmt.Sprintf("done:%03d", i), &lockcore.AcquireOptions{Label: fmt.Sprintf("task-%03d", i)})
		require.NoError(t, err)
		require.NoError(t, lease.Complete(ctx, time.Minute))
	}
	_, err = l.TryAcquire(ctx, "done:held", nil)
	require.NoError(t, err)
	count.reset()
	w, r = getPage(t, h, "pattern=done:*&limit=10")
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	t.Logf("300 completed, 1 held: %d EVAL, %d EVALSHA, %d bytes sent", count.eval.Load(), count.evalsha.Load(), count.bytes.Load())
	require.Equal(t, []string{"done:held"}, keysOf(r.Locks))
	require.Zero(t, count.eval.Load(), "scripts are sent by their SHA")
	require.Equal(t, int64(1), count.evalsha.Load(), "the row shown")
}
