package singleton

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// Tasks that complete without running are logged at Info, at most once per
// key per second; the next line counts those left out. The keys remembered
// are bounded.
func TestSkipLogIsRateLimitedPerKey(t *testing.T) {
	var buf bytes.Buffer
	s := newSkipLog(slog.New(slog.NewTextHandler(&buf, nil)))
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	dup := func(key string) *middleware.DuplicateError {
		return &middleware.DuplicateError{Job: middleware.Job{Key: key, Name: "report", ID: "t1"}, Reason: middleware.ReasonHeld,
			Action: middleware.ActionSkip, Cause: &lockkit.ConflictError{Key: key, Owner: "host-1", Label: "t0"}}
	}
	ctx := context.Background()
	s.log(ctx, dup("a"))
	s.log(ctx, dup("a"))
	s.log(ctx, dup("a"))
	s.log(ctx, dup("b"))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, buf.String())
	require.Contains(t, lines[0], `level=INFO msg="singleton: task completed without running" key=a task=report id=t1 reason=held by_task=t0 by_owner=host-1`)
	require.Contains(t, lines[1], "key=b")

	buf.Reset()
	now = now.Add(skipLogEvery)
	s.log(ctx, dup("a"))
	require.Contains(t, buf.String(), "key=a")
	require.Contains(t, buf.String(), "not_logged=2")

	for i := range 2 * skipLogKeys {
		s.log(ctx, dup(strings.Repeat("k", i%7)+string(rune('A'+i%26))+time.Duration(i).String()))
	}
	require.LessOrEqual(t, len(s.last), skipLogKeys)

	buf.Reset()
	quiet := newSkipLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	quiet.log(ctx, dup("a"))
	require.Zero(t, buf.Len(), "nothing below the logger's level")
	require.Empty(t, quiet.last)
}
