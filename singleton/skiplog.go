package singleton

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// skipLogEvery is how often a key's tasks that complete without running
// are logged at most; the lines left out are counted in the next one.
const skipLogEvery = time.Second

// skipLogKeys bounds the keys a skipLog remembers.
const skipLogKeys = 4096

// skipLog logs, at Info, the tasks that complete without running: at most
// one line per key per skipLogEvery.
type skipLog struct {
	l    *slog.Logger
	now  func() time.Time
	mu   sync.Mutex
	last map[string]skipped // key → its last line
}

type skipped struct {
	at      time.Time
	dropped int // lines left out since at
}

func newSkipLog(l *slog.Logger) *skipLog {
	return &skipLog{l: l, now: time.Now, last: make(map[string]skipped)}
}

var reasonNames = map[middleware.Reason]string{
	middleware.ReasonHeld: "held", middleware.ReasonClaimed: "claimed", middleware.ReasonSuperseded: "superseded",
	middleware.ReasonThrottled: "throttled", middleware.ReasonCovered: "covered", middleware.ReasonCompleted: "completed",
}

// log logs that dup's task completes without running, unless a line for its
// key was logged less than skipLogEvery ago.
func (s *skipLog) log(ctx context.Context, dup *middleware.DuplicateError) {
	if !s.l.Enabled(ctx, slog.LevelInfo) {
		return
	}
	key, now := dup.Job.Key, s.now()
	s.mu.Lock()
	prev, ok := s.last[key]
	if ok && now.Sub(prev.at) < skipLogEvery {
		prev.dropped++
		s.last[key] = prev
		s.mu.Unlock()
		return
	}
	if !ok && len(s.last) >= skipLogKeys {
		for k, e := range s.last {
			if now.Sub(e.at) >= skipLogEvery {
				delete(s.last, k)
			}
		}
		if len(s.last) >= skipLogKeys {
			clear(s.last)
		}
	}
	s.last[key] = skipped{at: now}
	s.mu.Unlock()

	attrs := []slog.Attr{slog.String("key", key), slog.String("task", dup.Job.Name), slog.String("id", dup.Job.ID),
		slog.String("reason", reasonNames[dup.Reason])}
	var ce *lockkit.ConflictError
	var cov *lockkit.CoveredError
	switch {
	case errors.As(dup.Cause, &ce):
		if ce.Label != "" {
			attrs = append(attrs, slog.String("by_task", ce.Label))
		}
		if ce.Owner != "" {
			attrs = append(attrs, slog.String("by_owner", ce.Owner))
		}
	case errors.As(dup.Cause, &cov):
		if cov.Owner != "" {
			attrs = append(attrs, slog.String("by_owner", cov.Owner))
		}
		if cov.Token != 0 {
			attrs = append(attrs, slog.Int64("by_token", cov.Token))
		}
	}
	if dup.Reason == middleware.ReasonCompleted {
		attrs = append(attrs, slog.String("by_task", dup.Job.Origin))
	}
	if prev.dropped > 0 {
		attrs = append(attrs, slog.Int("not_logged", prev.dropped))
	}
	s.l.LogAttrs(ctx, slog.LevelInfo, "singleton: task completed without running", attrs...)
}
