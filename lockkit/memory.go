package lockkit

import (
	"context"
	"fmt"
	"path"
	"sort"
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
func (l *MemoryLocker) TryAcquire(ctx context.Context, key string, opt *Options) (*Lease, error) {
	return l.e.tryAcquire(ctx, key, opt)
}

// Acquire implements Locker.
func (l *MemoryLocker) Acquire(ctx context.Context, key string, opt *Options) (*Lease, error) {
	return l.e.acquireWait(ctx, key, opt)
}

// Inspect implements Locker.
func (l *MemoryLocker) Inspect(ctx context.Context, key string) (*Info, error) {
	return l.e.inspect(ctx, key)
}

// Close implements Locker.
func (l *MemoryLocker) Close(ctx context.Context) error { return l.e.close(ctx) }

// Keys returns the keys matching pattern (path.Match syntax) that have at
// least one live holder, sorted.
func (l *MemoryLocker) Keys(_ context.Context, pattern string) ([]string, error) {
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, fmt.Errorf("%w: Keys(%q): %v", ErrInvalid, pattern, err)
	}
	s := l.m
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []string
	for k, lk := range s.locks {
		lk.expire(now)
		if ok, _ := path.Match(pattern, k); ok && len(lk.holders) > 0 {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out, nil
}

type memStore struct {
	mu    sync.Mutex
	locks map[string]*memLock
	ops   int
}

type memLock struct {
	holders   map[string]time.Time // member → expiry
	token     int64
	epoch     int64
	metaUntil time.Time
	queue     []string             // fair waiters in arrival order
	waiters   map[string]time.Time // waiter → deadline
	subs      map[chan struct{}]struct{}
}

func (lk *memLock) expire(now time.Time) {
	for m, exp := range lk.holders {
		if !now.Before(exp) {
			delete(lk.holders, m)
		}
	}
	for w, d := range lk.waiters {
		if !now.Before(d) {
			delete(lk.waiters, w)
		}
	}
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
		case ch <- struct{}{}:
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
	return len(lk.holders) == 0 && len(lk.waiters) == 0 && len(lk.subs) == 0 && !now.Before(lk.metaUntil)
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
	}
	lk := s.locks[key]
	if lk == nil {
		lk = &memLock{holders: make(map[string]time.Time), waiters: make(map[string]time.Time), subs: make(map[chan struct{}]struct{})}
		s.locks[key] = lk
	}
	lk.expire(now)
	return lk
}

type memBackend struct{ s *memStore }

func (b *memBackend) acquire(ctx context.Context, r *request) (acquireResult, error) {
	if err := ctx.Err(); err != nil {
		return acquireResult{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	lk := s.get(r.key, now)
	if r.epoch > 0 && !now.Before(lk.metaUntil) {
		lk.epoch = 0
	}
	if r.epoch > 0 && r.epoch <= lk.epoch {
		lk.forget(r.waiter)
		return acquireResult{lastEpoch: lk.epoch}, nil
	}
	ahead := len(lk.queue)
	for i, w := range lk.queue {
		if w == r.waiter {
			ahead = i
			break
		}
	}
	if len(lk.holders)+ahead < r.limit {
		token := max(lk.token+1, now.UnixMicro())
		lk.token = token
		lk.holders[memberOf(token, r.owner)] = now.Add(r.ttl)
		if r.epoch > 0 {
			lk.epoch = r.epoch
		}
		if u := now.Add(max(r.ttl, r.epochTTL)); u.After(lk.metaUntil) {
			lk.metaUntil = u
		}
		lk.forget(r.waiter)
		return acquireResult{ok: true, token: token}, nil
	}
	if r.waiter != "" {
		if _, ok := lk.waiters[r.waiter]; !ok && r.fair {
			lk.queue = append(lk.queue, r.waiter)
		}
		lk.waiters[r.waiter] = now.Add(r.waiterTTL)
		if r.fair {
			for i, w := range lk.queue {
				if w == r.waiter {
					ahead = i
				}
			}
		}
	}
	c := &ConflictError{Key: r.key, Holders: len(lk.holders), Ahead: ahead}
	var first time.Time
	for m, exp := range lk.holders {
		if first.IsZero() || exp.Before(first) {
			first = exp
			c.Token, c.Owner = parseMember(m)
			c.TTL = exp.Sub(now)
		}
	}
	return acquireResult{conflict: c}, nil
}

func (b *memBackend) release(ctx context.Context, leases []*Lease) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	held := make([]bool, len(leases))
	for i, l := range leases {
		lk := s.get(l.key, now)
		if _, ok := lk.holders[l.member]; ok {
			delete(lk.holders, l.member)
			held[i] = true
			lk.wake()
		}
	}
	return held, nil
}

func (b *memBackend) extend(ctx context.Context, leases []*Lease) []error {
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
		if _, ok := lk.holders[l.member]; !ok {
			errs[i] = errNotHeld
			continue
		}
		l.e.mu.Lock()
		ttl := l.ttl
		l.e.mu.Unlock()
		lk.holders[l.member] = now.Add(ttl)
		if u := now.Add(ttl); u.After(lk.metaUntil) {
			lk.metaUntil = u // the epoch is remembered while the lease lives
		}
	}
	return errs
}

func (b *memBackend) leave(_ context.Context, key, waiter string) error {
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
	info := &Info{Key: key, Waiters: len(lk.waiters)}
	for m, exp := range lk.holders {
		tok, owner := parseMember(m)
		info.Holders = append(info.Holders, Holder{Owner: owner, Token: tok, TTL: exp.Sub(now)})
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].TTL < info.Holders[j].TTL })
	return info, nil
}

func (b *memBackend) wakeups(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
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

func (b *memBackend) close() error { return nil }
