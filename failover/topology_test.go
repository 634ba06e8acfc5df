package failover

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// topology is a Redis deployment with replicas that a test starts and owns:
// Sentinel (sentinelTopology) or Cluster (clusterTopology). Its methods
// synchronise with the deployment's own state (ROLE, INFO replication,
// SENTINEL and CLUSTER replies), each within a deadline.
type topology interface {
	// name is "sentinel" or "cluster".
	name() string
	// client returns a new client of the deployment, as a process of its
	// own would have; the caller closes it.
	client() redis.UniversalClient
	// ready waits until the deployment is whole: every node runs, each
	// master's replicas are connected and have all its writes, and every
	// view of it (each sentinel's, each Cluster node's) agrees.
	ready(ctx context.Context) error
	// master returns the node that is key's master now.
	master(ctx context.Context, key string) (*node, error)
	// replicas returns master's replicas.
	replicas(ctx context.Context, master *node) []*node
	// promoted waits until a replica of the killed master is the master of
	// key, as every sentinel (or every surviving Cluster node) says and
	// the replica's ROLE confirms.
	promoted(ctx context.Context, key string) error
	// restart starts the killed nodes again, on their ports and
	// directories: each comes back as a replica of the master that
	// replaced it, in the background.
	restart(ctx context.Context) error
	// restore restarts the killed nodes and waits until they are replicas
	// of the new masters (ready).
	restore(ctx context.Context) error
}

// Deadlines of the topology's waits: a failover takes a second or two, a
// restarted node's full sync a fraction of a second.
const (
	readyWithin    = 30 * time.Second
	promotedWithin = 30 * time.Second
)

// role returns what ROLE says a node is: "master", or "slave" and its
// master's address and link state.
func role(ctx context.Context, n *node) (kind, master, state string, err error) {
	c := n.client()
	defer c.Close()
	r, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return "", "", "", err
	}
	kind = fmt.Sprint(r[0])
	if kind == "slave" && len(r) >= 4 {
		master = fmt.Sprintf("%v:%v", r[1], r[2])
		state = fmt.Sprint(r[3])
	}
	return kind, master, state, nil
}

// replication returns a node's INFO replication section.
func replication(ctx context.Context, n *node) (string, error) {
	c := n.client()
	defer c.Close()
	return c.Info(ctx, "replication").Result()
}

// links returns a wait unless the master_link_status of every replica is
// status ("up" or "down"), and their INFO replication replies.
func links(ctx context.Context, replicas []*node, status string) (infos []string, wait string) {
	for _, r := range replicas {
		info, err := replication(ctx, r)
		if err != nil {
			return nil, r.addr() + ": " + err.Error()
		}
		if got := infoField(info, "master_link_status"); got != status {
			return nil, r.addr() + ": link " + got
		}
		infos = append(infos, info)
	}
	return infos, ""
}

// synced waits until every replica has processed every write master had
// when it was called.
func synced(ctx context.Context, master *node, replicas []*node) error {
	info, err := replication(ctx, master)
	if err != nil {
		return fmt.Errorf("synced: %s: %w", master.addr(), err)
	}
	want, err := strconv.ParseInt(infoField(info, "master_repl_offset"), 10, 64)
	if err != nil {
		return fmt.Errorf("synced: %s: master_repl_offset: %w", master.addr(), err)
	}
	return poll(ctx, readyWithin, func() (string, error) {
		infos, wait := links(ctx, replicas, "up")
		for i, info := range infos {
			if got, _ := strconv.ParseInt(infoField(info, "slave_repl_offset"), 10, 64); got < want {
				return fmt.Sprintf("%s: offset %d < %d", replicas[i].addr(), got, want), nil
			}
		}
		return wait, nil
	})
}

// isolate disconnects master's replicas and keeps them from reconnecting
// (their replication user is turned off on master), then checks that master
// has no replica and that every replica's link is down: a write from then on
// is on master only, until master is killed.
func isolate(ctx context.Context, master *node, replicas []*node) error {
	c := master.client()
	defer c.Close()
	if err := c.Do(ctx, "ACL", "SETUSER", replUser, "off").Err(); err != nil {
		return fmt.Errorf("isolate: %s: %w", master.addr(), err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		return fmt.Errorf("isolate: %s: %w", master.addr(), err)
	}
	return poll(ctx, readyWithin, func() (string, error) {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return master.addr() + ": " + err.Error(), nil
		}
		if n := infoField(info, "connected_slaves"); n != "0" {
			return master.addr() + " has replicas: " + n, nil
		}
		_, wait := links(ctx, replicas, "down")
		return wait, nil
	})
}
