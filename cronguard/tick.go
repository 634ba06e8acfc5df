package cronguard

import (
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
)

const (
	// gapSamples is how many consecutive activations are inspected to find a
	// schedule's shortest interval.
	gapSamples = 1000
	// maxWalk bounds the activations tickAt steps through in one call.
	maxWalk = 1 << 16
	// maxLookback bounds how far back tickAt looks for the previous activation.
	maxLookback = 100 * 365 * 24 * time.Hour
)

// checkSchedule reports an error if s cannot name its ticks the same way on
// every replica, and returns the shortest interval between its activations
// among the next gapSamples after from.
func checkSchedule(s cron.Schedule, from time.Time) (time.Duration, error) {
	if d, ok := s.(cron.ConstantDelaySchedule); ok {
		return 0, fmt.Errorf("@every %s counts from when each replica started, so replicas disagree on the ticks; use a spec such as %q instead", d.Delay, "*/10 * * * * *")
	}
	a := s.Next(from)
	if a.IsZero() {
		return 0, fmt.Errorf("the schedule has no activation after %s", from.Format(time.RFC3339))
	}
	gap := time.Duration(-1)
	for i := 0; i < gapSamples; i++ {
		b := s.Next(a)
		if b.IsZero() {
			break
		}
		if !b.After(a) {
			return 0, fmt.Errorf("the schedule's Next(%s) returned %s, which is not later", a.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano))
		}
		// An anchored schedule gives the same next activation from anywhere
		// between two activations; one that counts from its argument does not.
		if i < 8 {
			for _, probe := range []time.Time{a.Add(b.Sub(a) / 2), b.Add(-time.Nanosecond)} {
				if n := s.Next(probe); !n.Equal(b) {
					return 0, fmt.Errorf("the schedule is not anchored to fixed times: Next(%s) is %s but Next(%s) is %s",
						a.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano), probe.Format(time.RFC3339Nano), n.Format(time.RFC3339Nano))
				}
			}
		}
		if d := b.Sub(a); gap < 0 || d < gap {
			gap = d
		}
		a = b
	}
	if gap < 0 {
		// A single activation: nothing can be confused with it.
		gap = maxLookback
	}
	return gap, nil
}

// tickAt returns the tick a run at now belongs to: the latest activation of s
// at or before now. cron fires an activation when the clock reads it, so a run
// that fired late, by less than the interval to the next activation, still
// names the activation that fired it. hint is a first guess of how far back
// the previous activation may be; it is doubled until an activation is found.
func tickAt(s cron.Schedule, now time.Time, hint time.Duration) (time.Time, error) {
	x := now
	for back := max(hint, time.Second); back <= maxLookback; back *= 2 {
		a := s.Next(x.Add(-back))
		if a.IsZero() {
			break
		}
		if !a.After(x) {
			for range maxWalk {
				n := s.Next(a)
				if n.IsZero() || n.After(x) {
					return a, nil
				}
				a = n
			}
			return time.Time{}, fmt.Errorf("%w: more than %d activations in %s before %s", ErrNoTick, maxWalk, back, x.Format(time.RFC3339Nano))
		}
	}
	return time.Time{}, fmt.Errorf("%w: the schedule has no activation at or before %s", ErrNoTick, x.Format(time.RFC3339Nano))
}
