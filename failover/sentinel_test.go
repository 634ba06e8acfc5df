package failover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
)

// masterName is the name the sentinels monitor the master under.
const masterName = "jobs"

// Sentinel timings: a master that does not answer for downAfterMs is down;
// a failover may be tried again after twice failoverTimeoutMs. The SENTINEL
// DEBUG periods are shortened too, so that a failover takes about two
// seconds, not ten, and that a killed master that comes back is made a
// replica within a second (the sentinels wait four publish periods before
// they reconfigure it). A sentinel pings every ping period (at most
// downAfterMs): with the two equal (500ms), the sentinels took a master
// they had just promoted for down and failed it over again within a second,
// losing what had been written to it. A replica is promoted only if its
// last INFO (sent every second during a failover) is younger than five ping
// periods (with 100ms, failovers were aborted for want of a replica).
const (
	downAfterMs       = 1000
	failoverTimeoutMs = 1000
)

var sentinelDebug = []any{"SENTINEL", "DEBUG", "ping-period", 300, "ask-period", 100, "publish-period", 200, "info-period", 500}

// sentinelTopology is one master, two replicas and three sentinels (quorum
// 2) on loopback ports of their own.
type sentinelTopology struct {
	data      []*node
	sentinels []*node
}

// startSentinel starts a Sentinel deployment in t's temporary directory and
// waits until it is ready; it is stopped when t ends.
func startSentinel(t *testing.T) *sentinelTopology {
	t.Helper()
	ctx := context.Background()
	s := &sentinelTopology{}
	ports, dir := own(t, 6, func() []*node { return append(slices.Clone(s.data), s.sentinels...) })
	for i, p := range ports[:3] {
		n := &node{port: p, dir: filepath.Join(dir, fmt.Sprint("redis-", p))}
		var extra []string
		if i > 0 {
			extra = append(extra, fmt.Sprintf("replicaof 127.0.0.1 %d", ports[0]))
		}
		if err := n.write(n.dataConf(extra...)); err != nil {
			t.Fatal(err)
		}
		if err := n.start(ctx); err != nil {
			t.Fatal(err)
		}
		s.data = append(s.data, n)
	}
	for _, p := range ports[3:] {
		n := &node{port: p, dir: filepath.Join(dir, fmt.Sprint("sentinel-", p)), sentinel: true}
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n", p, n.dir, n.log()) +
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n", masterName, ports[0]) +
			fmt.Sprintf("sentinel down-after-milliseconds %s %d\n", masterName, downAfterMs) +
			fmt.Sprintf("sentinel failover-timeout %s %d\n", masterName, failoverTimeoutMs) +
			fmt.Sprintf("sentinel parallel-syncs %s 2\n", masterName)
		if err := n.write(conf); err != nil {
			t.Fatal(err)
		}
		if err := n.start(ctx); err != nil {
			t.Fatal(err)
		}
		s.sentinels = append(s.sentinels, n)
		c := n.client()
		err := c.Do(ctx, sentinelDebug...).Err()
		c.Close()
		if err != nil {
			t.Fatalf("sentinel %s: %v", n.addr(), err)
		}
	}
	if err := s.ready(ctx); err != nil {
		t.Fatalf("the Sentinel deployment is not ready: %v", err)
	}
	return s
}

func (s *sentinelTopology) name() string { return "sentinel" }

func (s *sentinelTopology) client() redis.UniversalClient {
	addrs := make([]string, len(s.sentinels))
	for i, n := range s.sentinels {
		addrs[i] = n.addr()
	}
	return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: masterName, SentinelAddrs: addrs})
}

// masterAddr returns the master's address that every sentinel gives
// (SENTINEL GET-MASTER-ADDR-BY-NAME), or a wait naming the disagreement.
func (s *sentinelTopology) masterAddr(ctx context.Context) (addr, wait string) {
	for _, n := range s.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: n.addr(), MaxRetries: -1, DialerRetries: 1})
		r, err := c.GetMasterAddrByName(ctx, masterName).Result()
		c.Close()
		if err != nil {
			return "", n.addr() + ": " + err.Error()
		}
		a := net.JoinHostPort(r[0], r[1])
		if addr != "" && a != addr {
			return "", fmt.Sprintf("the sentinels disagree: %s, %s", addr, a)
		}
		addr = a
	}
	return addr, ""
}

// master returns the data node that every sentinel says is the master.
func (s *sentinelTopology) master(ctx context.Context, _ string) (*node, error) {
	addr, wait := s.masterAddr(ctx)
	if wait != "" {
		return nil, errors.New(wait)
	}
	for _, n := range s.data {
		if n.addr() == addr {
			return n, nil
		}
	}
	return nil, fmt.Errorf("the sentinels' master %s is none of the deployment's", addr)
}

// replicas returns the data nodes other than m.
func (s *sentinelTopology) replicas(_ context.Context, m *node) []*node {
	var rs []*node
	for _, n := range s.data {
		if n != m {
			rs = append(rs, n)
		}
	}
	return rs
}

func (s *sentinelTopology) ready(ctx context.Context) error {
	var m *node
	err := poll(ctx, readyWithin, func() (string, error) {
		addr, wait := s.masterAddr(ctx)
		if wait != "" {
			return wait, nil
		}
		for _, n := range s.data {
			if !n.alive() {
				return n.addr() + " is not running", nil
			}
			kind, master, state, err := role(ctx, n)
			switch {
			case err != nil:
				return n.addr() + ": " + err.Error(), nil
			case n.addr() == addr && kind != "master":
				return n.addr() + " is " + kind + ", not the master yet", nil
			case n.addr() == addr:
				m = n
			case kind != "slave" || master != addr || state != "connected":
				return fmt.Sprintf("%s is %s %s %s, not a connected replica of %s", n.addr(), kind, master, state, addr), nil
			}
		}
		for _, n := range s.sentinels {
			if wait := sentinelAgrees(ctx, n, addr); wait != "" {
				return wait, nil
			}
		}
		return "", nil
	})
	if err != nil {
		return fmt.Errorf("sentinel ready: %w", err)
	}
	return synced(ctx, m, s.replicas(ctx, m))
}

// sentinelAgrees returns a wait unless sentinel n sees master at addr with no
// flag but "master", the two other sentinels, and the two replicas, each
// flagged "slave" only and linked to addr.
func sentinelAgrees(ctx context.Context, n *node, addr string) string {
	c := redis.NewSentinelClient(&redis.Options{Addr: n.addr(), MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	m, err := c.Master(ctx, masterName).Result()
	if err != nil {
		return n.addr() + ": " + err.Error()
	}
	if m["flags"] != "master" || m["num-other-sentinels"] != "2" || m["num-slaves"] != "2" {
		return fmt.Sprintf("sentinel %s: master flags %q, %s other sentinels, %s replicas", n.addr(),
			m["flags"], m["num-other-sentinels"], m["num-slaves"])
	}
	rs, err := c.Replicas(ctx, masterName).Result()
	if err != nil {
		return n.addr() + ": " + err.Error()
	}
	for _, r := range rs {
		if r["flags"] != "slave" || r["master-link-status"] != "ok" ||
			net.JoinHostPort(r["master-host"], r["master-port"]) != addr {
			return fmt.Sprintf("sentinel %s: replica %s flags %q link %s master %s:%s", n.addr(), r["name"],
				r["flags"], r["master-link-status"], r["master-host"], r["master-port"])
		}
	}
	return ""
}

func (s *sentinelTopology) promoted(ctx context.Context, _ string) error {
	return poll(ctx, promotedWithin, func() (string, error) {
		addr, wait := s.masterAddr(ctx)
		if wait != "" {
			return wait, nil
		}
		for _, n := range s.data {
			if n.addr() != addr {
				continue
			}
			if !n.alive() {
				return "the sentinels still name the killed master " + addr, nil
			}
			kind, _, _, err := role(ctx, n)
			if err != nil {
				return addr + ": " + err.Error(), nil
			}
			if kind != "master" {
				return addr + " is " + kind + ", not promoted yet", nil
			}
			return "", nil
		}
		return "", fmt.Errorf("the sentinels' master %s is none of the deployment's", addr)
	})
}

func (s *sentinelTopology) restart(ctx context.Context) error { return restart(ctx, s.data) }

func (s *sentinelTopology) restore(ctx context.Context) error {
	if err := s.restart(ctx); err != nil {
		return err
	}
	return s.ready(ctx)
}
