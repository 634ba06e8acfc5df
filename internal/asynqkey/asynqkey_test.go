package asynqkey

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The names are asynq v0.26's and those running deployments use, byte for
// byte.
func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Queue("default"), "asynq:{default}:"},
		{Task("default", "t-1"), "asynq:{default}:t:t-1"},
		{Pending("default"), "asynq:{default}:pending"},
		{Active("default"), "asynq:{default}:active"},
		{Lease("default"), "asynq:{default}:lease"},
		{Retry("default"), "asynq:{default}:retry"},
		{Copy("default", "t-1"), "asynq:{default}:jobguard-copy:t-1"},
		{TypeKey("report"), "asynq:report"},
		{Reservation(`asynq:report:tenant_id="acme"`), `unique:asynq:report:tenant_id="acme"`},
		{Order("asynq:report"), "jobguard:order:asynq:report"},
	} {
		require.Equal(t, c.want, c.got)
	}
	for _, c := range []struct{ got, want string }{
		{KeyHeader, "jobguard-key"},
		{LabelHeader, "jobguard-origin-id"},
		{OrderHeader, "jobguard-order"},
		{EnqueuedAtHeader, "jobguard-enqueued-at"},
		{DebounceGenHeader, "jobguard-debounce-gen"},
	} {
		require.Equal(t, c.want, c.got, "the header's value is what tasks in running deployments carry")
	}
}
