package lockcore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// Of finds the engine under a *lockkit.Locker, and refuses anything
// else with ErrInvalid naming what needs it and the type it was given.
func TestOfFindsTheEngineUnderARedisLocker(t *testing.T) {
	l := lockkittest.New(t, lockkit.WithOwner("me"))
	rl, err := lockcore.Of("test", l)
	require.NoError(t, err)
	require.Equal(t, "me", rl.Owner())

	for _, other := range []any{nil, (*lockkit.Locker)(nil), struct{ *lockkit.Locker }{l}} {
		_, err := lockcore.Of("middleware.New", other)
		require.ErrorIs(t, err, lockcore.ErrInvalid)
		require.ErrorIs(t, err, lockkit.ErrInvalid)
		require.ErrorContains(t, err, "middleware.New needs a *lockkit.Locker")
	}
}
