// Package coretest gives tests the engine under a *lockkit.Locker, to
// take the adapters' kinds of leases (labels, reservations, follow-ups,
// parking) beside the Locker the adapter under test was given.
package coretest

import (
	"testing"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// Of returns the RedisLocker under l, a *lockkit.Locker; it fails the
// test otherwise.
func Of(tb testing.TB, l any) *lockcore.RedisLocker {
	tb.Helper()
	rl, err := lockcore.Of("test", l)
	if err != nil {
		tb.Fatal(err)
	}
	return rl
}
