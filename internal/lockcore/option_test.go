package lockcore

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestLockerOptionValidation(t *testing.T) {
	_, err := NewRedis(nil)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "client is nil")
	_, err = NewRedis((*redis.Client)(nil))
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "client is a nil *redis.Client")
	_, err = NewRedis((*redis.ClusterClient)(nil))
	require.ErrorIs(t, err, ErrInvalid)

	cases := []struct {
		name string
		opt  Option
		want string
	}{
		{"TTL below MinTTL", WithTTL(time.Millisecond), "WithTTL(1ms): must be at least 100ms"},
		{"TTL above MaxTTL", WithTTL(math.MaxInt64), "at most 876000h0m0s"},
		{"huge poll interval", WithPollInterval(math.MaxInt64), "WithPollInterval(2562047h47m16.854775807s)"},
		{"zero poll interval", WithPollInterval(0), "WithPollInterval(0s): must be positive"},
		{"zero renew batch", WithRenewBatch(0), "WithRenewBatch(0): must be positive"},
	}
	client := redis.NewClient(&redis.Options{})
	t.Cleanup(func() { _ = client.Close() })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewRedis(client, c.opt)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestDefaults(t *testing.T) {
	c, err := newConfig(nil)
	require.NoError(t, err)
	require.Equal(t, DefaultTTL, c.ttl)
	require.Equal(t, 30*time.Second, DefaultTTL)
	require.Equal(t, DefaultPrefix, c.prefix)
	require.Equal(t, DefaultPollInterval, c.poll)
	require.Equal(t, DefaultRenewBatch, c.renewBatch)

	host, _ := os.Hostname()
	parts := strings.Split(c.owner, ":")
	require.Len(t, parts, 3, "owner %q is hostname:pid:random", c.owner)
	require.Equal(t, host, parts[0])
	require.NotEqual(t, defaultOwner(), defaultOwner())

	r, err := c.request("k", nil)
	require.NoError(t, err)
	require.Equal(t, DefaultTTL/3, r.interval, "renewed every TTL/3")
	require.Equal(t, 1, r.limit)
	require.Equal(t, DefaultTTL, r.epochTTL)
}

func TestRenewRetryBacksOff(t *testing.T) {
	const interval = 100 * time.Millisecond
	require.Equal(t, 25*time.Millisecond, renewRetry(interval, 1, time.Hour))
	require.Equal(t, 50*time.Millisecond, renewRetry(interval, 2, time.Hour))
	require.Equal(t, 200*time.Millisecond, renewRetry(interval, 4, time.Hour))
	require.Equal(t, 150*time.Millisecond, renewRetry(interval, 5, 300*time.Millisecond), "at most half the validity left")
	require.Equal(t, 10*time.Millisecond, renewRetry(interval, 3, 0), "at least 10ms")
	require.Equal(t, 10*time.Millisecond, renewRetry(time.Millisecond, 1, time.Hour))
}

// Each invalid FollowUp or Park is ErrInvalid naming the field and the bad
// value; a pointer to a FollowUp stands for its value.
func TestFollowUpAndParkValidation(t *testing.T) {
	c, err := newConfig(nil)
	require.NoError(t, err)
	type embedded struct{ KeepNewest }
	cases := []struct {
		name string
		opt  AcquireOptions
		want string
	}{
		{"coalesce with limit 2", AcquireOptions{FollowUp: Coalesce{}, Limit: 2}, "Coalesce works with one holder and no Fair queue (Limit 2, Fair false)"},
		{"coalesce with fair", AcquireOptions{FollowUp: &Coalesce{}, Fair: true}, "Coalesce works with one holder and no Fair queue (Limit 1, Fair true)"},
		{"since before 1970", AcquireOptions{FollowUp: Coalesce{Since: time.Unix(-1, 0)}}, "Coalesce.Since 1969-12-31T23:59:59Z is not after 1970"},
		{"negative cover", AcquireOptions{FollowUp: Coalesce{CoverFor: -time.Second}}, "Coalesce.CoverFor -1s must not be negative"},
		{"negative order", AcquireOptions{FollowUp: KeepNewest{Order: -1}}, "KeepNewest.Order -1 must not be negative"},
		{"preempt with limit 2", AcquireOptions{FollowUp: Preempt{}, Limit: 2}, "Preempt works with one holder and no Fair queue (Limit 2, Fair false)"},
		{"negative preempt order", AcquireOptions{FollowUp: Preempt{Order: -2}}, "Preempt.Order -2 must not be negative"},
		{"negative grace", AcquireOptions{FollowUp: Preempt{Grace: -time.Second}}, "Preempt.Grace -1s must not be negative"},
		{"nil pointer", AcquireOptions{FollowUp: (*Preempt)(nil)}, "FollowUp is a nil *lockcore.Preempt"},
		{"other type", AcquireOptions{FollowUp: embedded{}}, "FollowUp lockcore.embedded is not a Coalesce, KeepNewest or Preempt value"},
		{"park without label", AcquireOptions{Park: &Parking{ID: "x"}}, `Park.ID "x" needs a Label and Limit 1 (Label "", Limit 1)`},
		{"park with limit 2", AcquireOptions{Park: &Parking{ID: "x"}, Label: "l", Limit: 2}, `Park.ID "x" needs a Label and Limit 1 (Label "l", Limit 2)`},
		{"negative hold", AcquireOptions{Park: &Parking{Hold: -time.Second}}, "Park.Hold -1s must not be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.request("k", &tc.opt)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// The follow-ups map onto the request as the scripts expect; the zero
// values take their documented defaults.
func TestFollowUpDefaults(t *testing.T) {
	c, err := newConfig(nil)
	require.NoError(t, err)
	r, err := c.request("k", &AcquireOptions{FollowUp: Coalesce{Final: true}, Park: &Parking{}})
	require.NoError(t, err)
	require.Equal(t, modeCoalesce, r.mode)
	require.True(t, r.final)
	require.Equal(t, "z", r.aid[:1], "a final call's acquire id")
	require.Equal(t, int64(-1), r.since, "zero Since: the first attempt")
	require.Equal(t, DefaultCoverFor, r.coverFor)
	require.Equal(t, 24*time.Hour, DefaultCoverFor)
	require.Equal(t, DefaultParkHold, r.parkHold)
	require.Equal(t, 5*time.Second, DefaultParkHold)
	require.False(t, r.later, "the first attempt")

	r, err = c.request("k", &AcquireOptions{FollowUp: KeepNewest{Order: 7}})
	require.NoError(t, err)
	require.Equal(t, modeKeepNewest, r.mode)
	require.Equal(t, int64(7), r.order)

	r, err = c.request("k", &AcquireOptions{FollowUp: &Preempt{Order: 3, Grace: time.Second}})
	require.NoError(t, err)
	require.Equal(t, modePreempt, r.mode)
	require.True(t, r.mode.keepsNewest(), "Preempt keeps the newest")
	require.Equal(t, int64(3), r.order)
	require.Equal(t, time.Second, r.grace)

	r, err = c.request("k", nil)
	require.NoError(t, err)
	require.Equal(t, modeNone, r.mode)
	require.Empty(t, r.park)
}
