package cronkey

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The key is the one running deployments use.
func TestKey(t *testing.T) {
	require.Equal(t, "cron:nightly-report", Key("nightly-report"))
}
