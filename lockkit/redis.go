package lockkit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/rediskey"
)

var (
	//go:embed scripts/acquire_core.lua
	acquireCoreSrc string
	//go:embed scripts/acquire_coalesce.lua
	acquireCoalesceSrc string
	//go:embed scripts/acquire_supersede.lua
	acquireSupersedeSrc string
	//go:embed scripts/acquire_preempt.lua
	acquirePreemptSrc string
	//go:embed scripts/acquire_park.lua
	acquireParkSrc string
	//go:embed scripts/acquire.lua
	acquireSrc string
	//go:embed scripts/release.lua
	releaseSrc string
	//go:embed scripts/release_grant.lua
	releaseGrantSrc string
	//go:embed scripts/release_hold.lua
	releaseHoldSrc string
	//go:embed scripts/release_cover.lua
	releaseCoverSrc string
	//go:embed scripts/release_done.lua
	releaseDoneSrc string
	//go:embed scripts/release_park.lua
	releaseParkSrc string
	//go:embed scripts/extend.lua
	extendSrc string
	//go:embed scripts/leave.lua
	leaveSrc string
	//go:embed scripts/inspect.lua
	inspectSrc string
	//go:embed scripts/free.lua
	freeSrc string
	//go:embed scripts/detach.lua
	detachSrc string
	//go:embed scripts/evict.lua
	evictSrc string
	//go:embed scripts/renew.lua
	renewSrc string
	//go:embed scripts/promote.lua
	promoteSrc string
	//go:embed scripts/plain_acquire.lua
	plainAcquireFile string
	// plainAcquireSrc calls keep_release of promote.lua.
	plainAcquireSrc = promoteSrc + plainAcquireFile
	//go:embed scripts/plain_release.lua
	plainReleaseSrc string

	// The scripts that change a holders key start with promote.lua.
	acquireScripts     = newScripts(modeAll, acquireSource)
	releaseScripts     = newScripts(releaseAll, releaseSource)
	plainAcquireScript = redis.NewScript(plainAcquireSrc)
	plainReleaseScript = redis.NewScript(plainReleaseSrc)
	extendScript       = redis.NewScript(extendSrc)
	leaveScript        = redis.NewScript(promoteSrc + leaveSrc)
	inspectScript      = redis.NewScript(inspectSrc)
	freeScript         = redis.NewScript(promoteSrc + freeSrc)
	detachScript       = redis.NewScript(promoteSrc + detachSrc)
	evictScript        = redis.NewScript(promoteSrc + evictSrc)
	renewScript        = redis.NewScript(renewSrc)
)

// acquireMode is a set of the follow-up modes of an acquire call, each with
// its own part of the acquire script.
type acquireMode uint8

const (
	modeCoalesce  acquireMode = 1 << iota // acquire_coalesce.lua
	modeSupersede                         // acquire_supersede.lua
	modePreempt                           // acquire_preempt.lua
	modePark                              // acquire_park.lua
	modeAll       = modeCoalesce | modeSupersede | modePreempt | modePark
)

// newScripts builds the script source(m) of every set m of modes up to
// all, indexed by m.
func newScripts[M ~uint8](all M, source func(M) string) []*redis.Script {
	s := make([]*redis.Script, all+1)
	for m := range s {
		s[m] = redis.NewScript(source(M(m)))
	}
	return s
}

// acquireSource is the acquire script of the modes m: promote.lua,
// acquire_core.lua, what the files of the modes declare, and acquire.lua with
// their sections at its places (see acquire_core.lua). A mode's code only
// acts when its arguments ask for it, so a script with more modes than a
// call has gives the same answer; a plain waiting acquire runs the core
// alone.
func acquireSource(m acquireMode) string {
	parts := []string{acquireCoalesceSrc, acquireSupersedeSrc, acquirePreemptSrc, acquireParkSrc}
	return inlineSource(promoteSrc+acquireCoreSrc, acquireSrc, parts, uint(m))
}

// inlineSource is head, what the parts whose bits are set in m begin with
// (before their first place), and body with the parts' sections at its
// places: the lines after a line "-- @<place>" of a part go at the line of
// the same name in body, and the places of the parts left out stay empty.
func inlineSource(head, body string, parts []string, m uint) string {
	src := head
	places := make(map[string]string)
	for i, part := range parts {
		if m&(1<<i) == 0 {
			continue
		}
		place := ""
		for _, line := range strings.SplitAfter(part, "\n") {
			if name, ok := placeOf(line); ok {
				place = name
			}
			if place == "" {
				src += line
			} else {
				places[place] += line
			}
		}
	}
	for _, line := range strings.SplitAfter(body, "\n") {
		if name, ok := placeOf(line); ok {
			line = places[name]
		}
		src += line
	}
	return src
}

// placeOf reads a line "-- @<place>" (or "-- @<place>: what goes there") of
// the acquire and release scripts.
func placeOf(line string) (string, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "-- @")
	if !ok {
		return "", false
	}
	name, _, _ := strings.Cut(rest, ":")
	return name, true
}

// acquireModes is the set of modes whose code r's acquire script needs, with
// sup its Supersede argument: a Preempt call's first attempt only preempts.
func acquireModes(r *request, sup string) acquireMode {
	var m acquireMode
	if r.coalesce {
		m |= modeCoalesce
	}
	if sup != "0" || r.order > 0 {
		m |= modeSupersede
	}
	if r.preempt == "1" && r.waiter != "" {
		m |= modePreempt
	}
	if r.park != "" {
		m |= modePark
	}
	return m
}

// releaseMode is the set of the options of a release call that need their
// own part of the release script.
type releaseMode uint8

const (
	releaseHold  releaseMode = 1 << iota // release_hold.lua: HoldAtLeast
	releaseCover                         // release_cover.lua: a Coalesce run's success
	releaseDone                          // release_done.lua: a completed label
	releasePark                          // release_park.lua: reserve the key for a parked job
	releaseAll   = releaseHold | releaseCover | releaseDone | releasePark
)

// releaseSource is the release script of the options m: promote.lua and
// release.lua with the hand-over (release_grant.lua, in every release
// script) and the sections of the options at its places. A section only
// acts when its arguments ask for it, so a script with more sections than a
// call needs gives the same answer.
func releaseSource(m releaseMode) string {
	parts := []string{releaseGrantSrc, releaseHoldSrc, releaseCoverSrc, releaseDoneSrc, releaseParkSrc}
	return inlineSource(promoteSrc, releaseSrc, parts, 1|uint(m)<<1)
}

// releaseModes is the set of options whose sections the release of l under
// end needs.
func releaseModes(l *Lease, end ending) releaseMode {
	var m releaseMode
	if l.holdFor(end) > 0 {
		m |= releaseHold
	}
	if end.cover > 0 {
		m |= releaseCover
	}
	if end.done > 0 {
		m |= releaseDone
	}
	if l.onParked != nil {
		m |= releasePark
	}
	return m
}

// RedisLocker is a Locker backed by Redis, shared by every process that uses
// the same Redis and prefix. All keys of one lock share a {hash tag}, so it
// works on Redis Cluster as well as standalone and Sentinel deployments.
//
// Redis layout for key K under prefix P: P{K}:h holds the holders. A plain
// lock (limit 1, no waiting, queue, epoch, Coalesce, Supersede, Preempt,
// Adopt or Park) that no other kind of acquire touched keeps its one holder
// there as a STRING; its release leaves "~<token>." there for the client's
// retry window: the last token and the record of the release, moved into
// P{K}:d:<token> when the key is taken again within the window. Any
// other operation first turns the STRING into a sorted set scored by expiry,
// with records of completed labels and cleaned-up calls, which the key keeps
// while waiters, a queue or parked jobs may live; its released holders are
// then kept in P{K}:d for the retry window, or, by a release that leaves the
// key empty, in P{K}:h as a plain release leaves it. P{K}:b holds the newest request
// recorded by Debounce, P{K}:k the parked jobs (Parking.ID), P{K}:c
// the start of the last Coalesce run that succeeded, P{K}:f the last fencing
// token (for a second), P{K}:m the last epoch and the order of the latest Supersede run, P{K}:q and P{K}:w the
// waiters; releases are published on P{K}:r. In P and K, the characters
// '{', '}' and '%' are written %7B, %7D and %25, so that {K} is always the
// hash tag: any key and any prefix work on Redis Cluster. Every key expires
// on its own; nothing a released lock leaves outlives the retry window (see
// NewRedis).
//
// Every script is safe to run twice, as go-redis does when a reply is late:
// a repeated acquire returns the lease its first run took, a repeated release
// reports the same success.
type RedisLocker struct {
	e *engine
	r *redisBackend
}

var _ Locker = (*RedisLocker)(nil)

// NewRedis returns a RedisLocker using client, which it does not close. It
// returns an error matching ErrInvalid for a nil client (also a typed nil) or
// an invalid option. The Locker starts no goroutine until a lease is acquired
// or a waiter waits; call Close to stop them. Its first acquire checks the
// server's version and fails with ErrUnsupported below MinRedisVersion.
//
// A released lock's holders key is kept for the client's retry window,
// (MaxRetries+1) × (ReadTimeout + MaxRetryBackoff) (a ClusterClient:
// (MaxRedirects+1) × (MaxRetries+1) attempts), between a second and a
// minute: 14s with go-redis v9.17's defaults, 24s with v9.23's; so that a
// release that go-redis sends again reports the same.
func NewRedis(client redis.UniversalClient, opts ...Option) (*RedisLocker, error) {
	cfg, err := clientConfig("NewRedis", client, opts)
	if err != nil {
		return nil, err
	}
	b := &redisBackend{c: client, prefix: escapeKey(cfg.prefix), grace: retryWindow(client), subs: make(map[string]*subscribers)}
	return &RedisLocker{e: newEngine(cfg, b), r: b}, nil
}

// clientConfig is the config of opts for op on client: it refuses a nil
// client, also a typed nil, and an invalid option.
func clientConfig(op string, client redis.UniversalClient, opts []Option) (config, error) {
	if client == nil {
		return config{}, fmt.Errorf("%w: %s: client is nil", ErrInvalid, op)
	}
	if v := reflect.ValueOf(client); v.Kind() == reflect.Pointer && v.IsNil() {
		return config{}, fmt.Errorf("%w: %s: client is a nil %T", ErrInvalid, op, client)
	}
	return newConfig(opts)
}

// retryWindow is how long after a command's first run go-redis may run it
// again: every attempt waits for a read timeout and a backoff. A Client and
// a Ring make 1 + MaxRetries attempts; a ClusterClient makes 1 +
// MaxRedirects (default 3) attempts, on a node whose client makes 1 +
// MaxRetries each (MaxRetries defaults to none for a cluster).
func retryWindow(client redis.UniversalClient) time.Duration {
	attempts, read, backoff := 4, 3*time.Second, 512*time.Millisecond
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		attempts, read, backoff = max(o.MaxRetries, 0)+1, o.ReadTimeout, o.MaxRetryBackoff
	case *redis.ClusterClient:
		o := c.Options()
		attempts, read, backoff = (max(o.MaxRedirects, 0)+1)*(max(o.MaxRetries, 0)+1), o.ReadTimeout, o.MaxRetryBackoff
	case *redis.Ring:
		o := c.Options()
		attempts, read, backoff = max(o.MaxRetries, 0)+1, o.ReadTimeout, o.MaxRetryBackoff
	}
	if read <= 0 {
		read = 3 * time.Second
	}
	w := time.Duration(attempts) * (read + max(backoff, 0))
	return min(max(w, time.Second), time.Minute)
}

// Owner returns the owner id recorded with this Locker's leases.
func (l *RedisLocker) Owner() string { return l.e.cfg.owner }

// TryAcquire implements Locker.
func (l *RedisLocker) TryAcquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return l.e.tryAcquire(ctx, key, opt)
}

// Acquire implements Locker.
func (l *RedisLocker) Acquire(ctx context.Context, key string, opt *AcquireOptions) (*Lease, error) {
	return l.e.acquireWait(ctx, key, opt)
}

// Inspect implements Locker.
func (l *RedisLocker) Inspect(ctx context.Context, key string) (*Info, error) {
	return l.e.inspect(ctx, key)
}

// ForceRelease implements Locker.
func (l *RedisLocker) ForceRelease(ctx context.Context, key string, which Select) (int, error) {
	return l.e.forceRelease(ctx, key, which)
}

// Redis returns the client the Locker was built on and its key prefix
// (WithPrefix; DefaultPrefix without it), for what keeps its own state
// beside the Locker's leases on the same Redis and prefix: a
// throttle.Throttle or a debounce.Debouncer built with them shares the
// budgets and requests of every process on that Redis and prefix.
func (l *RedisLocker) Redis() (client redis.UniversalClient, prefix string) {
	return l.r.c, l.e.cfg.prefix
}

// Held returns how many leases the Locker holds and renews now (not
// reservations, which nothing renews).
func (l *RedisLocker) Held() int { return l.e.held() }

// Logger returns the logger set with WithLogger (slog.Default() without
// it). The layers above lockkit log through it, when the Locker they are
// given is a *RedisLocker, unless they are given their own.
func (l *RedisLocker) Logger() *slog.Logger { return l.e.cfg.logger }

// Close implements Locker. It does not close the Redis client.
func (l *RedisLocker) Close(ctx context.Context) error { return l.e.close(ctx) }

// Keys implements Locker. It uses SCAN on every master, never KEYS, then
// checks each key's holders; a key may be missed or reported after it was
// released, as SCAN guarantees. It walks the whole keyspace: ScanKeys reads
// one bounded page.
func (l *RedisLocker) Keys(ctx context.Context, pattern string) ([]string, error) {
	match := globEscape(l.r.prefix) + "{" + serverGlob(pattern) + "}:h"
	var (
		mu  sync.Mutex
		out []string
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var found []string
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			found = append(found, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return err
		}
		live, err := liveKeys(ctx, c, l.r.prefix, l.matching(found, pattern))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		out = append(out, live...)
		return nil
	}
	var err error
	if cc, ok := l.r.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, l.r.c)
	}
	if err != nil {
		return nil, fmt.Errorf("lockkit: keys %q: %w", pattern, err)
	}
	sort.Strings(out)
	return out, nil
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

type redisBackend struct {
	c      redis.UniversalClient
	prefix string        // escaped
	grace  time.Duration // how long a released holder is remembered

	mu   sync.Mutex
	ps   *redis.PubSub
	subs map[string]*subscribers
	// onOperators receives the notices of the operators' channel.
	onOperators func(key, notice string)
	wg          sync.WaitGroup
	done        bool

	// sorted remembers, until when, the keys a plain script found in the
	// sorted set: their acquires and releases skip the plain script, which
	// would only defer to the full one (one more round trip).
	sortedMu sync.Mutex
	sorted   map[string]time.Time
}

// Keys found in the sorted set are remembered for sortedFor, at most
// sortedMax of them.
const (
	sortedFor = time.Minute
	sortedMax = 4096
)

// isSorted reports whether key was lately found in the sorted set.
func (b *redisBackend) isSorted(key string) bool {
	b.sortedMu.Lock()
	defer b.sortedMu.Unlock()
	until, ok := b.sorted[key]
	if ok && time.Now().After(until) {
		delete(b.sorted, key)
		return false
	}
	return ok
}

// markSorted remembers that key was found in the sorted set.
func (b *redisBackend) markSorted(key string) {
	b.sortedMu.Lock()
	defer b.sortedMu.Unlock()
	if b.sorted == nil || len(b.sorted) >= sortedMax {
		b.sorted = make(map[string]time.Time)
	}
	b.sorted[key] = time.Now().Add(sortedFor)
}

type lockKeys struct{ holders, meta, queue, waiters, fence, channel, cover, released, parked, follow string }

func (b *redisBackend) keys(key string) lockKeys {
	base := b.base(key)
	return lockKeys{base + ":h", base + ":m", base + ":q", base + ":w", base + ":f", base + ":r", base + ":c", base + ":d", base + ":k", base + ":u"}
}

// base is the prefix of every key of key's lock: "<prefix>{<key>}".
func (b *redisBackend) base(key string) string { return rediskey.Base(b.prefix, key) }

// plainKeys are the keys of plain_release.lua for the lease with member
// "<token>:...": its holders key and the key its release's record moves to
// when the key is taken again, "<released>:<token>".
func (b *redisBackend) plainKeys(key, member string) []string {
	base := b.base(key)
	return []string{base + ":h", base + ":d:" + member[:strings.IndexByte(member, ':')]}
}

// plain reports whether r can use the plain form of a holders key
// (plain_acquire.lua): limit 1, no waiting, queue, epoch, Coalesce,
// Supersede, Preempt, Adopt or Park.
func plain(r *request) bool {
	return r.limit == 1 && r.waiter == "" && !r.fair && r.epoch == 0 && !r.coalesce &&
		r.preempt == "0" && !r.adopt && r.park == ""
}

func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// ready fails with ErrUnsupported when the server is older than
// MinRedisVersion. A server that does not report its version (INFO renamed
// or limited) is accepted.
func (b *redisBackend) ready(ctx context.Context) error {
	info, err := b.c.Info(ctx, "server").Result()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("lockkit: checking the Redis version: %w", err)
		}
		return nil
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			if versionLess(v, MinRedisVersion) {
				return fmt.Errorf("%w: Redis %s is older than %s", ErrUnsupported, v, MinRedisVersion)
			}
			return nil
		}
	}
	return nil
}

// versionLess compares dotted version numbers.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// parkKeep is how long a parked id is kept after its last park.
const parkKeep = 10 * time.Minute

// parkEntry is r's entry in its key's parked queue, "" when r does not park:
// "<ParkHold ms>:<escaped label>:<Park>".
func parkEntry(r *request) string {
	if r.park == "" {
		return ""
	}
	return strconv.FormatInt(ms(r.parkHold), 10) + ":" + escapeLabel(r.label) + ":" + r.park
}

// parkedID is the job id of a parked-queue entry (parkEntry): what follows
// its hold and its escaped label, which holds no ':'.
func parkedID(entry string) string {
	if _, rest, ok := strings.Cut(entry, ":"); ok {
		if _, id, ok := strings.Cut(rest, ":"); ok {
			return id
		}
	}
	return entry
}

// acquireCall is the acquire script of r's modes, with its keys and
// arguments (see acquire_core.lua and the files of the modes).
func (b *redisBackend) acquireCall(r *request) (*redis.Script, []string, []any) {
	k := b.keys(r.key)
	fair := "0"
	if r.fair {
		fair = "1"
	}
	since := int64(0)
	if r.coalesce {
		since = r.since
	}
	adopt := "0"
	if r.adopt {
		adopt = "1"
	}
	sup := r.supersede
	if r.waiter == "" && r.park == "" {
		sup = "0" // only a waiting or parking call is a follow-up
	}
	return acquireScripts[acquireModes(r, sup)], []string{k.holders, k.meta, k.queue, k.waiters, k.fence, k.cover, k.parked, k.follow},
		[]any{r.owner, ms(r.ttl), r.limit, r.waiter, fair, ms(r.waiterTTL), r.epoch, ms(r.epochTTL), r.aid, escapeLabel(r.label), since, adopt, sup, k.channel, r.preempt, ms(r.grace),
			parkEntry(r), ms(parkKeep), r.order}
}

func (b *redisBackend) acquire(ctx context.Context, r *request) (acquireResult, error) {
	if plain(r) && !b.isSorted(r.key) {
		v, err := plainAcquireScript.Run(ctx, b.c, []string{b.base(r.key) + ":h"},
			":"+r.aid+":"+r.owner+":"+escapeLabel(r.label), ms(r.ttl)).Result()
		if err != nil {
			return acquireResult{}, err
		}
		if token, ok := v.(string); ok {
			return acquireResult{ok: true, token: toInt(token), plain: true}, nil
		}
		vals, _ := v.([]any)
		switch {
		case len(vals) >= 2 && toInt(vals[0]) == 1:
			res := acquireResult{ok: true, token: toInt(vals[1]), plain: true}
			if len(vals) > 2 {
				res.left = time.Duration(toInt(vals[2])) * time.Millisecond
			}
			return res, nil
		case len(vals) >= 1 && toInt(vals[0]) == 0:
			return conflictOf(r.key, vals)
		case len(vals) != 1 || toInt(vals[0]) != -9:
			return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
		}
		// The key's holders are in the sorted set: acquire.lua.
		b.markSorted(r.key)
	}
	script, keys, args := b.acquireCall(r)
	vals, err := script.Run(ctx, b.c, keys, args...).Slice()
	if err != nil {
		return acquireResult{}, err
	}
	if len(vals) < 1 {
		return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
	}
	switch toInt(vals[0]) {
	case 1:
		if len(vals) < 2 {
			return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
		}
		res := acquireResult{ok: true, token: toInt(vals[1])}
		if len(vals) > 2 {
			// Found taken by an earlier run, or handed over by a release:
			// its TTL left, counted from now.
			res.left = time.Duration(toInt(vals[2])) * time.Millisecond
		}
		res.wasParked = len(vals) > 3 && toInt(vals[3]) == 1
		return res, nil
	case -1:
		if len(vals) < 2 {
			return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
		}
		return acquireResult{lastEpoch: toInt(vals[1])}, nil
	case -2:
		return acquireResult{completed: true}, nil
	case -3:
		return acquireResult{abandoned: true}, nil
	case -5:
		return acquireResult{superseded: true}, nil
	case -4:
		if len(vals) < 5 {
			return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
		}
		c := &CoveredError{Key: r.key, By: Coverage(toInt(vals[1])), Token: toInt(vals[2])}
		if m, _ := vals[3].(string); m != "" {
			_, c.Owner, _ = parseMember(m)
		}
		return acquireResult{covered: c, since: toInt(vals[4])}, nil
	}
	return conflictOf(r.key, vals)
}

// conflictOf reads the acquire script's reply for a held key.
func conflictOf(key string, vals []any) (acquireResult, error) {
	if len(vals) < 5 {
		return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
	}
	c := &ConflictError{Key: key, TTL: time.Duration(toInt(vals[2])) * time.Millisecond, Holders: int(toInt(vals[3])), Ahead: int(toInt(vals[4]))}
	if m, _ := vals[1].(string); m != "" {
		c.Token, c.Owner, c.Label = parseMember(m)
	}
	res := acquireResult{conflict: c}
	if len(vals) > 5 {
		res.since = toInt(vals[5])
	}
	c.Parked = -1
	if len(vals) > 6 {
		c.Parked = int(toInt(vals[6]))
	}
	if len(vals) > 7 {
		// The replaced entry, "<hold ms>:<label>:<id>": its id.
		if e, _ := vals[7].(string); e != "" {
			if _, rest, ok := strings.Cut(e, ":"); ok {
				_, c.Superseded, _ = strings.Cut(rest, ":")
			}
		}
	}
	return res, nil
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// pipelineScript runs script once per lease in one pipeline (see
// pipelineEval).
func (b *redisBackend) pipelineScript(ctx context.Context, s *redis.Script, leases []*Lease, keys func(lockKeys) []string, args func(*Lease) []any) []*redis.Cmd {
	return b.pipelineEval(ctx, s, len(leases),
		func(i int) []string { return keys(b.keys(leases[i].key)) },
		func(i int) []any { return args(leases[i]) })
}

// pipelineEval runs n calls of script in one pipeline, call i with keys(i)
// and args(i), retrying with EVAL the calls that found the script cache
// empty (after a Redis restart).
func (b *redisBackend) pipelineEval(ctx context.Context, s *redis.Script, n int, keys func(int) []string, args func(int) []any) []*redis.Cmd {
	return b.pipelineScripts(ctx, n, func(p redis.Pipeliner, i int, eval bool) *redis.Cmd {
		if eval {
			return s.Eval(ctx, p, keys(i), args(i)...)
		}
		return s.EvalSha(ctx, p, keys(i), args(i)...)
	})
}

// pipelineScripts sends n script calls in one pipeline, call i with send(p,
// i, false) (EVALSHA), and sends again, with send(p, i, true) (EVAL), the
// calls that found the script cache empty (after a Redis restart).
func (b *redisBackend) pipelineScripts(ctx context.Context, n int, send func(p redis.Pipeliner, i int, eval bool) *redis.Cmd) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	run := func(idx []int, eval bool) {
		_, _ = b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				cmds[i] = send(p, i, eval)
			}
			return nil
		})
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	run(all, false)
	var again []int
	for i, c := range cmds {
		if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		run(again, true)
	}
	return cmds
}

func (b *redisBackend) release(ctx context.Context, leases []*Lease, ends []ending) ([]bool, error) {
	idx := make(map[*Lease]int, len(leases))
	for i, l := range leases {
		idx[l] = i
	}
	held := make([]bool, len(leases))
	var errs []error
	// A lease taken in the plain form is released with plain_release.lua
	// when the release records nothing else; the script defers to
	// release.lua when the key's holders are in the sorted set by now, and
	// the key is remembered (isSorted).
	var plains, full []*Lease
	for i, l := range leases {
		var end ending
		if ends != nil {
			end = ends[i]
		}
		if l.plain && l.member != "" && end.done <= 0 && end.cover <= 0 && l.holdFor(end) <= 0 && !end.handOver && !b.isSorted(l.key) {
			plains = append(plains, l)
		} else {
			full = append(full, l)
		}
	}
	if len(plains) > 0 {
		cmds := b.run(ctx, plainReleaseScript, plains,
			func(l *Lease) []string { return b.plainKeys(l.key, l.member) },
			func(l *Lease) []any {
				return []any{l.member, ms(b.grace), "~" + l.member[:strings.IndexByte(l.member, ':')] + "."}
			})
		for i, c := range cmds {
			n, err := c.Int64()
			switch {
			case err != nil:
				errs = append(errs, err)
			case n == -9:
				b.markSorted(plains[i].key)
				full = append(full, plains[i])
			default:
				held[idx[plains[i]]] = n == 1
			}
		}
	}
	if len(full) == 0 {
		return held, errors.Join(errs...)
	}
	cmds := b.runEach(ctx, full, func(l *Lease) (*redis.Script, []string, []any) {
		var end ending
		if ends != nil {
			end = ends[idx[l]]
		}
		return b.releaseCall(l, end)
	})
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// 1 or 0, {1, id of the parked job the key was reserved for}, or
		// {2, ms the release is held for} (with OnParked).
		if vals, ok := v.([]any); ok && len(vals) == 2 {
			v = vals[0]
			if id, _ := vals[1].(string); id != "" {
				full[i].parked.Store(&id)
			}
			if toInt(v) == 2 {
				full[i].holdLeft.Store(int64(time.Duration(max(toInt(vals[1]), 1)) * time.Millisecond))
				v = int64(1)
			}
		}
		held[idx[full[i]]] = toInt(v) == 1
	}
	return held, errors.Join(errs...)
}

// run runs script once for each lease, with keys(lease, its keys) and
// args(lease): one call alone, more in one pipeline (see pipelineEval).
func (b *redisBackend) run(ctx context.Context, s *redis.Script, leases []*Lease, keys func(*Lease) []string, args func(*Lease) []any) []*redis.Cmd {
	if len(leases) == 1 {
		l := leases[0]
		return []*redis.Cmd{s.Run(ctx, b.c, keys(l), args(l)...)}
	}
	return b.pipelineEval(ctx, s, len(leases),
		func(i int) []string { return keys(leases[i]) },
		func(i int) []any { return args(leases[i]) })
}

// releaseCall is the release script of l's options under end, with its
// keys and arguments.
func (b *redisBackend) releaseCall(l *Lease, end ending) (*redis.Script, []string, []any) {
	k := b.keys(l.key)
	// The eighth key: the record a plain release of it left (none for a
	// lease with no member).
	rec := k.released + ":"
	if l.member != "" {
		rec = b.plainKeys(l.key, l.member)[1]
	}
	label := ""
	if end.done > 0 {
		label = escapeLabel(l.label)
	}
	resume, handOver := "0", "0"
	if l.onParked != nil {
		resume = "1"
	}
	if end.handOver {
		handOver = "1"
	}
	return releaseScripts[releaseModes(l, end)],
		[]string{k.holders, k.waiters, k.cover, k.released, k.queue, k.fence, k.parked, rec},
		[]any{l.member, l.aid, k.channel, ms(b.grace), label, ms(end.done), ms(l.ttlLocked()), ms(end.cover), ms(l.holdFor(end)), resume, handOver}
}

// runEach runs the script call(lease) gives once for each lease, with the
// keys and arguments it gives: one call alone, more in one pipeline (see
// pipelineScripts).
func (b *redisBackend) runEach(ctx context.Context, leases []*Lease, call func(*Lease) (*redis.Script, []string, []any)) []*redis.Cmd {
	if len(leases) == 1 {
		s, keys, args := call(leases[0])
		return []*redis.Cmd{s.Run(ctx, b.c, keys, args...)}
	}
	return b.pipelineScripts(ctx, len(leases), func(p redis.Pipeliner, i int, eval bool) *redis.Cmd {
		s, keys, args := call(leases[i])
		if eval {
			return s.Eval(ctx, p, keys, args...)
		}
		return s.EvalSha(ctx, p, keys, args...)
	})
}

// renewArgs are a lease's keys and member argument for renew.lua, built
// once and boxed once, so that a renewal allocates nothing per lease.
type renewArgs struct {
	holders, meta, member any
}

// renewPerCall is how many leases one renew.lua call renews at most.
const renewPerCall = 100

// renewMany renews leases with renew.lua, up to renewPerCall leases per
// call (on Redis Cluster, per hash slot: a script's keys share one), all
// calls in one pipeline: a renewal costs one script call per many leases
// instead of one each.
func (b *redisBackend) renewMany(ctx context.Context, leases []*Lease, ttls []time.Duration) []error {
	bySlot := make(map[uint16][]int)
	var slots []uint16
	_, cluster := b.c.(*redis.ClusterClient)
	for i, l := range leases {
		var slot uint16 // one server holds every key: any mix goes in one call
		if cluster {
			slot = keySlot(escapeKey(l.key))
		}
		if _, ok := bySlot[slot]; !ok {
			slots = append(slots, slot)
		}
		bySlot[slot] = append(bySlot[slot], i)
	}
	var calls [][]int // the leases of each script call
	for _, slot := range slots {
		idx := bySlot[slot]
		for start := 0; start < len(idx); start += renewPerCall {
			calls = append(calls, idx[start:min(start+renewPerCall, len(idx))])
		}
	}
	for _, l := range leases {
		if l.renewArgs == nil {
			k := b.keys(l.key)
			l.renewArgs = &renewArgs{holders: k.holders, meta: k.meta, member: l.member}
		}
	}
	// Leases mostly share a TTL: each call states one, and only a lease with
	// another, or one that claimed an epoch, carries its own. Each call's
	// command is built whole, from the leases' boxed keys and members.
	ttlArgs := make(map[int64]any, 1)
	cmds := b.pipelineScripts(ctx, len(calls), func(p redis.Pipeliner, c int, eval bool) *redis.Cmd {
		idx := calls[c]
		nkeys := len(idx)
		for _, i := range idx {
			if leases[i].epoch {
				nkeys++
			}
		}
		cmd := make([]any, 3, 3+nkeys+1+len(idx))
		cmd[0], cmd[1], cmd[2] = "evalsha", renewScript.Hash(), nkeys
		if eval {
			cmd[0], cmd[1] = "eval", renewSrc
		}
		for _, i := range idx {
			a := leases[i].renewArgs
			cmd = append(cmd, a.holders)
			if leases[i].epoch {
				cmd = append(cmd, a.meta)
			}
		}
		common := ms(ttls[idx[0]])
		arg, ok := ttlArgs[common]
		if !ok {
			arg = common
			ttlArgs[common] = arg
		}
		cmd = append(cmd, arg)
		for _, i := range idx {
			if ttl := ms(ttls[i]); ttl != common || leases[i].epoch {
				if leases[i].epoch {
					ttl = -ttl
				}
				cmd = append(cmd, "!"+strconv.FormatInt(ttl, 10))
			}
			cmd = append(cmd, leases[i].renewArgs.member)
		}
		return p.Do(ctx, cmd...)
	})
	errs := make([]error, len(leases))
	for c, idx := range calls {
		vals, err := cmds[c].Int64Slice()
		for j, i := range idx {
			switch {
			case err != nil:
				errs[i] = err
			case j >= len(vals):
				errs[i] = fmt.Errorf("unexpected renew reply %v", vals)
			case vals[j] == 2:
				errs[i] = errPreempted
			case vals[j] == 3:
				errs[i] = errEvicted
			case vals[j] != 1:
				errs[i] = errNotHeld
			}
		}
	}
	return errs
}

func (b *redisBackend) extend(ctx context.Context, leases []*Lease, ttls []time.Duration, renew bool) []error {
	if renew && len(leases) > 1 {
		return b.renewMany(ctx, leases, ttls)
	}
	mode := "0"
	if renew {
		mode = "1"
	}
	idx := make(map[*Lease]int, len(leases))
	for i, l := range leases {
		idx[l] = i
	}
	cmds := b.pipelineScript(ctx, extendScript, leases,
		func(k lockKeys) []string { return []string{k.holders, k.meta} },
		func(l *Lease) []any {
			epoch := "0"
			if l.epoch {
				epoch = "1"
			}
			return []any{l.member, ms(ttls[idx[l]]), epoch, mode}
		})
	errs := make([]error, len(leases))
	for i, c := range cmds {
		n, err := c.Int64()
		switch {
		case err != nil:
			errs[i] = err
		case n == 2:
			errs[i] = errPreempted
		case n == 3:
			errs[i] = errEvicted
		case n != 1:
			errs[i] = errNotHeld
		}
	}
	return errs
}

// groups splits leases by the Cluster master that stores them; on any other
// client they are one group.
func (b *redisBackend) groups(leases []*Lease) [][]*Lease {
	cc, ok := b.c.(*redis.ClusterClient)
	if !ok {
		return [][]*Lease{leases}
	}
	byNode := make(map[string][]*Lease)
	var order []string
	for _, l := range leases {
		addr := ""
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if c, err := cc.MasterForKey(ctx, b.keys(l.key).holders); err == nil {
			addr = c.Options().Addr
		}
		cancel()
		if _, seen := byNode[addr]; !seen {
			order = append(order, addr)
		}
		byNode[addr] = append(byNode[addr], l)
	}
	out := make([][]*Lease, len(order))
	for i, a := range order {
		out[i] = byNode[a]
	}
	return out
}

func (b *redisBackend) detach(ctx context.Context, l *Lease, member string, ttl time.Duration) (bool, error) {
	k := b.keys(l.key)
	n, err := detachScript.Run(ctx, b.c, []string{k.holders, k.fence}, l.member, member, ms(ttl)).Int64()
	return n == 1, err
}

func (b *redisBackend) free(ctx context.Context, key, label string) (bool, error) {
	k := b.keys(key)
	n, err := freeScript.Run(ctx, b.c, []string{k.holders, k.waiters, k.fence}, escapeLabel(label), k.channel, ms(b.grace)).Int64()
	return n == 1, err
}

func (b *redisBackend) evict(ctx context.Context, key, owner string, token int64, call string) (int, error) {
	k := b.keys(key)
	n, err := evictScript.Run(ctx, b.c, []string{k.holders, k.waiters, k.fence}, owner, k.channel, call, ms(b.grace), token, b.operators(), key).Int()
	return n, err
}

func (b *redisBackend) leave(ctx context.Context, key, waiter, aid string) error {
	k := b.keys(key)
	return leaveScript.Run(ctx, b.c, []string{k.queue, k.waiters, k.holders, k.fence}, waiter, k.channel, aid).Err()
}

func (b *redisBackend) inspect(ctx context.Context, key string) (*Info, error) {
	k := b.keys(key)
	vals, err := inspectScript.Run(ctx, b.c, []string{k.holders, k.waiters, k.parked}).Slice()
	if err != nil {
		return nil, err
	}
	info := &Info{Key: key}
	if len(vals) > 1 {
		info.Waiters, info.Parked = int(toInt(vals[0])), int(toInt(vals[1]))
	}
	if len(vals) > 2 {
		entries, _ := vals[2].([]any)
		for _, e := range entries {
			if s, ok := e.(string); ok {
				info.ParkedIDs = append(info.ParkedIDs, parkedID(s))
			}
		}
	}
	for i := 3; i+1 < len(vals); i += 2 {
		m, _ := vals[i].(string)
		tok, owner, label := parseMember(m)
		info.Holders = append(info.Holders, Holder{Owner: owner, Label: label, Token: tok, TTL: time.Duration(toInt(vals[i+1])) * time.Millisecond})
	}
	return info, nil
}

// wakeups shares one pub/sub connection among all waiters of the Locker; a
// channel is subscribed while at least one waiter needs it. It returns once
// Redis has confirmed the subscription (or after subscribeWait), so that a
// release after it is never missed.
func (b *redisBackend) wakeups(key, waiter string) (<-chan int64, func()) {
	ch := make(chan int64, 1)
	name := b.keys(key).channel
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return ch, func() {}
	}
	set := b.subscribeLocked(name)
	set.chans[ch] = waiter
	b.mu.Unlock()
	t := time.NewTimer(subscribeWait)
	select {
	case <-set.ready:
	case <-t.C:
	}
	t.Stop()
	return ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(set.chans, ch)
		b.dropLocked(name, set)
	}
}

// watch tells l, through its key's channel, when a Preempt acquire preempts
// it. It does not wait for Redis to confirm the subscription: once Redis
// does, the lease is renewed at once, which finds a preemption sent before.
// On a channel already subscribed (a waiting acquire's), a preemption of l
// received after its acquire was sent, before l listened, is applied now.
func (b *redisBackend) watch(l *Lease, sent time.Time) func() {
	name := b.keys(l.key).channel
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return func() {}
	}
	set := b.subscribeLocked(name)
	set.leases[l] = struct{}{}
	missed := set.preempted >= l.token && !set.preemptedAt.Before(sent)
	b.mu.Unlock()
	if missed {
		l.preempt()
	}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(set.leases, l)
		b.dropLocked(name, set)
	}
}

// operators is the channel on which evict.lua tells every Locker of the
// prefix which holders a ForceRelease removed. A key's channels are
// "<prefix>{<key>}:r": no key's channel is this one.
func (b *redisBackend) operators() string { return b.prefix + "!operators" }

// watchOperators subscribes, for the Locker's life, to the operators'
// channel: evicted is called with the key and the notice of every
// ForceRelease of the prefix. A failed subscribe only costs latency: a
// removed lease still learns of it at its next renewal.
func (b *redisBackend) watchOperators(evicted func(key, notice string)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done || b.onOperators != nil {
		return
	}
	b.onOperators = evicted
	b.subscribeLocked(b.operators()).operators = true
}

// subscribeLocked returns the subscribers of channel name, subscribing to
// it first if nobody listens yet. b.mu is held.
func (b *redisBackend) subscribeLocked(name string) *subscribers {
	if b.ps == nil {
		b.ps = b.c.Subscribe(context.Background())
		msgs := b.ps.ChannelWithSubscriptions()
		b.wg.Add(1)
		go b.dispatch(msgs)
	}
	set := b.subs[name]
	if set == nil {
		set = &subscribers{chans: make(map[chan int64]string), leases: make(map[*Lease]struct{}), ready: make(chan struct{})}
		b.subs[name] = set
		// A failed subscribe only costs latency: waiters fall back to
		// polling, preempted leases to their renewal.
		_ = b.ps.Subscribe(context.Background(), name)
	}
	return set
}

// dropLocked unsubscribes from channel name when set has nobody left. b.mu
// is held.
func (b *redisBackend) dropLocked(name string, set *subscribers) {
	if len(set.chans) == 0 && len(set.leases) == 0 && !set.operators && b.subs[name] == set {
		delete(b.subs, name)
		if !b.done {
			_ = b.ps.Unsubscribe(context.Background(), name)
		}
	}
}

// subscribeWait bounds how long a waiter waits for Redis to confirm its
// subscription before it relies on polling alone.
const subscribeWait = time.Second

type subscribers struct {
	chans     map[chan int64]string // waiters' wake-ups, by waiter id
	leases    map[*Lease]struct{}   // held leases that a Preempt acquire may end
	ready     chan struct{}         // closed when Redis confirms the subscription
	confirmed bool
	operators bool // the operators' channel (watchOperators): never dropped
	// The highest token a preemption notice named, and when it came.
	preempted   int64
	preemptedAt time.Time
}

// dispatch delivers channel messages: "p<token>" preempts the watched leases
// with a token up to it, "f<token>:<owner>" tells those of owner (or all, for
// "") that ForceRelease removed them, "t<token>" the one of that token,
// "g<token>:<waiter>" tells a waiter that
// a release handed it the key (the others sleep on); anything else (a
// release) wakes the waiters.
func (b *redisBackend) dispatch(msgs <-chan any) {
	defer b.wg.Done()
	for m := range msgs {
		var preempted, evicted, check []*Lease
		var operatorNotices [][2]string
		b.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			set := b.subs[m.Channel]
			if set == nil || m.Kind != "subscribe" {
				break
			}
			if !set.confirmed {
				set.confirmed = true
				close(set.ready)
			} else {
				// Subscribed again after a reconnect: a release sent
				// meanwhile was missed too.
				for ch := range set.chans {
					select {
					case ch <- 0:
					default:
					}
				}
			}
			// A preemption before the subscription (or during the outage)
			// was missed: the leases' renewal, made due now, finds it.
			for l := range set.leases {
				check = append(check, l)
			}
		case *redis.Message:
			set := b.subs[m.Channel]
			if set == nil {
				break
			}
			if set.operators {
				if n, rest, ok := strings.Cut(m.Payload, ":"); ok {
					if size, err := strconv.Atoi(n); err == nil && size >= 0 && size <= len(rest) {
						operatorNotices = append(operatorNotices, [2]string{rest[:size], rest[size:]})
					}
				}
				break
			}
			if top, ok := strings.CutPrefix(m.Payload, "p"); ok {
				upTo, _ := strconv.ParseInt(top, 10, 64)
				set.preempted, set.preemptedAt = max(set.preempted, upTo), time.Now()
				for l := range set.leases {
					if l.token <= upTo {
						preempted = append(preempted, l)
					}
				}
				break
			}
			if rest, ok := strings.CutPrefix(m.Payload, "g"); ok {
				top, waiter, _ := strings.Cut(rest, ":")
				token, _ := strconv.ParseInt(top, 10, 64)
				for ch, w := range set.chans {
					if w == waiter && token > 0 {
						grant(ch, token)
					}
				}
				break
			}
			if rest, ok := strings.CutPrefix(m.Payload, "t"); ok {
				token, _ := strconv.ParseInt(rest, 10, 64)
				for l := range set.leases {
					if l.token == token {
						evicted = append(evicted, l)
					}
				}
			}
			if rest, ok := strings.CutPrefix(m.Payload, "f"); ok {
				top, owner, _ := strings.Cut(rest, ":")
				upTo, _ := strconv.ParseInt(top, 10, 64)
				for l := range set.leases {
					if l.token <= upTo && (owner == "" || owner == l.owner) {
						evicted = append(evicted, l)
					}
				}
			}
			for ch := range set.chans {
				select {
				case ch <- 0:
				default:
				}
			}
		}
		onOperators := b.onOperators
		b.mu.Unlock()
		for _, n := range operatorNotices {
			onOperators(n[0], n[1])
		}
		for _, l := range preempted {
			l.preempt()
		}
		for _, l := range evicted {
			l.evicted()
		}
		for _, l := range check {
			l.e.renewNow(l)
		}
	}
}

// grant puts token in ch, in place of a wake-up already waiting there.
func grant(ch chan int64, token int64) {
	for {
		select {
		case ch <- token:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

func (b *redisBackend) close() error {
	b.mu.Lock()
	b.done = true
	ps := b.ps
	b.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	b.wg.Wait()
	return err
}
