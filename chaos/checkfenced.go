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
// newer token (a write of a stale run never lands after a newer run's); and
// each write the fence refused (outcome "stale") had a token older than the
// newest its refusal named, and than an entry of its key's stream (a newer
// run did write). An entry a failover lost may explain the latter: then it
// is advisory.
func (h *history) checkFenced() []Violation {
	streams := map[string][]Record{} // fam/key → its entries
	wrote := map[string]Record{}     // fam/key entry ID → the write of it
	for _, r := range h.records {
		switch {
		case r.Ev == evEntry:
			streams[r.Fam+"/"+r.Key] = append(streams[r.Fam+"/"+r.Key], r)
		case r.Ev == evWrite && r.Entry != "":
			wrote[r.Fam+"/"+r.Key+" "+r.Entry] = r
		}
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
			v := h.violation(ruleFenced, r.Task, fmt.Sprintf("key %s: %s write of token %d refused as stale (newest %d), but no entry of the key's stream has a newer token", key, r.Kind, r.Token, r.Newest), r)
			if len(h.failovers) > 0 {
				v = advise(v, "the newer entry may have been lost with the "+h.failovers[0].describe(h.base))
			}
			vs = append(vs, v)
		}
	}
	return vs
}
