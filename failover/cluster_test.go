package failover

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// nodeTimeoutMs is the Cluster's cluster-node-timeout: a master that does
// not answer for it is suspected, and failed once a majority of masters
// agree; its replica then waits 500ms to 1s before it asks for votes.
const nodeTimeoutMs = 500

// clusterReloadInterval is how often the harness's ClusterClients reload
// the slot map on their own (go-redis's ClusterStateReloadInterval). A
// ClusterClient reloads it when a node answers MOVED (or READONLY), but a
// killed master answers nothing, and go-redis's default interval is 60s:
// with it a client keeps sending the killed master's slots to the dead
// address for up to a minute (TestClusterClientFollows measures it).
const clusterReloadInterval = 500 * time.Millisecond

// clusterTopology is a Redis Cluster of three masters with one replica each,
// on loopback ports of its own. A replica's failover needs no setting but
// cluster-replica-validity-factor 0 (a replica cut off from its master still
// takes over) and no replica migration (a killed master's replica stays
// where it was put).
type clusterTopology struct {
	nodes []*node
}

// startCluster starts a Cluster in t's temporary directory and waits until
// it is ready; it is stopped when t ends.
func startCluster(t *testing.T) *clusterTopology {
	t.Helper()
	ctx := context.Background()
	c := &clusterTopology{}
	ports, dir := own(t, 6, func() []*node { return c.nodes })
	args := []string{"--cluster", "create"}
	for _, p := range ports {
		n := &node{port: p, dir: filepath.Join(dir, fmt.Sprint("redis-", p))}
		if err := n.write(n.dataConf("cluster-enabled yes", "cluster-config-file nodes.conf",
			fmt.Sprintf("cluster-node-timeout %d", nodeTimeoutMs), "cluster-replica-validity-factor 0",
			"cluster-allow-replica-migration no")); err != nil {
			t.Fatal(err)
		}
		if err := n.start(ctx); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
		args = append(args, n.addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v: %s", err, out)
	}
	if err := c.ready(ctx); err != nil {
		t.Fatalf("the Cluster is not ready: %v", err)
	}
	return c
}

func (c *clusterTopology) name() string { return "cluster" }

func (c *clusterTopology) client() redis.UniversalClient {
	return c.clientWith(clusterReloadInterval)
}

// clientWith returns a ClusterClient of every node that reloads its slot map
// every reload (zero: go-redis's default). Maintenance notifications are
// off: go-redis v9.23 leaves a goroutine of theirs running after Close.
func (c *clusterTopology) clientWith(reload time.Duration) *redis.ClusterClient {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.addr()
	}
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: reload,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
}

// clusterEntry is one line of CLUSTER NODES.
type clusterEntry struct {
	id, addr, master string // master: the master's id for a replica, else "-"
	flags            []string
	connected        bool
	slots            [][2]int
}

func (e clusterEntry) has(flag string) bool { return slices.Contains(e.flags, flag) }

func (e clusterEntry) owns(slot int) bool {
	for _, r := range e.slots {
		if r[0] <= slot && slot <= r[1] {
			return true
		}
	}
	return false
}

// clusterNodes returns n's view of the Cluster (CLUSTER NODES).
func clusterNodes(ctx context.Context, n *node) ([]clusterEntry, error) {
	cl := n.client()
	defer cl.Close()
	s, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var es []clusterEntry
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("%s: CLUSTER NODES line %q", n.addr(), line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		e := clusterEntry{id: f[0], addr: addr, flags: strings.Split(f[2], ","), master: f[3], connected: f[7] == "connected"}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated
			}
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("%s: slot range %q: %w", n.addr(), r, err)
			}
			e.slots = append(e.slots, [2]int{a, b})
		}
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b clusterEntry) int { return strings.Compare(a.addr, b.addr) })
	return es, nil
}

// view is the part of a node's CLUSTER NODES that every node must agree on
// once the Cluster is ready: each node's address, role and master.
func view(es []clusterEntry) string {
	ids := map[string]string{}
	for _, e := range es {
		ids[e.id] = e.addr
	}
	var b strings.Builder
	for _, e := range es {
		role := "master"
		if e.has("slave") {
			role = "replica of " + ids[e.master]
		}
		fmt.Fprintf(&b, "%s %s %v; ", e.addr, role, e.slots)
	}
	return b.String()
}

func (c *clusterTopology) node(addr string) *node {
	for _, n := range c.nodes {
		if n.addr() == addr {
			return n
		}
	}
	return nil
}

func (c *clusterTopology) live() []*node {
	var ns []*node
	for _, n := range c.nodes {
		if n.alive() {
			ns = append(ns, n)
		}
	}
	return ns
}

func (c *clusterTopology) ready(ctx context.Context) error {
	err := poll(ctx, readyWithin, func() (string, error) {
		var agreed string
		for _, n := range c.nodes {
			if !n.alive() {
				return n.addr() + " is not running", nil
			}
			if wait := clusterOK(ctx, n); wait != "" {
				return wait, nil
			}
			es, err := clusterNodes(ctx, n)
			if err != nil {
				return n.addr() + ": " + err.Error(), nil
			}
			if wait := whole(es); wait != "" {
				return n.addr() + " sees " + wait, nil
			}
			if v := view(es); agreed == "" {
				agreed = v
			} else if v != agreed {
				return fmt.Sprintf("the nodes disagree: %s and %s", agreed, v), nil
			}
		}
		return "", nil
	})
	if err != nil {
		return fmt.Errorf("cluster ready: %w", err)
	}
	for _, n := range c.nodes {
		if kind, _, _, err := role(ctx, n); err != nil {
			return err
		} else if kind == "master" {
			if err := synced(ctx, n, c.replicas(ctx, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// clusterOK returns a wait unless n says cluster_state:ok.
func clusterOK(ctx context.Context, n *node) string {
	cl := n.client()
	defer cl.Close()
	info, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return n.addr() + ": " + err.Error()
	}
	if st := infoField(info, "cluster_state"); st != "ok" {
		return n.addr() + ": cluster_state " + st
	}
	return ""
}

// whole returns a wait unless a view shows six connected nodes flagged
// neither failing nor in handshake, three masters that share every slot,
// each with one replica.
func whole(es []clusterEntry) string {
	if len(es) != 6 {
		return fmt.Sprintf("%d nodes", len(es))
	}
	replicas := map[string]int{}
	slots := 0
	for _, e := range es {
		for _, f := range []string{"fail", "fail?", "handshake", "noaddr"} {
			if e.has(f) {
				return e.addr + " flagged " + f
			}
		}
		if !e.connected {
			return e.addr + " disconnected"
		}
		if e.has("slave") {
			replicas[e.master]++
		}
		for _, r := range e.slots {
			slots += r[1] - r[0] + 1
		}
	}
	for _, e := range es {
		if e.has("master") && replicas[e.id] != 1 {
			return fmt.Sprintf("master %s with %d replicas", e.addr, replicas[e.id])
		}
	}
	if slots != 16384 || len(replicas) != 3 {
		return fmt.Sprintf("%d slots assigned, %d masters with replicas", slots, len(replicas))
	}
	return ""
}

// replicas returns the nodes that master's view names as its replicas.
func (c *clusterTopology) replicas(ctx context.Context, master *node) []*node {
	es, err := clusterNodes(ctx, master)
	if err != nil {
		return nil
	}
	var id string
	for _, e := range es {
		if e.addr == master.addr() {
			id = e.id
		}
	}
	var rs []*node
	for _, e := range es {
		if e.has("slave") && e.master == id {
			if n := c.node(e.addr); n != nil {
				rs = append(rs, n)
			}
		}
	}
	return rs
}

// slot returns key's hash slot.
func (c *clusterTopology) slot(ctx context.Context, key string) (int, error) {
	for _, n := range c.live() {
		cl := n.client()
		s, err := cl.ClusterKeySlot(ctx, key).Result()
		cl.Close()
		if err == nil {
			return int(s), nil
		}
	}
	return 0, errors.New("no node answers CLUSTER KEYSLOT")
}

// master returns the node that serves key's slot as a live node sees it.
// Every lock key of lockkit is "<prefix>{<key>}:<part>", in key's slot.
func (c *clusterTopology) master(ctx context.Context, key string) (*node, error) {
	slot, err := c.slot(ctx, key)
	if err != nil {
		return nil, err
	}
	for _, n := range c.live() {
		es, err := clusterNodes(ctx, n)
		if err != nil {
			continue
		}
		for _, e := range es {
			if e.has("master") && !e.has("fail") && e.owns(slot) {
				if m := c.node(e.addr); m != nil && m.alive() {
					return m, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no live master serves slot %d", slot)
}

func (c *clusterTopology) promoted(ctx context.Context, key string) error {
	slot, err := c.slot(ctx, key)
	if err != nil {
		return err
	}
	return poll(ctx, promotedWithin, func() (string, error) {
		var owner string
		for _, n := range c.live() {
			if wait := clusterOK(ctx, n); wait != "" {
				return wait, nil
			}
			es, err := clusterNodes(ctx, n)
			if err != nil {
				return n.addr() + ": " + err.Error(), nil
			}
			var o string
			for _, e := range es {
				if e.has("master") && e.owns(slot) {
					o = e.addr
				}
			}
			if m := c.node(o); m == nil || !m.alive() {
				return fmt.Sprintf("%s: slot %d is still served by %q", n.addr(), slot, o), nil
			}
			if owner != "" && o != owner {
				return fmt.Sprintf("the nodes disagree on slot %d: %s and %s", slot, owner, o), nil
			}
			owner = o
		}
		kind, _, _, err := role(ctx, c.node(owner))
		if err != nil {
			return owner + ": " + err.Error(), nil
		}
		if kind != "master" {
			return owner + " is " + kind + ", not promoted yet", nil
		}
		return "", nil
	})
}

func (c *clusterTopology) restart(ctx context.Context) error { return restart(ctx, c.nodes) }

func (c *clusterTopology) restore(ctx context.Context) error {
	if err := c.restart(ctx); err != nil {
		return err
	}
	return c.ready(ctx)
}
