package opsview

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/glob"
	"github.com/jobguard/jobguard/internal/printable"
)

// Bounds of one read of the decision log (GET api/decisions).
const (
	// decisionPage is how many decisions a page shows when the limit
	// parameter is absent (it may ask for up to maxPageSize).
	decisionPage = 50
	// decisionChunk is the COUNT of each XREVRANGE of a page.
	decisionChunk = 200
	// decisionReads bounds the XREVRANGE calls of a page: with a filter,
	// a page looks through at most decisionChunk*decisionReads (1,000)
	// entries, and Older goes on from there.
	decisionReads = 5
)

// WithDecisionLog shows, under the locks, the latest decisions of the
// asynq middleware (the tasks that completed without running: task, key,
// reason, the run or task that held or covered it, when), newest first and
// paged, read from stream on rdb (the servers' Redis); the page's key
// filter applies. stream "" is the one the asynq middleware writes,
// "jobguard:decisions" (singleton.WithDecisionLog). A page shows 50 decisions
// (the limit parameter may ask for up to 1000); with a filter it looks
// through at most 1,000 entries of the log (5 XREVRANGE calls of 200), and
// Older goes on from there. New returns an error matching ErrInvalid for a
// nil rdb. Defaults to none: the page has no decisions section.
func WithDecisionLog(rdb redis.UniversalClient, stream string) Option {
	return func(h *Handler) {
		h.decisions, h.stream, h.decisionsSet = rdb, stream, true
		if stream == "" {
			h.stream = decisionlog.Stream
		}
	}
}

// nilClient reports whether c is nil, also a typed nil.
func nilClient(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case nil:
		return true
	case *redis.Client:
		return c == nil
	case *redis.ClusterClient:
		return c == nil
	case *redis.Ring:
		return c == nil
	}
	return false
}

// decisionView is one entry of the decision log as the page gets it: its
// fields escaped (printable.String).
type decisionView struct {
	ID     string            `json:"id"`
	At     string            `json:"at"`
	Fields map[string]string `json:"fields"`
}

type decisionsReply struct {
	Pattern   string         `json:"pattern"`
	Decisions []decisionView `json:"decisions"`
	// Before is the page's cursor (the request's), Next the next (older)
	// page's: "" when the log's oldest entry was read.
	Before string `json:"before"`
	Next   string `json:"next"`
	// Read is how many entries the page looked through.
	Read int `json:"read"`
}

// decisionsPage serves GET api/decisions: query pattern (a Redis glob of
// the keys), before (the next cursor of the page before) and limit.
func (h *Handler) decisionsPage(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method != http.MethodGet:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	case h.decisions == nil:
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	pattern := q.Get("pattern")
	if pattern == "" {
		pattern = h.pattern
	}
	limit, err := limitOf(r, decisionPage)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	before := q.Get("before")
	if before != "" && !streamID(before) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("before %q: want a stream entry ID such as 1795650000000-0", before))
		return
	}
	reply, err := h.readDecisions(r.Context(), pattern, before, limit)
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	writeJSON(w, http.StatusOK, reply)
}

// readDecisions reads the log from before (exclusive; "" for its newest
// entry) towards its oldest, decisionChunk entries per XREVRANGE and at
// most decisionReads of them, until limit entries of keys matching pattern
// are found.
func (h *Handler) readDecisions(ctx context.Context, pattern, before string, limit int) (decisionsReply, error) {
	reply := decisionsReply{Pattern: pattern, Decisions: []decisionView{}, Before: before}
	from := "+"
	if before != "" {
		from = "(" + before
	}
	calls := decisionlog.Calls{}
	for range decisionReads {
		entries, err := h.decisions.XRevRangeN(ctx, h.stream, from, "-", decisionChunk).Result()
		if err != nil {
			return reply, err
		}
		for i, e := range entries {
			reply.Read++
			d := decisionlog.Decode(e)
			if !glob.Match(pattern, d.Key) || calls.Repeated(d) {
				continue // another key's, or a write go-redis sent again
			}
			reply.Decisions = append(reply.Decisions, viewOf(d))
			if len(reply.Decisions) == limit {
				if i < len(entries)-1 || len(entries) == decisionChunk {
					reply.Next = e.ID
				}
				return reply, nil
			}
		}
		if len(entries) < decisionChunk {
			return reply, nil // the oldest entry was read
		}
		from = "(" + entries[len(entries)-1].ID
		reply.Next = entries[len(entries)-1].ID
	}
	return reply, nil
}

// viewOf is d as the page shows it.
func viewOf(d decisionlog.Decision) decisionView {
	v := decisionView{ID: d.ID, At: d.AtText(), Fields: make(map[string]string, len(d.Fields))}
	for k, s := range d.Fields {
		v.Fields[printable.String(k)] = printable.String(s)
	}
	return v
}

// streamID reports whether s is a stream entry ID, "<ms>-<seq>".
func streamID(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return ok && err1 == nil && err2 == nil
}
