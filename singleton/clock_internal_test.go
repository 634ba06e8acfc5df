package singleton

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Client's stamp bounds the Redis server's clock from above between two
// reads of it, for a server clock that runs up to 500 ppm faster than this
// host's: 29 s after a read, the stamp is at least 14.5 ms past read + 29 s.
func TestStampBoundsAServerClockThatRunsFast(t *testing.T) {
	read := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	c := &Client{server: read, synced: time.Now().Add(-29 * time.Second)}
	since := time.Since(c.synced)
	stamp, err := c.now(context.Background())
	require.NoError(t, err)
	fast := read.Add(since + since/2000) // the server's clock, 500 ppm fast
	require.False(t, stamp.Before(fast), "stamp %s is before the server's clock %s", stamp, fast)
}
