// Package opsview is an operator's web page for jobguard locks, an
// http.Handler to mount next to asynqmon: the held keys with their holders
// (owner, label, fencing token, TTL), waiters and parked jobs, the
// reservations of each key on its row (a parked task's, and singleton's
// Unique record "unique:<key>", which gets no row of its own), a filter,
// auto-refresh, pages of keys whose cost does not grow with the keyspace
// (WithScanBudget), and, only when WithRelease is given, a button that
// cancels the runs a row shows, by their fencing tokens (lockkit's
// Locker.CancelRun with a Select.Token, so a run that took the key since
// is kept): the key stays held, shown as cancelling, until the run returns,
// then goes to the next task. A separate button frees the key at once
// (Locker.ForceRelease), warning that the run may still be going.
// WithDecisionLog adds the tasks that did not run (singleton's decision
// log), WithTaskState each holder's task state (singleton.TaskState).
//
//	h, err := opsview.New(locker, opsview.WithRelease())
//	http.Handle("/locks/", http.StripPrefix("/locks", requireAdmin(h)))
//
// The page is plain HTML with a little JavaScript, served by the package
// with no build step; it calls the handler's JSON endpoints with relative
// URLs, so it works under any prefix. The handler has no authentication of
// its own: put it behind yours, above all with WithRelease. Every response
// forbids framing unless WithFrameAncestors names the origins allowed to.
package opsview

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/invalid"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/printable"
	"github.com/jobguard/jobguard/lockkit"
)

// defaultRefresh is how often the page reloads the locks when WithRefresh
// is not given.
const defaultRefresh = 2 * time.Second

// ErrInvalid is matched by every error New returns; it also matches
// lockkit.ErrInvalid.
var ErrInvalid = invalid.New("opsview: invalid option")

// releaseHeader must be sent, with the value "release", by a request to
// release a key: a cross-site form cannot set it, so a page elsewhere cannot
// make an operator's browser release keys. page.html sends it.
const releaseHeader = "X-Jobguard-Action"

//go:embed page.html
var page string

// Option configures the handler.
type Option func(*Handler)

// WithRelease shows, on every key, a Release button (cancel the runs shown:
// the key stays held until they return) and a Free anyway button (free the
// key at once, while the runs may still be going), and accepts release
// requests (see Handler). Defaults to read-only.
func WithRelease() Option { return func(h *Handler) { h.release = true } }

// WithRefresh sets how often the page reloads the locks. Must be at least
// 100ms. Defaults to 2s.
func WithRefresh(d time.Duration) Option { return func(h *Handler) { h.refresh = d } }

// WithPattern sets the Redis glob of the keys shown when the page's filter
// names none. Must not be empty. Defaults to "*".
func WithPattern(p string) Option { return func(h *Handler) { h.pattern = p } }

// WithFrameAncestors lets pages of the named origins frame the handler's
// responses: Content-Security-Policy frame-ancestors sources such as
// "https://admin.example.com" or "'self'". Defaults to none: every response
// forbids framing (X-Frame-Options DENY and frame-ancestors 'none'), so a
// page on another site cannot overlay the page and steer an operator's clicks.
func WithFrameAncestors(origins ...string) Option {
	return func(h *Handler) { h.ancestors = append([]string(nil), origins...) }
}

// Handler serves the page at its root and its JSON endpoints: GET api/locks
// (a page of the held keys; query pattern, a Redis glob, cursor, the next
// cursor of the page before, and limit, from 1 to 1000, defaulting to 100),
// GET api/decisions (with WithDecisionLog: a page of the decision log; query
// pattern, before and limit, from 1 to 1000, defaulting to 50) and POST
// api/release (form
// key, and either token, repeated, the fencing tokens of the holders to
// release (409 Conflict when one of them no longer holds the key, or, for
// a release that is not forced, holds it as a reservation), or optional
// owner; force=1 frees the key at once; needs WithRelease and the header
// "X-Jobguard-Action: release", which a cross-site form cannot send, so a
// page elsewhere cannot make an operator's browser release keys: 403
// Forbidden without it). A release asks the runs to stop (lockkit's
// Locker.CancelRun) and the key goes to the next task when they return; a
// forced one removes the holders (Locker.ForceRelease) while their runs may
// go on. The page's Confirm sends the tokens it showed.
type Handler struct {
	l       *lockkit.Locker
	core    *lockcore.RedisLocker // the engine under l; nil when l is not a *lockkit.Locker
	release bool
	refresh time.Duration
	pattern string
	// ancestors is WithFrameAncestors' list; frame and csp the headers set
	// on every response.
	ancestors []string
	frame     string
	csp       string
	actor     string // WithActorHeader
	// scanCount and scanCalls are WithScanBudget's; 0 is lockkit's default.
	scanCount, scanCalls int
	state                func(ctx context.Context, taskID string) (state, link string) // WithTaskState
	// decisions and stream are WithDecisionLog's.
	decisions    redis.UniversalClient
	stream       string
	decisionsSet bool
}

// New returns the handler for locker. It returns an error matching
// ErrInvalid for a nil locker or an invalid option.
func New(locker *lockkit.Locker, opts ...Option) (*Handler, error) {
	if locker == nil {
		return nil, fmt.Errorf("%w: New: locker is nil", ErrInvalid)
	}
	h := &Handler{l: locker, refresh: defaultRefresh, pattern: "*"}
	core, err := lockcore.Of("opsview.New", locker)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	h.core = core
	for _, o := range opts {
		if o != nil {
			o(h)
		}
	}
	switch {
	case h.refresh < 100*time.Millisecond:
		return nil, fmt.Errorf("%w: WithRefresh(%s): must be at least 100ms", ErrInvalid, h.refresh)
	case h.pattern == "":
		return nil, fmt.Errorf("%w: WithPattern(\"\")", ErrInvalid)
	case h.decisionsSet && nilClient(h.decisions):
		return nil, fmt.Errorf("%w: WithDecisionLog: the Redis client is nil", ErrInvalid)
	case h.scanCount < 0 || h.scanCalls < 0:
		return nil, fmt.Errorf("%w: WithScanBudget(%d, %d): want 0 (the default) or more", ErrInvalid, h.scanCount, h.scanCalls)
	}
	h.frame, h.csp = "DENY", "frame-ancestors 'none'"
	if len(h.ancestors) > 0 {
		for _, o := range h.ancestors {
			if o == "" || o == "'none'" || strings.ContainsAny(o, " \t\r\n;,") {
				return nil, fmt.Errorf("%w: WithFrameAncestors(%q): want one origin such as https://admin.example.com or 'self'", ErrInvalid, o)
			}
		}
		h.frame, h.csp = "", "frame-ancestors "+strings.Join(h.ancestors, " ")
		if len(h.ancestors) == 1 && h.ancestors[0] == "'self'" {
			h.frame = "SAMEORIGIN"
		}
	}
	return h, nil
}

// WithActorHeader names the request header that the program's own
// authentication sets to the operator's identity (such as
// "X-Forwarded-User"): every release is logged at Info with it, the key, the
// fencing tokens asked for, how many holders were removed, and the error, if
// any, through the Locker's logger (lockkit.WithLogger). Without it a
// release is logged too, with
// no actor. Defaults to none.
func WithActorHeader(name string) Option { return func(h *Handler) { h.actor = name } }

// WithScanBudget bounds the work of one listing of the held keys, whatever
// the size of the keyspace: at most calls SCAN calls of COUNT count each
// (the engine's ScanKeys); a page may then show fewer keys than
// its size, and Next goes on from where it stopped. New returns an
// error matching ErrInvalid for a negative count or calls. Zero means
// the default; defaults to 1000 keys a SCAN and
// 10 SCAN calls.
func WithScanBudget(count, calls int) Option {
	return func(h *Handler) { h.scanCount, h.scanCalls = count, calls }
}

// WithTaskState shows, next to each holder whose label is a task ID, the
// task's state and a link to it, as f returns them for the label: "" for a
// state or link f does not know (f is called for every holder shown, on
// every refresh, so it should be quick; singleton.TaskState asks asynq's
// Inspector and links to asynqmon). A link that is not an http or https URL
// or an absolute path is not shown. Defaults to none.
func WithTaskState(f func(ctx context.Context, taskID string) (state, link string)) Option {
	return func(h *Handler) { h.state = f }
}

// taskState fills v's task state and link from WithTaskState's function.
func (h *Handler) taskState(ctx context.Context, v *holderView) {
	if h.state == nil || v.Label == "" {
		return
	}
	state, link := h.state(ctx, v.Label)
	v.State = printable.String(state)
	if u, err := url.Parse(link); err == nil && link != "" && printable.String(link) == link &&
		(u.Scheme == "http" || u.Scheme == "https" || (u.Scheme == "" && u.Host == "" && strings.HasPrefix(link, "/") && !strings.HasPrefix(link, "//"))) {
		v.Link = link
	}
}

// pageSize is how many held keys one page shows when the limit parameter
// is absent; the limit parameter may ask for up to maxPageSize.
const (
	pageSize    = 100
	maxPageSize = 1000
)

// ServeHTTP implements http.Handler.
// Every response forbids framing unless WithFrameAncestors allows it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.frame != "" {
		w.Header().Set("X-Frame-Options", h.frame)
	}
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "+h.csp)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	switch strings.TrimPrefix(r.URL.Path, "/") {
	case "":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte(page))
	case "api/locks":
		h.locks(w, r)
	case "api/release":
		h.releaseKey(w, r)
	case "api/decisions":
		h.decisionsPage(w, r)
	default:
		http.NotFound(w, r)
	}
}

// lockView is one held key as the page gets it.
// The *_text fields are what the page shows: the value with its control
// bytes escaped (printable.String).
type lockView struct {
	Key     string       `json:"key"`
	KeyText string       `json:"key_text"`
	Holders []holderView `json:"holders"`
	Waiters int          `json:"waiters"`
	Parked  int          `json:"parked"`
	// ParkedIDs are the ids of the first 20 parked jobs (lockkit's
	// Info.ParkedIDs), escaped; ParkedTasks the same jobs as the page
	// shows them: an asynq task's queue and ID when the id is one of
	// singleton's parked entries.
	ParkedIDs   []string   `json:"parked_ids"`
	ParkedTasks []taskView `json:"parked_tasks"`
	// Reservations are the holders of the key's Unique record
	// (singleton's "unique:<key>", a reservation for a task enqueued and
	// not yet run), shown on the key's row instead of a row of their own.
	// Record is that record's key, escaped.
	Reservations []holderView `json:"reservations"`
	Record       string       `json:"record,omitempty"`
	// Error, escaped, is why the key could not be inspected: the row shows
	// it instead of its holders.
	Error string `json:"error,omitempty"`
}

type holderView struct {
	Owner     string `json:"owner"`
	OwnerText string `json:"owner_text"`
	Label     string `json:"label"`
	LabelText string `json:"label_text"`
	Token     int64  `json:"token"`
	TTLms     int64  `json:"ttl_ms"`
	// HeldMs is how long the holder has held the key, from its fencing
	// token (at least the Redis server's time in microseconds when it was
	// acquired) and this process's clock; 0 when the token says nothing.
	HeldMs int64 `json:"held_ms"`
	// State is the task's state (WithTaskState), escaped; Link a URL of
	// its page.
	State string `json:"task_state,omitempty"`
	Link  string `json:"task_link,omitempty"`
	// Reserved: the holder is a reservation, which runs nothing. For is
	// the asynq task it is kept for, when the owner (a parked task's,
	// "parked:<queue>\n<task>\n<origin>") or the label (a Unique record's,
	// "<queue>/<task>") names one.
	Reserved bool      `json:"reserved,omitempty"`
	For      *taskView `json:"for,omitempty"`
	// Cancelling: an operator asked the holder's run to stop
	// (lockkit's Locker.CancelRun) CancelMs ago; the key stays held
	// until the run returns.
	Cancelling bool  `json:"cancelling,omitempty"`
	CancelMs   int64 `json:"cancel_ms,omitempty"`
}

// taskView is an asynq task as the page names it: its queue and ID, and
// the first task of its Requeue chain when that is another (Origin); ID is
// the raw id, escaped, when it names no task. Each field is escaped.
type taskView struct {
	Queue  string `json:"queue,omitempty"`
	Task   string `json:"task,omitempty"`
	Origin string `json:"origin,omitempty"`
	ID     string `json:"id"`
}

// parkedTask reads a parked job's id: singleton parks a task as
// "<queue>\n<task ID>\n<origin>".
func parkedTask(id string) taskView {
	v := taskView{ID: printable.String(id)}
	parts := strings.SplitN(id, "\n", 3)
	if len(parts) == 3 && parts[0] != "" && parts[1] != "" {
		v.Queue, v.Task = printable.String(parts[0]), printable.String(parts[1])
		if parts[2] != parts[1] {
			v.Origin = printable.String(parts[2])
		}
	}
	return v
}

// reservedFor is the task a reservation is kept for: the parked task its
// owner names ("parked:" and the task's parked id), or the task its label
// names when it is a Unique record's ("<queue, with % and / escaped>/<task
// ID>"); nil when neither does.
func reservedFor(hd lockcore.Holder, record bool) *taskView {
	if !hd.Reserved {
		return nil
	}
	if id, ok := strings.CutPrefix(hd.Owner, "parked:"); ok {
		if v := parkedTask(id); v.Task != "" {
			return &v
		}
	}
	if record {
		if q, task, ok := strings.Cut(hd.Label, "/"); ok && q != "" && task != "" {
			q = strings.NewReplacer("%2F", "/", "%25", "%").Replace(q)
			return &taskView{Queue: printable.String(q), Task: printable.String(task), ID: printable.String(hd.Label)}
		}
	}
	return nil
}

type locksReply struct {
	Pattern   string     `json:"pattern"`
	Locks     []lockView `json:"locks"`
	Release   bool       `json:"release"`
	RefreshMs int64      `json:"refresh_ms"`
	At        string     `json:"at"`
	// Cursor is the page's cursor (the request's), Next the next page's:
	// "" after the last page. Limit bounds the keys of a page; a page can
	// hold fewer while Next is not "" (the SCAN budget ran out first).
	Cursor string `json:"cursor"`
	Next   string `json:"next"`
	Limit  int    `json:"limit"`
	// Decisions says that api/decisions serves the decision log
	// (WithDecisionLog).
	Decisions bool `json:"decisions"`
}

func (h *Handler) locks(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	pattern := r.URL.Query().Get("pattern")
	if pattern == "" {
		pattern = h.pattern
	}
	limit, err := limitOf(r, pageSize)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	cursor := r.URL.Query().Get("cursor")
	keys, next, err := h.page(r.Context(), pattern, cursor, limit)
	if errors.Is(err, lockcore.ErrInvalid) {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	reply := locksReply{Pattern: pattern, Locks: []lockView{}, Release: h.release, RefreshMs: h.refresh.Milliseconds(),
		At: time.Now().UTC().Format(time.RFC3339), Cursor: cursor, Next: next, Limit: limit, Decisions: h.decisions != nil}
	for _, v := range h.foldRecords(r.Context(), h.inspectPage(r.Context(), keys)) {
		if v != nil {
			reply.Locks = append(reply.Locks, *v)
		}
	}
	writeJSON(w, http.StatusOK, reply)
}

// recordPrefix begins the key of a Unique record: singleton reserves key
// for a task enqueued with Unique under "unique:<key>" (asynqkey.Reservation).
var recordPrefix = asynqkey.Reservation("")

// foldRecords shows each Unique record of the page on the row of the key
// it belongs to, not as a row of its own (with buttons of its own, which
// would free the record instead of the key): a record whose key is on the
// page joins that key's row; otherwise the key is inspected and its row
// takes the record's place, held or not. A record with a holder that is not
// a reservation, or that could not be inspected, stays a row of its own.
func (h *Handler) foldRecords(ctx context.Context, views []*lockView) []*lockView {
	at := make(map[string]int, len(views))
	for i, v := range views {
		if v != nil {
			at[v.Key] = i
		}
	}
	for i, v := range views {
		if v == nil || v.Error != "" || !strings.HasPrefix(v.Key, recordPrefix) {
			continue
		}
		key := strings.TrimPrefix(v.Key, recordPrefix)
		reserved := true
		for _, hv := range v.Holders {
			reserved = reserved && hv.Reserved
		}
		if key == "" || !reserved {
			continue
		}
		j, ok := at[key]
		if !ok || views[j] == nil {
			base := h.inspectPage(ctx, []string{key})[0]
			if base == nil {
				base = &lockView{Key: key, KeyText: printable.String(key), Holders: []holderView{}, ParkedIDs: []string{},
					ParkedTasks: []taskView{}, Reservations: []holderView{}}
			}
			views[i], at[key] = base, i
			j = i
		} else {
			views[i] = nil
		}
		views[j].Reservations = append(views[j].Reservations, v.Holders...)
		views[j].Record = v.KeyText
	}
	return views
}

// inspect returns key's state: with the parked jobs from the engine under
// a *lockkit.Locker, from Locker.Inspect otherwise.
func (h *Handler) inspect(ctx context.Context, key string) (*lockcore.Info, error) {
	if h.core != nil {
		return h.core.Inspect(ctx, key)
	}
	in, err := h.l.Inspect(ctx, key)
	if err != nil {
		return nil, err
	}
	info := &lockcore.Info{Key: in.Key, Waiters: in.Waiters}
	for _, hd := range in.Holders {
		info.Holders = append(info.Holders, lockcore.Holder{Owner: hd.Owner, Label: hd.Label, Token: hd.Token, TTL: hd.TTL,
			Reserved: hd.Reserved, Cancelling: hd.Cancelling, CancelAge: hd.CancelAge})
	}
	return info, nil
}

// page returns the keys of the page at cursor and the next page's cursor:
// one bounded ScanKeys call. A cursor that is not one of ScanKeys' is an
// error matching ErrInvalid (a 400).
func (h *Handler) page(ctx context.Context, pattern, cursor string, limit int) ([]string, string, error) {
	return h.core.ScanKeys(ctx, pattern, cursor, &lockcore.ScanOptions{Count: h.scanCount, Calls: h.scanCalls, Limit: limit})
}

// limitOf reads the limit parameter: def when absent.
func limitOf(r *http.Request, def int) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, nil
	}
	limit, err := strconv.Atoi(v)
	if err != nil || limit < 1 || limit > maxPageSize {
		return 0, fmt.Errorf("limit %q: want a number from 1 to %d", v, maxPageSize)
	}
	return limit, nil
}

// inspectWorkers bounds the Inspect calls of one page in flight.
const inspectWorkers = 8

// inspectPage inspects keys side by side (inspectWorkers at a time): one
// round trip per key, but a page costs about keys/inspectWorkers round
// trips of time. A key whose holders left since it was listed is nil; a key
// whose Inspect failed is shown with its error, and the others as usual.
func (h *Handler) inspectPage(ctx context.Context, keys []string) []*lockView {
	views := make([]*lockView, len(keys))
	now := time.Now().UnixMicro()
	sem := make(chan struct{}, inspectWorkers)
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			v := &lockView{Key: k, KeyText: printable.String(k), Holders: []holderView{}, ParkedIDs: []string{},
				ParkedTasks: []taskView{}, Reservations: []holderView{}}
			info, err := h.inspect(ctx, k)
			if err != nil {
				v.Error = printable.String(err.Error())
				views[i] = v
				return
			}
			if len(info.Holders) == 0 {
				return
			}
			v.Waiters, v.Parked = info.Waiters, info.Parked
			for _, id := range info.ParkedIDs {
				v.ParkedIDs = append(v.ParkedIDs, printable.String(id))
				v.ParkedTasks = append(v.ParkedTasks, parkedTask(id))
			}
			for _, hd := range info.Holders {
				held := int64(0)
				if hd.Token > 1e15 && hd.Token < now { // a time in microseconds
					held = (now - hd.Token) / 1000
				}
				hv := holderView{
					Owner: hd.Owner, OwnerText: printable.String(hd.Owner),
					Label: hd.Label, LabelText: printable.String(hd.Label),
					Token: hd.Token, TTLms: hd.TTL.Milliseconds(), HeldMs: held,
					Reserved: hd.Reserved, For: reservedFor(hd, strings.HasPrefix(k, recordPrefix)),
					Cancelling: hd.Cancelling, CancelMs: hd.CancelAge.Milliseconds(),
				}
				h.taskState(ctx, &hv)
				v.Holders = append(v.Holders, hv)
			}
			views[i] = v
		}()
	}
	wg.Wait()
	return views
}

// audit logs a release at Info through the Locker's logger: who (the
// WithActorHeader header), from where, which key and holders, and what came
// of it.
func (h *Handler) audit(r *http.Request, key string, tokens []int64, owner string, force bool, released int, err error) {
	attrs := []slog.Attr{slog.String("key", printable.String(key)), slog.Int("released", released),
		slog.Bool("force", force), slog.String("remote", r.RemoteAddr)}
	if h.actor != "" {
		attrs = append(attrs, slog.String("actor", r.Header.Get(h.actor)))
	}
	if len(tokens) > 0 {
		attrs = append(attrs, slog.Any("tokens", tokens))
	} else {
		attrs = append(attrs, slog.String("owner", printable.String(owner)))
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	logger := slog.Default()
	if h.core != nil {
		logger = h.core.Logger()
	}
	logger.LogAttrs(r.Context(), slog.LevelInfo, "opsview: release", attrs...)
}

func (h *Handler) releaseKey(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method != http.MethodPost:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	case !h.release:
		writeError(w, http.StatusForbidden, errors.New("this view is read-only (opsview.WithRelease)"))
		return
	case r.Header.Get(releaseHeader) != "release":
		writeError(w, http.StatusForbidden, fmt.Errorf("a release needs the %s: release header", releaseHeader))
		return
	}
	key := r.FormValue("key")
	if key == "" {
		writeError(w, http.StatusBadRequest, errors.New("key is empty"))
		return
	}
	_ = r.ParseForm()
	force := false
	switch v := r.FormValue("force"); v {
	case "", "0":
	case "1":
		force = true
	default:
		writeError(w, http.StatusBadRequest, fmt.Errorf("force %q: want 1 or 0", v))
		return
	}
	// A release asks the runs to stop and hands the key on when they
	// return (CancelRun); force frees the key at once (ForceRelease),
	// while a run that ignores its ctx may still go on.
	op := h.l.CancelRun
	if force {
		op = h.l.ForceRelease
	}
	if len(r.Form["token"]) == 0 {
		n, err := op(r.Context(), key, lockkit.Select{Owner: r.FormValue("owner")})
		h.audit(r, key, nil, r.FormValue("owner"), force, n, err)
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"key": key, "released": n, "force": force})
		return
	}
	// Only the holders the operator saw: whoever holds the key now may be
	// another run.
	var tokens []int64
	for _, s := range r.Form["token"] {
		t, err := strconv.ParseInt(s, 10, 64)
		if err != nil || t <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("token %q is not a fencing token", s))
			return
		}
		tokens = append(tokens, t)
	}
	n := 0
	var gone []error
	for _, t := range tokens {
		_, err := op(r.Context(), key, lockkit.Select{Token: t})
		switch {
		case err == nil:
			n++
		case errors.Is(err, lockcore.ErrNotHeld):
			gone = append(gone, err)
		default:
			h.audit(r, key, tokens, "", force, n, err)
			writeJSON(w, http.StatusBadGateway, map[string]any{"error": err.Error(), "released": n, "force": force})
			return
		}
	}
	if len(gone) > 0 {
		h.audit(r, key, tokens, "", force, n, errors.Join(gone...))
		writeJSON(w, http.StatusConflict, map[string]any{"error": errors.Join(gone...).Error(), "released": n, "force": force})
		return
	}
	h.audit(r, key, tokens, "", force, n, nil)
	writeJSON(w, http.StatusOK, map[string]any{"key": key, "released": n, "force": force})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}
