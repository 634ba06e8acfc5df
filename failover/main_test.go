package failover

import (
	"context"
	"os/exec"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial to a killed master; the tests report
	// what they measured themselves.
	redis.SetLogger(silent{})
	// A go-redis pool whose dials to a killed node all failed probes it
	// once a second until it is closed; the probe notices the Close only
	// after its sleep.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}

// needRedis skips the test without the redis-server and redis-cli
// binaries (make test-failover installs them).
func needRedis(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skip(bin + " is not installed; make test-failover installs it")
		}
	}
}
