// Package every parses "@every d" schedules that replicas agree on: their
// ticks are the multiples of d since the Unix epoch, shifted by an optional
// offset, instead of counting from when each process started as robfig/cron's
// ConstantDelaySchedule does.
package every

import (
	"fmt"
	"strings"
	"time"
)

// Schedule ticks at every instant t with (t - Offset) a multiple of Every
// since the Unix epoch. It implements robfig/cron's Schedule.
type Schedule struct {
	Every  time.Duration
	Offset time.Duration
}

// Next returns the first tick after t.
func (s Schedule) Next(t time.Time) time.Time {
	d := s.Every.Nanoseconds()
	n := t.UnixNano() - s.Offset.Nanoseconds()
	k := n / d
	if n < 0 && n%d != 0 {
		k-- // floor
	}
	return time.Unix(0, (k+1)*d+s.Offset.Nanoseconds()).In(t.Location())
}

// String returns the spec that makes s, such as "@every 1h offset 15m0s".
func (s Schedule) String() string {
	if s.Offset == 0 {
		return "@every " + s.Every.String()
	}
	return fmt.Sprintf("@every %s offset %s", s.Every, s.Offset)
}

// Parse reads spec. ok is false when spec is not an "@every" spec. An
// "@every" spec is "@every <duration>" or "@every <duration> offset
// <duration>" (time.ParseDuration syntax); the period must be at least a
// millisecond and the offset must lie in [0, period).
func Parse(spec string) (s Schedule, ok bool, err error) {
	fields := strings.Fields(spec)
	if len(fields) == 0 || fields[0] != "@every" {
		return Schedule{}, false, nil
	}
	if len(fields) != 2 && (len(fields) != 4 || fields[2] != "offset") {
		return Schedule{}, true, fmt.Errorf("%q: want \"@every <duration>\" or \"@every <duration> offset <duration>\"", spec)
	}
	if s.Every, err = time.ParseDuration(fields[1]); err != nil {
		return Schedule{}, true, fmt.Errorf("%q: %w", spec, err)
	}
	if s.Every < time.Millisecond {
		return Schedule{}, true, fmt.Errorf("%q: the period must be at least 1ms", spec)
	}
	if len(fields) == 4 {
		if s.Offset, err = time.ParseDuration(fields[3]); err != nil {
			return Schedule{}, true, fmt.Errorf("%q: %w", spec, err)
		}
		if s.Offset < 0 || s.Offset >= s.Every {
			return Schedule{}, true, fmt.Errorf("%q: the offset must be at least 0 and less than the period", spec)
		}
	}
	return s, true, nil
}
