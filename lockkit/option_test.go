package lockkit

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
