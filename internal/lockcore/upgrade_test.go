package lockcore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
)

// During a rolling upgrade a key holds records that the version before
// wrote: waiter ids that start with "g" (a waiter a release may hand the key
// to) or "y" (a waiting Coalesce follow-up), and holders whose acquire id
// starts with "r" (a reservation) or "z" (a final Coalesce run). Each is
// written here with raw Redis commands as that version writes it, and is
// treated as it was.
func TestRecordsOfThePreviousVersion(t *testing.T) {
	handoverClients(t, func(t *testing.T, newClient func() redis.UniversalClient) {
		ctx := ctxT(t)
		c := newClient()
		l, err := NewRedis(c, WithPrefix(testredis.Prefix(t, c)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		// serverNow is the server's time: ms and us.
		serverNow := func() (int64, int64) {
			now, err := c.Time(ctx).Result()
			require.NoError(t, err)
			return now.UnixMilli(), now.UnixMicro()
		}
		const aid = "0123456789abcdef"

		t.Run("hand-over waiter", func(t *testing.T) {
			k := l.r.keys("g")
			first, err := l.TryAcquire(ctx, "g", &AcquireOptions{Epoch: 1})
			require.NoError(t, err)
			now, _ := serverNow()
			wid := "g89abcdef:60000:" + aid + ":job:old-owner"
			require.NoError(t, c.ZAdd(ctx, k.waiters, redis.Z{Score: float64(now + 5000), Member: wid}).Err())
			require.NoError(t, first.Release(ctx))
			info, err := l.Inspect(ctx, "g")
			require.NoError(t, err)
			require.Len(t, info.Holders, 1, "the release handed the key to the waiter")
			require.Equal(t, "old-owner", info.Holders[0].Owner)
			require.Equal(t, "job", info.Holders[0].Label)
			require.Greater(t, info.Holders[0].Token, first.Token())
			// The waiter gave up meanwhile: it gives the key back.
			require.NoError(t, l.e.b.leave(ctx, "g", wid, aid))
			info, err = l.Inspect(ctx, "g")
			require.NoError(t, err)
			require.Empty(t, info.Holders, "the waiter that left gave the key back")
		})

		t.Run("waiting Coalesce follow-up", func(t *testing.T) {
			k := l.r.keys("y")
			run, err := l.TryAcquire(ctx, "y", &AcquireOptions{Label: "run"})
			require.NoError(t, err)
			defer func() { _ = run.Release(ctx) }()
			now, _ := serverNow()
			require.NoError(t, c.ZAdd(ctx, k.waiters, redis.Z{Score: float64(now + 5000), Member: "y" + aid}).Err())
			_, err = l.TryAcquire(ctx, "y", &AcquireOptions{FollowUp: Coalesce{}})
			var covered *CoveredError
			require.ErrorAs(t, err, &covered)
			require.Equal(t, CoveredByFollowUp, covered.By, "the waiting follow-up covers the call")
		})

		t.Run("reservation", func(t *testing.T) {
			k := l.r.keys("r")
			now, nowus := serverNow()
			member := fmt.Sprintf("%d:r%s:old-owner:%s", nowus, aid, escapeLabel("job"))
			require.NoError(t, c.ZAdd(ctx, k.holders, redis.Z{Score: float64(now + 60000), Member: member}).Err())
			require.NoError(t, c.PExpire(ctx, k.holders, time.Minute).Err())
			info, err := l.Inspect(ctx, "r")
			require.NoError(t, err)
			require.Len(t, info.Holders, 1)
			require.True(t, info.Holders[0].Reserved, "Inspect reports the reservation")
			n, err := l.CancelRun(ctx, "r", Select{})
			require.NoError(t, err)
			require.Zero(t, n, "a reservation runs nothing to cancel")
			_, err = l.TryAcquire(ctx, "r", &AcquireOptions{Label: "other"})
			require.ErrorIs(t, err, ErrNotAcquired, "the reservation holds the key")
			lease, err := l.TryAcquire(ctx, "r", &AcquireOptions{Label: "job", TakeReservation: true})
			require.NoError(t, err, "the job takes its reservation over")
			require.True(t, lease.WasParked())
			require.Greater(t, lease.Token(), nowus)
			require.NoError(t, lease.Release(ctx))
		})

		t.Run("final Coalesce run", func(t *testing.T) {
			for _, final := range []bool{true, false} {
				key := fmt.Sprintf("z%t", final)
				k := l.r.keys(key)
				now, nowus := serverNow()
				id := aid
				if final {
					id = "z" + aid
				}
				// A run that began after the call's work was asked for.
				member := fmt.Sprintf("%d:%s:old-owner:", nowus+int64(time.Minute/time.Microsecond), id)
				require.NoError(t, c.ZAdd(ctx, k.holders, redis.Z{Score: float64(now + 60000), Member: member}).Err())
				require.NoError(t, c.PExpire(ctx, k.holders, time.Minute).Err())
				_, err := l.TryAcquire(ctx, key, &AcquireOptions{FollowUp: Coalesce{Since: time.UnixMicro(nowus)}})
				var covered *CoveredError
				if final {
					require.False(t, errors.As(err, &covered), "a final run covers no other call: %v", err)
					require.ErrorIs(t, err, ErrNotAcquired)
				} else {
					require.ErrorAs(t, err, &covered)
					require.Equal(t, CoveredByRun, covered.By)
				}
			}
		})
	})
}
