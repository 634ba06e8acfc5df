package main

// What the checker knows of the fenced family's writes: the workers'
// records of each write (evWrite) and the entries of the keys' streams the
// driver read once the run was quiet (evEntry).

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// entryID orders the IDs of a stream's entries ("<ms>-<n>").
func entryID(id string) (ms, n int64) {
	a, b, _ := strings.Cut(id, "-")
	ms, _ = strconv.ParseInt(a, 10, 64)
	n, _ = strconv.ParseInt(b, 10, 64)
	return ms, n
}

func cmpEntry(a, b Record) int {
	am, an := entryID(a.Entry)
	bm, bn := entryID(b.Entry)
	if c := cmpInt(am, bm); c != 0 {
		return c
	}
	return cmpInt(an, bn)
}

// checkFenced: in each fenced key's stream no entry follows one with a
// newer token (a write of a stale run never lands after a newer run's), and
// its last value is not older than the newest one a worker set; and each
// write the fence refused (outcome "stale") had a token older than the
// newest its refusal named, and than an entry of its key's stream (a newer
// run did write). A write a failover lost may explain the last two: then
// they are advisory.
func (h *history) checkFenced() []Violation {
	streams := map[string][]Record{} // fam/key → its entries
	last := map[string]Record{}      // fam/key → its last value
	set := map[string]Record{}       // fam/key → the write of its last value with the newest token, of those that returned ok
	wrote := map[string]Record{}     // fam/key entry ID → the write of it
	for _, r := range h.records {
		key := r.Fam + "/" + r.Key
		switch {
		case r.Ev == evEntry && r.Kind == writeLast:
			last[key] = r
		case r.Ev == evEntry:
			streams[key] = append(streams[key], r)
		case r.Ev == evWrite && r.Kind == writeLast && r.Outcome == "ok" && r.Token > set[key].Token:
			set[key] = r
		case r.Ev == evWrite && r.Entry != "":
			wrote[key+" "+r.Entry] = r
		}
	}
	lost := func(v Violation) Violation {
		if len(h.failovers) > 0 {
			v = advise(v, "the newer write may have been lost with the "+h.failovers[0].describe(h.base))
		}
		return v
	}
	// writeOf is the write of entry e of key, or e when none is recorded.
	writeOf := func(key string, e Record) Record {
		if w, ok := wrote[key+" "+e.Entry]; ok {
			return w
		}
		return e
	}
	var vs []Violation
	for key, es := range streams {
		slices.SortStableFunc(es, cmpEntry)
		newest := 0
		for i, e := range es {
			if e.Token < es[newest].Token {
				n := es[newest]
				vs = append(vs, h.violation(ruleFenced, e.Task, fmt.Sprintf("key %s: entry %s (%s of run %d on %s, token %d) follows entry %s (%s of task %s on %s, token %d): a write with an older token landed after a newer one",
					key, e.Entry, e.Kind, e.Run, e.By, e.Token, n.Entry, n.Kind, n.Task, n.By, n.Token), writeOf(key, n), writeOf(key, e)))
				continue
			}
			if e.Token > es[newest].Token {
				newest = i
			}
		}
	}
	for _, r := range h.records {
		if r.Ev != evWrite || r.Outcome != "stale" {
			continue
		}
		key := r.Fam + "/" + r.Key
		newer := slices.IndexFunc(streams[key], func(e Record) bool { return e.Token > r.Token })
		switch {
		case r.Newest <= r.Token:
			vs = append(vs, h.violation(ruleFenced, r.Task, fmt.Sprintf("key %s: %s write of token %d refused as stale, naming token %d, not a newer one", key, r.Kind, r.Token, r.Newest), r))
		case newer < 0:
			vs = append(vs, lost(h.violation(ruleFenced, r.Task, fmt.Sprintf("key %s: %s write of token %d refused as stale (newest %d), but no entry of the key's stream has a newer token", key, r.Kind, r.Token, r.Newest), r)))
		}
	}
	for key, w := range set {
		switch l, ok := last[key]; {
		case !ok:
			vs = append(vs, lost(h.violation(ruleFenced, w.Task, fmt.Sprintf("key %s: no last value, though task %s set one with token %d", key, w.Task, w.Token), w)))
		case l.Token < w.Token:
			vs = append(vs, lost(h.violation(ruleFenced, l.Task, fmt.Sprintf("key %s: the last value is task %s's, token %d, older than the one task %s set with token %d", key, l.Task, l.Token, w.Task, w.Token), w)))
		}
	}
	return vs
}
