package lockcore

import (
	"errors"
	"testing"
	"time"
)

// FuzzOptions checks that every AcquireOptions value is either rejected with an
// ErrInvalid naming the problem, or turned into a request the renewer can
// honour: never a panic, never a lease that cannot be renewed in time.
func FuzzOptions(f *testing.F) {
	f.Add("k", int64(0), int64(0), false, 0, int64(0), int64(0))
	f.Add("", int64(time.Second), int64(0), false, 1, int64(0), int64(0))
	f.Add("k", int64(time.Second), int64(time.Second), false, 1, int64(0), int64(0))
	f.Add("k", int64(-1), int64(0), true, -3, int64(-1), int64(-1))
	f.Add("tenant:42", int64(MinTTL), int64(MinTTL/3), false, 3, int64(1700000000), int64(time.Minute))
	f.Fuzz(func(t *testing.T, key string, ttl, interval int64, noRenew bool, limit int, epoch, epochTTL int64) {
		c, err := newConfig(nil)
		if err != nil {
			t.Fatal(err)
		}
		o := &AcquireOptions{TTL: time.Duration(ttl), RenewInterval: time.Duration(interval), NoRenew: noRenew,
			Limit: limit, Epoch: epoch, EpochTTL: time.Duration(epochTTL)}
		r, err := c.request(key, o)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not match ErrInvalid", err)
			}
			return
		}
		switch {
		case r.key == "":
			t.Fatal("empty key accepted")
		case r.ttl < MinTTL:
			t.Fatalf("TTL %s below MinTTL accepted", r.ttl)
		case !noRenew && (r.interval <= 0 || r.interval >= r.ttl):
			t.Fatalf("renew interval %s not within (0, %s)", r.interval, r.ttl)
		case noRenew && r.interval != 0:
			t.Fatalf("NoRenew lease has renew interval %s", r.interval)
		case r.limit < 1:
			t.Fatalf("limit %d accepted", r.limit)
		case r.epoch < 0 || r.epochTTL <= 0:
			t.Fatalf("epoch %d / epoch TTL %s accepted", r.epoch, r.epochTTL)
		}
	})
}
