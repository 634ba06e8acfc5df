package lockcore

// redisBackend: the calls of the scripts (acquire, release, renew, extend,
// free, evict, inspect), pipelined per server.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/rediskey"
)

type redisBackend struct {
	c      redis.UniversalClient
	prefix string        // escaped
	grace  time.Duration // how long a released holder is remembered
	acks   replicaAcks   // the replicas a lease write waits for
	lanes  *lanes        // WithBatching's lanes, nil without it

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

// plainAcquireArgs are the arguments of plain_acquire.lua, in the order of
// the table at its top (list lays them out).
type plainAcquireArgs struct {
	Tail string // the holder's member after its token: ":<acquire id>:<owner>:<escaped label>"
	TTL  time.Duration
}

// list lays a out as plain_acquire.lua's ARGV.
func (a *plainAcquireArgs) list() []any { return []any{a.Tail, ms(a.TTL)} }

// plainReleaseArgs are the arguments of plain_release.lua, in the order of
// the table at its top (list lays them out).
type plainReleaseArgs struct {
	Member string
	Grace  time.Duration // the client's retry window
	Record string        // what the key keeps: "~<token>."
}

// list lays a out as plain_release.lua's ARGV.
func (a *plainReleaseArgs) list() []any { return []any{a.Member, ms(a.Grace), a.Record} }

// plain reports whether r can use the plain form of a holders key
// (plain_acquire.lua): limit 1, no waiting, queue, epoch, Coalesce,
// Supersede, Preempt, TakeReservation or Park.
func plain(r *request) bool {
	return r.limit == 1 && r.waiter == "" && !r.fair && r.epoch == 0 && r.mode != modeCoalesce &&
		r.mode != modePreempt && !r.takeReserved && r.park == ""
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

// flag is a script's boolean argument: "1" for true, "" for false (the
// scripts test it with == '1').
func flag(b bool) string {
	if b {
		return "1"
	}
	return ""
}

// acquireArgs are the arguments of every acquire script, in the order of
// the table at the top of acquire_core.lua (list lays them out).
type acquireArgs struct {
	Owner     string
	TTL       time.Duration
	Limit     int
	Waiter    string // the waiter id, "" when the call does not wait
	Fair      bool
	WaiterTTL time.Duration
	Epoch     int64 // 0 for none
	EpochKeep time.Duration
	AcquireID string
	Label     string // escaped (escapeLabel)
	// Since is when a Coalesce call's work was asked for (server us), -1
	// (or 0) for its first attempt.
	Since int64
	// TakeReserved replaces a live reservation carrying Label (TakeReservation).
	TakeReserved bool
	// Mode is the FollowUp's mode (modeFinal for a final Coalesce call);
	// modeNone also for a KeepNewest or Preempt call that is no follow-up
	// (neither waiting nor parking, or waiting for its own earlier delivery).
	Mode    followUpMode
	Channel string // the release channel
	// First is the call's first attempt (not a waiting call's later one).
	First     bool
	Grace     time.Duration // Preempt.Grace
	ParkEntry string        // the parked-queue entry, "" when the call does not park
	ParkKeep  time.Duration // how long the parked queue and follow-up records are kept
	Order     int64         // KeepNewest/Preempt Order, 0 for none
	EpochTag  string
}

// list lays a out as the scripts' ARGV.
func (a *acquireArgs) list() []any {
	return []any{a.Owner, ms(a.TTL), a.Limit, a.Waiter, flag(a.Fair), ms(a.WaiterTTL), a.Epoch, ms(a.EpochKeep), a.AcquireID, a.Label,
		a.Since, flag(a.TakeReserved), string(a.Mode), a.Channel, flag(a.First), ms(a.Grace), a.ParkEntry, ms(a.ParkKeep), a.Order, a.EpochTag}
}

// acquireArgsOf are the acquire script's arguments for r.
func (b *redisBackend) acquireArgsOf(r *request) acquireArgs {
	a := acquireArgs{Owner: r.owner, TTL: r.ttl, Limit: r.limit, Waiter: r.waiter, Fair: r.fair, WaiterTTL: r.waiterTTL,
		Epoch: r.epoch, EpochKeep: r.epochTTL, AcquireID: r.aid, Label: escapeLabel(r.label), TakeReserved: r.takeReserved,
		Mode: r.mode, Channel: b.keys(r.key).channel, First: !r.later, Grace: r.grace, ParkEntry: parkEntry(r), ParkKeep: parkKeep,
		Order: r.order, EpochTag: r.epochTag}
	if r.mode == modeCoalesce {
		a.Since = r.since
		if r.final {
			a.Mode = modeFinal
		}
	}
	if r.mode.keepsNewest() && ((r.waiter == "" && r.park == "") || r.behindOwnRun) {
		a.Mode = modeNone // only a waiting or parking call is a follow-up
	}
	return a
}

// acquireKeys are the keys of every acquire script (see acquire_core.lua).
func (k lockKeys) acquireKeys() []string {
	return []string{k.holders, k.meta, k.queue, k.waiters, k.fence, k.cover, k.parked, k.follow}
}

// acquireCall is the acquire script of r's parts, with its keys and
// arguments (see acquire_core.lua and the files of the parts).
func (b *redisBackend) acquireCall(r *request) (*redis.Script, []string, []any) {
	a := b.acquireArgsOf(r)
	return acquireScripts[partsOf(&a)], b.keys(r.key).acquireKeys(), a.list()
}

func (b *redisBackend) acquire(ctx context.Context, r *request) (acquireResult, error) {
	res, err := b.acquireOnce(ctx, r)
	if err == nil && res.ok && res.left > 0 && b.acks.n > 0 {
		// Found taken for this call: made so by another connection's write,
		// which this one's WAIT did not count.
		if err := b.confirm(ctx, r, res.token); err != nil {
			return acquireResult{}, err
		}
		res.left = 0
	}
	return res, err
}

func (b *redisBackend) acquireOnce(ctx context.Context, r *request) (acquireResult, error) {
	if plain(r) && !b.isSorted(r.key) {
		a := plainAcquireArgs{Tail: ":" + r.aid + ":" + r.owner + ":" + escapeLabel(r.label), TTL: r.ttl}
		v, err := b.script(ctx, r.key, plainAcquireScript, []string{b.base(r.key) + ":h"}, a.list()).Result()
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
			return conflictOf(r, vals)
		case len(vals) != 1 || toInt(vals[0]) != -9:
			return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
		}
		// The key's holders are in the sorted set: acquire.lua.
		b.markSorted(r.key)
	}
	script, keys, args := b.acquireCall(r)
	vals, err := b.script(ctx, r.key, script, keys, args).Slice()
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
		if len(vals) > 4 {
			res.otherTag, _ = vals[4].(string)
		}
		return res, nil
	case -1:
		if len(vals) < 2 {
			return acquireResult{}, fmt.Errorf("unexpected acquire reply %v", vals)
		}
		res := acquireResult{lastEpoch: toInt(vals[1])}
		if len(vals) > 2 {
			res.otherTag, _ = vals[2].(string)
		}
		return res, nil
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
	return conflictOf(r, vals)
}

// conflictOf reads the acquire script's reply for a held key, for the call
// r.
func conflictOf(r *request, vals []any) (acquireResult, error) {
	key := r.key
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
	if len(vals) > 8 {
		if n := int(toInt(vals[8])); n > 0 && n < r.limit {
			c.Limit = n // a holder's smaller limit applied
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

// pipelineScripts sends n script calls in one pipeline, call i with send(p,
// i, false) (EVALSHA), and sends again, with send(p, i, true) (EVAL), the
// calls that found the script cache empty (after a Redis restart).
func (b *redisBackend) pipelineScripts(ctx context.Context, n int, send func(p redis.Pipeliner, i int, eval bool) *redis.Cmd) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	b.scriptsOn(ctx, b.c, all, cmds, send, nil)
	return cmds
}

// scriptsOn sends the calls idx on c in one pipeline, call i with send(p, i,
// false) into cmds[i], and again, with send(p, i, true) (EVAL), those that
// found the script cache empty. When acked says yes of any call sent, the
// pipeline ends in WAIT (see ackedScripts), and each of those calls that
// succeeded gets the error of a WAIT that counted too few replicas; acked
// nil: no call waits.
func (b *redisBackend) scriptsOn(ctx context.Context, c pipeliner, idx []int, cmds []*redis.Cmd, send func(p redis.Pipeliner, i int, eval bool) *redis.Cmd, acked func(int) bool) {
	short := make(map[int]error)
	run := func(idx []int, eval bool) {
		var w *redis.Cmd
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			wait := false
			for _, i := range idx {
				cmds[i] = send(p, i, eval)
				wait = wait || (acked != nil && acked(i))
			}
			if wait {
				w = p.Do(ctx, "wait", b.acks.n, ms(b.acks.timeout))
			}
			return nil
		})
		if w != nil {
			err := b.ackErr(w)
			for _, i := range idx {
				if acked(i) {
					short[i] = err
				}
			}
		}
	}
	run(idx, false)
	var again []int
	for _, i := range idx {
		if err := cmds[i].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		run(again, true)
	}
	for i, err := range short {
		if err != nil && cmds[i].Err() == nil {
			cmds[i].SetErr(err)
		}
	}
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
	// the key is remembered (isSorted). Both kinds of call go in one
	// pipeline; only those the plain script deferred go in a second.
	isPlain := make(map[*Lease]bool, len(leases))
	for i, l := range leases {
		var end ending
		if ends != nil {
			end = ends[i]
		}
		if l.plain && l.member != "" && end.done <= 0 && end.coalesce <= 0 && l.holdFor(end) <= 0 && !end.handOver && !b.isSorted(l.key) {
			isPlain[l] = true
		}
	}
	call := func(l *Lease) (*redis.Script, []string, []any) {
		if isPlain[l] {
			a := plainReleaseArgs{Member: l.member, Grace: b.grace, Record: "~" + l.member[:strings.IndexByte(l.member, ':')] + "."}
			return plainReleaseScript, b.plainKeys(l.key, l.member), a.list()
		}
		var end ending
		if ends != nil {
			end = ends[idx[l]]
		}
		return b.releaseCall(l, end)
	}
	// A release that records a completion or what a run covered waits: a
	// record lost in a failover would let the work run again.
	waited := func(l *Lease) bool {
		return ends != nil && (ends[idx[l]].done > 0 || ends[idx[l]].coalesce > 0)
	}
	// 1 or 0, {1, id of the parked job the key was reserved for}, or {2,
	// ms the release is held for} (with OnParked).
	result := func(l *Lease, c *redis.Cmd) {
		v, err := c.Result()
		if err != nil {
			errs = append(errs, err)
			return
		}
		if vals, ok := v.([]any); ok && len(vals) == 2 {
			v = vals[0]
			if id, _ := vals[1].(string); id != "" {
				l.parked.Store(&id)
			}
			if toInt(v) == 2 {
				l.holdLeft.Store(int64(time.Duration(max(toInt(vals[1]), 1)) * time.Millisecond))
				v = int64(1)
			}
		}
		held[idx[l]] = toInt(v) == 1
	}
	var deferred []*Lease
	for i, c := range b.runEach(ctx, leases, call, waited) {
		l := leases[i]
		if !isPlain[l] {
			result(l, c)
			continue
		}
		n, err := c.Int64()
		switch {
		case err != nil:
			errs = append(errs, err)
		case n == -9:
			b.markSorted(l.key)
			delete(isPlain, l)
			deferred = append(deferred, l)
		default:
			held[idx[l]] = n == 1
		}
	}
	if len(deferred) > 0 {
		for i, c := range b.runEach(ctx, deferred, call, waited) {
			result(deferred[i], c)
		}
	}
	return held, errors.Join(errs...)
}

// releaseArgs are the arguments of every release script, in the order of
// the table at the top of release.lua (list lays them out).
type releaseArgs struct {
	Member    string // the lease's member, "" to find the holder by AcquireID
	AcquireID string
	Channel   string // the release channel
	Grace     time.Duration
	DoneLabel string        // the label to record as completed (escaped), "" for none
	DoneFor   time.Duration // how long the completion is remembered
	// RefuseFor: with Member "", how long an acquire with AcquireID stays
	// refused when no holder has it.
	RefuseFor        time.Duration
	CoalesceFor      time.Duration // how long a Coalesce run's success is remembered, 0 for none
	Hold             time.Duration // HoldAtLeast left to the holder, 0 for none
	ReserveForParked bool          // reserve the left key for the oldest parked job
	HandOver         bool          // the hand-over of a held release
}

// list lays a out as the scripts' ARGV.
func (a *releaseArgs) list() []any {
	return []any{a.Member, a.AcquireID, a.Channel, ms(a.Grace), a.DoneLabel, ms(a.DoneFor), ms(a.RefuseFor), ms(a.CoalesceFor), ms(a.Hold),
		flag(a.ReserveForParked), flag(a.HandOver)}
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
	a := releaseArgs{Member: l.member, AcquireID: l.aid, Channel: k.channel, Grace: b.grace, DoneFor: end.done, RefuseFor: l.ttlLocked(),
		CoalesceFor: end.coalesce, Hold: l.holdFor(end), ReserveForParked: l.onParked != nil, HandOver: end.handOver}
	if end.done > 0 {
		a.DoneLabel = escapeLabel(l.label)
	}
	return releaseScripts[releaseModesOf(&a)],
		[]string{k.holders, k.waiters, k.cover, k.released, k.queue, k.fence, k.parked, rec},
		a.list()
}

// runEach runs the script call(lease) gives once for each lease, with the
// keys and arguments it gives: one call alone (see b.call), more in one
// pipeline (see pipelineScripts); when the Locker waits for replicas, the
// calls of the leases that waited says yes are acknowledged (ackedScripts).
func (b *redisBackend) runEach(ctx context.Context, leases []*Lease, call func(*Lease) (*redis.Script, []string, []any), waited func(*Lease) bool) []*redis.Cmd {
	if len(leases) == 1 {
		l := leases[0]
		s, keys, args := call(l)
		return []*redis.Cmd{b.call(ctx, l.key, waited(l), s, keys, args)}
	}
	send := func(leases []*Lease) func(p redis.Pipeliner, i int, eval bool) *redis.Cmd {
		return func(p redis.Pipeliner, i int, eval bool) *redis.Cmd {
			s, keys, args := call(leases[i])
			if eval {
				return s.Eval(ctx, p, keys, args...)
			}
			return s.EvalSha(ctx, p, keys, args...)
		}
	}
	var acked, rest []*Lease
	if b.acks.n > 0 {
		for _, l := range leases {
			if waited(l) {
				acked = append(acked, l)
			} else {
				rest = append(rest, l)
			}
		}
	}
	if len(acked) == 0 {
		return b.pipelineScripts(ctx, len(leases), send(leases))
	}
	byLease := make(map[*Lease]*redis.Cmd, len(leases))
	for i, c := range b.ackedScripts(ctx, len(acked), func(i int) string { return acked[i].key }, send(acked)) {
		byLease[acked[i]] = c
	}
	if len(rest) > 0 {
		for i, c := range b.pipelineScripts(ctx, len(rest), send(rest)) {
			byLease[rest[i]] = c
		}
	}
	cmds := make([]*redis.Cmd, len(leases))
	for i, l := range leases {
		cmds[i] = byLease[l]
	}
	return cmds
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
	ttlArgs := make(map[int64]any, 1)
	cmds := b.writeScripts(ctx, len(calls), func(c int) string { return leases[calls[c][0]].key }, func(p redis.Pipeliner, c int, eval bool) *redis.Cmd {
		return p.Do(ctx, renewCommand(eval, leases, calls[c], ttls, ttlArgs)...)
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
			case vals[j] == 4:
				errs[i] = errCancelAsked
			case vals[j] != 1:
				errs[i] = errNotHeld
			}
		}
	}
	return errs
}

// renewCommand is the EVALSHA (EVAL when eval) of renew.lua for the leases
// of idx, with their ttls: it lays out the script's KEYS and ARGV as the
// table at its top names them, built whole from the leases' boxed keys and
// members (renewArgs). Leases mostly share a TTL: the call states one
// (common_ttl, boxed once per value in ttlArgs), and only a lease with
// another, or one that claimed an epoch, carries its own (own_ttl).
func renewCommand(eval bool, leases []*Lease, idx []int, ttls []time.Duration, ttlArgs map[int64]any) []any {
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
	return cmd
}

// extendArgs are the arguments of extend.lua, in the order of the table at
// its top (list lays them out).
type extendArgs struct {
	Member string
	TTL    time.Duration
	Epoch  bool // the lease claimed an epoch: its epoch key is kept as long
	// Renew is a renewal, which never shortens the lease; false for Extend,
	// which sets it.
	Renew bool
}

// list lays a out as extend.lua's ARGV.
func (a *extendArgs) list() []any { return []any{a.Member, ms(a.TTL), flag(a.Epoch), flag(a.Renew)} }

func (b *redisBackend) extend(ctx context.Context, leases []*Lease, ttls []time.Duration, renew bool) []error {
	if renew && len(leases) > 1 {
		return b.renewMany(ctx, leases, ttls)
	}
	var cmds []*redis.Cmd
	if len(leases) == 1 && b.lanes != nil { // rides the lane of its key
		k := b.keys(leases[0].key)
		a := extendArgs{Member: leases[0].member, TTL: ttls[0], Epoch: leases[0].epoch, Renew: renew}
		cmds = []*redis.Cmd{b.script(ctx, leases[0].key, extendScript, []string{k.holders, k.meta}, a.list())}
	} else {
		cmds = b.writeScripts(ctx, len(leases), func(i int) string { return leases[i].key }, func(p redis.Pipeliner, i int, eval bool) *redis.Cmd {
			k := b.keys(leases[i].key)
			a := extendArgs{Member: leases[i].member, TTL: ttls[i], Epoch: leases[i].epoch, Renew: renew}
			if eval {
				return extendScript.Eval(ctx, p, []string{k.holders, k.meta}, a.list()...)
			}
			return extendScript.EvalSha(ctx, p, []string{k.holders, k.meta}, a.list()...)
		})
	}
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
		case n == 4:
			errs[i] = errCancelAsked
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

// reserveArgs are the arguments of reserve.lua, in the order of the table
// at its top (list lays them out).
type reserveArgs struct {
	Member         string // the lease's member
	ReservedMember string // the reservation's member
	TTL            time.Duration
}

// list lays a out as reserve.lua's ARGV.
func (a *reserveArgs) list() []any { return []any{a.Member, a.ReservedMember, ms(a.TTL)} }

func (b *redisBackend) reserve(ctx context.Context, l *Lease, member string, ttl time.Duration) (bool, error) {
	k := b.keys(l.key)
	a := reserveArgs{Member: l.member, ReservedMember: member, TTL: ttl}
	n, err := b.script(ctx, l.key, reserveScript, []string{k.holders, k.fence}, a.list()).Int64()
	return n == 1, err
}

// freeArgs are the arguments of free.lua, in the order of the table at its
// top (list lays them out).
type freeArgs struct {
	Label   string // escaped (escapeLabel)
	Channel string // the release channel
	Grace   time.Duration
}

// list lays a out as free.lua's ARGV.
func (a *freeArgs) list() []any { return []any{a.Label, a.Channel, ms(a.Grace)} }

func (b *redisBackend) free(ctx context.Context, key, label string) (bool, error) {
	k := b.keys(key)
	a := freeArgs{Label: escapeLabel(label), Channel: k.channel, Grace: b.grace}
	n, err := b.call(ctx, key, false, freeScript, []string{k.holders, k.waiters, k.fence, k.parked}, a.list()).Int64()
	return n == 1, err
}

// unpark removes entry from key's parked queue (unpark.lua), acknowledged
// as a lease write is: a removal lost with a failover would keep the entry.
func (b *redisBackend) unpark(ctx context.Context, key, entry string) error {
	return b.script(ctx, key, unparkScript, []string{b.keys(key).parked}, []any{entry}).Err()
}

// evictArgs are the arguments of evict.lua, in the order of the table at
// its top (list lays them out).
type evictArgs struct {
	Owner     string // "" for every holder
	Channel   string // the release channel
	CallID    string
	Grace     time.Duration
	Token     int64  // the one holder to remove, 0 for any
	Operators string // the operators' channel of the prefix
	Lock      string // the lock's key, as the Locker names it
}

// list lays a out as evict.lua's ARGV.
func (a *evictArgs) list() []any {
	return []any{a.Owner, a.Channel, a.CallID, ms(a.Grace), a.Token, a.Operators, a.Lock}
}

func (b *redisBackend) evict(ctx context.Context, key, owner string, token int64, call string) (int, error) {
	k := b.keys(key)
	a := evictArgs{Owner: owner, Channel: k.channel, CallID: call, Grace: b.grace, Token: token, Operators: b.operators(), Lock: key}
	return b.call(ctx, key, false, evictScript, []string{k.holders, k.waiters, k.fence}, a.list()).Int()
}

// cancelArgs are the arguments of cancel.lua, in the order of the table at
// its top (list lays them out).
type cancelArgs struct {
	Owner     string // "" for every holder
	Token     int64  // the one holder to ask, 0 for any
	Operators string // the operators' channel of the prefix
	Lock      string // the lock's key, as the Locker names it
	Keep      time.Duration
}

// list lays a out as cancel.lua's ARGV.
func (a *cancelArgs) list() []any { return []any{a.Owner, a.Token, a.Operators, a.Lock, ms(a.Keep)} }

func (b *redisBackend) cancel(ctx context.Context, key, owner string, token int64) (int, error) {
	k := b.keys(key)
	a := cancelArgs{Owner: owner, Token: token, Operators: b.operators(), Lock: key, Keep: cancelKeep}
	return b.call(ctx, key, false, cancelScript, []string{k.holders, k.fence}, a.list()).Int()
}

// leaveArgs are the arguments of leave.lua, in the order of the table at
// its top (list lays them out).
type leaveArgs struct {
	Waiter    string
	Channel   string // the release channel
	AcquireID string
}

// list lays a out as leave.lua's ARGV.
func (a *leaveArgs) list() []any { return []any{a.Waiter, a.Channel, a.AcquireID} }

func (b *redisBackend) leave(ctx context.Context, key, waiter, aid string) error {
	k := b.keys(key)
	a := leaveArgs{Waiter: waiter, Channel: k.channel, AcquireID: aid}
	return b.call(ctx, key, false, leaveScript, []string{k.queue, k.waiters, k.holders, k.fence}, a.list()).Err()
}

// inspectArgs are the arguments of inspect.lua, in the order of the table
// at its top (list lays them out).
type inspectArgs struct {
	CancelKeep time.Duration // how long an operator's request to stop is remembered
}

// list lays a out as inspect.lua's ARGV.
func (a *inspectArgs) list() []any { return []any{ms(a.CancelKeep)} }

func (b *redisBackend) inspect(ctx context.Context, key string) (*Info, error) {
	k := b.keys(key)
	a := inspectArgs{CancelKeep: cancelKeep}
	vals, err := b.call(ctx, key, false, inspectScript, []string{k.holders, k.waiters, k.parked}, a.list()).Slice()
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
	asked := map[int64]time.Duration{} // how long ago each holder asked to stop was asked
	if len(vals) > 3 && (len(vals)-3)%2 == 1 {
		pairs, _ := vals[len(vals)-1].([]any)
		for i := 0; i+1 < len(pairs); i += 2 {
			tok, _ := strconv.ParseInt(fmt.Sprint(pairs[i]), 10, 64)
			asked[tok] = time.Duration(max(toInt(pairs[i+1]), 0)) * time.Millisecond
		}
	}
	for i := 3; i+1 < len(vals); i += 2 {
		m, _ := vals[i].(string)
		tok, owner, label := parseMember(m)
		since, cancelling := asked[tok]
		info.Holders = append(info.Holders, Holder{Owner: owner, Label: label, Token: tok, TTL: time.Duration(toInt(vals[i+1])) * time.Millisecond,
			Reserved: reservedMember(m), Cancelling: cancelling, CancelAge: since})
	}
	return info, nil
}
