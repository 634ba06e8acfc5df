package gocronguard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/gocronguard"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/elect"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// skewed is the real clock shifted by an offset, as on a machine whose clock
// is off: gocron fires its jobs by it.
type skewed struct {
	clockwork.Clock
	off time.Duration
}

func (c skewed) Now() time.Time                  { return time.Now().Add(c.off) }
func (c skewed) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c skewed) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

func redisClient(t *testing.T) *redis.Client {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		t.Fatal("REDIS_ADDR is not set: run the tests with make test-gocron")
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func prefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "test:gocron:" + hex.EncodeToString(b) + ":"
}

// gocron #841: three schedulers whose clocks are up to 300ms apart run a 1ms
// job every second. With the job's schedule, or with a hold longer than the
// skew, each second runs once.
func TestEachRunOnceUnderClockSkew(t *testing.T) {
	for name, opt := range map[string]gocronguard.Option{
		"schedule": gocronguard.WithSchedule("report", "* * * * * *"),
		"hold":     gocronguard.WithHoldAtLeast(500 * time.Millisecond),
	} {
		t.Run(name, func(t *testing.T) {
			rdb := redisClient(t)
			p := prefix()
			var mu sync.Mutex
			runs := map[int64]int{} // second → runs
			var scheds []gocron.Scheduler
			for i, off := range []time.Duration{0, -150 * time.Millisecond, -300 * time.Millisecond} {
				clock := skewed{Clock: clockwork.NewRealClock(), off: off}
				locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(p))
				require.NoError(t, err)
				defer locker.Close(context.Background())
				gl, err := gocronguard.NewLocker(locker, opt, gocronguard.WithClock(clock.Now))
				require.NoError(t, err)
				s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithDistributedLocker(gl))
				require.NoError(t, err)
				_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
					mu.Lock()
					runs[clock.Now().Add(500*time.Millisecond).Truncate(time.Second).Unix()]++
					mu.Unlock()
					time.Sleep(time.Millisecond)
				}), gocron.WithName("report"))
				require.NoError(t, err, "scheduler %d", i)
				s.Start()
				scheds = append(scheds, s)
			}
			time.Sleep(4200 * time.Millisecond)
			for _, s := range scheds {
				require.NoError(t, s.Shutdown())
			}
			mu.Lock()
			defer mu.Unlock()
			require.GreaterOrEqual(t, len(runs), 3)
			for sec, n := range runs {
				require.Equal(t, 1, n, "second %d ran %d times", sec, n)
			}
		})
	}
}

// The Elector: only the leader's scheduler runs jobs; when it resigns,
// another scheduler takes over, with a greater term.
func TestElectorRunsJobsOnTheLeaderOnly(t *testing.T) {
	rdb := redisClient(t)
	p := prefix()
	var mu sync.Mutex
	ran := map[int]int{}
	var electors []*gocronguard.Elector
	var scheds []gocron.Scheduler
	for i := range 3 {
		locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(p))
		require.NoError(t, err)
		defer locker.Close(context.Background())
		e, err := gocronguard.NewElector(locker, "leader", &lockkit.AcquireOptions{TTL: time.Second})
		require.NoError(t, err)
		electors = append(electors, e)
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
		require.NoError(t, err)
		_, err = s.NewJob(gocron.DurationJob(50*time.Millisecond), gocron.NewTask(func() {
			mu.Lock()
			ran[i]++
			mu.Unlock()
		}))
		require.NoError(t, err)
		s.Start()
		scheds = append(scheds, s)
	}
	defer func() {
		for _, s := range scheds {
			_ = s.Shutdown()
		}
	}()
	leader := func() int {
		n := -1
		for i, e := range electors {
			if e.IsLeader(context.Background()) == nil {
				require.Equal(t, -1, n, "two leaders")
				n = i
			}
		}
		return n
	}
	var first int
	require.Eventually(t, func() bool { first = leader(); return first >= 0 }, 5*time.Second, 5*time.Millisecond)
	term, _ := electors[first].Term()
	time.Sleep(400 * time.Millisecond)
	mu.Lock()
	require.Positive(t, ran[first])
	require.Equal(t, ran[first], ran[0]+ran[1]+ran[2], "only the leader ran jobs")
	mu.Unlock()

	require.NoError(t, electors[first].Close(context.Background()))
	require.ErrorIs(t, electors[first].IsLeader(context.Background()), elect.ErrNotLeader)
	var next int
	require.Eventually(t, func() bool { next = leader(); return next >= 0 }, 5*time.Second, 5*time.Millisecond)
	require.NotEqual(t, first, next)
	nextTerm, _ := electors[next].Term()
	require.Greater(t, nextTerm, term)
	for i, e := range electors {
		if i != first {
			require.NoError(t, e.Close(context.Background()))
		}
	}
}

func TestValidation(t *testing.T) {
	l := lockkittest.New(t)
	for want, opts := range map[string][]gocronguard.Option{
		`WithSchedule("a", "nope")`:   {gocronguard.WithSchedule("a", "nope")},
		"WithHoldAtLeast(0s)":         {gocronguard.WithHoldAtLeast(0)},
		"WithTolerance(-1s)":          {gocronguard.WithTolerance(-time.Second)},
		"WithClock(nil)":              {gocronguard.WithClock(nil)},
		`WithSchedule("a", "@every")`: {gocronguard.WithSchedule("a", "@every")},
		// The last would replace the first without a word.
		`WithSchedule("a", "0 * * * *"): job "a" has a schedule already ("@hourly")`: {
			gocronguard.WithSchedule("a", "@hourly"), gocronguard.WithSchedule("a", "0 * * * *")},
	} {
		_, err := gocronguard.NewLocker(l, opts...)
		require.ErrorIs(t, err, gocronguard.ErrInvalid, want)
		require.ErrorIs(t, err, lockkit.ErrInvalid, want)
		require.ErrorContains(t, err, want)
	}
	_, err := gocronguard.NewLocker(nil)
	require.ErrorIs(t, err, gocronguard.ErrInvalid)
	_, err = gocronguard.NewElector(nil, "k", nil)
	require.ErrorIs(t, err, lockkit.ErrInvalid)
	_, err = gocronguard.NewElector(l, "k", nil, gocronguard.WithHandover(0))
	require.ErrorIs(t, err, gocronguard.ErrInvalid)
	require.ErrorContains(t, err, "WithHandover(0s)")
}

// A scheduler with gocron.WithLocation fires a spec without a time zone in
// that zone; the Locker, given the same location, names the same
// activation: the job runs. Without it, the Locker would look for 09:00 on
// the host's zone and skip the run (ErrNoTick). A spec that names its own
// zone keeps it.
func TestScheduleInTheSchedulersLocation(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	for name, spec := range map[string]string{"scheduler's zone": "0 9 * * *", "own zone": "CRON_TZ=America/New_York 0 9 * * *"} {
		t.Run(name, func(t *testing.T) {
			l := lockkittest.New(t)
			// The host's clock is in UTC; 09:00 in New York is 14:00 UTC.
			fake := clockwork.NewFakeClockAt(time.Date(2026, 3, 2, 8, 59, 58, 0, ny).In(time.UTC))
			gl, err := gocronguard.NewLocker(l, gocronguard.WithSchedule("daily", spec), gocronguard.WithClock(fake.Now),
				gocronguard.WithLocation(ny))
			require.NoError(t, err)
			ran, failed := make(chan struct{}, 1), make(chan error, 1)
			s, err := gocron.NewScheduler(gocron.WithClock(fake), gocron.WithLocation(ny), gocron.WithDistributedLocker(gl))
			require.NoError(t, err)
			_, err = s.NewJob(gocron.CronJob("0 9 * * *", false), gocron.NewTask(func() { ran <- struct{}{} }), gocron.WithName("daily"),
				gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { failed <- err })))
			require.NoError(t, err)
			s.Start()
			defer func() { require.NoError(t, s.Shutdown()) }()
			require.NoError(t, fake.BlockUntilContext(context.Background(), 1), "the scheduler waits for its first run")
			fake.Advance(2 * time.Second)
			select {
			case <-ran:
			case err := <-failed:
				t.Fatalf("the run was skipped: %v", err)
			case <-time.After(5 * time.Second):
				t.Fatal("the job did not fire")
			}
		})
	}
}

// A leader that resigns right after running a second's tick hands over
// within milliseconds; the new leader, whose clock is 300ms behind, fires
// the same second after that and does not run it again: a new leader leads
// only after the handover (1s by default), longer than the skew.
func TestElectorLeaderChangeRunsEachTickOnce(t *testing.T) {
	rdb := redisClient(t)
	p := prefix()
	var mu sync.Mutex
	runs := map[int64]int{} // second → runs
	first := make(chan int64, 1)
	later := make(chan struct{}, 1)
	var firstSec int64
	newScheduler := func(off time.Duration) (*gocronguard.Elector, gocron.Scheduler) {
		locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(p))
		require.NoError(t, err)
		t.Cleanup(func() { _ = locker.Close(context.Background()) })
		e, err := gocronguard.NewElector(locker, "leader", &lockkit.AcquireOptions{TTL: 5 * time.Second})
		require.NoError(t, err)
		clock := skewed{Clock: clockwork.NewRealClock(), off: off}
		s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithDistributedElector(e))
		require.NoError(t, err)
		_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
			sec := clock.Now().Add(500 * time.Millisecond).Truncate(time.Second).Unix()
			mu.Lock()
			runs[sec]++
			if firstSec == 0 {
				firstSec = sec
				first <- sec
			} else if sec > firstSec+1 {
				select {
				case later <- struct{}{}:
				default:
				}
			}
			mu.Unlock()
		}), gocron.WithName("report"))
		require.NoError(t, err)
		return e, s
	}
	a, sa := newScheduler(0)
	require.Eventually(t, func() bool { return a.IsLeader(context.Background()) == nil }, 5*time.Second, 5*time.Millisecond)
	b, sb := newScheduler(-300 * time.Millisecond)
	sa.Start()
	sb.Start()
	defer func() {
		require.NoError(t, sa.Shutdown())
		require.NoError(t, sb.Shutdown())
		require.NoError(t, b.Close(context.Background()))
	}()
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("the leader ran nothing")
	}
	require.NoError(t, a.Close(context.Background())) // resigns right after the tick
	select {
	case <-later:
	case <-time.After(10 * time.Second):
		t.Fatal("the new leader ran nothing")
	}
	mu.Lock()
	defer mu.Unlock()
	for sec, n := range runs {
		require.Equal(t, 1, n, "second %d ran %d times (the first was %d)", sec, n, firstSec)
	}
}

// What the hold mode promises, with gocron's DurationJob on two schedulers
// started 500ms apart (each fires at its own phase): runs of the job start
// at least the hold apart across the fleet, and nothing more. With a 400ms
// hold both schedulers run the job every second (their runs are 500ms
// apart); with a hold close to the interval (900ms), it runs about once a
// second across the fleet.
func TestHoldModeSpacesRunsByTheHold(t *testing.T) {
	for _, hold := range []time.Duration{400 * time.Millisecond, 900 * time.Millisecond} {
		t.Run(hold.String(), func(t *testing.T) {
			rdb := redisClient(t)
			p := prefix()
			var mu sync.Mutex
			var starts []time.Time
			var scheds []gocron.Scheduler
			for i := range 2 {
				if i == 1 {
					time.Sleep(500 * time.Millisecond) // started 500ms after the first
				}
				locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(p))
				require.NoError(t, err)
				defer locker.Close(context.Background())
				gl, err := gocronguard.NewLocker(locker, gocronguard.WithHoldAtLeast(hold))
				require.NoError(t, err)
				s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
				require.NoError(t, err)
				_, err = s.NewJob(gocron.DurationJob(time.Second), gocron.NewTask(func() {
					mu.Lock()
					starts = append(starts, time.Now())
					mu.Unlock()
				}), gocron.WithName("sweep"))
				require.NoError(t, err)
				s.Start()
				scheds = append(scheds, s)
			}
			begin := time.Now()
			time.Sleep(3500 * time.Millisecond)
			for _, s := range scheds {
				require.NoError(t, s.Shutdown())
			}
			elapsed := time.Since(begin) + 500*time.Millisecond // from the first start
			mu.Lock()
			defer mu.Unlock()
			require.NotEmpty(t, starts)
			for i := 1; i < len(starts); i++ {
				// The hold starts when the lease is taken, a little before
				// the job starts: allow for that latency.
				require.GreaterOrEqual(t, starts[i].Sub(starts[i-1]), hold-50*time.Millisecond, "runs %d and %d", i-1, i)
			}
			require.LessOrEqual(t, len(starts), int(elapsed/hold)+1)
			t.Logf("hold %s: %d runs in %s", hold, len(starts), elapsed.Round(100*time.Millisecond))
		})
	}
}
