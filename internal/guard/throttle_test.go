package guard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/internal/throttle"
	"github.com/jobguard/jobguard/lockkit"
)

// A redelivery that waited for its own earlier delivery spends no start only
// when that delivery's start is still spent. Here the earlier delivery never
// ran: its acquire took the key in Redis but the reply was lost, so it gave
// its reserved start back, and the Locker removed the holder it left. The
// redelivery, which waited for that holder, takes a start when it gets the
// key: the one given back when the give-back came first (and none if
// another run took it meanwhile: it is throttled and gives the key back),
// or, when the give-back is late, the reservation itself, which the late
// give-back then no longer finds. Either way a newcomer is throttled
// afterwards: one start per period. Every throttle call of the redelivery
// runs twice, as go-redis sends a script again after a lost reply.
func TestThrottleRedeliveryOfAnAcquireThatFailedTakesAStart(t *testing.T) {
	for name, newLocker := range backends(t) {
		for _, then := range []guard.Action{guard.ActionSkip, guard.ActionRequeue} {
			for _, c := range []string{"given back first", "given back late", "budget spent meanwhile"} {
				t.Run(fmt.Sprintf("%s/%s/%s", name, then, c), func(t *testing.T) {
					if name == "redis" {
						testredis.Addr(t)
					}
					redeliveryOfAFailedAcquire(t, newLocker, then, c)
				})
			}
		}
	}
}

func redeliveryOfAFailedAcquire(t *testing.T, newLocker func(*testing.T, ...redis.Hook) *lockkit.Locker, then guard.Action, c string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := []guard.Option{guard.WithThrottle(1, time.Minute, then), guard.WithPolicy(guard.Requeue(time.Second))}
	key := t.Name()
	job := guard.With(guard.Job{Key: key, Name: "t1"}, guard.Work{Label: "t1"})
	other := guard.With(guard.Job{Key: key, Name: "t2"}, guard.Work{Label: "t2"})
	work := func(context.Context) error { return nil }

	// A's acquire runs, and its reply is lost once A's redelivery waits.
	plain, full := testredis.ScriptShape(1, 2), testredis.ScriptShape(8, 20)
	replyLost, resume := make(chan struct{}), make(chan struct{})
	acquire := &testredis.Faults{Match: func(c redis.Cmder) bool { return plain(c) || full(c) },
		After: func(redis.Cmder) { close(replyLost); <-resume }}
	acquire.Arm(testredis.DropReply, 1)
	// What A's failed delivery leaves is removed (the Locker's release of
	// the holder, a release script), and its start given back (ZREMs).
	cleanup := &gate{match: testredis.ScriptShape(8, 11), open: make(chan struct{})}
	giveBack := &gate{match: func(c redis.Cmder) bool { return c.Name() == "zrem" }, open: make(chan struct{})}
	switch c {
	case "given back late":
		close(cleanup.open)
	default:
		close(giveBack.open)
	}
	a, _ := newGuard(t, newLocker(t, acquire, cleanup, giveBack), opts...)
	twice := &testredis.Faults{Match: testredis.ScriptShape(3, 6)} // every throttle call
	twice.Arm(testredis.Repeat, -1)
	b, _ := newGuard(t, newLocker(t, twice), opts...)
	n, _ := newGuard(t, newLocker(t), opts...)
	l := newLocker(t)
	client, prefix := coretest.Of(t, l).Redis()
	starts, err := throttle.New(client, 1, time.Minute, throttle.WithPrefix(prefix))
	require.NoError(t, err)

	aOut := make(chan guard.Outcome, 1)
	go func() { aOut <- a.Run(ctx, job, work) }()
	select {
	case <-replyLost:
	case out := <-aOut:
		t.Fatalf("A's acquire was not sent: %v", out.Err)
	}
	// A newcomer meets the budget A reserved (under ActionRequeue it
	// books its turn, and is back as its claimant below).
	out := n.Run(ctx, other, work)
	require.NotNil(t, out.Duplicate, "%v", out.Err)
	require.Equal(t, guard.ReasonThrottled, out.Duplicate.Reason)

	bOut := make(chan guard.Outcome, 1)
	go func() { bOut <- b.Run(ctx, job, work) }()
	require.Eventually(t, func() bool {
		info, err := l.Inspect(ctx, key)
		return len(bOut) == 1 || err == nil && info.Waiters == 1
	}, 10*time.Second, time.Millisecond, "the redelivery waits for the holder of its earlier delivery")
	require.Empty(t, bOut, "the redelivery waits")
	close(resume)
	var redelivered guard.Outcome
	if c == "given back late" {
		redelivered = <-bOut
		close(giveBack.open)
	}
	out = <-aOut
	require.False(t, out.Ran)
	require.Nil(t, out.Duplicate)
	require.Error(t, out.Err, "A's acquire failed")
	if c == "budget spent meanwhile" {
		// Another task, back in its turn, takes the start A gave back.
		for range 2 {
			_, err := starts.ReserveInTurn(ctx, key, "x", "x")
			require.NoError(t, err)
		}
		wait, err := starts.Start(ctx, key, "x")
		require.NoError(t, err)
		require.Zero(t, wait)
	}
	if c != "given back late" {
		close(cleanup.open)
		redelivered = <-bOut
	}
	if c == "budget spent meanwhile" {
		require.False(t, redelivered.Ran, "a run of another task took the start")
		require.NotNil(t, redelivered.Duplicate, "%v", redelivered.Err)
		require.Equal(t, guard.ReasonThrottled, redelivered.Duplicate.Reason)
		require.Equal(t, then, redelivered.Duplicate.Action)
		info, err := l.Inspect(ctx, key)
		require.NoError(t, err)
		require.Empty(t, info.Holders, "the throttled redelivery gave the key back")
	} else {
		require.True(t, redelivered.Ran, "the redelivery runs (%v)", redelivered.Err)
	}
	require.NotZero(t, twice.Hits())

	out = n.Run(ctx, other, work)
	require.False(t, out.Ran, "a second run began within the period")
	require.NotNil(t, out.Duplicate, "%v", out.Err)
	require.Equal(t, guard.ReasonThrottled, out.Duplicate.Reason)
}

// gate holds the commands, and the pipelines with a command, that match
// until open is closed.
type gate struct {
	match func(redis.Cmder) bool
	open  chan struct{}
}

func (*gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if g.match(cmd) {
			<-g.open
		}
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if g.match(c) {
				<-g.open
				break
			}
		}
		return next(ctx, cmds)
	}
}

// A throttled run costs four round trips: its reservation, the acquire, its
// start and the release; the check that a redelivery's earlier delivery
// spent its start costs the common path none.
func TestThrottledRunCostsFourRoundTrips(t *testing.T) {
	for name, newLocker := range backends(t) {
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				testredis.Addr(t)
			}
			ctx := context.Background()
			var rt testredis.Counter
			g, _ := newGuard(t, newLocker(t, &rt), guard.WithThrottle(2, time.Minute, guard.ActionSkip))
			work := func(context.Context) error { return nil }
			job := guard.With(guard.Job{Key: t.Name() + "/warm", Name: "t"}, guard.Work{Label: "t0"})
			require.True(t, g.Run(ctx, job, work).Ran) // the scripts are loaded, the server's version read
			for i := range 3 {
				rt.Reset()
				job := guard.With(guard.Job{Key: fmt.Sprint(t.Name(), "/", i), Name: "t"}, guard.Work{Label: fmt.Sprint("t", i+1)})
				out := g.Run(ctx, job, work)
				require.True(t, out.Ran, "%v", out.Err)
				require.EqualValues(t, 4, rt.Count(), "run %d", i)
			}
		})
	}
}
