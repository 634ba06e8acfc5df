package cronguard_test

import (
	"context"
	"errors"
	"log"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/middleware"
	"github.com/jobguard/jobguard/singleton"
)

func TestRunIsCountedForTheTickThatFiredIt(t *testing.T) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)
	monday := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC) // a Monday
	ms := time.Millisecond
	cases := []struct {
		name string
		spec string
		tick time.Time     // the activation that fired
		late time.Duration // the replica's clock reading minus tick
		want time.Time
	}{
		{"on time", "* * * * * *", t0, 0, t0},
		{"1ms late", "* * * * * *", t0, ms, t0},
		{"300ms late", "* * * * * *", t0, 300 * ms, t0},
		{"999ms late", "* * * * * *", t0, 999 * ms, t0},
		{"a whole interval late: the next tick", "* * * * * *", t0, time.Second, t0.Add(time.Second)},
		{"a reading before the activation: the previous tick", "* * * * * *", t0, -ms, t0.Add(-time.Second)},
		{"5m: 4m59.999s late", "0 */5 * * * *", t0, 5*time.Minute - ms, t0},
		{"weekdays: Friday's run 60h late", "0 0 9 * * MON-FRI", monday.AddDate(0, 0, 4), 60 * time.Hour, monday.AddDate(0, 0, 4)},
		{"weekdays: Monday on time", "0 0 9 * * MON-FRI", monday, 0, monday},
		{"CRON_TZ read from a UTC clock", "CRON_TZ=Asia/Tokyo 0 0 9 * * *", time.Date(2026, 3, 2, 9, 0, 0, 0, tokyo), 100 * ms, time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			r := newFleet(t).replica(0, "entry", tc.spec, rec)
			var got time.Time
			r.fire(tc.tick.Add(tc.late).UTC(), cronguard.Func(func(ctx context.Context) error {
				got, _ = cronguard.Tick(ctx)
				return nil
			}))
			require.True(t, tc.want.Equal(got), "want %s, got %s", tc.want, got)
			ev, ok := rec.find(middleware.EventAcquired)
			require.True(t, ok)
			require.Equal(t, tc.want.UnixMilli(), guard.WorkOf(ev.Job).Epoch)
			require.Equal(t, tc.want.UTC().Format(time.RFC3339Nano), ev.Job.ID)
			require.Equal(t, "cron:entry", ev.Job.Key)
		})
	}
}

// TestEachTickRunsOnceAcrossSkewedReplicas: replicas whose clocks are ahead of
// or behind the others fire each tick at different real times, each when its
// own clock reads the tick (plus a random delay); the job takes no time, so
// every replica but the first fires after the run has ended. Each tick runs
// once.
func TestEachTickRunsOnceAcrossSkewedReplicas(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	skews := []time.Duration{0, 300 * time.Millisecond, -300 * time.Millisecond, 450 * time.Millisecond} // clock ahead (+) or behind (-)
	var replicas []*replica
	for i := range skews {
		replicas = append(replicas, f.replica(i, "report", "* * * * * *", rec))
	}
	runs := make(map[int64]int) // by tick, in Unix ms
	won := make([]int, len(replicas))
	const ticks = 50
	for k := range ticks {
		tick := t0.Add(time.Duration(k) * time.Second)
		// Replica i fires when its clock reads tick + delay: at real time
		// tick + delay - skew. Fire them in real-time order.
		delays := make([]time.Duration, len(replicas))
		order := rand.Perm(len(replicas))
		for i := range replicas {
			delays[i] = time.Duration(rand.N(500)) * time.Millisecond
		}
		sort.Slice(order, func(a, b int) bool {
			i, j := order[a], order[b]
			return delays[i]-skews[i] < delays[j]-skews[j]
		})
		for _, i := range order {
			replicas[i].fire(tick.Add(delays[i]), cronguard.Func(func(ctx context.Context) error {
				tick, _ := cronguard.Tick(ctx)
				runs[tick.UnixMilli()]++ // replicas fire one at a time here
				won[i]++
				return nil
			}))
		}
	}
	require.Len(t, runs, ticks)
	for k := range ticks {
		tick := t0.Add(time.Duration(k) * time.Second)
		require.Equal(t, 1, runs[tick.UnixMilli()], "tick %s", tick)
		require.Equal(t, len(replicas)-1, rec.count(middleware.EventClaimed, tick), "tick %s", tick)
	}
	require.Greater(t, won[3], won[2], "the replica whose clock is ahead wins more ticks")
}

func TestSkipWhileRunning(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	a := f.replica(0, "e", "* * * * * *", rec)
	b := f.replica(1, "e", "* * * * * *", rec)
	c := f.replica(2, "e", "* * * * * *", rec)
	long := newBlocking()
	doneA := a.fireAsync(t0, long.job())
	require.True(t, t0.Equal(recv(t, long.started)))

	// The next tick fires while the first still runs: skipped, not run.
	next := t0.Add(time.Second)
	ran := false
	b.fire(next, cronguard.Func(func(context.Context) error { ran = true; return nil }))
	require.False(t, ran)
	require.Equal(t, 1, rec.count(middleware.EventDuplicate, next))
	ev, _ := rec.find(middleware.EventDuplicate)
	require.Equal(t, middleware.ActionSkip, ev.Action)
	require.Equal(t, "replica-0", ev.Holder)

	// A replica firing that tick after the first run ended runs it, once.
	close(long.release)
	<-doneA
	c.fire(next.Add(300*time.Millisecond), cronguard.Func(func(context.Context) error { ran = true; return nil }))
	require.True(t, ran)
	ran = false
	b.fire(next.Add(400*time.Millisecond), cronguard.Func(func(context.Context) error { ran = true; return nil }))
	require.False(t, ran)
	require.Equal(t, 1, rec.count(middleware.EventClaimed, next))
}

func TestWaitInOrderWhileRunning(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	opt := cronguard.WithPolicy(cronguard.WaitInOrder(time.Minute, cronguard.Skip()))
	a := f.replica(0, "e", "* * * * * *", rec, opt)
	b := f.replica(1, "e", "* * * * * *", rec, opt)
	c := f.replica(2, "e", "* * * * * *", rec, opt)
	d := f.replica(3, "e", "* * * * * *", rec, opt)
	waiters := func() int {
		info, err := f.base.Inspect(context.Background(), "cron:e")
		require.NoError(t, err)
		return info.Waiters
	}

	first := newBlocking()
	doneA := a.fireAsync(t0, first.job())
	recv(t, first.started)

	// Tick 1 fires on b, then late on c; tick 2 fires on d. All wait.
	second := newBlocking()
	doneB := b.fireAsync(t0.Add(time.Second), second.job())
	require.Eventually(t, func() bool { return waiters() == 1 }, 5*time.Second, time.Millisecond)
	ranC := make(chan struct{}, 1)
	doneC := c.fireAsync(t0.Add(1300*time.Millisecond), cronguard.Func(func(context.Context) error { ranC <- struct{}{}; return nil }))
	require.Eventually(t, func() bool { return waiters() == 2 }, 5*time.Second, time.Millisecond)
	third := newBlocking()
	doneD := d.fireAsync(t0.Add(2*time.Second), third.job())
	require.Eventually(t, func() bool { return waiters() == 3 }, 5*time.Second, time.Millisecond)

	// When tick 0 ends, tick 1 runs (once), then tick 2 after it.
	close(first.release)
	<-doneA
	require.True(t, t0.Add(time.Second).Equal(recv(t, second.started)))
	<-doneC
	require.Empty(t, ranC)
	require.Equal(t, 1, rec.count(middleware.EventClaimed, t0.Add(time.Second)))
	select {
	case <-third.started:
		t.Fatal("tick 2 overlapped tick 1")
	default:
	}
	close(second.release)
	<-doneB
	require.True(t, t0.Add(2*time.Second).Equal(recv(t, third.started)))
	close(third.release)
	<-doneD
	require.Equal(t, 2, rec.count(middleware.EventWaited, time.Time{}))
	require.Equal(t, 0, rec.count(middleware.EventDuplicate, time.Time{}))
}

func TestWaitInOrderGivesUpAfterMax(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	opt := cronguard.WithPolicy(cronguard.WaitInOrder(20*time.Millisecond, cronguard.Skip()))
	a := f.replica(0, "e", "* * * * * *", rec, opt)
	b := f.replica(1, "e", "* * * * * *", rec, opt)
	long := newBlocking()
	doneA := a.fireAsync(t0, long.job())
	recv(t, long.started)
	ran := false
	b.fire(t0.Add(time.Second), cronguard.Func(func(context.Context) error { ran = true; return nil }))
	require.False(t, ran)
	ev, ok := rec.find(middleware.EventDuplicate)
	require.True(t, ok)
	require.GreaterOrEqual(t, ev.Wait, 20*time.Millisecond)
	close(long.release)
	<-doneA
}

func TestLimit(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	opt := cronguard.WithLimit(2)
	var reps []*replica
	for i := range 4 {
		reps = append(reps, f.replica(i, "e", "* * * * * *", rec, opt))
	}
	first, second := newBlocking(), newBlocking()
	done0 := reps[0].fireAsync(t0, first.job())
	recv(t, first.started)
	done1 := reps[1].fireAsync(t0.Add(time.Second), second.job())
	require.True(t, t0.Add(time.Second).Equal(recv(t, second.started)), "tick 1 runs while tick 0 runs")

	// Late replicas of ticks 0 and 1 skip: each tick runs once.
	ran := false
	never := cronguard.Func(func(context.Context) error { ran = true; return nil })
	reps[2].fire(t0.Add(300*time.Millisecond), never)
	reps[3].fire(t0.Add(1300*time.Millisecond), never)
	require.False(t, ran)
	require.Equal(t, 1, rec.count(middleware.EventClaimed, t0))
	require.Equal(t, 1, rec.count(middleware.EventClaimed, t0.Add(time.Second)))

	// A third tick finds both slots taken: skipped for overlap.
	reps[2].fire(t0.Add(2*time.Second), never)
	require.False(t, ran)
	require.Equal(t, 1, rec.count(middleware.EventDuplicate, t0.Add(2*time.Second)))

	close(first.release)
	close(second.release)
	<-done0
	<-done1
	reps[3].fire(t0.Add(3*time.Second), never)
	require.True(t, ran)
}

func TestErrorsAndPanicsAreReportedAndReleased(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	logs := &logRecorder{}
	r := f.replica(0, "e", "* * * * * *", rec, cronguard.WithLogger(logs))

	boom := errors.New("boom")
	r.fire(t0, cronguard.Func(func(context.Context) error { return boom }))
	ev, ok := rec.find(middleware.EventReleased)
	require.True(t, ok)
	require.ErrorIs(t, ev.Err, boom)
	require.True(t, logs.has("error job failed: boom"))

	require.PanicsWithValue(t, "kaput", func() {
		r.fire(t0.Add(time.Second), cron.FuncJob(func() { panic("kaput") }))
	})
	ev, ok = rec.find(middleware.EventError)
	require.True(t, ok)
	require.ErrorContains(t, ev.Err, "kaput")
	require.True(t, logs.has("error guard error: middleware: e panicked: kaput"))
	info, err := f.base.Inspect(context.Background(), "cron:e")
	require.NoError(t, err)
	require.Empty(t, info.Holders, "the panic released the lease")

	ran := false
	r.fire(t0.Add(2*time.Second), cron.FuncJob(func() { ran = true }))
	require.True(t, ran)
	require.True(t, logs.has("info run"))
	require.True(t, logs.has("info done"))
}

func TestCronRecoverInTheChainKeepsTheProcessAlive(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	logs := &logRecorder{}
	r := f.replica(0, "e", "* * * * * *", rec)
	job := cron.NewChain(cron.Recover(logs), r.wrap).Then(cron.FuncJob(func() { panic("kaput") }))
	r.clock.Set(t0)
	require.NotPanics(t, job.Run)
	require.True(t, logs.has("error panic: kaput"))
	require.Equal(t, 1, rec.count(middleware.EventError, t0))
}

// once is a schedule with a single activation.
type once struct{ at time.Time }

func (o once) Next(t time.Time) time.Time {
	if t.Before(o.at) {
		return o.at
	}
	return time.Time{}
}

// relative is a schedule that counts from its argument, like @every.
type relative struct{ d time.Duration }

func (r relative) Next(t time.Time) time.Time { return t.Add(r.d) }

// parser returns fixed schedules by spec.
type parser map[string]cron.Schedule

func (p parser) Parse(spec string) (cron.Schedule, error) {
	if s, ok := p[spec]; ok {
		return s, nil
	}
	return nil, errors.New("unknown spec")
}

func TestRunWithoutATickIsReportedNotRun(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	logs := &logRecorder{}
	r := f.replica(0, "e", "launch", rec, cronguard.WithLogger(logs),
		cronguard.WithParser(parser{"launch": once{t0.Add(time.Hour)}}))
	ran := false
	r.fire(t0, cron.FuncJob(func() { ran = true }))
	require.False(t, ran)
	ev, ok := rec.find(middleware.EventError)
	require.True(t, ok)
	require.ErrorIs(t, ev.Err, cronguard.ErrNoTick)
	require.True(t, logs.has("error guard error"))

	r.fire(t0.Add(time.Hour), cron.FuncJob(func() { ran = true }))
	require.True(t, ran)
}

func TestValidation(t *testing.T) {
	locker := lockkittest.New(t)
	sec := cronguard.WithSeconds()
	cases := []struct {
		name       string
		locker     *lockkit.Locker
		opts       []cronguard.Option
		entry      string
		spec       string
		wantErrMsg string // "" means valid
	}{
		{"valid", locker, []cronguard.Option{sec}, "e", "* * * * * *", ""},
		{"valid five fields", locker, nil, "e", "*/5 * * * *", ""},
		{"valid descriptor", locker, nil, "e", "@hourly", ""},
		{"nil locker", nil, nil, "e", "@hourly", "New: locker is nil"},
		{"negative tolerance", locker, []cronguard.Option{cronguard.WithTolerance(-time.Second)}, "e", "@hourly", "WithTolerance(-1s): must not be negative"},
		{"short TTL", locker, []cronguard.Option{cronguard.WithTTL(time.Millisecond)}, "e", "@hourly", "WithTTL(1ms): must be zero (the Locker's) or between 100ms and"},
		{"delay without a bound", locker, []cronguard.Option{cronguard.WithPolicy(cronguard.WaitInOrder(0, cronguard.Skip()))}, "e", "@hourly", "WaitInOrder: the wait 0s must be positive"},
		{"allow zero", locker, []cronguard.Option{cronguard.WithLimit(0)}, "e", "@hourly", "WithLimit(0): must be between 1 and 10000"},
		{"requeue", locker, []cronguard.Option{cronguard.WithPolicy(middleware.Requeue(time.Second))}, "e", "@hourly", "WithPolicy(Requeue(1s)): cron runs a tick once"},
		{"fail after a wait", locker, []cronguard.Option{cronguard.WithPolicy(cronguard.Wait(time.Second, middleware.Fail()))}, "e", "@hourly", "a tick cannot be requeued or failed"},
		{"coalesce", locker, []cronguard.Option{cronguard.WithPolicy(middleware.Coalesce())}, "e", "@hourly", "WithPolicy(Coalesce()): a tick that finds its entry running"},
		{"throttle that requeues", locker, []cronguard.Option{middleware.WithThrottle(1, time.Minute, middleware.ActionRequeue)}, "e", "@hourly", "WithThrottle(..., requeue)"},
		{"a singleton option", locker, []cronguard.Option{singleton.KeyByTaskID()}, "e", "@hourly", "an option of package singleton"},
		{"nil clock", locker, []cronguard.Option{cronguard.WithClock(nil)}, "e", "@hourly", "WithClock(nil)"},
		{"nil location", locker, []cronguard.Option{cronguard.WithLocation(nil)}, "e", "@hourly", "WithLocation(nil)"},
		{"nil parser", locker, []cronguard.Option{cronguard.WithParser(nil)}, "e", "@hourly", "WithParser(nil)"},
		{"nil logger", locker, []cronguard.Option{cronguard.WithLogger(nil)}, "e", "@hourly", "WithLogger(nil)"},
		{"nil observer", locker, []cronguard.Option{cronguard.WithObserver(nil)}, "e", "@hourly", "WithObserver #1 is nil"},
		{"empty name", locker, nil, "", "@hourly", `entry name is empty (spec "@hourly")`},
		{"bad spec", locker, nil, "e", "every minute", `entry "e": spec "every minute": expected exactly 5 fields, found 2`},
		{"seconds field without WithSeconds", locker, nil, "e", "* * * * * *", `entry "e": spec "* * * * * *": expected exactly 5 fields, found 6: [* * * * * *]: a seconds field needs cronguard.WithSeconds() (the Guard parses specs itself: cron.WithSeconds() on the Cron is not enough)`},
		{"seconds field with another parser", locker, []cronguard.Option{cronguard.WithParser(cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow))}, "e", "* * * * * *", `spec "* * * * * *": expected exactly 5 fields, found 6`},
		{"@every", locker, nil, "e", "@every 5m", "schedule it with Add, which aligns its ticks"},
		{"never fires", locker, []cronguard.Option{sec}, "e", "0 0 0 30 2 *", "the schedule has no activation after"},
		{"not anchored", locker, []cronguard.Option{cronguard.WithParser(parser{"r": relative{5 * time.Second}})}, "e", "r", "the schedule is not anchored to fixed times"},
		{"tolerance = interval", locker, []cronguard.Option{sec, cronguard.WithTolerance(time.Second)}, "e", "* * * * * *",
			`WithTolerance(1s) must be shorter than the schedule's shortest interval (1s of "* * * * * *")`},
		{"tolerance > shortest interval", locker, []cronguard.Option{sec, cronguard.WithTolerance(3 * time.Second)}, "e", "0,2,30 * * * * *",
			`WithTolerance(3s) must be shorter than the schedule's shortest interval (2s of "0,2,30 * * * * *")`},
		{"tolerance just under the interval", locker, []cronguard.Option{sec, cronguard.WithTolerance(999 * time.Millisecond)}, "e", "* * * * * *", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := cronguard.Wrap(tc.locker, tc.entry, tc.spec, tc.opts...)
			if tc.wantErrMsg == "" {
				require.NoError(t, err)
				require.NotNil(t, w)
				return
			}
			require.ErrorIs(t, err, cronguard.ErrInvalid)
			require.ErrorIs(t, err, lockkit.ErrInvalid)
			require.ErrorContains(t, err, tc.wantErrMsg)
			require.Nil(t, w)
		})
	}

	g, err := cronguard.New(locker)
	require.NoError(t, err)
	_, err = g.Add(nil, "e", "@hourly", cron.FuncJob(func() {}))
	require.ErrorIs(t, err, cronguard.ErrInvalid)
	_, err = g.Add(cron.New(), "e", "@hourly", nil)
	require.ErrorIs(t, err, cronguard.ErrInvalid)
	_, err = g.Add(cron.New(), "", "@hourly", cron.FuncJob(func() {}))
	require.ErrorIs(t, err, cronguard.ErrInvalid)
}

// The Guard parses its entries' specs itself: a seconds field needs
// cronguard.WithSeconds, whatever the Cron was given, and the error of a
// seconds field without it names that option.
func TestSecondsFieldNeedsTheGuardsWithSeconds(t *testing.T) {
	locker := lockkittest.New(t)
	job := cron.FuncJob(func() {})
	g, err := cronguard.New(locker)
	require.NoError(t, err)
	_, err = g.Add(cron.New(cron.WithSeconds()), "no-seconds", "*/10 * * * * *", job)
	require.ErrorIs(t, err, cronguard.ErrInvalid)
	require.ErrorContains(t, err, "a seconds field needs cronguard.WithSeconds()")

	g, err = cronguard.New(locker, cronguard.WithSeconds())
	require.NoError(t, err)
	_, err = g.Add(cron.New(), "seconds", "*/10 * * * * *", job)
	require.NoError(t, err, "Add schedules the Guard's parse: the Cron's parser is not used")
}

// The tolerance defaults to 2s (WithTolerance), capped at half the
// entry's shortest interval.
func TestDefaultTolerance(t *testing.T) {
	for _, tc := range []struct {
		spec string
		opts []cronguard.Option
		want time.Duration // the claim's lifetime: 2 × interval + 2 × tolerance
	}{
		{"@hourly", nil, 2*time.Hour + 2*2*time.Second},                 // the default tolerance, 2s
		{"*/3 * * * * *", nil, 6*time.Second + 2*1500*time.Millisecond}, // capped at half the interval
		{"* * * * * *", nil, 2*time.Second + 2*500*time.Millisecond},
		{"@hourly", []cronguard.Option{cronguard.WithTolerance(time.Minute)}, 2*time.Hour + 2*time.Minute},
		{"* * * * * *", []cronguard.Option{cronguard.WithTolerance(0)}, 2 * time.Second},
	} {
		rec := newRecorder()
		r := newFleet(t).replica(0, "e", tc.spec, rec, tc.opts...)
		r.fire(t0, cron.FuncJob(func() {}))
		ev, ok := rec.find(middleware.EventAcquired)
		require.True(t, ok)
		require.Equal(t, tc.want, guard.WorkOf(ev.Job).EpochTTL, tc.spec)
	}
}

func TestAddUsesTheCronsLocationAndChain(t *testing.T) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)
	f := newFleet(t)
	rec := newRecorder()
	clk := newClock(time.Date(2026, 3, 2, 0, 0, 0, 300e6, time.UTC)) // 09:00:00.3 in Tokyo
	g, err := cronguard.New(f.locker(0), cronguard.WithSeconds(), cronguard.WithClock(clk.Now),
		cronguard.WithLogger(cron.DiscardLogger), cronguard.WithObserver(rec.observe))
	require.NoError(t, err)
	var wrapped atomic.Int32
	outer := func(j cron.Job) cron.Job {
		return cron.FuncJob(func() { wrapped.Add(1); j.Run() })
	}
	c := cron.New(cron.WithLocation(tokyo), cron.WithChain(outer))
	var got time.Time
	id, err := g.Add(c, "morning", "0 0 9 * * *", cronguard.Func(func(ctx context.Context) error {
		got, _ = cronguard.Tick(ctx)
		return nil
	}))
	require.NoError(t, err)
	entry := c.Entry(id)
	require.True(t, entry.Valid())
	entry.WrappedJob.Run()
	require.Equal(t, int32(1), wrapped.Load())
	require.True(t, time.Date(2026, 3, 2, 9, 0, 0, 0, tokyo).Equal(got), "got %s", got)
	next := entry.Schedule.Next(got)
	require.Equal(t, 24*time.Hour, next.Sub(got))
}

func TestObserversAndJobSeeTheTickAndTheLease(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	r := f.replica(0, "e", "*/10 * * * * *", rec)
	var (
		inJob time.Time
		token int64
	)
	r.fire(t0.Add(3*time.Second), cronguard.Func(func(ctx context.Context) error {
		inJob, _ = cronguard.Tick(ctx)
		if lease, ok := lockkit.LeaseFromContext(ctx); ok {
			token = lease.Token()
		}
		return nil
	}))
	require.True(t, t0.Equal(inJob))
	require.Equal(t, 1, rec.count(middleware.EventAcquired, t0))
	ev, _ := rec.find(middleware.EventAcquired)
	require.NotZero(t, token)
	require.Equal(t, ev.Token, token, "the job sees its lease's fencing token")
	require.Equal(t, 1, rec.count(middleware.EventReleased, t0))
	_, ok := cronguard.Tick(context.Background())
	require.False(t, ok)
}

func TestDefaultTTLIsTheLockers(t *testing.T) {
	f := newFleet(t)
	r := f.replica(0, "e", "* * * * * *", newRecorder())
	long := newBlocking()
	done := r.fireAsync(t0, long.job())
	recv(t, long.started)
	info, err := f.base.Inspect(context.Background(), "cron:e")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.InDelta(t, lockcore.DefaultTTL.Seconds(), info.Holders[0].TTL.Seconds(), 1)
	close(long.release)
	<-done
}

// A running tick's lease carries the tick (UTC, RFC 3339) as its label:
// what the ops page and `jobguard inspect` show beside the holder. A second
// replica firing the same tick meanwhile is refused by the tick's claim
// (EventClaimed), not made to wait for the run as a delivery of the same
// work would be.
func TestLeaseIsLabelledWithItsTick(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	a := f.replica(0, "e", "*/10 * * * * *", rec)
	b := f.replica(1, "e", "*/10 * * * * *", rec)
	long := newBlocking()
	done := a.fireAsync(t0.Add(2*time.Second), long.job())
	recv(t, long.started)
	info, err := f.base.Inspect(context.Background(), "cron:e")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "2026-03-02T09:00:00Z", info.Holders[0].Label)
	ran := false
	b.fire(t0.Add(3*time.Second), cron.FuncJob(func() { ran = true }))
	require.False(t, ran, "the same tick on another replica")
	require.Equal(t, 1, rec.count(middleware.EventClaimed, t0))
	close(long.release)
	<-done
}

// The TTL and the slog logger given once at the Locker are what a Guard
// uses, unless WithTTL or WithLogger (a cron.Logger) override them.
func TestSettingsComeFromTheLocker(t *testing.T) {
	var lockerLog strings.Builder
	l := lockkittest.New(t, lockkit.WithTTL(2*time.Second),
		lockkit.WithLogger(slog.New(slog.NewTextHandler(&lockerLog, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	run := func(name string, opts ...cronguard.Option) time.Duration {
		w, err := cronguard.Wrap(l, name, "* * * * *", append([]cronguard.Option{
			cronguard.WithClock(func() time.Time { return at }), cronguard.WithLocation(time.UTC)}, opts...)...)
		require.NoError(t, err)
		var ttl time.Duration
		w(cronguard.Func(func(ctx context.Context) error {
			info, err := l.Inspect(ctx, "cron:"+name)
			require.NoError(t, err)
			ttl = info.Holders[0].TTL
			return errors.New("smtp down")
		})).Run()
		return ttl
	}
	require.InDelta(t, 2, run("a").Seconds(), 0.1, "the Locker's TTL")
	require.Contains(t, lockerLog.String(), `level=WARN msg="jobguard: released" key=cron:a job=a`)
	lockerLog.Reset()
	var cronLog strings.Builder
	ttl := run("b", cronguard.WithTTL(5*time.Second), cronguard.WithLogger(cron.PrintfLogger(log.New(&cronLog, "", 0))))
	require.InDelta(t, 5, ttl.Seconds(), 0.1, "the Guard's own TTL")
	require.Empty(t, lockerLog.String())
	require.Contains(t, cronLog.String(), "job failed")
}

// KeepNewest: ticks that fire while an earlier one runs wait; only the latest
// of them runs, once the earlier run ends.
func TestKeepNewest(t *testing.T) {
	onEachFleet(t, testKeepNewest)
}

func testKeepNewest(t *testing.T, f *fleet) {
	rec := newRecorder()
	opt := cronguard.WithPolicy(cronguard.KeepNewest())
	a := f.replica(0, "e", "* * * * * *", rec, opt)
	b := f.replica(1, "e", "* * * * * *", rec, opt)
	c := f.replica(2, "e", "* * * * * *", rec, opt)
	waiters := func(n int) {
		require.Eventually(t, func() bool {
			info, err := f.base.Inspect(context.Background(), "cron:e")
			require.NoError(t, err)
			return info.Waiters == n
		}, 5*time.Second, time.Millisecond)
	}
	first := newBlocking()
	doneA := a.fireAsync(t0, first.job())
	recv(t, first.started)

	var mu sync.Mutex
	var ran []time.Time
	job := cronguard.Func(func(ctx context.Context) error {
		tick, _ := cronguard.Tick(ctx)
		mu.Lock()
		ran = append(ran, tick)
		mu.Unlock()
		return nil
	})
	doneB := b.fireAsync(t0.Add(time.Second), job)
	waiters(1)
	doneC := c.fireAsync(t0.Add(2*time.Second), job)
	<-doneB // tick 1 gave its place to tick 2
	require.Equal(t, 1, rec.count(middleware.EventDuplicate, t0.Add(time.Second)))
	waiters(1)
	close(first.release)
	<-doneA
	<-doneC
	require.Len(t, ran, 1, "only the latest waiting tick runs")
	require.True(t, t0.Add(2*time.Second).Equal(ran[0]), "tick %s ran", ran[0])
}

// Preempt: a tick that finds the previous tick running cancels it
// (cause lockkit.ErrPreempted) and runs once it returns, with a higher
// fencing token.
func TestPreempt(t *testing.T) {
	onEachFleet(t, testPreempt)
	_, err := cronguard.New(newFleet(t).base, cronguard.WithPolicy(cronguard.Preempt(-time.Second)))
	require.ErrorIs(t, err, cronguard.ErrInvalid)
}

func testPreempt(t *testing.T, f *fleet) {
	rec := newRecorder()
	opt := cronguard.WithPolicy(cronguard.Preempt(0))
	a := f.replica(0, "e", "* * * * * *", rec, opt)
	b := f.replica(1, "e", "* * * * * *", rec, opt)
	started := make(chan int64, 1)
	cause := make(chan error, 1)
	returned := make(chan struct{})
	doneA := a.fireAsync(t0, cronguard.Func(func(ctx context.Context) error {
		lease, _ := lockkit.LeaseFromContext(ctx)
		started <- lease.Token()
		<-ctx.Done()
		cause <- context.Cause(ctx)
		<-returned
		return ctx.Err()
	}))
	oldToken := recv(t, started)
	var newToken atomic.Int64
	doneB := b.fireAsync(t0.Add(time.Second), cronguard.Func(func(ctx context.Context) error {
		lease, _ := lockkit.LeaseFromContext(ctx)
		newToken.Store(lease.Token())
		return nil
	}))
	err := recv(t, cause)
	require.ErrorIs(t, err, lockcore.ErrPreempted)
	require.ErrorIs(t, err, lockkit.ErrLost)
	require.Zero(t, newToken.Load(), "the new tick waits for the cancelled run to return")
	close(returned)
	<-doneA
	<-doneB
	require.Greater(t, newToken.Load(), oldToken)
	require.Equal(t, 1, rec.count(middleware.EventPreempted, t0))
}

// onEachFleet runs test on a fleet on miniredis, on a real Redis and on a
// Redis Cluster.
func onEachFleet(t *testing.T, test func(*testing.T, *fleet)) {
	t.Run("miniredis", func(t *testing.T) { test(t, newFleet(t)) })
	t.Run("redis", func(t *testing.T) { test(t, redisFleet(t, false)) })
	t.Run("cluster", func(t *testing.T) { test(t, redisFleet(t, true)) })
}

// Add takes "@every d": the ticks are multiples of d since the epoch on
// every replica, so two replicas started at different times agree, and each
// tick runs once.
func TestAddAlignsEvery(t *testing.T) {
	store := lockkittest.NewStore(t)
	var mu sync.Mutex
	runs := map[time.Time]int{}
	done := make(chan struct{})
	job := cron.FuncJob(func() {})
	var crons []*cron.Cron
	for range 2 {
		l := store.Locker()
		g, err := cronguard.New(l, cronguard.WithObserver(func(ctx context.Context, e middleware.Event) {
			if e.Kind != middleware.EventAcquired {
				return
			}
			tick, _ := cronguard.Tick(ctx)
			mu.Lock()
			defer mu.Unlock()
			runs[tick]++
			if len(runs) == 5 {
				close(done)
			}
		}))
		require.NoError(t, err)
		c := cron.New()
		_, err = g.Add(c, "e", "@every 200ms offset 50ms", job)
		require.NoError(t, err)
		c.Start()
		crons = append(crons, c)
		time.Sleep(70 * time.Millisecond) // the second replica starts later
	}
	recv(t, done)
	for _, c := range crons {
		<-c.Stop().Done()
	}
	mu.Lock()
	defer mu.Unlock()
	for tick, n := range runs {
		require.Equal(t, 1, n, "tick %s ran once", tick)
		require.Zero(t, (tick.UnixMilli()-50)%200, "tick %s is aligned", tick.Format(time.RFC3339Nano))
	}
}

// A Guard refuses a second entry with a name it already has: both would
// claim the same ticks, so each tick would run only one of the two jobs. An
// entry removed from its Cron frees its name, so that Remove and Add change
// an entry's schedule.
func TestGuardRefusesAnEntryNameItHas(t *testing.T) {
	f := redisFleet(t, false)
	clk := newClock(t0)
	g, err := cronguard.New(f.locker(0), cronguard.WithSeconds(), cronguard.WithClock(clk.Now), cronguard.WithLogger(cron.DiscardLogger))
	require.NoError(t, err)
	c := cron.New(cron.WithSeconds())
	var digests, reports atomic.Int32
	id, err := g.Add(c, "digest", "0 * * * * *", cronguard.Func(func(context.Context) error { digests.Add(1); return nil }))
	require.NoError(t, err)
	_, err = g.Add(c, "digest", "0 */5 * * * *", cronguard.Func(func(context.Context) error { reports.Add(1); return nil }))
	require.ErrorIs(t, err, cronguard.ErrDuplicateEntry)
	require.ErrorIs(t, err, cronguard.ErrInvalid)
	require.ErrorContains(t, err, `entry "digest"`)
	_, err = g.Add(cron.New(cron.WithSeconds()), "digest", "0 * * * * *", cronguard.Func(func(context.Context) error { return nil }))
	require.ErrorIs(t, err, cronguard.ErrDuplicateEntry, "the name is the fleet's, whatever the Cron")
	_, err = g.Wrap("digest", "0 * * * * *")
	require.ErrorIs(t, err, cronguard.ErrDuplicateEntry)
	require.Len(t, c.Entries(), 1)
	c.Entry(id).WrappedJob.Run()
	require.Equal(t, int32(1), digests.Load())

	c.Remove(id)
	id, err = g.Add(c, "digest", "0 */5 * * * *", cronguard.Func(func(context.Context) error { reports.Add(1); return nil }))
	require.NoError(t, err, "a removed entry's name is free")
	clk.Set(t0.Add(5 * time.Minute))
	c.Entry(id).WrappedJob.Run()
	require.Equal(t, int32(1), reports.Load())

	_, err = g.Wrap("weekly", "@weekly")
	require.NoError(t, err)
	_, err = g.Wrap("weekly", "@weekly")
	require.ErrorIs(t, err, cronguard.ErrDuplicateEntry, "a name given to Wrap stays taken")
	_, err = g.Add(c, "weekly", "@weekly", cron.FuncJob(func() {}))
	require.ErrorIs(t, err, cronguard.ErrDuplicateEntry)
}

// Two entries that share an extra key (middleware.WithExtraKeys) never run
// at once: a tick of one that fires while the other runs is skipped on
// every replica (its claim is kept with its own key), and the next runs.
func TestEntriesSharingAnExtraKeyRunOneAtATime(t *testing.T) {
	f := newFleet(t)
	rec := newRecorder()
	shared := middleware.WithExtraKeys(func(context.Context, middleware.Job) map[string]int { return map[string]int{"db": 1} })
	a := f.replica(0, "nightly", "* * * * * *", rec, shared)
	b := f.replica(1, "hourly", "* * * * * *", rec, shared)
	b2 := f.replica(2, "hourly", "* * * * * *", rec, shared)
	long := newBlocking()
	doneA := a.fireAsync(t0, long.job())
	recv(t, long.started)

	ran := false
	never := cronguard.Func(func(context.Context) error { ran = true; return nil })
	b.fire(t0, never)
	require.False(t, ran, "ran beside the other entry's run")
	ev, ok := rec.find(middleware.EventDuplicate)
	require.True(t, ok)
	require.ErrorContains(t, ev.Err, `"db"`)
	b2.fire(t0.Add(200*time.Millisecond), never)
	require.False(t, ran, "a late replica ran the skipped tick")

	close(long.release)
	<-doneA
	b2.fire(t0.Add(time.Second), never)
	require.True(t, ran)
}
