package lockcore

// The Lua scripts: their sources, embedded, and the assembly of one acquire
// and one release script per set of modes from their sections.

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/acquire_core.lua
	acquireCoreSrc string
	//go:embed scripts/acquire_coalesce.lua
	acquireCoalesceSrc string
	//go:embed scripts/acquire_keepnewest.lua
	acquireKeepNewestSrc string
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
	//go:embed scripts/release_coalesce.lua
	releaseCoalesceSrc string
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
	//go:embed scripts/unpark.lua
	unparkSrc string
	//go:embed scripts/reserve.lua
	reserveSrc string
	//go:embed scripts/evict.lua
	evictSrc string
	//go:embed scripts/cancel.lua
	cancelSrc string
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
	acquireScripts     = newScripts(partsAll, acquireSource)
	releaseScripts     = newScripts(releaseAll, releaseSource)
	plainAcquireScript = redis.NewScript(plainAcquireSrc)
	plainReleaseScript = redis.NewScript(plainReleaseSrc)
	extendScript       = redis.NewScript(extendSrc)
	leaveScript        = redis.NewScript(promoteSrc + leaveSrc)
	inspectScript      = redis.NewScript(inspectSrc)
	freeScript         = redis.NewScript(promoteSrc + freeSrc)
	unparkScript       = redis.NewScript(unparkSrc)
	reserveScript      = redis.NewScript(promoteSrc + reserveSrc)
	evictScript        = redis.NewScript(promoteSrc + evictSrc)
	cancelScript       = redis.NewScript(promoteSrc + cancelSrc)
	renewScript        = redis.NewScript(renewSrc)
)

// followUpMode is the mode of an acquire call's FollowUp, as the acquire
// scripts name it (their argument mode, see acquire_core.lua).
type followUpMode string

const (
	modeNone       followUpMode = ""
	modeCoalesce   followUpMode = "coalesce"   // Coalesce: acquire_coalesce.lua
	modeFinal      followUpMode = "final"      // Coalesce with Final, which covers no other: acquire_coalesce.lua
	modeKeepNewest followUpMode = "keepnewest" // KeepNewest: acquire_keepnewest.lua
	modePreempt    followUpMode = "preempt"    // Preempt: KeepNewest's part and acquire_preempt.lua
)

// coalesces tells whether the call is a Coalesce call, final or not.
func (m followUpMode) coalesces() bool { return m == modeCoalesce || m == modeFinal }

// keepsNewest tells whether the call is the key's one pending follow-up
// (KeepNewest and Preempt).
func (m followUpMode) keepsNewest() bool { return m == modeKeepNewest || m == modePreempt }

// acquireParts is a set of the parts of an acquire script, each in its own
// file, that only some calls need.
type acquireParts uint8

const (
	partCoalesce   acquireParts = 1 << iota // acquire_coalesce.lua
	partKeepNewest                          // acquire_keepnewest.lua
	partPreempt                             // acquire_preempt.lua
	partPark                                // acquire_park.lua
	partsAll       = partCoalesce | partKeepNewest | partPreempt | partPark
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

// acquireSource is the acquire script of the parts m: promote.lua,
// acquire_core.lua, what the files of the parts declare, and acquire.lua with
// their sections at its places (see acquire_core.lua). A part's code only
// acts when its arguments ask for it, so a script with more parts than a
// call needs gives the same answer; a plain waiting acquire runs the core
// alone.
func acquireSource(m acquireParts) string {
	parts := []string{acquireCoalesceSrc, acquireKeepNewestSrc, acquirePreemptSrc, acquireParkSrc}
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

// partsOf is the set of parts whose code a call with the arguments a needs:
// a Preempt call's later attempts only keep the newest.
func partsOf(a *acquireArgs) acquireParts {
	var m acquireParts
	if a.Mode.coalesces() {
		m |= partCoalesce
	}
	if a.Mode.keepsNewest() || a.Order > 0 {
		m |= partKeepNewest
	}
	if a.Mode == modePreempt && a.First && a.Waiter != "" {
		m |= partPreempt
	}
	if a.ParkEntry != "" {
		m |= partPark
	}
	return m
}

// releaseMode is the set of the options of a release call that need their
// own part of the release script.
type releaseMode uint8

const (
	releaseHold     releaseMode = 1 << iota // release_hold.lua: HoldAtLeast
	releaseCoalesce                         // release_coalesce.lua: a Coalesce run's success
	releaseDone                             // release_done.lua: a completed label
	releasePark                             // release_park.lua: reserve the key for a parked job
	releaseAll      = releaseHold | releaseCoalesce | releaseDone | releasePark
)

// releaseSource is the release script of the options m: promote.lua and
// release.lua with the hand-over (release_grant.lua, in every release
// script) and the sections of the options at its places. A section only
// acts when its arguments ask for it, so a script with more sections than a
// call needs gives the same answer.
func releaseSource(m releaseMode) string {
	parts := []string{releaseGrantSrc, releaseHoldSrc, releaseCoalesceSrc, releaseDoneSrc, releaseParkSrc}
	return inlineSource(promoteSrc, releaseSrc, parts, 1|uint(m)<<1)
}

// releaseModesOf is the set of options whose sections a release with the
// arguments a needs.
func releaseModesOf(a *releaseArgs) releaseMode {
	var m releaseMode
	if a.Hold > 0 {
		m |= releaseHold
	}
	if a.CoalesceFor > 0 {
		m |= releaseCoalesce
	}
	if a.DoneFor > 0 {
		m |= releaseDone
	}
	if a.ReserveForParked {
		m |= releasePark
	}
	return m
}
