package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by one test, for fault tests that
// stop and restart Redis. It keeps nothing on disk, so a restart loses every
// key, as a Redis without persistence does.
type Server struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
}

// StartServer starts a redis-server on a free loopback port and stops it when
// the test ends. Without the redis-server binary the test is skipped, except
// under CI (CI=true), where that is a failure.
func StartServer(t testing.TB) *Server {
	t.Helper()
	s := newServer(t)
	s.Start()
	t.Cleanup(s.Kill)
	return s
}

// newServer is a Server on a free loopback port, not started. Without the
// redis-server binary the test is skipped, except under CI (CI=true), where
// that is a failure.
func newServer(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not installed; `make test` installs it")
		}
		t.Skip("redis-server is not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return &Server{t: t, port: port, dir: t.TempDir()}
}

// Addr returns the server's host:port; it stays the same across restarts.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// Start starts the server (again) on its port and waits until it answers.
func (s *Server) Start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", "--port", fmt.Sprint(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"))
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server on port %d did not start:\n%s", s.port, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL, losing every key.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server too
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// StartReplica starts a redis-server as StartServer does, makes it a replica
// of master (REPLICAOF) and waits until master counts it as a connected,
// synchronised replica.
func StartReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	r := StartServer(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	if err := c.SlaveOf(ctx, "127.0.0.1", fmt.Sprint(master.port)).Err(); err != nil {
		t.Fatalf("REPLICAOF: %v", err)
	}
	m := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer m.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := m.Info(ctx, "replication").Result()
		if strings.Contains(info, "port="+fmt.Sprint(r.port)+",state=online") {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica on port %d did not come online:\n%s", r.port, info)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Pause stops the server's process (SIGSTOP) until Resume: it keeps its
// connections but answers nothing, as a server in a long pause does.
func (s *Server) Pause() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("SIGSTOP redis-server: %v", err)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Sentinel is a Redis Sentinel process owned by one test, monitoring one
// master under a name with a quorum of 1.
type Sentinel struct {
	*Server
	// Name is the monitored master's name.
	Name string
}

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) on a
// free loopback port that monitors master as name, with a quorum of 1 and
// short timeouts (a master down for 1s is failed over), and stops it when
// the test ends. It returns once the sentinel reports the master.
func StartSentinel(t testing.TB, master *Server, name string) *Sentinel {
	t.Helper()
	s := newServer(t)
	port := s.port
	conf := filepath.Join(s.dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
		port, s.dir, filepath.Join(s.dir, "redis.log"), name, master.port, name, name)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command("redis-server", conf, "--sentinel")
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start redis-server --sentinel: %v", err)
	}
	t.Cleanup(s.Kill)
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.GetMasterAddrByName(context.Background(), name).Result(); err == nil {
			return &Sentinel{Server: s, Name: name}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			t.Fatalf("sentinel on port %d did not start:\n%s", port, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Failover makes the sentinel promote a replica of its master (SENTINEL
// FAILOVER) and waits until it names to as the master and to says it is
// one.
func (s *Sentinel) Failover(to *Server) {
	s.t.Helper()
	ctx := context.Background()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	r := redis.NewClient(&redis.Options{Addr: to.Addr()})
	defer r.Close()
	deadline := time.Now().Add(20 * time.Second)
	// Until the sentinel has found the replica (it asks the master for its
	// replicas every few seconds), it answers NOGOODSLAVE.
	for err := c.Failover(ctx, s.Name).Err(); err != nil; err = c.Failover(ctx, s.Name).Err() {
		if time.Now().After(deadline) {
			s.t.Fatalf("SENTINEL FAILOVER %s: %v", s.Name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		addr, _ := c.GetMasterAddrByName(ctx, s.Name).Result()
		info, _ := r.Info(ctx, "replication").Result()
		if len(addr) == 2 && addr[1] == fmt.Sprint(to.port) && strings.Contains(info, "role:master") {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the sentinel did not promote %s: it names %v; %s", to.Addr(), addr, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
