package lockcore_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/testredis"
)

// ScanKeys pages the held keys with bounded work per call: following the
// cursors returns every held key matching the pattern, and no released key, whatever the page size and SCAN budget.
func TestScanKeysPagesEveryHeldKey(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { testScanKeys(t, testredis.Client(t)) })
	// On a Cluster the cursor walks its masters one after the other.
	t.Run("cluster", func(t *testing.T) { testScanKeys(t, testredis.Cluster(t)) })
}

func testScanKeys(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	l, err := lockcore.NewRedis(c, lockcore.WithPrefix(testredis.Prefix(t, c)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	var want []string
	for i := range 250 {
		k := fmt.Sprintf("tenant:%03d", i)
		var opt *lockcore.AcquireOptions
		if i%10 == 5 || i%10 == 7 {
			// Holders in the sorted form: a semaphore, a completed label.
			opt = &lockcore.AcquireOptions{Limit: 2, Label: fmt.Sprintf("task-%03d", i)}
		}
		lease, err := l.TryAcquire(ctx, k, opt)
		require.NoError(t, err)
		switch i % 10 {
		case 3:
			require.NoError(t, lease.Release(ctx)) // released: not listed
			continue
		case 7:
			require.NoError(t, lease.Complete(ctx, time.Minute)) // only its record is left: not listed
			continue
		}
		want = append(want, k)
	}
	_, err = l.TryAcquire(ctx, "report:{daily}%", nil)
	require.NoError(t, err)
	for _, o := range []lockcore.ScanOptions{{Count: 50, Calls: 1, Limit: 30}, {Count: 10, Calls: 3, Limit: 7}, {}, {Count: 1000, Limit: 1}} {
		t.Run(fmt.Sprintf("%+v", o), func(t *testing.T) {
			var got []string
			cursor := ""
			for {
				keys, next, err := l.ScanKeys(ctx, "tenant:*", cursor, &o)
				require.NoError(t, err)
				require.True(t, sort.StringsAreSorted(keys))
				require.LessOrEqual(t, len(keys), cmp.Or(o.Limit, lockcore.DefaultScanLimit))
				got = append(got, keys...)
				if next == "" {
					break
				}
				require.NotEqual(t, cursor, next, "a cursor moves on")
				cursor = next
			}
			// SCAN may return a key twice (Redis resized its table meanwhile).
			slices.Sort(got)
			require.Equal(t, want, slices.Compact(got))
		})
	}
	keys, next, err := l.ScanKeys(ctx, "report:{*", "", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"report:{daily}%"}, keys)
	require.Empty(t, next)

	for _, bad := range []string{"x", "0", "0.x", "-1.0", "9.0", "0.0."} {
		_, _, err := l.ScanKeys(ctx, "*", bad, nil)
		require.ErrorIs(t, err, lockcore.ErrInvalid, bad)
	}
	_, _, err = l.ScanKeys(ctx, "*", "", &lockcore.ScanOptions{Calls: -1})
	require.ErrorIs(t, err, lockcore.ErrInvalid)
	require.ErrorContains(t, err, "Calls: -1")
}
