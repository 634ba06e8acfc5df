package every

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseAndNext(t *testing.T) {
	s, ok, err := Parse("@every 10m offset 2m")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "@every 10m0s offset 2m0s", s.String())
	at := time.Date(2026, 3, 2, 9, 3, 0, 0, time.UTC)
	require.Equal(t, time.Date(2026, 3, 2, 9, 12, 0, 0, time.UTC), s.Next(at))
	require.Equal(t, time.Date(2026, 3, 2, 9, 22, 0, 0, time.UTC), s.Next(s.Next(at)))
	require.Equal(t, time.Date(2026, 3, 2, 9, 12, 0, 0, time.UTC), s.Next(time.Date(2026, 3, 2, 9, 2, 0, 0, time.UTC)), "a tick is after t, never t")

	// Two processes that started at different times agree on the ticks.
	s, _, _ = Parse("@every 250ms")
	a, b := s.Next(time.Unix(100, 3e6)), s.Next(time.Unix(100, 190e6))
	require.Equal(t, a, b)
	require.Equal(t, time.Unix(100, 250e6), a)
	require.Equal(t, time.Unix(-1, 0), Schedule{Every: time.Second}.Next(time.Unix(-2, 5)), "before 1970")

	for _, spec := range []string{"@every", "@every x", "@every 0s", "@every 1h offset 1h", "@every 1h offset -1s", "@every 1h after 1m", "@every 500us"} {
		_, ok, err := Parse(spec)
		require.True(t, ok, spec)
		require.Error(t, err, spec)
	}
	_, ok, err = Parse("*/5 * * * *")
	require.False(t, ok)
	require.NoError(t, err)
}
