package cronguard

import (
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
)

const (
	// gapSamples is how many consecutive activations are inspected to find a
	// schedule's shortest interval, at most: those after gapHorizon are not.
	gapSamples = 1000
	// gapHorizon is how far ahead activations are inspected: a year, in which
	// every month, weekday and change of UTC offset comes round.
	gapHorizon = 366 * 24 * time.Hour
	// probedIntervals is how many intervals between activations the anchoring
	// check probes.
	probedIntervals = 8
	// maxWalk bounds the activations tickAt steps through in one call.
	maxWalk = 1 << 16
	// maxLookback bounds how far back tickAt looks for the previous activation.
	maxLookback = 100 * 365 * 24 * time.Hour
)

// How robfig/cron's SpecSchedule.Next behaves around a change of UTC offset
// (daylight saving time) in the schedule's time zone shapes the checks below.
// Next reads its argument on the zone's wall clock and steps the fields
// forward, adding absolute hours, minutes and seconds:
//
//   - In a gap (clocks go forward) the skipped wall times do not exist and
//     are no activations: New_York "30 2 * * *" does not fire that day. But a
//     minute step across the gap lands on the instant of the change with only
//     the minute field checked: Lord_Howe (02:00 becomes 02:30) "30 1 * * *"
//     fires at 01:30 and again at 02:30+11:00, half an hour later; Chatham
//     (02:45 becomes 03:45) "45 2 * * *" fires at 03:45+13:45.
//   - In an overlap (clocks go back) a repeated wall time may be an
//     activation twice (New_York "30 1 * * *": 01:30 EDT and 01:30 EST, an
//     hour apart) or once (Chatham "45 2 * * *" skips the second 02:45), and
//     an hour step across a half-hour change shifts the minutes: Lord_Howe
//     "0 3 * * *" goes from Saturday 03:00 to Monday 03:00.
//
// So Next depends only on the instant it is given, never on when anything
// started: it is anchored. Yet near a change it is not "the first activation
// after t" for one fixed set of activations: Lord_Howe "30 1 * * *" gives
// Next(01:30) = 02:30+11:00 but Next(01:59:59) = 01:30 the next day, and
// "0 3 * * *" gives Next(Saturday 03:00) = Monday 03:00 but Next(Sunday
// 02:45) = Sunday 03:00. The activations that count are those cron fires:
// the chain of Next from each activation, the same from any start well
// before.

// checkSchedule reports an error if s cannot name its ticks the same way on
// every replica, and returns the shortest interval between its activations
// among the next gapSamples in the gapHorizon after from (at least one
// interval), leaving out intervals across a change of UTC offset (see
// offsetChangeIn) unless there are no others.
func checkSchedule(s cron.Schedule, from time.Time) (time.Duration, error) {
	if d, ok := s.(cron.ConstantDelaySchedule); ok {
		return 0, fmt.Errorf("@every %s counts from when each replica started, so replicas disagree on the ticks; use a spec such as %q instead", d.Delay, "*/10 * * * * *")
	}
	// A spec is anchored by construction: its Next reads only the wall clock
	// of its argument. Other schedules are probed between activations.
	_, spec := s.(*cron.SpecSchedule)
	loc := zoneOf(s, from.Location())
	a := s.Next(from)
	if a.IsZero() {
		return 0, fmt.Errorf("the schedule has no activation after %s", from.Format(time.RFC3339))
	}
	gap, gapAll := time.Duration(-1), time.Duration(-1)
	probed := 0
	var firstA, firstB time.Time // the first interval, probed if no other can be
	limit := from.Add(gapHorizon)
	for i := 0; i < gapSamples && (i == 0 || !a.After(limit)); i++ {
		b := s.Next(a)
		if b.IsZero() {
			break
		}
		if !b.After(a) {
			return 0, fmt.Errorf("the schedule's Next(%s) returned %s, which is not later", a.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano))
		}
		if i == 0 {
			firstA, firstB = a, b
		}
		d := b.Sub(a)
		if gapAll < 0 || d < gapAll {
			gapAll = d
		}
		if offsetChangeIn(loc, a, b) {
			// Shortened (or lengthened) by the change: a daily spec may fire
			// twice, 30 minutes apart, on the day clocks change. A tolerance
			// longer than that costs at most one of the two runs.
			a = b
			continue
		}
		if gap < 0 || d < gap {
			gap = d
		}
		// An anchored schedule gives the same next activation from anywhere
		// between two activations; one that counts from its argument does not.
		// Only intervals without a change of offset are probed: across one,
		// an anchored schedule such as a spec may answer differently (above).
		if !spec && probed < probedIntervals {
			if err := probe(s, a, b, false); err != nil {
				return 0, err
			}
			probed++
		}
		a = b
	}
	if !spec && probed == 0 && !firstA.IsZero() {
		// Every interval crosses a change of offset (activations months
		// apart): what counts from its argument misses b from both probes.
		if err := probe(s, firstA, firstB, true); err != nil {
			return 0, err
		}
	}
	switch {
	case gap > 0:
		return gap, nil
	case gapAll > 0:
		return gapAll, nil
	}
	// A single activation: nothing can be confused with it.
	return maxLookback, nil
}

// probe reports an error if s, whose activation after a is b, gives another
// next activation from the middle of the interval or just before b; if
// lenient, only if it does from both.
func probe(s cron.Schedule, a, b time.Time, lenient bool) error {
	var err error
	for _, p := range []time.Time{a.Add(b.Sub(a) / 2), b.Add(-time.Nanosecond)} {
		n := s.Next(p)
		if n.Equal(b) {
			if lenient {
				return nil
			}
			continue
		}
		err = fmt.Errorf("the schedule is not anchored to fixed times: Next(%s) is %s but Next(%s) is %s",
			a.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano), p.Format(time.RFC3339Nano), n.Format(time.RFC3339Nano))
		if !lenient {
			return err
		}
	}
	return err
}

// zoneOf returns the time zone whose wall clock s reads when given a time in
// loc: a spec's CRON_TZ, or else loc (as robfig/cron does for time.Local).
func zoneOf(s cron.Schedule, loc *time.Location) *time.Location {
	if ss, ok := s.(*cron.SpecSchedule); ok && ss.Location != nil && ss.Location != time.Local {
		return ss.Location
	}
	return loc
}

// offsetChangeIn reports whether loc changes its UTC offset (begins a new
// zone period) at a, at b or between them.
func offsetChangeIn(loc *time.Location, a, b time.Time) bool {
	start, end := a.In(loc).ZoneBounds()
	return start.Equal(a) || (!end.IsZero() && !end.After(b))
}

// tickAt returns the tick a run at now belongs to: the latest activation of s
// at or before now. cron fires an activation when the clock reads it, so a run
// that fired late, by less than the interval to the next activation, still
// names the activation that fired it. hint is a first guess of how far back
// the previous activation may be; it is doubled until an activation is found.
// The answer does not depend on hint: it is the activation of the chain cron
// follows (Next from each activation), even just after a change of offset.
func tickAt(s cron.Schedule, now time.Time, hint time.Duration) (time.Time, error) {
	a, first, err := latestFrom(s, now, hint)
	if err != nil {
		return time.Time{}, err
	}
	// a was reached by stepping Next from first, itself the Next of some time
	// before it. When first is an activation of the chain, so is a. But if
	// first comes at or after the change of offset that began the zone period
	// of a, it may be a wall time that the chain, crossing the change from
	// its activation p before it, skipped (Lord_Howe "0 3 * * *": Sunday
	// 03:00, when Next of Saturday 03:00 is Monday 03:00; Chatham "45 2 * * *":
	// the second 02:45, when Next of the first is the next day's). Stepping
	// from anywhere in the period finds every activation the chain fires
	// there, so a is one of them unless it comes before the chain's first,
	// Next(p): then p is the latest.
	start, _ := a.In(zoneOf(s, now.Location())).ZoneBounds()
	if start.IsZero() || first.Before(start) {
		return a, nil
	}
	p, _, err := latestFrom(s, start.Add(-time.Nanosecond), hint)
	if err != nil {
		return a, nil // no activation before the change: nothing was skipped
	}
	if n := s.Next(p); a.Before(n) {
		return p, nil
	}
	return a, nil
}

// latestFrom returns the latest activation of s at or before now, reached by
// stepping Next from a first activation found from a time before now, and
// that first activation.
func latestFrom(s cron.Schedule, now time.Time, hint time.Duration) (time.Time, time.Time, error) {
	x := now
	for back := max(hint, time.Second); back <= maxLookback; back *= 2 {
		first := s.Next(x.Add(-back))
		if first.IsZero() {
			break
		}
		if !first.After(x) {
			a := first
			for range maxWalk {
				n := s.Next(a)
				if n.IsZero() || n.After(x) {
					return a, first, nil
				}
				a = n
			}
			return time.Time{}, time.Time{}, fmt.Errorf("%w: more than %d activations in %s before %s", ErrNoTick, maxWalk, back, x.Format(time.RFC3339Nano))
		}
	}
	return time.Time{}, time.Time{}, fmt.Errorf("%w: the schedule has no activation at or before %s", ErrNoTick, x.Format(time.RFC3339Nano))
}
