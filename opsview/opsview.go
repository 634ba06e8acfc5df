// Package opsview is an operator's web page for jobguard locks, an
// http.Handler to mount next to asynqmon: the held keys with their holders
// (owner, label, fencing token, TTL), waiters and parked jobs, a filter,
// auto-refresh, and, only when WithRelease is given, a button that
// force-releases the holders a row shows, by their fencing tokens (lockkit's
// Locker.ForceReleaseToken), so a run that took the key since is kept.
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
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jobguard/jobguard/internal/invalid"
	"github.com/jobguard/jobguard/lockkit"
)

// DefaultRefresh is how often the page reloads the locks when WithRefresh
// is not given.
const DefaultRefresh = 2 * time.Second

// ErrInvalid is matched by every error New returns; it also matches
// lockkit.ErrInvalid.
var ErrInvalid = invalid.New("opsview: invalid option")

// ReleaseHeader must be sent, with the value "release", by a request to
// release a key: a cross-site form cannot set it, so a page elsewhere cannot
// make an operator's browser release keys.
const ReleaseHeader = "X-Jobguard-Action"

//go:embed page.html
var page string

// Option configures the handler.
type Option func(*Handler)

// WithRelease shows a release button on every key and accepts release
// requests. Defaults to read-only.
func WithRelease() Option { return func(h *Handler) { h.release = true } }

// WithRefresh sets how often the page reloads the locks. Must be at least
// 100ms. Defaults to DefaultRefresh.
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
// (the held keys; query pattern, a Redis glob) and POST api/release (form
// key, and either token, repeated, the fencing tokens of the holders to
// release (lockkit's Locker.ForceReleaseToken; 409 Conflict when one of
// them no longer holds the key), or optional owner; needs WithRelease and
// ReleaseHeader). The page's Confirm sends the tokens it showed.
type Handler struct {
	l       lockkit.Locker
	release bool
	refresh time.Duration
	pattern string
	// ancestors is WithFrameAncestors' list; frame and csp the headers set
	// on every response.
	ancestors []string
	frame     string
	csp       string
}

// New returns the handler for locker. It returns an error matching
// ErrInvalid for a nil locker or an invalid option.
func New(locker lockkit.Locker, opts ...Option) (*Handler, error) {
	if locker == nil {
		return nil, fmt.Errorf("%w: New: locker is nil", ErrInvalid)
	}
	h := &Handler{l: locker, refresh: DefaultRefresh, pattern: "*"}
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
	default:
		http.NotFound(w, r)
	}
}

// lockView is one held key as the page gets it.
// The *_text fields are what the page shows: the value with its control
// bytes escaped (lockkit.Printable).
type lockView struct {
	Key     string       `json:"key"`
	KeyText string       `json:"key_text"`
	Holders []holderView `json:"holders"`
	Waiters int          `json:"waiters"`
	Parked  int          `json:"parked"`
}

type holderView struct {
	Owner     string `json:"owner"`
	OwnerText string `json:"owner_text"`
	Label     string `json:"label"`
	LabelText string `json:"label_text"`
	Token     int64  `json:"token"`
	TTLms     int64  `json:"ttl_ms"`
}

type locksReply struct {
	Pattern   string     `json:"pattern"`
	Locks     []lockView `json:"locks"`
	Release   bool       `json:"release"`
	RefreshMs int64      `json:"refresh_ms"`
	At        string     `json:"at"`
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
	keys, err := h.l.Keys(r.Context(), pattern)
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	reply := locksReply{Pattern: pattern, Locks: []lockView{}, Release: h.release, RefreshMs: h.refresh.Milliseconds(), At: time.Now().UTC().Format(time.RFC3339)}
	for _, k := range keys {
		info, err := h.l.Inspect(r.Context(), k)
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
		if len(info.Holders) == 0 {
			continue
		}
		v := lockView{Key: k, KeyText: lockkit.Printable(k), Waiters: info.Waiters, Parked: info.Parked, Holders: []holderView{}}
		for _, hd := range info.Holders {
			v.Holders = append(v.Holders, holderView{
				Owner: hd.Owner, OwnerText: lockkit.Printable(hd.Owner),
				Label: hd.Label, LabelText: lockkit.Printable(hd.Label),
				Token: hd.Token, TTLms: hd.TTL.Milliseconds(),
			})
		}
		reply.Locks = append(reply.Locks, v)
	}
	writeJSON(w, http.StatusOK, reply)
}

func (h *Handler) releaseKey(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method != http.MethodPost:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	case !h.release:
		writeError(w, http.StatusForbidden, errors.New("this view is read-only (opsview.WithRelease)"))
		return
	case r.Header.Get(ReleaseHeader) != "release":
		writeError(w, http.StatusForbidden, fmt.Errorf("a release needs the %s: release header", ReleaseHeader))
		return
	}
	key := r.FormValue("key")
	if key == "" {
		writeError(w, http.StatusBadRequest, errors.New("key is empty"))
		return
	}
	_ = r.ParseForm()
	if len(r.Form["token"]) == 0 {
		n, err := h.l.ForceRelease(r.Context(), key, r.FormValue("owner"))
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"key": key, "released": n})
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
		err := h.l.ForceReleaseToken(r.Context(), key, t)
		switch {
		case err == nil:
			n++
		case errors.Is(err, lockkit.ErrNotHeld):
			gone = append(gone, err)
		default:
			writeJSON(w, http.StatusBadGateway, map[string]any{"error": err.Error(), "released": n})
			return
		}
	}
	if len(gone) > 0 {
		writeJSON(w, http.StatusConflict, map[string]any{"error": errors.Join(gone...).Error(), "released": n})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"key": key, "released": n})
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
