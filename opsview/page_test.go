package opsview_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/opsview"
)

type pageReply struct {
	Total, Offset, Limit int
	Locks                []struct {
		Key     string
		Holders []struct {
			Token  int64
			HeldMs int64 `json:"held_ms"`
		}
	}
}

// The page's API pages the held keys in key order (100 by default) and
// inspects only the page's keys; each holder says how long it has held its
// key. Bad paging parameters are refused with a message naming them.
func TestLocksArePaged(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	l, err := lockkit.NewRedis(c, lockkit.WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	for i := range 25 {
		_, err := l.TryAcquire(ctx, fmt.Sprintf("tenant:%02d", i), nil)
		require.NoError(t, err)
	}
	time.Sleep(20 * time.Millisecond) // the holders have held their keys a little while
	h, err := opsview.New(l)
	require.NoError(t, err)
	get := func(query string) (*httptest.ResponseRecorder, pageReply) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/locks?"+query, nil))
		var r pageReply
		if w.Code == http.StatusOK {
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &r))
		}
		return w, r
	}
	w, r := get("pattern=tenant:*")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, 25, r.Total)
	require.Equal(t, opsview.DefaultPageSize, r.Limit)
	require.Len(t, r.Locks, 25)
	for _, lock := range r.Locks {
		require.GreaterOrEqual(t, lock.Holders[0].HeldMs, int64(15), lock.Key)
		require.Less(t, lock.Holders[0].HeldMs, int64(60_000), lock.Key)
	}

	w, r = get("pattern=tenant:*&offset=20&limit=10")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, 25, r.Total)
	require.Len(t, r.Locks, 5)
	require.Equal(t, "tenant:20", r.Locks[0].Key)
	require.Equal(t, "tenant:24", r.Locks[4].Key)
	w, r = get("pattern=tenant:*&offset=40")
	require.Equal(t, http.StatusOK, w.Code)
	require.Empty(t, r.Locks)

	for _, bad := range []string{"offset=-1", "offset=x", "limit=0", "limit=1001"} {
		w, _ := get(bad)
		require.Equal(t, http.StatusBadRequest, w.Code, bad)
		name, _, _ := strings.Cut(bad, "=")
		require.Contains(t, w.Body.String(), name, bad)
	}
}

// Every release is logged at Info through the Locker's logger: the actor
// that the program's authentication put in the WithActorHeader header, the
// key, the tokens asked for and what came of it.
func TestReleasesAreAudited(t *testing.T) {
	ctx := context.Background()
	var logs bytes.Buffer
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
		form := url.Values{"key": {"tenant:7"}, "token": {fmt.Sprint(token)}}
		req := httptest.NewRequest(http.MethodPost, "/api/release", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(opsview.ReleaseHeader, "release")
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
