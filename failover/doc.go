// Package failover holds jobguard's failover tests: lockkit leases on a
// Redis Sentinel deployment (a master, two replicas, three sentinels) and
// on a Redis Cluster with a replica per master, each started by the test on
// loopback ports of its own. A master is SIGKILLed right after a lease's
// acquire, its release or a renewal, a replica is promoted, and the killed
// node comes back as its replica, so that one test goes through many
// failovers. Replication is asynchronous: a forced variant of each scenario
// cuts the replicas off before the write, so that the promoted replica
// certainly lacks it (the negative control). Each scenario logs one line of
// figures: overlaps (a second locker took the key while the first still
// believed it held it), lost leases, stranded keys, and how long the
// failovers took.
//
// Run it with `make test-failover` (FAILOVERS=n failovers per scenario,
// JOBGUARD_FAILOVERS to go test; 1 unless set). JOBGUARD_FOLLOW_WAIT sets how
// long the Cluster test waits for a ClusterClient with go-redis's default
// slot map reload interval to follow a failover (3s unless set).
package failover
