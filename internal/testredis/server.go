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
	s := &Server{t: t, port: port, dir: t.TempDir()}
	s.Start()
	t.Cleanup(s.Kill)
	return s
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
