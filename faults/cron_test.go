//go:build faults

package faults_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/cronguard"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// cronRun is one run of the guarded entry somewhere in the fleet.
type cronRun struct {
	replica    int
	tick       time.Time
	start, end time.Time
}

type cronFleet struct {
	mu      sync.Mutex
	runs    []*cronRun
	skipped map[int64]int // tick → replicas that skipped it as still running
	started chan int      // replica of every run that starts
}

// Scenario 5: three cron replicas, one firing late and one with its clock
// behind, and the replica running a tick killed mid-run (its process gone:
// cron stopped, Redis unreachable). Every tick runs at most once, no two runs
// overlap while a lease is valid, and the fleet resumes within the TTL.
func TestCronReplicaKilledMidRunWithSkew(t *testing.T) {
	addr := testredis.Addr(t)
	prefix := testredis.Prefix(t, testredis.Client(t))
	const ttl = 2500 * time.Millisecond
	fleet := &cronFleet{skipped: make(map[int64]int), started: make(chan int, 64)}
	type replica struct {
		rdb  *redis.Client
		cron *cron.Cron
		lock *lockkit.Locker
	}
	var replicas []*replica
	skews := []struct{ late, behind time.Duration }{{0, 0}, {200 * time.Millisecond, 0}, {300 * time.Millisecond, 300 * time.Millisecond}}
	for i, sk := range skews {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		locker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix), lockkit.WithOwner(fmt.Sprint("replica-", i)))
		require.NoError(t, err)
		behind := sk.behind
		g, err := cronguard.New(locker, cronguard.WithSeconds(), cronguard.WithTTL(ttl),
			cronguard.WithLogger(cron.DiscardLogger),
			cronguard.WithClock(func() time.Time { return time.Now().Add(-behind) }),
			cronguard.WithObserver(func(ctx context.Context, e middleware.Event) {
				if e.Kind != middleware.EventDuplicate {
					return
				}
				if tick, ok := cronguard.Tick(ctx); ok {
					fleet.mu.Lock()
					fleet.skipped[tick.UnixMilli()]++
					fleet.mu.Unlock()
				}
			}))
		require.NoError(t, err)
		chain := []cron.JobWrapper{cron.Recover(cron.DiscardLogger)}
		if late := sk.late; late > 0 {
			chain = append(chain, func(j cron.Job) cron.Job {
				return cron.FuncJob(func() { time.Sleep(late); j.Run() }) // a replica that fires late
			})
		}
		c := cron.New(cron.WithSeconds(), cron.WithLogger(cron.DiscardLogger), cron.WithChain(chain...))
		_, err = g.Add(c, "digest", "* * * * * *", cronguard.Func(func(ctx context.Context) error {
			tick, _ := cronguard.Tick(ctx)
			r := &cronRun{replica: i, tick: tick, start: time.Now()}
			fleet.mu.Lock()
			fleet.runs = append(fleet.runs, r)
			fleet.mu.Unlock()
			fleet.started <- i
			time.Sleep(300 * time.Millisecond) // the work; it goes on even if its process is cut off
			fleet.mu.Lock()
			r.end = time.Now()
			fleet.mu.Unlock()
			return nil
		}))
		require.NoError(t, err)
		replicas = append(replicas, &replica{rdb: rdb, cron: c, lock: locker})
	}
	for _, r := range replicas {
		r.cron.Start()
	}
	stopAll := func() {
		for _, r := range replicas {
			<-r.cron.Stop().Done()
			_ = r.lock.Close(context.Background())
			_ = r.rdb.Close()
		}
	}
	defer stopAll()

	// Let a few ticks pass, then kill whichever replica starts the next run,
	// in the middle of it.
	var victim int
	for n := 0; ; n++ {
		select {
		case victim = <-fleet.started:
		case <-time.After(5 * time.Second):
			t.Fatal("no run started")
		}
		if n >= 3 {
			break
		}
	}
	killed := time.Now()
	replicas[victim].cron.Stop()
	require.NoError(t, replicas[victim].rdb.Close())

	// The fleet runs later ticks again within the TTL (plus a tick's firing).
	var recovered time.Time
	deadline := time.After(ttl + 3*time.Second)
	for recovered.IsZero() {
		select {
		case i := <-fleet.started:
			if i != victim {
				recovered = time.Now()
			}
		case <-deadline:
			t.Fatal("the fleet did not run a tick after the kill")
		}
	}
	// Run a few more ticks on the survivors.
	for range 3 {
		select {
		case <-fleet.started:
		case <-time.After(5 * time.Second):
			t.Fatal("the survivors stopped running ticks")
		}
	}
	stopAll()

	fleet.mu.Lock()
	defer fleet.mu.Unlock()
	perTick := make(map[int64]int)
	for _, r := range fleet.runs {
		perTick[r.tick.UnixMilli()]++
	}
	twice := 0
	for tick, n := range perTick {
		if n > 1 {
			twice++
			t.Errorf("tick %s ran %d times", time.UnixMilli(tick).Format(time.TimeOnly), n)
		}
	}
	// No two runs overlapped: the killed replica's run still held a valid
	// lease while it went on.
	overlap := 0
	for i, a := range fleet.runs {
		for _, b := range fleet.runs[i+1:] {
			if a.end.IsZero() || b.end.IsZero() {
				continue
			}
			if a.start.Before(b.end) && b.start.Before(a.end) {
				overlap++
			}
		}
	}
	require.Zero(t, overlap, "runs overlapped")
	first, last := fleet.runs[0].tick, fleet.runs[len(fleet.runs)-1].tick
	missing := 0
	for tk := first; !tk.After(last); tk = tk.Add(time.Second) {
		if perTick[tk.UnixMilli()] == 0 {
			missing++
			require.Positive(t, fleet.skipped[tk.UnixMilli()], "tick %s neither ran nor was reported skipped", tk.Format(time.TimeOnly))
		}
	}
	// Ticks fired while the dead replica's lease lived are skipped, not lost
	// silently: every one of them was reported as still running.
	require.LessOrEqual(t, missing, int(ttl/time.Second)+2, "ticks not run after the kill")
	t.Logf("cron kill: replica %d killed mid-run; %d ticks from %s to %s, run twice %d, overlaps %d, "+
		"skipped while its lease lived %d, next run %s after the kill (TTL %s)",
		victim, len(perTick)+missing, first.Format(time.TimeOnly), last.Format(time.TimeOnly), twice, overlap,
		missing, recovered.Sub(killed).Round(time.Millisecond), ttl)
}
