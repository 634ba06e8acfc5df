package lockcore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// faultyLocker returns a RedisLocker whose client runs commands through a
// Faults hook matching match, and a clean client of the same Redis.
func faultyLocker(t *testing.T, match func(redis.Cmder) bool, opts ...Option) (*RedisLocker, *testredis.Faults, *RedisLocker) {
	t.Helper()
	clean := testredis.Client(t)
	hook := &testredis.Faults{Match: match}
	c := hookedClient(t, hook)
	prefix := testredis.Prefix(t, clean)
	l, err := NewRedis(c, append([]Option{WithPrefix(prefix), WithOwner("faulty")}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	observer, err := NewRedis(clean, WithPrefix(prefix), WithOwner("observer"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = observer.Close(context.Background()) })
	return l, hook, observer
}

// anyScript matches a call of any of the scripts with sources srcs.
func anyScript(srcs ...string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		for _, src := range srcs {
			if testredis.IsScript(src)(cmd) {
				return true
			}
		}
		return false
	}
}

func holders(t *testing.T, l Locker, key string) []Holder {
	t.Helper()
	info, err := l.Inspect(context.Background(), key)
	require.NoError(t, err)
	return info.Holders
}

// go-redis sends a command again when its reply is late or lost. The repeated
// acquire script must return the lease its first run took, not a conflict
// with it.
func TestRepeatedAcquireReturnsTheSameLease(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			ctx := ctxT(t)
			l, hook, observer := faultyLocker(t, anyScript(append(acquireSources(), plainAcquireSrc)...))
			hook.Arm(testredis.Repeat, 1)
			var (
				lease *Lease
				err   error
			)
			if wait {
				lease, err = l.Acquire(ctx, "job", nil)
			} else {
				lease, err = l.TryAcquire(ctx, "job", nil)
			}
			require.NoError(t, err)
			require.EqualValues(t, 1, hook.Hits())
			hs := holders(t, observer, "job")
			require.Len(t, hs, 1)
			require.Equal(t, lease.Token(), hs[0].Token)
			require.NoError(t, lease.Release(ctx))
			require.Empty(t, holders(t, observer, "job"))
		})
	}
}

// A repeated acquire under a limit that differs from the holder's counts
// once: its second run finds its own holder, not a conflict with it, and
// the key keeps the smaller limit of the two.
func TestRepeatedAcquireUnderAnotherLimitCountsOnce(t *testing.T) {
	ctx := ctxT(t)
	l, hook, observer := faultyLocker(t, anyScript(acquireSources()...))
	first, err := observer.TryAcquire(ctx, "k", &AcquireOptions{Limit: 3})
	require.NoError(t, err)
	hook.Arm(testredis.Repeat, 1)
	lease, err := l.TryAcquire(ctx, "k", &AcquireOptions{Limit: 2})
	require.NoError(t, err)
	require.EqualValues(t, 1, hook.Hits())
	require.Len(t, holders(t, observer, "k"), 2)
	_, err = observer.TryAcquire(ctx, "k", &AcquireOptions{Limit: 3})
	require.ErrorIs(t, err, ErrNotAcquired, "the holder with limit 2 keeps the key at two")
	require.NoError(t, lease.Release(ctx))
	require.NoError(t, first.Release(ctx))
}

// An acquire whose script ran but whose reply never arrived fails, and the
// holder it left is removed within one renewal interval; a late run of the
// same call cannot take the key afterwards.
func TestFailedAcquireLeavesNoHolder(t *testing.T) {
	for _, f := range []testredis.Fault{testredis.DropReply, testredis.Late} {
		for _, wait := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/wait=%v", f, wait), func(t *testing.T) {
				ctx := ctxT(t)
				ttl := 3 * time.Second
				l, hook, observer := faultyLocker(t, anyScript(append(acquireSources(), plainAcquireSrc)...), WithTTL(ttl))
				hook.Arm(f, 1)
				actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				var err error
				if wait {
					_, err = l.Acquire(actx, "job", nil)
				} else {
					_, err = l.TryAcquire(actx, "job", nil)
				}
				require.Error(t, err)
				require.NotErrorIs(t, err, ErrNotAcquired, "an unknown outcome is not a conflict")
				returned := time.Now()
				require.Eventually(t, func() bool { return len(holders(t, observer, "job")) == 0 }, ttl/3, 5*time.Millisecond)
				t.Logf("%s: holder removed %s after the call returned", f, time.Since(returned).Round(time.Millisecond))
				other, err := observer.TryAcquire(ctx, "job", nil)
				require.NoError(t, err)
				require.NoError(t, other.Release(ctx))
			})
		}
	}
}

// A release that Redis ran but whose reply was lost and sent again still
// succeeds: Do reports the job's own result, not ErrNotHeld.
func TestRepeatedReleaseSucceeds(t *testing.T) {
	ctx := ctxT(t)
	l, hook, observer := faultyLocker(t, anyScript(append(releaseSources(), plainReleaseSrc)...))
	hook.Arm(testredis.Repeat, 1)
	ran := false
	err := Do(ctx, l, "job", nil, func(context.Context) error { ran = true; return nil })
	require.NoError(t, err)
	require.True(t, ran)
	require.EqualValues(t, 1, hook.Hits())
	require.Empty(t, holders(t, observer, "job"))
}

// A release whose reply was lost returns the error, and the holder is gone
// all the same.
func TestFailedReleaseLeavesNoHolder(t *testing.T) {
	ctx := ctxT(t)
	l, hook, observer := faultyLocker(t, anyScript(append(releaseSources(), plainReleaseSrc)...))
	lease, err := l.TryAcquire(ctx, "job", nil)
	require.NoError(t, err)
	hook.Arm(testredis.DropReply, 1)
	require.Error(t, lease.Release(ctx))
	require.Eventually(t, func() bool { return len(holders(t, observer, "job")) == 0 }, time.Second, 5*time.Millisecond)
}

// An acquire whose script lands after Close started is released, never
// handed out: it would never be renewed.
func TestAcquireDuringCloseIsReleased(t *testing.T) {
	ctx := ctxT(t)
	l, hook, observer := faultyLocker(t, anyScript(append(acquireSources(), plainAcquireSrc)...))
	inFlight := make(chan struct{})
	hook.Before = func(redis.Cmder) {
		close(inFlight)
		require.Eventually(t, l.e.isClosed, 5*time.Second, time.Millisecond)
	}
	hook.Arm(testredis.Repeat, 1) // any fault that runs the script; Before holds it
	done := make(chan error, 1)
	go func() {
		lease, err := l.TryAcquire(ctx, "job", nil)
		if lease != nil {
			err = errors.Join(err, errors.New("a lease was handed out after Close"))
		}
		done <- err
	}()
	<-inFlight
	require.NoError(t, l.Close(ctx))
	require.ErrorIs(t, <-done, ErrClosed)
	require.Empty(t, holders(t, observer, "job"), "Close returned with a holder no Lease represents")
	_, err := l.TryAcquire(ctx, "job", nil)
	require.ErrorIs(t, err, ErrClosed)
}

// A renewal still in flight when Extend lengthens the lease must not shorten
// it again when it lands, and the holder never believes in more time than
// Redis gives it.
func TestExtendRacingRenewal(t *testing.T) {
	ctx := ctxT(t)
	clean := testredis.Client(t)
	c := redis.NewClient(clean.Options())
	t.Cleanup(func() { _ = c.Close() })
	hold := make(chan struct{})
	held := make(chan struct{})
	landed := make(chan struct{})
	hook := &testredis.Faults{
		Match:  testredis.IsScript(extendSrc),
		Before: func(redis.Cmder) { close(held); <-hold },
		After:  func(redis.Cmder) { close(landed) },
	}
	c.AddHook(hook)
	prefix := testredis.Prefix(t, clean)
	l, err := NewRedis(c, WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	observer, err := NewRedis(clean, WithPrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = observer.Close(context.Background()) })

	lease, err := l.TryAcquire(ctx, "job", &AcquireOptions{TTL: 600 * time.Millisecond}) // renewed every 200ms
	require.NoError(t, err)
	// Hold the first renewal (a pipeline of one EVALSHA) in flight.
	hook.Arm(testredis.Repeat, 1)
	<-held
	require.NoError(t, lease.Extend(ctx, 10*time.Second))
	close(hold)
	<-landed
	hs := holders(t, observer, "job")
	require.Len(t, hs, 1)
	require.Greater(t, hs[0].TTL, 5*time.Second, "the late renewal shortened the extended lease")
	require.True(t, lease.validUntilLocked().Before(time.Now().Add(hs[0].TTL)), "the holder believes in more time than Redis gives")
	require.NoError(t, lease.Release(ctx))
}

// A server older than MinRedisVersion is refused with a clear error.
func TestOldRedisIsRefused(t *testing.T) {
	ctx := ctxT(t)
	c := redis.NewClient(testredis.Client(t).Options())
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(fakeVersion("6.0.16"))
	l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	defer l.Close(ctx)
	_, err = l.TryAcquire(ctx, "job", nil)
	require.ErrorIs(t, err, ErrUnsupported)
	require.ErrorContains(t, err, "Redis 6.0.16 is older than 6.2.0")
	_, err = l.Acquire(ctx, "job", nil)
	require.ErrorIs(t, err, ErrUnsupported)

	c2 := redis.NewClient(testredis.Client(t).Options())
	t.Cleanup(func() { _ = c2.Close() })
	c2.AddHook(fakeVersion("6.2.0"))
	l2, err := NewRedis(c2, WithPrefix(testredis.Prefix(t, c2)))
	require.NoError(t, err)
	defer l2.Close(ctx)
	lease, err := l2.TryAcquire(ctx, "job", nil)
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))
}

type fakeVersion string

func (v fakeVersion) DialHook(next redis.DialHook) redis.DialHook { return next }
func (v fakeVersion) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "info" {
			cmd.(*redis.StringCmd).SetVal("# Server\r\nredis_version:" + string(v) + "\r\nredis_mode:standalone\r\n")
			return nil
		}
		return next(ctx, cmd)
	}
}
func (v fakeVersion) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Close releases every chunk of leases it can: a chunk whose release fails
// does not keep the leases of the next chunks held until their TTL.
func TestCloseGoesOnPastAFailedChunk(t *testing.T) {
	ctx := ctxT(t)
	l, hook, observer := faultyLocker(t, anyScript(plainReleaseSrc), WithRenewBatch(2))
	keys := []string{"a", "b", "c", "d", "e", "f"}
	for _, k := range keys {
		_, err := l.TryAcquire(ctx, k, nil)
		require.NoError(t, err)
	}
	hook.Arm(testredis.DropReply, 1) // the first chunk's pipeline: it ran, its reply is lost
	err := l.Close(ctx)
	require.ErrorIs(t, err, testredis.ErrInjected, "Close reports the chunk it could not confirm")
	require.EqualValues(t, 1, hook.Hits())
	for _, k := range keys {
		require.Empty(t, holders(t, observer, k), "key %q is still held after Close", k)
	}
}

// Close sends its chunks of releases side by side, so that a partition
// costs go-redis' retries once per closeChunks chunks, not once per chunk.
func TestCloseSendsChunksSideBySide(t *testing.T) {
	ctx := ctxT(t)
	clean := testredis.Client(t)
	c := redis.NewClient(clean.Options())
	t.Cleanup(func() { _ = c.Close() })
	gate := &meetHook{want: closeChunks, met: make(chan struct{})}
	c.AddHook(gate)
	prefix := testredis.Prefix(t, clean)
	l, err := NewRedis(c, WithPrefix(prefix), WithRenewBatch(1))
	require.NoError(t, err)
	for i := range 2 * closeChunks {
		_, err := l.TryAcquire(ctx, fmt.Sprintf("k%d", i), nil)
		require.NoError(t, err)
	}
	gate.arm()
	require.NoError(t, l.Close(ctx))
	gate.mu.Lock()
	defer gate.mu.Unlock()
	require.False(t, gate.late, "Close never had %d releases in flight at once", closeChunks)
}

// meetHook, once armed, holds each script call until want of them are in
// flight at once (closing met), or gives up after a second (late).
type meetHook struct {
	want  int
	met   chan struct{}
	mu    sync.Mutex
	armed bool
	n     int
	late  bool // a call gave up waiting for the others
}

func (h *meetHook) arm() { h.mu.Lock(); h.armed = true; h.mu.Unlock() }

func (h *meetHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *meetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		armed := h.armed && (cmd.Name() == "evalsha" || cmd.Name() == "eval")
		if armed {
			if h.n++; h.n == h.want {
				close(h.met)
			}
		}
		h.mu.Unlock()
		if armed {
			select {
			case <-h.met:
			case <-time.After(time.Second):
				h.mu.Lock()
				h.late = true
				h.mu.Unlock()
			}
		}
		return next(ctx, cmd)
	}
}

func (h *meetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The hand-over of a held release (HoldAtLeast) whose reply was lost is sent
// again: the repeat finds the reservation its first run made, and the
// parked job is passed to OnParked once.
func TestHandOverWhoseReplyWasLostIsSentAgain(t *testing.T) {
	ctx := ctxT(t)
	isHandOver := func(cmd redis.Cmder) bool {
		a := cmd.Args()
		return testredis.ScriptShape(8, 11)(cmd) && fmt.Sprint(a[len(a)-1]) == "1"
	}
	l, hook, observer := faultyLocker(t, isHandOver)
	calls := make(chan string, 4)
	onParked := func(_, id string) { calls <- id }
	holder, err := l.TryAcquire(ctx, "job", &AcquireOptions{HoldAtLeast: 200 * time.Millisecond, Park: &Parking{OnParked: onParked}})
	require.NoError(t, err)
	_, err = observer.TryAcquire(ctx, "job", &AcquireOptions{Label: "j1", TakeReservation: true, Park: &Parking{ID: "id-j1", OnParked: onParked}})
	require.ErrorIs(t, err, ErrNotAcquired)
	hook.Arm(testredis.DropReply, 1)
	require.NoError(t, holder.Release(ctx))
	select {
	case id := <-calls:
		require.Equal(t, "id-j1", id)
	case <-ctx.Done():
		t.Fatal("OnParked not called")
	}
	require.EqualValues(t, 1, hook.Hits(), "the first hand-over's reply was dropped")
	hs := holders(t, observer, "job")
	require.Len(t, hs, 1)
	require.Equal(t, "parked:id-j1", hs[0].Owner)
	select {
	case id := <-calls:
		t.Fatalf("OnParked called once more, with %s", id)
	case <-time.After(50 * time.Millisecond):
	}
}

// parkedCalls returns an OnParked that sends each id it is passed to the
// channel it returns.
func parkedCalls() (func(key, id string), chan string) {
	calls := make(chan string, 4)
	return func(_, id string) { calls <- id }, calls
}

// expectParked waits for OnParked to be passed want (the Locker's
// background loop sends what a failed call left within milliseconds; 5 s
// bound the wait), then checks that the key is reserved for want and that
// OnParked is not passed anything more.
func expectParked(t *testing.T, calls chan string, observer *RedisLocker, key, want string) {
	t.Helper()
	select {
	case id := <-calls:
		require.Equal(t, want, id)
	case <-time.After(5 * time.Second):
		t.Fatalf("OnParked(%s) not called", want)
	}
	hs := holders(t, observer, key)
	require.Len(t, hs, 1)
	require.Equal(t, "parked:"+want, hs[0].Owner)
	select {
	case id := <-calls:
		t.Fatalf("OnParked called once more, with %s", id)
	case <-time.After(50 * time.Millisecond):
	}
}

// A release whose reply was lost, or came after the caller gave up, ran:
// it reserved the key for the oldest parked job. The Locker sends it again,
// the repeat reports that job, and the job is passed to OnParked once, as
// by the release itself: it is not left to its backstop while the key
// stays reserved for it.
func TestReleaseWhoseReplyWasLostStartsTheParkedJob(t *testing.T) {
	for _, f := range []testredis.Fault{testredis.DropReply, testredis.Late} {
		t.Run(f.String(), func(t *testing.T) {
			ctx := ctxT(t)
			l, hook, observer := faultyLocker(t, testredis.ScriptShape(8, 11))
			onParked, calls := parkedCalls()
			holder, err := l.TryAcquire(ctx, "job", &AcquireOptions{Park: &Parking{OnParked: onParked}})
			require.NoError(t, err)
			_, err = observer.TryAcquire(ctx, "job", &AcquireOptions{Label: "j1", TakeReservation: true,
				Park: &Parking{ID: "id-j1", Hold: time.Minute, OnParked: onParked}})
			require.ErrorIs(t, err, ErrNotAcquired)
			hook.Arm(f, 1)
			rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			require.Error(t, holder.Release(rctx), "the reply was lost")
			require.EqualValues(t, 1, hook.Hits())
			expectParked(t, calls, observer, "job", "id-j1")
		})
	}
}

// An acquire whose reply was lost may have taken the key (here, a parked
// job taking its reservation over): the Locker removes the holder it left
// and, as that lease's release would, reserves the key for the next parked
// job and passes it to OnParked.
func TestAcquireWhoseReplyWasLostHandsTheKeyToTheNextParkedJob(t *testing.T) {
	for _, f := range []testredis.Fault{testredis.DropReply, testredis.Late} {
		t.Run(f.String(), func(t *testing.T) {
			ctx := ctxT(t)
			l, hook, observer := faultyLocker(t, anyScript(acquireSources()...))
			onParked, calls := parkedCalls()
			parkedOpts := func(label string) *AcquireOptions {
				return &AcquireOptions{Label: label, TakeReservation: true, Park: &Parking{ID: "id-" + label, Hold: time.Minute, OnParked: onParked}}
			}
			holder, err := observer.TryAcquire(ctx, "job", &AcquireOptions{Park: &Parking{OnParked: onParked}})
			require.NoError(t, err)
			for _, label := range []string{"j1", "j2"} {
				_, err = observer.TryAcquire(ctx, "job", parkedOpts(label))
				require.ErrorIs(t, err, ErrNotAcquired)
			}
			require.NoError(t, holder.Release(ctx))
			require.Equal(t, "id-j1", <-calls)

			hook.Arm(f, 1)
			actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			_, err = l.TryAcquire(actx, "job", parkedOpts("j1"))
			require.Error(t, err, "the reply was lost")
			require.NotErrorIs(t, err, ErrNotAcquired)
			require.EqualValues(t, 1, hook.Hits())
			expectParked(t, calls, observer, "job", "id-j2")
		})
	}
}
