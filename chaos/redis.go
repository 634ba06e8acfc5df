package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// topology is the Redis a run uses.
type topology string

const (
	topoStandalone topology = "standalone" // one redis-server
	topoCluster    topology = "cluster"    // a Redis Cluster of clusterMasters masters
	topoSentinel   topology = "sentinel"   // a master and its replicas behind sentinels (sentinelSet)
)

// topologyOf is the topology of a run against a Cluster, against a master
// behind sentinels, or else against a standalone server.
func topologyOf(cluster, sentinel bool) topology {
	switch {
	case cluster:
		return topoCluster
	case sentinel:
		return topoSentinel
	}
	return topoStandalone
}

// redisServer is a redis-server the run started. A standalone server or a
// Cluster node has an append-only file fsynced on every write, so that a
// restart keeps every acknowledged write; a Cluster node keeps its cluster
// config (nodes.conf) in its dir too, so that it comes back as the same
// master of the same slots. A server of a Sentinel topology runs from its
// config file (conf), which the sentinels rewrite as they change its role.
type redisServer struct {
	addr, dir string
	port      int
	cluster   bool
	conf      string // the config file the server runs from, if any
	sentinel  bool   // a sentinel (redis-server <conf> --sentinel)
	cmd       *exec.Cmd
}

// startRedis starts a standalone redis-server of the run's own on a free
// port.
func startRedis(dir string) (*redisServer, error) {
	return startFree(func(port int) (*redisServer, error) {
		return &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", port), dir: dir, port: port}, nil
	})
}

// startFree starts the server that mk makes for a free port (for another
// port if a process that runs beside it, such as another chaos run, took
// that one before the server bound it).
func startFree(mk func(port int) (*redisServer, error)) (*redisServer, error) {
	var err error
	for range 3 {
		var l net.Listener
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		var s *redisServer
		if s, err = mk(port); err != nil {
			return nil, err
		}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

func (s *redisServer) start() error {
	args := []string{"--port", fmt.Sprint(s.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir}
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
	}
	if s.conf != "" {
		args = []string{s.conf}
		if s.sentinel {
			args = append(args, "--sentinel")
		}
	}
	s.cmd = exec.Command("redis-server", args...)
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	defer rdb.Close()
	for i := 0; ; i++ {
		// The server that answers must be this one, not one of another
		// run's that holds the port.
		if info, err := rdb.Info(context.Background(), "server").Result(); err == nil {
			if pid := fmt.Sprintf("process_id:%d\r\n", s.cmd.Process.Pid); !strings.Contains(info, pid) {
				s.stop()
				return fmt.Errorf("redis-server on %s: the port is another server's", s.addr)
			}
			return nil
		}
		if i == 100 {
			s.stop()
			return errors.New("redis-server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop SIGKILLs the server.
func (s *redisServer) stop() { _ = s.cmd.Process.Kill(); _ = s.cmd.Wait() }

// clusterMasters is the number of masters of a chaos Redis Cluster.
const clusterMasters = 3

// startCluster starts a Redis Cluster of clusterMasters masters, no
// replicas, each with its append-only file fsynced on every write, in
// subdirectories of dir, and waits until every node reports it ready.
func startCluster(dir string) ([]*redisServer, error) {
	var nodes []*redisServer
	stopAll := func() {
		for _, n := range nodes {
			n.stop()
		}
	}
	for i := range clusterMasters {
		d := filepath.Join(dir, fmt.Sprint("node", i))
		// Another port pair (and a fresh dir: no nodes.conf of the failed
		// server) if a process beside the run took the pair before the
		// server bound it.
		var err error
		for range 3 {
			_ = os.RemoveAll(d)
			if err = mkdir(d); err != nil {
				break
			}
			var port int
			if port, err = clusterPort(); err != nil {
				break
			}
			s := &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", port), dir: d, port: port, cluster: true}
			if err = s.start(); err == nil {
				nodes = append(nodes, s)
				break
			}
		}
		if err != nil {
			stopAll()
			return nil, err
		}
	}
	args := []string{"--cluster", "create"}
	for _, n := range nodes {
		args = append(args, n.addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		stopAll()
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	if err := clusterReady(nodes); err != nil {
		stopAll()
		return nil, err
	}
	return nodes, nil
}

// clusterReady waits until every node says cluster_state:ok.
func clusterReady(nodes []*redisServer) error {
	for i := 0; i < 200; i++ {
		ok := true
		for _, n := range nodes {
			c := redis.NewClient(&redis.Options{Addr: n.addr})
			info, err := c.ClusterInfo(context.Background()).Result()
			c.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok = false
			}
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("the Redis Cluster did not become ready")
}

// clusterPort returns a free loopback port whose cluster bus port (+10000)
// is free too.
func clusterPort() (int, error) {
	for range 200 {
		p := 20000 + rand.IntN(10000)
		if free(p) && free(p+10000) {
			return p, nil
		}
	}
	return 0, errors.New("no free port pair for a cluster node")
}

func free(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// newClient returns a client of the Redis at addrs, named name (CLIENT
// SETNAME on each connection): a ClusterClient of the Cluster whose masters
// addrs are (maintenance notifications off: go-redis v9.23 leaves a
// goroutine of theirs running after Close), a failover Client of the master
// the sentinels at addrs name, or a Client of addrs[0].
func newClient(addrs []string, topo topology, name string) redis.UniversalClient {
	switch topo {
	case topoCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClientName: name,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	case topoSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinelMaster, SentinelAddrs: addrs, ClientName: name})
	}
	return redis.NewClient(&redis.Options{Addr: addrs[0], ClientName: name})
}

// eachMaster runs fn on every master of rdb: the client itself unless it is
// a ClusterClient.
func eachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, c *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("chaos: unsupported client %T", rdb)
}

func mkdir(d string) error { return os.MkdirAll(d, 0o755) }
