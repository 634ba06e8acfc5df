package gocronguard

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// The documented defaults: a hold of 1s for a job without a schedule, a
// tolerance of 1s (half the interval when shorter), a handover of 1s, and
// the key "gocron:<job>".
func TestDefaults(t *testing.T) {
	l := lockkittest.New(t)
	lk, err := NewLocker(l, WithSchedule("hourly", "@hourly"), WithSchedule("second", "* * * * * *"))
	require.NoError(t, err)
	require.Equal(t, time.Second, lk.hold)
	require.Equal(t, time.Second, lk.scheds["hourly"].tol)
	require.Equal(t, 500*time.Millisecond, lk.scheds["second"].tol, "half the 1s interval")

	ctx := context.Background()
	k, err := lk.Lock(ctx, "report")
	require.NoError(t, err)
	keys, err := l.Keys(ctx, "gocron:*")
	require.NoError(t, err)
	require.Equal(t, []string{"gocron:report"}, keys)
	require.NoError(t, k.Unlock(ctx))

	e, err := NewElector(l, "leader", nil)
	require.NoError(t, err)
	require.Equal(t, time.Second, e.handover)
	require.NoError(t, e.Close(ctx))
}
