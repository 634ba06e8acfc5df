package failover

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jobguard/jobguard/lockkit"
)

// TestSentinel runs every scenario on a Sentinel deployment, with lockkit's
// default options.
func TestSentinel(t *testing.T) {
	needRedis(t)
	t.Parallel()
	topo := startSentinel(t)
	checkWithoutOptions(t, measureAll(t, topo, nil))
}

// TestCluster runs every scenario on a Redis Cluster with replicas, with
// lockkit's default options, then checks whether a ClusterClient with
// go-redis's default settings follows a failover on its own.
func TestCluster(t *testing.T) {
	needRedis(t)
	t.Parallel()
	topo := startCluster(t)
	checkWithoutOptions(t, measureAll(t, topo, nil))
	t.Run("client-follows", func(t *testing.T) { clientFollows(t, topo) })
	t.Run("locker-follows", func(t *testing.T) { lockerFollows(t, topo) })
}

// lockerFollows kills the master of a lease held through a ClusterClient
// with go-redis's default slot map reload interval (60s): the Locker has
// its client reload the map when a renewal finds the master dead, so the
// lease is renewed on the promoted replica and not lost.
func lockerFollows(t *testing.T, topo *clusterTopology) {
	ctx := context.Background()
	key := "locker-follows"
	c := topo.clientWith(0)
	defer c.Close()
	renewed := make(chan time.Time, 64)
	// The lease waits for the replica, so that the promoted one has it.
	l, err := lockkit.NewRedis(c, lockkit.WithReplicaAcks(1, time.Second), lockkit.WithObserver(func(e lockkit.Event) {
		if e.Kind == lockkit.LeaseRenewed {
			select {
			case renewed <- time.Now():
			default:
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	lease, err := l.TryAcquire(ctx, key, &lockkit.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m, err := topo.master(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	m.kill()
	if err := topo.promoted(ctx, key); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	// The killed master comes back as the promoted one's replica, which
	// the renewals wait for.
	if err := topo.restore(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case at := <-renewed:
			if at.Before(promoted) {
				continue
			}
			t.Logf("failover: cluster locker: renewed on the promoted replica %s after the promotion", at.Sub(promoted).Round(time.Millisecond))
		case <-lease.Lost():
			t.Fatalf("the lease was lost across the failover: %v", lease.Err())
		}
		break
	}
}

// checkWithoutOptions asserts what the scenarios must show without an
// option that waits for replicas: the harness lost every forced write, and
// a lost acquire lets a second locker take the key while the first still
// works (the negative control), a lost release strands the key.
func checkWithoutOptions(t *testing.T, all []figures) {
	var promoted, writable []time.Duration
	for _, f := range all {
		promoted, writable = append(promoted, f.promoted...), append(writable, f.writable...)
		if len(f.acquireErrs) > 0 {
			t.Errorf("%s: acquires failed: %v", f.scenario, f.acquireErrs)
		}
		if !f.scenario.forced {
			continue
		}
		if f.lostWrites != f.failovers {
			t.Errorf("%s: the promoted replica lacked the write in %d of %d failovers", f.scenario, f.lostWrites, f.failovers)
		}
		switch f.scenario.write {
		case afterAcquire:
			// Before A's first renewal nothing tells A that its lease is gone.
			if f.overlaps < f.failovers-f.late {
				t.Errorf("%s: %d overlaps in %d failovers (%d late): B must take the key while A works", f.scenario,
					f.overlaps, f.failovers, f.late)
			}
			if f.lost != f.failovers {
				t.Errorf("%s: %d of %d leases reported lost", f.scenario, f.lost, f.failovers)
			}
		case afterRelease:
			if f.stranded < f.failovers-f.late {
				t.Errorf("%s: %d stranded keys in %d failovers (%d late)", f.scenario, f.stranded, f.failovers, f.late)
			}
		}
	}
	if len(all) > 0 {
		t.Logf("failover: %s: %d failovers, promoted in median %s, max %s; client writes after median %s, max %s",
			all[0].topology, len(promoted), median(promoted), maxOf(promoted), median(writable), maxOf(writable))
	}
}

// followWait is how long clientFollows waits for a ClusterClient with
// go-redis's default slot map reload interval (60s):
// JOBGUARD_FOLLOW_WAIT, 3s unless set.
func followWait(t *testing.T) time.Duration {
	s := os.Getenv("JOBGUARD_FOLLOW_WAIT")
	if s == "" {
		return 3 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("JOBGUARD_FOLLOW_WAIT=%q: want a positive duration", s)
	}
	return d
}

// clientFollows kills a master and reports when a ClusterClient with
// go-redis's default ClusterStateReloadInterval (60s) writes to the promoted
// replica, beside the harness's client (500ms). A killed master answers no
// MOVED, so nothing but the interval makes the client reload its slot map.
func clientFollows(t *testing.T, topo *clusterTopology) {
	ctx := context.Background()
	key := "cluster-client-follows"
	tuned, dflt := topo.client(), topo.clientWith(0)
	defer tuned.Close()
	defer dflt.Close()
	if err := writable(ctx, tuned, key, promotedWithin); err != nil {
		t.Fatal(err)
	}
	if err := writable(ctx, dflt, key, promotedWithin); err != nil {
		t.Fatal(err)
	}
	m, err := topo.master(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	m.kill()
	if err := topo.promoted(ctx, key); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(killed)
	if err := writable(ctx, tuned, key, promotedWithin); err != nil {
		t.Fatal(err)
	}
	followed := time.Since(killed)
	err = writable(ctx, dflt, key, followWait(t))
	if err != nil {
		t.Logf("failover: cluster client: promoted %s after the kill; a ClusterClient reloading its slots every %s wrote to the new master after %s; one with go-redis's default interval (60s) still failed %s later: %v",
			promoted.Round(time.Millisecond), clusterReloadInterval, followed.Round(time.Millisecond), followWait(t), err)
	} else {
		t.Logf("failover: cluster client: promoted %s after the kill; a ClusterClient reloading its slots every %s wrote to the new master after %s, one with go-redis's default interval (60s) after %s",
			promoted.Round(time.Millisecond), clusterReloadInterval, followed.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	}
	if err := topo.restore(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSentinelReplicaAcks runs every scenario on Sentinel with lockers that
// wait for one replica: no failover lets a second locker take a key while
// the first still works.
func TestSentinelReplicaAcks(t *testing.T) {
	needRedis(t)
	t.Parallel()
	checkWithReplicaAcks(t, measureAll(t, startSentinel(t), replicaAcks))
}

// TestClusterReplicaAcks is TestSentinelReplicaAcks on the Cluster.
func TestClusterReplicaAcks(t *testing.T) {
	needRedis(t)
	t.Parallel()
	checkWithReplicaAcks(t, measureAll(t, startCluster(t), replicaAcks))
}

var replicaAcks = []lockkit.Option{lockkit.WithReplicaAcks(1, 200*time.Millisecond)}

// checkWithReplicaAcks asserts what WithReplicaAcks promises (docs/redis.md):
// no overlap in any scenario; a forced lost acquire fails with
// ErrNotReplicated instead of handing out a lease the promoted replica
// lacks; every acquire that failed failed for want of acknowledgements (a
// shard whose one replica was promoted has none until the killed master is
// back), never with a redirection or another error. A lost release still
// strands its key until its TTL, as documented.
func checkWithReplicaAcks(t *testing.T, all []figures) {
	for _, f := range all {
		if f.overlaps != 0 {
			t.Errorf("%s: %d overlaps in %d failovers", f.scenario, f.overlaps, f.failovers)
		}
		for _, err := range f.acquireErrs {
			if !errors.Is(err, lockkit.ErrNotReplicated) {
				t.Errorf("%s: an acquire failed with %v, not for want of acknowledgements", f.scenario, err)
			}
		}
		if f.scenario.forced && f.scenario.write == afterAcquire && len(f.acquireErrs) != f.failovers {
			t.Errorf("%s: %d of %d acquires not acknowledged by the cut-off replicas failed", f.scenario, len(f.acquireErrs), f.failovers)
		}
	}
}
