package lockcore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/glob"
	"github.com/jobguard/jobguard/internal/rediskey"
)

// Defaults of ScanOptions.
const (
	// DefaultScanCount is the COUNT of each SCAN call of ScanKeys when
	// ScanOptions.Count is zero.
	DefaultScanCount = 1000
	// DefaultScanCalls is how many SCAN calls one ScanKeys call makes at
	// most when ScanOptions.Calls is zero.
	DefaultScanCalls = 10
	// DefaultScanLimit is how many keys one ScanKeys call returns at most
	// when ScanOptions.Limit is zero.
	DefaultScanLimit = 100
)

// ScanOptions bound one ScanKeys call. A nil *ScanOptions means all
// defaults.
type ScanOptions struct {
	// Count is the COUNT hint of each SCAN call: about how many Redis keys
	// one call looks at. Zero means DefaultScanCount; must not be negative.
	Count int
	// Calls bounds the SCAN calls of one ScanKeys call (on a Cluster, over
	// all its masters). Zero means DefaultScanCalls; must not be negative.
	Calls int
	// Limit bounds the keys returned. Zero means DefaultScanLimit; must not
	// be negative.
	Limit int
}

// ScanKeys returns a page of the keys with a live holder that match
// pattern (Keys' Redis glob syntax), and the cursor of the next page: ""
// when the keyspace has been walked to its end. cursor is "" for the first
// page, then the cursor a call returned. Unlike Keys, its cost does not grow
// with the keyspace: at most opt's Calls SCAN calls of COUNT opt's Count,
// and pipelined liveness checks of the keys found, with no script (a GET
// each, and a ZCOUNT for a key whose holders are in the sorted form): as
// many keys as the page has room for, then twice as many at a time, so a
// page can hold fewer keys than Limit (even none) while the cursor is not
// "". Each
// page is sorted; the pages together are not. As with SCAN, a key may be
// reported twice, or after it was released; a key held throughout is
// reported, except that a page ending inside a SCAN batch while Redis shrinks
// its table may miss one. It returns ErrInvalid
// for a negative option or a cursor that no call returned, and wraps Redis
// errors.
func (l *RedisLocker) ScanKeys(ctx context.Context, pattern, cursor string, opt *ScanOptions) ([]string, string, error) {
	var o ScanOptions
	if opt != nil {
		o = *opt
	}
	if o.Count < 0 || o.Calls < 0 || o.Limit < 0 {
		return nil, "", fmt.Errorf("%w: ScanOptions{Count: %d, Calls: %d, Limit: %d}: must not be negative", ErrInvalid, o.Count, o.Calls, o.Limit)
	}
	o.Count, o.Calls, o.Limit = orDefault(o.Count, DefaultScanCount), orDefault(o.Calls, DefaultScanCalls), orDefault(o.Limit, DefaultScanLimit)
	at, err := parseScanCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	nodes, err := l.scanNodes(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("lockkit: scan keys %q: %w", pattern, err)
	}
	if at.node >= len(nodes) {
		return nil, "", fmt.Errorf("%w: cursor %q: no such node", ErrInvalid, cursor)
	}
	match := glob.Escape(l.r.prefix) + "{" + serverGlob(pattern) + "}:h"
	var out []string
	check := o.Limit // how many keys the next liveness check takes at least
	for calls := 0; calls < o.Calls; calls++ {
		c := nodes[at.node]
		found, next, err := c.Scan(ctx, at.scan, match, int64(o.Count)).Result()
		if err != nil {
			return nil, "", fmt.Errorf("lockkit: scan keys %q: %w", pattern, err)
		}
		cands := l.matching(found, pattern)
		if at.after != "" {
			// The batch of this cursor was looked at up to at.after.
			cands = cands[sort.SearchStrings(cands, at.after+"\x00"):]
		}
		// The liveness of as many keys as the page has room for, then twice
		// as many each time, at a time: a batch of a large keyspace holds
		// more keys than a page, and most of them may be released ones.
		for len(cands) > 0 {
			room := o.Limit - len(out)
			chunk := cands[:min(len(cands), max(room, check))]
			cands = cands[len(chunk):]
			if check < o.Count {
				check *= 2
			}
			live, err := l.r.liveKeys(ctx, c, chunk)
			if err != nil {
				return nil, "", fmt.Errorf("lockkit: scan keys %q: %w", pattern, err)
			}
			if len(live) >= room && (len(live) > room || len(cands) > 0) {
				// The rest of this batch is the next page's: the same SCAN
				// cursor, after the last key shown.
				out = append(out, live[:room]...)
				sort.Strings(out)
				return out, scanCursor{node: at.node, scan: at.scan, after: live[room-1]}.String(), nil
			}
			out = append(out, live...)
		}
		at = scanCursor{node: at.node, scan: next}
		if next == 0 {
			if at.node+1 == len(nodes) {
				sort.Strings(out)
				return out, "", nil
			}
			at.node++
		}
		if len(out) == o.Limit {
			break
		}
	}
	sort.Strings(out)
	return out, at.String(), nil
}

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// serverGlob is the part of pattern that SCAN's MATCH can filter by: the
// pattern itself when its escaped form means the same ('?' would not: a
// '{', '}' or '%' of a key is stored as three bytes), otherwise "*";
// glob.Match decides in every case.
func serverGlob(pattern string) string {
	if strings.ContainsAny(pattern, "[?{}%") {
		return "*"
	}
	return pattern
}

// matching returns, sorted, the keys of the holders keys found (as SCAN
// returns them) that match pattern.
func (l *RedisLocker) matching(found []string, pattern string) []string {
	var out []string
	for _, k := range found {
		if key := unescape(strings.TrimSuffix(strings.TrimPrefix(k, l.r.prefix+"{"), "}:h")); glob.Match(pattern, key) {
			out = append(out, key)
		}
	}
	sort.Strings(out)
	return out
}

// liveKeys returns the keys on c that have a live holder, in their order,
// with no script: one pipelined round trip of GETs, and one of ZCOUNTs for
// the keys whose holders are in the sorted form. A plain form holds one
// holder until it expires, or what its release left, which starts with "~"
// (plain_release.lua); in the sorted form a holder is scored by its expiry,
// and the records that outlive one by negative scores (acquire_core.lua),
// so that a live holder is one scored after the server's time, as
// inspect.lua reads them.
func (b *redisBackend) liveKeys(ctx context.Context, c redis.Cmdable, keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	gets := make([]*redis.StringCmd, len(keys))
	var now *redis.TimeCmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		for i, k := range keys {
			gets[i] = p.Get(ctx, b.keys(k).holders)
		}
		return nil
	})
	held := make([]bool, len(keys))
	var sorted []int
	for i, cmd := range gets {
		v, err := cmd.Result()
		switch {
		case err == nil:
			held[i] = !strings.HasPrefix(v, "~")
		case errors.Is(err, redis.Nil):
		case redis.HasErrorPrefix(err, "WRONGTYPE"):
			sorted = append(sorted, i)
		default:
			return nil, err
		}
	}
	if len(sorted) > 0 {
		t, err := now.Result()
		if err != nil {
			return nil, err
		}
		after := "(" + strconv.FormatInt(t.UnixMilli(), 10)
		counts := make([]*redis.IntCmd, len(sorted))
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j, i := range sorted {
				counts[j] = p.ZCount(ctx, b.keys(keys[i]).holders, after, "+inf")
			}
			return nil
		})
		for j, i := range sorted {
			n, err := counts[j].Result()
			switch {
			case err == nil:
				held[i] = n > 0
			case redis.HasErrorPrefix(err, "WRONGTYPE"):
				held[i] = true // taken again in the plain form meanwhile
			default:
				return nil, err
			}
		}
	}
	var out []string
	for i, k := range keys {
		if held[i] {
			out = append(out, k)
		}
	}
	return out, nil
}

// scanNodes returns the clients that SCAN walks, in a stable order: the
// Cluster's masters by address, or the one client.
func (l *RedisLocker) scanNodes(ctx context.Context) ([]redis.Cmdable, error) {
	cc, ok := l.r.c.(*redis.ClusterClient)
	if !ok {
		return []redis.Cmdable{l.r.c}, nil
	}
	var (
		mu      sync.Mutex
		masters []*redis.Client
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock() // called on every master at once
		defer mu.Unlock()
		masters = append(masters, c)
		return nil
	})
	sort.Slice(masters, func(i, j int) bool { return masters[i].Options().Addr < masters[j].Options().Addr })
	out := make([]redis.Cmdable, len(masters))
	for i, m := range masters {
		out[i] = m
	}
	return out, err
}

// scanCursor is where a ScanKeys page ends: the node, the SCAN cursor on
// it, and the last key shown of that cursor's batch ("" when none was).
type scanCursor struct {
	node  int
	scan  uint64
	after string
}

// String returns the cursor as ScanKeys returns it:
// "<node>.<scan cursor>[.<key after>]", the key escaped as in a URL query.
func (c scanCursor) String() string {
	s := strconv.Itoa(c.node) + "." + strconv.FormatUint(c.scan, 10)
	if c.after != "" {
		s += "." + rediskey.Escape(c.after, "%.")
	}
	return s
}

func parseScanCursor(s string) (scanCursor, error) {
	if s == "" {
		return scanCursor{}, nil
	}
	bad := fmt.Errorf("%w: cursor %q: not a cursor that ScanKeys returned", ErrInvalid, s)
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return scanCursor{}, bad
	}
	node, err1 := strconv.Atoi(parts[0])
	scan, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || node < 0 {
		return scanCursor{}, bad
	}
	c := scanCursor{node: node, scan: scan}
	if len(parts) == 3 {
		if c.after = unescape(parts[2]); c.after == "" {
			return scanCursor{}, bad
		}
	}
	return c, nil
}
