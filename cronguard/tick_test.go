package cronguard

import (
	"sort"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// dstZones change their UTC offset by 30 minutes at 02:00 (Lord_Howe), by an
// hour at 02:45 (Chatham) and by an hour at 02:00 (New_York).
var dstZones = []string{"Australia/Lord_Howe", "America/New_York", "Pacific/Chatham"}

// dstSpec is a five-field spec with its shortest interval on the days
// without a change of offset.
type dstSpec struct {
	spec string
	gap  time.Duration
}

var dstSpecs = []dstSpec{
	{"30 1 * * *", 24 * time.Hour},
	{"30 2 * * *", 24 * time.Hour},
	{"45 2 * * *", 24 * time.Hour},
	{"0 * * * *", time.Hour},
	{"*/15 * * * *", 15 * time.Minute},
	{"30 1 * * 0", 7 * 24 * time.Hour},
	{"0 0 1 * *", 28 * 24 * time.Hour},
}

// dstQuirks are specs that robfig/cron fires oddly on the day of a change:
// twice, or skipping the day from some arguments of Next and not others.
var dstQuirks = []dstSpec{
	{"0 3 * * *", 24 * time.Hour},
	{"0,15 3 * * *", 15 * time.Minute},
	{"0 2 * * *", 24 * time.Hour},
	{"45 1 * * *", 24 * time.Hour},
	{"30 * * * *", time.Hour},
}

var fiveFields = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

func loadZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

// changes2026 returns the instants at which loc changes its UTC offset in 2026.
func changes2026(t *testing.T, loc *time.Location) []time.Time {
	t.Helper()
	var out []time.Time
	end := time.Date(2027, 1, 1, 0, 0, 0, 0, loc)
	for at := time.Date(2026, 1, 1, 0, 0, 0, 0, loc); ; {
		_, next := at.ZoneBounds()
		if next.IsZero() || !next.Before(end) {
			break
		}
		out = append(out, next)
		at = next
	}
	require.Len(t, out, 2, loc.String())
	return out
}

// addedAround returns times around each change of offset of loc in 2026 at
// which to add an entry whose activations are gap apart: in the interval
// after the change and in intervals up to 8 before it, from where a check
// looking 8 activations ahead crosses the change. They are a third of an
// interval off the change, so a daily spec is added at another time of day
// than a weekly one.
func addedAround(t *testing.T, loc *time.Location, gap time.Duration) []time.Time {
	t.Helper()
	var out []time.Time
	for _, change := range changes2026(t, loc) {
		for _, k := range []int{-1, 0, 1, 2, 8} {
			out = append(out, change.Add(-time.Duration(k)*gap-gap/3).In(loc))
		}
	}
	return out
}

// custom hides a schedule's type, as a user's own cron.Schedule does.
type custom struct{ cron.Schedule }

// counting counts from its argument, like @every.
type counting struct{ d time.Duration }

func (c counting) Next(t time.Time) time.Time { return t.Add(c.d) }

// parserOf parses every spec to s.
type parserOf struct{ s cron.Schedule }

func (p parserOf) Parse(string) (cron.Schedule, error) { return p.s, nil }

// wrapAt wraps spec in at's time zone on a Guard whose clock reads at.
func wrapAt(t *testing.T, locker *lockkit.Locker, at time.Time, spec string, opts ...Option) error {
	t.Helper()
	g, err := New(locker, append([]Option{WithClock(func() time.Time { return at }), WithLocation(at.Location()),
		WithLogger(cron.DiscardLogger)}, opts...)...)
	require.NoError(t, err)
	_, err = g.Wrap("e", spec)
	return err
}

// TestSpecAddedInTheDaysBeforeAnOffsetChangeIsValid: "30 1 * * *" in
// Lord_Howe, added on any of the 8 days before clocks go forward on 4 October
// 2026 (or, weekly, in the 8 weeks before), used to be rejected as "not
// anchored".
func TestSpecAddedInTheDaysBeforeAnOffsetChangeIsValid(t *testing.T) {
	locker := lockkittest.New(t)
	loc := loadZone(t, "Australia/Lord_Howe")
	for at := time.Date(2026, 9, 24, 5, 30, 0, 0, loc); at.Before(time.Date(2026, 10, 6, 0, 0, 0, 0, loc)); at = at.Add(24 * time.Hour) {
		require.NoError(t, wrapAt(t, locker, at, "30 1 * * *"), "added at %s", at)
	}
	for at := time.Date(2026, 8, 1, 5, 30, 0, 0, loc); at.Before(time.Date(2026, 10, 6, 0, 0, 0, 0, loc)); at = at.Add(7 * 24 * time.Hour) {
		require.NoError(t, wrapAt(t, locker, at, "30 1 * * 0"), "added at %s", at)
	}
}

// TestSpecIsValidWhenAddedAroundAnOffsetChange: whenever a spec is added, a
// change of offset coming up does not make it invalid, nor make its
// shortest interval shorter than on other days (a daily spec that fires
// twice, 30 minutes apart, on the day clocks change still accepts a
// tolerance of hours).
func TestSpecIsValidWhenAddedAroundAnOffsetChange(t *testing.T) {
	locker := lockkittest.New(t)
	for _, zone := range dstZones {
		t.Run(zone, func(t *testing.T) {
			t.Parallel()
			loc := loadZone(t, zone)
			for _, tc := range dstSpecs {
				for _, at := range addedAround(t, loc, tc.gap) {
					require.NoError(t, wrapAt(t, locker, at, tc.spec, WithTolerance(tc.gap-time.Second)), "%q added at %s", tc.spec, at)
				}
			}
		})
	}
}

// TestCustomAnchoredScheduleIsValidAroundAnOffsetChange: a cron.Schedule of
// the user's own anchored to the wall clock, here a spec behind another type,
// is accepted whenever it is added, with the same shortest interval.
func TestCustomAnchoredScheduleIsValidAroundAnOffsetChange(t *testing.T) {
	for _, zone := range dstZones {
		t.Run(zone, func(t *testing.T) {
			t.Parallel()
			loc := loadZone(t, zone)
			for _, tc := range append(append([]dstSpec{}, dstSpecs...), dstQuirks[0]) {
				s, err := fiveFields.Parse(tc.spec)
				require.NoError(t, err)
				for _, at := range addedAround(t, loc, tc.gap) {
					gap, err := checkSchedule(custom{s}, at)
					require.NoError(t, err, "%q added at %s", tc.spec, at)
					require.Equal(t, tc.gap, gap, "%q added at %s", tc.spec, at)
				}
			}
		})
	}
}

// TestCountingScheduleIsRejectedAroundAnOffsetChange: a schedule that counts
// from its argument is still rejected, even added just before a change of
// offset or with intervals longer than the time between two changes.
func TestCountingScheduleIsRejectedAroundAnOffsetChange(t *testing.T) {
	locker := lockkittest.New(t)
	for _, zone := range dstZones {
		loc := loadZone(t, zone)
		for _, d := range []time.Duration{time.Second, 15 * time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 400 * 24 * time.Hour} {
			for _, change := range changes2026(t, loc) {
				for _, at := range []time.Time{change.Add(-d / 2), change.Add(-time.Second), change, change.Add(time.Hour)} {
					err := wrapAt(t, locker, at.In(loc), "counting", WithParser(parserOf{counting{d}}))
					require.ErrorIs(t, err, ErrInvalid, "%s every %s added at %s", zone, d, at.In(loc))
					require.ErrorContains(t, err, "not anchored", "%s every %s added at %s", zone, d, at.In(loc))
				}
			}
		}
	}
}

// TestTickAroundAnOffsetChangeIsTheLatestActivation: around every change of
// offset, a run at any moment names the latest activation at or before it of
// the chain cron fires (s.Next from each activation, from well before), the
// same whatever first guess of the interval (hint) the replica has.
func TestTickAroundAnOffsetChangeIsTheLatestActivation(t *testing.T) {
	for _, zone := range dstZones {
		t.Run(zone, func(t *testing.T) {
			t.Parallel()
			loc := loadZone(t, zone)
			for _, tc := range append(append([]dstSpec{}, dstSpecs...), dstQuirks...) {
				s, err := fiveFields.Parse(tc.spec)
				require.NoError(t, err)
				for _, change := range changes2026(t, loc) {
					from, to := change.Add(-30*time.Hour), change.Add(30*time.Hour)
					var chain []time.Time
					for a := s.Next(from.Add(-2*tc.gap - 24*time.Hour)); !a.After(to); a = s.Next(a) {
						chain = append(chain, a)
					}
					xs := []time.Time{}
					for x := from; x.Before(to); x = x.Add(41*time.Minute + 7*time.Millisecond) {
						xs = append(xs, x)
					}
					for _, a := range chain {
						if a.After(change.Add(-3*time.Hour)) && a.Before(change.Add(3*time.Hour)) {
							xs = append(xs, a.Add(-time.Millisecond), a, a.Add(999*time.Millisecond))
						}
					}
					for _, x := range xs {
						i := sort.Search(len(chain), func(i int) bool { return chain[i].After(x) })
						require.Positive(t, i)
						want := chain[i-1]
						for _, hint := range []time.Duration{15 * time.Minute, tc.gap} {
							got, err := tickAt(s, x.In(loc), hint)
							require.NoError(t, err)
							require.True(t, want.Equal(got), "%q at %s (hint %s): want %s, got %s",
								tc.spec, x.In(loc), hint, want.In(loc), got.In(loc))
						}
					}
				}
			}
		})
	}
}
