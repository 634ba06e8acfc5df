package lockkit

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MemoryLocker is a Locker whose state lives in process memory. It has the
// same semantics as RedisLocker (holder limits, TTL expiry and renewal, lost
// leases, fencing tokens, fair queues, epochs) for a single-process deployment
// and for unit tests without Redis. Lockers made with NewPeer share its state,
// like processes sharing one Redis.
type MemoryLocker struct {
	e *engine
	m *memStore
}

var _ Locker = (*MemoryLocker)(nil)

// NewMemory returns a MemoryLocker with its own empty state. It returns an
// error matching ErrInvalid for an invalid option (WithPrefix is ignored).
func NewMemory(opts ...Option) (*MemoryLocker, error) {
	return newMemory(&memStore{locks: make(map[string]*memLock)}, opts)
}

// NewPeer returns another MemoryLocker sharing l's state, with its own owner
// id, renewer and options, as a second process sharing one Redis would be.
func (l *MemoryLocker) NewPeer(opts ...Option) (*MemoryLocker, error) {
	return newMemory(l.m, opts)
}

func newMemory(s *memStore, opts []Option) (*MemoryLocker, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &MemoryLocker{e: newEngine(cfg, &memBackend{s: s}), m: s}, nil
}

// Owner returns the owner id recorded with this Locker's leases.
func (l *MemoryLocker) Owner() string { return l.e.cfg.owner }

// TryAcquire implements Locker.
func (l *MemoryLocker) TryAcquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return l.e.tryAcquire(ctx, key, opt)
}

// Acquire implements Locker.
func (l *MemoryLocker) Acquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return l.e.acquireWait(ctx, key, opt)
}

// Inspect implements Locker.
func (l *MemoryLocker) Inspect(ctx context.Context, key string) (*Info, error) {
	return l.e.inspect(ctx, key)
}

// Close implements Locker.
func (l *MemoryLocker) Close(ctx context.Context) error { return l.e.close(ctx) }

// Keys implements Locker.
func (l *MemoryLocker) Keys(_ context.Context, pattern string) ([]string, error) {
	s := l.m
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []string
	for k, lk := range s.locks {
		lk.expire(now)
		if len(lk.holders) > 0 && globMatch(pattern, k) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Debounce implements Locker.
func (l *MemoryLocker) Debounce(ctx context.Context, key, id string, quiet, maxWait time.Duration) (Request, error) {
	return l.e.debounce(ctx, key, id, quiet, maxWait)
}

// Claim implements Locker.
func (l *MemoryLocker) Claim(ctx context.Context, key string, gen int64, force bool) (Request, bool, error) {
	return l.e.claim(ctx, key, gen, force)
}

// ForceRelease implements Locker.
func (l *MemoryLocker) ForceRelease(ctx context.Context, key, owner string) (int, error) {
	return l.e.forceRelease(ctx, key, owner)
}

// ForceReleaseToken implements Locker.
func (l *MemoryLocker) ForceReleaseToken(ctx context.Context, key string, token int64) error {
	return l.e.forceReleaseToken(ctx, key, token)
}

// Throttle implements Locker.
func (l *MemoryLocker) Throttle(ctx context.Context, key string, n int, period time.Duration) (time.Duration, error) {
	return l.e.throttle(ctx, key, n, period)
}

// ThrottleStart implements Locker.
func (l *MemoryLocker) ThrottleStart(ctx context.Context, key string, n int, period time.Duration, id string) (time.Duration, error) {
	return l.e.throttleStart(ctx, key, n, period, id)
}

// ReturnStart implements Locker.
func (l *MemoryLocker) ReturnStart(ctx context.Context, key, id string) error {
	return l.e.returnStart(ctx, key, id)
}

// Free implements Locker.
func (l *MemoryLocker) Free(ctx context.Context, key, label string) (bool, error) {
	return l.e.free(ctx, key, label)
}

// Held returns how many leases the Locker holds and renews now (not
// reservations, which nothing renews).
func (l *MemoryLocker) Held() int { return l.e.held() }

// Logger implements Locker.
func (l *MemoryLocker) Logger() *slog.Logger { return l.e.cfg.logger }

type memStore struct {
	mu     sync.Mutex
	locks  map[string]*memLock
	ops    int
	starts map[string][]memStart // throttle key → its starts in the last period
	bursts map[string]*memBurst  // debounce key → its newest request
}

// memBurst is a key's newest Debounce request.
type memBurst struct {
	gen     int64
	id      string
	due     time.Time
	first   time.Time // zero when no burst is open
	claimed int64     // the greatest generation claimed
	until   time.Time // forgotten at
}

type memLock struct {
	holders       map[string]time.Time // member → expiry
	done          map[string]time.Time // completed label → forgotten at
	abandoned     map[string]time.Time // acquire id of a failed call → forgotten at
	token         int64
	epoch         int64
	epochAid      string    // the acquire call that claimed epoch
	metaUntil     time.Time // the epoch and order are forgotten at
	order         int64     // the order of the key's latest Supersede run (AcquireOptions.Order)
	pending       string    // the key's Supersede follow-up: a waiter, or a parked id (pendingParked)
	pendingParked bool
	pendingOrder  int64                // the order of pending, 0 for none
	replaced      string               // the parked follow-up that pending replaced
	replacer      string               // the acquire call that replaced it: only it is told again
	superseded    map[string]time.Time // label of a replaced parked follow-up → forgotten at
	gaveUp        map[string]time.Time // acquire id that gave up for a superseded label → forgotten at
	coalesced     string               // the parked id of the key's parked Coalesce follow-up
	cover         int64                // the token of the latest Coalesce run that succeeded
	coverTill     time.Time            // cover is forgotten at
	preempted     map[string]bool      // holders a Preempt acquire preempted
	evicted       map[string]time.Time // holders ForceRelease removed → forgotten at (evict.lua's "x:<token>")
	watchers      map[*Lease]struct{}  // held Preempt leases, told when preempted
	queue         []string             // fair waiters in arrival order
	waiters       map[string]time.Time // waiter → deadline
	subs          map[chan int64]struct{}
	parked        []memParked // parked jobs in order of their first park
}

// memParked is a parked job (AcquireOptions.Park).
type memParked struct {
	id, label string
	hold      time.Duration
	until     time.Time // forgotten at
}

func (lk *memLock) expire(now time.Time) {
	for _, set := range []map[string]time.Time{lk.holders, lk.done, lk.abandoned, lk.superseded, lk.gaveUp, lk.evicted} {
		for m, exp := range set {
			if !now.Before(exp) {
				delete(set, m)
			}
		}
	}
	for w, d := range lk.waiters {
		if !now.Before(d) {
			delete(lk.waiters, w)
		}
	}
	if !now.Before(lk.coverTill) {
		lk.cover = 0
	}
	for m := range lk.preempted {
		if _, ok := lk.holders[m]; !ok {
			delete(lk.preempted, m)
		}
	}
	parked := lk.parked[:0]
	for _, p := range lk.parked {
		if now.Before(p.until) {
			parked = append(parked, p)
		}
	}
	lk.parked = parked
	live := lk.queue[:0]
	for _, w := range lk.queue {
		if _, ok := lk.waiters[w]; ok {
			live = append(live, w)
		}
	}
	lk.queue = live
}

func (lk *memLock) wake() {
	for ch := range lk.subs {
		select {
		case ch <- 0:
		default:
		}
	}
}

func (lk *memLock) forget(w string) bool {
	delete(lk.waiters, w)
	for i, q := range lk.queue {
		if q == w {
			lk.queue = append(lk.queue[:i], lk.queue[i+1:]...)
			return true
		}
	}
	return false
}

func (lk *memLock) idle(now time.Time) bool {
	return len(lk.holders) == 0 && len(lk.waiters) == 0 && len(lk.subs) == 0 && len(lk.done) == 0 && len(lk.watchers) == 0 && len(lk.parked) == 0 &&
		len(lk.abandoned) == 0 && !now.Before(lk.metaUntil) && lk.cover == 0 && len(lk.superseded) == 0 && len(lk.gaveUp) == 0 && len(lk.evicted) == 0
}

// get returns key's state, creating it; every 1024 calls it drops idle keys.
func (s *memStore) get(key string, now time.Time) *memLock {
	s.ops++
	if s.ops%1024 == 0 {
		for k, lk := range s.locks {
			lk.expire(now)
			if lk.idle(now) {
				delete(s.locks, k)
			}
		}
		for k, log := range s.starts {
			if len(log) == 0 {
				delete(s.starts, k)
			}
		}
		for k, bu := range s.bursts {
			if !now.Before(bu.until) {
				delete(s.bursts, k)
			}
		}
	}
	lk := s.locks[key]
	if lk == nil {
		lk = &memLock{holders: make(map[string]time.Time), done: make(map[string]time.Time), abandoned: make(map[string]time.Time),
			superseded: make(map[string]time.Time), gaveUp: make(map[string]time.Time), evicted: make(map[string]time.Time),
			waiters: make(map[string]time.Time), subs: make(map[chan int64]struct{}), preempted: make(map[string]bool), watchers: make(map[*Lease]struct{})}
		s.locks[key] = lk
	}
	lk.expire(now)
	return lk
}

type memBackend struct{ s *memStore }

func (b *memBackend) ready(context.Context) error { return nil }

func (b *memBackend) groups(leases []*Lease) [][]*Lease { return [][]*Lease{leases} }

// holderOf returns the live member of lk taken by acquire call aid.
func (lk *memLock) holderOf(aid string) (string, bool) {
	for m := range lk.holders {
		if _, rest, _ := strings.Cut(m, ":"); strings.HasPrefix(rest, aid+":") {
			return m, true
		}
	}
	return "", false
}

func (b *memBackend) acquire(ctx context.Context, r *request) (acquireResult, error) {
	if err := ctx.Err(); err != nil {
		return acquireResult{}, err
	}
	s := b.s
	var preempted []*Lease
	s.mu.Lock()
	defer func() {
		s.mu.Unlock()
		for _, l := range preempted {
			l.preempt()
		}
	}()
	now := time.Now()
	lk := s.get(r.key, now)
	if !now.Before(lk.metaUntil) {
		lk.epoch, lk.epochAid, lk.order = 0, "", 0
	}
	if r.epoch > 0 && (r.epoch < lk.epoch || (r.epoch == lk.epoch && lk.epochAid != r.aid)) {
		lk.forget(r.waiter)
		return acquireResult{lastEpoch: lk.epoch}, nil
	}
	if _, ok := lk.abandoned[r.aid]; ok {
		lk.forget(r.waiter)
		return acquireResult{abandoned: true}, nil
	}
	if m, ok := lk.holderOf(r.aid); ok {
		token, _, _ := parseMember(m)
		return acquireResult{ok: true, token: token}, nil
	}
	adopted := false // a call that took over its reservation is the key's run, not a follow-up
	if r.adopt {
		for m := range lk.holders {
			if _, aid, _ := strings.Cut(m, ":"); strings.HasPrefix(aid, "r") {
				if _, _, l := parseMember(m); l == r.label {
					delete(lk.holders, m)
					adopted = true
				}
			}
		}
	}
	since := int64(0)
	if r.coalesce {
		since = r.since
		if since < 0 || since > now.UnixMicro() {
			since = now.UnixMicro()
		}
		covered := func(by Coverage, token int64, owner string) (acquireResult, error) {
			lk.forget(r.waiter)
			return acquireResult{covered: &CoveredError{Key: r.key, By: by, Token: token, Owner: owner}, since: since}, nil
		}
		if lk.cover >= since {
			return covered(CoveredBySuccess, lk.cover, "")
		}
		for m := range lk.holders {
			// A delivery of the run's own work is not covered by it.
			if token, owner, l := parseMember(m); token >= since && (r.label == "" || l != r.label) {
				return covered(CoveredByRun, token, owner)
			}
		}
		if !lk.hasSameLabel(r.label) && !adopted {
			for w := range lk.waiters {
				if w != r.waiter && strings.HasPrefix(w, "y") {
					return covered(CoveredByFollowUp, 0, "") // only a Coalesce follow-up covers
				}
			}
			if p, ok := lk.isParked(lk.coalesced); ok && lk.coalesced != r.park {
				if r.label == "" || p.label != r.label {
					return covered(CoveredByFollowUp, 0, "")
				}
				lk.unpark(p.id) // this job's own earlier entry: this call takes its place
			}
		}
	}
	if _, ok := lk.done[r.label]; ok && r.label != "" {
		lk.forget(r.waiter)
		return acquireResult{completed: true}, nil
	}
	if _, ok := lk.gaveUp[r.aid]; ok {
		return acquireResult{superseded: true}, nil
	}
	if _, ok := lk.superseded[r.label]; ok && r.label != "" && r.park != "" {
		// A newer follow-up replaced this parked one: it gives up, once.
		delete(lk.superseded, r.label)
		lk.gaveUp[r.aid] = now.Add(parkKeep)
		lk.forget(r.waiter)
		return acquireResult{superseded: true}, nil
	}
	// This call's follow-up id: its waiter, or the parked id of a parking
	// call that does not wait.
	fid, fidParked := r.waiter, false
	if fid == "" && r.park != "" {
		fid, fidParked = r.park, true
	}
	if !adopted && lk.older(r, fid) {
		lk.forget(r.waiter)
		lk.unpark(r.park)
		return acquireResult{superseded: true}, nil
	}
	same := ""
	if r.label != "" {
		for m := range lk.holders {
			if _, _, l := parseMember(m); l == r.label {
				same = m
			}
		}
	}
	if r.preempt == "1" && r.waiter != "" {
		preempted = lk.preemptHolders(now, r.grace)
	}
	ahead := len(lk.queue)
	for i, w := range lk.queue {
		if w == r.waiter {
			ahead = i
			break
		}
	}
	replaced := ""
	// A call whose own earlier delivery holds the key (same) is no
	// follow-up (as in acquire.lua).
	if fid != "" && r.supersede != "0" && r.supersede != "" && !adopted && !(same != "" && r.supersede == "1") {
		if r.supersede == "1" {
			if lk.pending == fid && lk.pendingParked == fidParked {
				if lk.replacer == r.aid {
					replaced = lk.replaced
				}
			} else {
				if p, ok := lk.isParked(lk.pending); ok && lk.pendingParked {
					// A parked follow-up: its next acquire gives up; unless
					// it is this job's own earlier entry, whose place this
					// call takes.
					lk.unpark(p.id)
					if p.label == "" || p.label != r.label {
						if p.label != "" {
							lk.superseded[p.label] = now.Add(parkKeep)
						}
						replaced = p.id
					}
				} else if lk.pending != "" {
					lk.wake() // the follow-up it replaces gives up
				}
				lk.pending, lk.pendingParked, lk.replaced, lk.replacer, lk.pendingOrder = fid, fidParked, replaced, r.aid, r.order
			}
		} else if lk.pending != r.waiter || lk.pendingParked {
			lk.forget(r.waiter)
			return acquireResult{superseded: true}, nil
		}
	}
	if same == "" && len(lk.holders)+ahead < r.limit {
		if lk.pending == fid && lk.pendingParked == fidParked && fid != "" {
			lk.pending, lk.replaced, lk.replacer, lk.pendingOrder = "", "", "", 0
		}
		if fid != "" && (r.supersede != "0" || r.order > 0) {
			// The run's order: an older call gives up while it runs and after.
			switch {
			case r.order == 0:
				lk.order = 0
			case r.order > lk.order:
				lk.order = r.order
			}
			if u := now.Add(parkKeep); r.order > 0 && u.After(lk.metaUntil) {
				lk.metaUntil = u
			}
		}
		token := lk.take(now, r.aid, r.owner, r.label, r.ttl)
		if r.epoch > 0 {
			lk.epoch, lk.epochAid = r.epoch, r.aid
			if u := now.Add(max(r.ttl, r.epochTTL)); u.After(lk.metaUntil) {
				lk.metaUntil = u
			}
		}
		lk.forget(r.waiter)
		lk.unpark(r.park)
		return acquireResult{ok: true, token: token}, nil
	}
	parked := lk.park(r, now)
	if parked >= 0 && r.coalesce && r.waiter == "" && same == "" {
		lk.coalesced = r.park
	}
	if r.waiter != "" {
		if _, ok := lk.waiters[r.waiter]; !ok && r.fair {
			lk.queue = append(lk.queue, r.waiter)
		}
		if same == "" || !r.coalesce {
			lk.waiters[r.waiter] = now.Add(r.waiterTTL)
		}
		if r.fair {
			for i, w := range lk.queue {
				if w == r.waiter {
					ahead = i
				}
			}
		}
	}
	c := &ConflictError{Key: r.key, Holders: len(lk.holders), Ahead: ahead, Parked: parked, Superseded: replaced}
	var first time.Time
	for m, exp := range lk.holders {
		if same != "" && m != same {
			continue
		}
		if first.IsZero() || exp.Before(first) {
			first = exp
			c.Token, c.Owner, c.Label = parseMember(m)
			c.TTL = exp.Sub(now)
		}
	}
	return acquireResult{conflict: c, since: since}, nil
}

// older tells whether r, a follow-up call (fid) with an order, is older
// than the key's latest Supersede run or than its live follow-up (parked,
// reserved for by a release, or waiting).
func (lk *memLock) older(r *request, fid string) bool {
	if r.order == 0 || fid == "" {
		return false
	}
	if r.order < lk.order {
		return true
	}
	if lk.pending == "" || lk.pending == r.waiter || lk.pending == r.park || r.order >= lk.pendingOrder {
		return false
	}
	if lk.pendingParked {
		if _, ok := lk.isParked(lk.pending); ok {
			return true
		}
		for m := range lk.holders {
			if _, owner, _ := parseMember(m); owner == "parked:"+lk.pending {
				return true
			}
		}
		return false
	}
	_, ok := lk.waiters[lk.pending]
	return ok
}

// park adds r to the parked queue, once (AcquireOptions.Park), and returns
// how many parked jobs are ahead of it; -1 when r does not park.
func (lk *memLock) park(r *request, now time.Time) int {
	if r.park == "" {
		return -1
	}
	for i := range lk.parked {
		lk.parked[i].until = now.Add(parkKeep)
	}
	for i, p := range lk.parked {
		if p.id == r.park {
			return i
		}
	}
	lk.parked = append(lk.parked, memParked{id: r.park, label: r.label, hold: r.parkHold, until: now.Add(parkKeep)})
	return len(lk.parked) - 1
}

// unpark removes id from the parked queue.
func (lk *memLock) unpark(id string) {
	if id == "" {
		return
	}
	lk.parked = slices.DeleteFunc(lk.parked, func(p memParked) bool { return p.id == id })
}

// isParked returns id's place in the parked queue.
func (lk *memLock) isParked(id string) (memParked, bool) {
	for _, p := range lk.parked {
		if p.id == id {
			return p, true
		}
	}
	return memParked{}, false
}

// take adds a holder with the next fencing token and returns the token.
func (lk *memLock) take(now time.Time, aid, owner, label string, ttl time.Duration) int64 {
	token := max(lk.token+1, now.UnixMicro())
	lk.token = token
	lk.holders[memberOf(token, aid, owner, label)] = now.Add(ttl)
	return token
}

// reserveParked reserves the unheld key, freed by the release of the lease
// with token released, for its oldest parked job whose label was not
// completed, and returns the job's id ("" for none). The reservation is
// named as release.lua names it.
func (lk *memLock) reserveParked(now time.Time, released int64) string {
	if len(lk.holders) > 0 {
		return ""
	}
	for len(lk.parked) > 0 {
		p := lk.parked[0]
		lk.parked = lk.parked[1:]
		if _, done := lk.done[p.label]; done && p.label != "" {
			continue
		}
		lk.take(now, "r"+strconv.FormatInt(released, 10), "parked:"+p.id, p.label, p.hold)
		return p.id
	}
	return ""
}

// grantable reports whether release.lua would hand the freed key to a
// waiter, the head of the fair queue or else the waiter seen longest ago:
// a plain acquire (see handOverID) that was not abandoned and whose label
// was not completed. The key is then left to that waiter, which is woken,
// and no parked job is reserved for.
func (lk *memLock) grantable(now time.Time) bool {
	wid := ""
	if len(lk.queue) > 0 {
		wid = lk.queue[0]
		if d, ok := lk.waiters[wid]; !ok || !d.After(now) {
			return false
		}
	} else {
		var first time.Time
		for w, d := range lk.waiters {
			if d.After(now) && (first.IsZero() || d.Before(first)) {
				wid, first = w, d
			}
		}
	}
	if !strings.HasPrefix(wid, "g") {
		return false
	}
	parts := strings.SplitN(wid, ":", 5)
	if len(parts) != 5 {
		return false
	}
	if _, ok := lk.abandoned[parts[2]]; ok {
		return false
	}
	_, done := lk.done[unescape(parts[3])]
	return !done || parts[3] == ""
}

// preemptHolders preempts every live holder not preempted yet: it is no
// longer renewed and expires within grace (if positive). It returns the
// watched leases to tell.
func (lk *memLock) preemptHolders(now time.Time, grace time.Duration) []*Lease {
	top := int64(0)
	for m, exp := range lk.holders {
		if lk.preempted[m] {
			continue
		}
		lk.preempted[m] = true
		if grace > 0 && now.Add(grace).Before(exp) {
			lk.holders[m] = now.Add(grace)
		}
		if token, _, _ := parseMember(m); token > top {
			top = token
		}
	}
	var out []*Lease
	for l := range lk.watchers {
		if l.token <= top {
			out = append(out, l)
		}
	}
	return out
}

// hasSameLabel reports whether a live holder carries label.
func (lk *memLock) hasSameLabel(label string) bool {
	if label == "" {
		return false
	}
	for m := range lk.holders {
		if _, _, l := parseMember(m); l == label {
			return true
		}
	}
	return false
}

func (b *memBackend) release(ctx context.Context, leases []*Lease, ends []ending) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	held := make([]bool, len(leases))
	for i, l := range leases {
		var end ending
		if ends != nil {
			end = ends[i]
		}
		lk := s.get(l.key, now)
		member := l.member
		if member == "" {
			var ok bool
			if member, ok = lk.holderOf(l.aid); !ok {
				lk.abandoned[l.aid] = now.Add(l.ttl)
				continue
			}
		}
		if _, ok := lk.holders[member]; ok {
			held[i] = true
			token, _, _ := parseMember(member)
			freed := false
			if until := time.UnixMicro(token).Add(l.holdFor(end)); l.holdFor(end) > 0 && until.After(now) {
				lk.holders[member] = until // held, no longer renewed, until then
			} else {
				delete(lk.holders, member)
				lk.wake()
				freed = true
			}
			if end.done > 0 {
				lk.done[l.label] = now.Add(end.done)
			}
			if end.cover > 0 && l.token > lk.cover {
				lk.cover, lk.coverTill = l.token, now.Add(end.cover)
			}
			if freed && l.onParked != nil && !lk.grantable(now) {
				if id := lk.reserveParked(now, token); id != "" {
					l.parked.Store(&id)
				}
			}
		}
	}
	return held, nil
}

func (b *memBackend) extend(ctx context.Context, leases []*Lease, ttls []time.Duration, renew bool) []error {
	errs := make([]error, len(leases))
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i, l := range leases {
		lk := s.get(l.key, now)
		exp, ok := lk.holders[l.member]
		if _, evicted := lk.evicted[l.member]; !ok && evicted {
			errs[i] = errEvicted
			continue
		}
		if !ok {
			errs[i] = errNotHeld
			continue
		}
		if lk.preempted[l.member] {
			errs[i] = errPreempted
			continue
		}
		u := now.Add(ttls[i])
		if !renew || u.After(exp) {
			lk.holders[l.member] = u
		}
		if l.epoch && u.After(lk.metaUntil) {
			lk.metaUntil = u // the epoch is remembered while the lease lives
		}
	}
	return errs
}

func (b *memBackend) throttle(ctx context.Context, key string, n int, period time.Duration, call string) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.starts == nil {
		s.starts = make(map[string][]memStart)
	}
	log := s.starts[key][:0]
	for _, st := range s.starts[key] {
		if st.at.After(now.Add(-period)) {
			log = append(log, st)
		}
	}
	s.starts[key] = log
	for _, st := range log {
		if st.id == call {
			return 0, nil // a repeat: its start is taken
		}
	}
	if len(log) < n {
		s.starts[key] = append(log, memStart{now, call})
		return 0, nil
	}
	return max(time.Millisecond, log[0].at.Add(period).Sub(now)+time.Millisecond), nil
}

// memStart is one start in a throttle key's log.
type memStart struct {
	at time.Time
	id string
}

func (b *memBackend) returnStart(ctx context.Context, key, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts[key] = slices.DeleteFunc(s.starts[key], func(st memStart) bool { return st.id == id })
	return nil
}

func (b *memBackend) detach(ctx context.Context, l *Lease, member string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	lk := s.get(l.key, now)
	if _, ok := lk.holders[l.member]; !ok {
		return false, nil
	}
	delete(lk.holders, l.member)
	lk.holders[member] = now.Add(ttl)
	return true, nil
}

func (b *memBackend) free(ctx context.Context, key, label string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	lk := s.get(key, time.Now())
	for m := range lk.holders {
		if _, _, l := parseMember(m); l == label {
			delete(lk.holders, m)
			lk.wake()
			return true, nil
		}
	}
	return false, nil
}

func (b *memBackend) leave(_ context.Context, key, waiter, _ string) error {
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	lk := s.get(key, time.Now())
	if lk.forget(waiter) {
		lk.wake()
	}
	return nil
}

func (b *memBackend) inspect(ctx context.Context, key string) (*Info, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	lk := s.get(key, now)
	info := &Info{Key: key, Waiters: len(lk.waiters), Parked: len(lk.parked)}
	for m, exp := range lk.holders {
		tok, owner, label := parseMember(m)
		info.Holders = append(info.Holders, Holder{Owner: owner, Label: label, Token: tok, TTL: exp.Sub(now)})
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].TTL < info.Holders[j].TTL })
	return info, nil
}

func (b *memBackend) wakeups(key, _ string) (<-chan int64, func()) {
	ch := make(chan int64, 1)
	s := b.s
	s.mu.Lock()
	lk := s.get(key, time.Now())
	lk.subs[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(lk.subs, ch)
		s.mu.Unlock()
	}
}

func (b *memBackend) watch(l *Lease) func() {
	s := b.s
	s.mu.Lock()
	lk := s.get(l.key, time.Now())
	lk.watchers[l] = struct{}{}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(lk.watchers, l)
		s.mu.Unlock()
	}
}

func (b *memBackend) debounce(ctx context.Context, key, id string, quiet, maxWait time.Duration) (Request, error) {
	if err := ctx.Err(); err != nil {
		return Request{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.bursts == nil {
		s.bursts = make(map[string]*memBurst)
	}
	bu := s.bursts[key]
	if bu != nil && !now.Before(bu.until) {
		bu = nil
	}
	if bu != nil && bu.id == id {
		return Request{Gen: bu.gen, ID: id, Wait: max(bu.due.Sub(now), 0)}, nil
	}
	if bu == nil {
		bu = &memBurst{}
		s.bursts[key] = bu
	}
	bu.gen = max(bu.gen+1, now.UnixMicro())
	bu.id = id
	if bu.first.IsZero() {
		bu.first = now
	}
	bu.due = now.Add(quiet)
	if maxWait > 0 && bu.first.Add(maxWait).Before(bu.due) {
		bu.due = bu.first.Add(maxWait)
		if bu.due.Before(now) {
			bu.due = now
		}
	}
	bu.until = bu.due.Add(DebounceRetention)
	return Request{Gen: bu.gen, ID: id, Wait: bu.due.Sub(now)}, nil
}

func (b *memBackend) claim(ctx context.Context, key string, gen int64, force bool) (Request, bool, error) {
	if err := ctx.Err(); err != nil {
		return Request{}, false, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	bu := s.bursts[key]
	if bu == nil || !now.Before(bu.until) {
		delete(s.bursts, key)
		return Request{}, true, nil
	}
	if gen >= bu.gen || (force && bu.claimed < bu.gen) {
		bu.first = time.Time{}
		bu.claimed = max(bu.claimed, gen)
		return Request{}, true, nil
	}
	return Request{Gen: bu.gen, ID: bu.id, Wait: max(bu.due.Sub(now), 0), Claimed: bu.claimed >= bu.gen}, false, nil
}

func (b *memBackend) evict(ctx context.Context, key, owner string, pin int64, _ string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s := b.s
	var evicted []*Lease
	s.mu.Lock()
	defer func() {
		s.mu.Unlock()
		for _, l := range evicted {
			l.evicted()
		}
	}()
	lk := s.get(key, time.Now())
	n := 0
	var top int64
	for m, exp := range lk.holders {
		token, o, _ := parseMember(m)
		if (owner == "" || o == owner) && (pin == 0 || token == pin) {
			delete(lk.holders, m)
			lk.evicted[m] = exp.Add(time.Second)
			n++
			top = max(top, token)
		}
	}
	if n > 0 {
		for l := range lk.watchers {
			if l.token <= top && (owner == "" || l.owner == owner) && (pin == 0 || l.token == pin) {
				evicted = append(evicted, l)
			}
		}
		lk.wake()
	}
	return n, nil
}

func (b *memBackend) close() error { return nil }
