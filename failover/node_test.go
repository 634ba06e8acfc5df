package failover

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
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// node is one redis-server process of a topology (a data node or a
// sentinel) with a port, a directory and a config file of its own, so that it
// can be killed and started again as the same node. Data nodes keep nothing
// on disk but their config (and a Cluster node's nodes.conf): a killed node
// comes back empty, as its promoted replica's replica.
type node struct {
	port     int
	dir      string
	sentinel bool
	cmd      *exec.Cmd
	exited   chan struct{} // closed when cmd has exited
}

func (n *node) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.port) }
func (n *node) conf() string { return filepath.Join(n.dir, "redis.conf") }
func (n *node) log() string  { return filepath.Join(n.dir, "redis.log") }

// replUser is the user replicas authenticate as to their master: the forced
// write loss turns it off on a master (isolate) so that its replicas, once
// disconnected, cannot come back before the master is killed.
const (
	replUser     = "repl"
	replPassword = "repl-secret"
)

// dataConf is the config every data node starts from: no persistence, a
// full sync that starts at once (a restarted node resyncs), replication as
// replUser, and a log file.
func (n *node) dataConf(extra ...string) string {
	lines := []string{
		fmt.Sprintf("port %d", n.port),
		"bind 127.0.0.1",
		"dir " + n.dir,
		"logfile " + n.log(),
		`save ""`,
		"appendonly no",
		"repl-diskless-sync-delay 0",
		"masteruser " + replUser,
		"masterauth " + replPassword,
		"user " + replUser + " on >" + replPassword + " +psync +sync +replconf +ping",
	}
	return strings.Join(append(lines, extra...), "\n") + "\n"
}

// write writes the node's config file.
func (n *node) write(conf string) error {
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(n.conf(), []byte(conf), 0o644)
}

// start starts the node from its config file and waits until it answers,
// checking that the server that answers is this process (not another one
// on the port). The process is killed if the test binary dies.
func (n *node) start(ctx context.Context) error {
	args := []string{n.conf()}
	if n.sentinel {
		args = append(args, "--sentinel")
	}
	cmd := exec.Command("redis-server", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server on %s: %w", n.addr(), err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.cmd, n.exited = cmd, exited
	c := n.client()
	defer c.Close()
	pid := fmt.Sprintf("process_id:%d\r\n", cmd.Process.Pid)
	err := poll(ctx, 5*time.Second, func() (string, error) {
		select {
		case <-exited:
			return "", fmt.Errorf("redis-server on %s exited: %s", n.addr(), n.tail())
		default:
		}
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return err.Error(), nil
		}
		if !strings.Contains(info, pid) {
			return "", fmt.Errorf("port %d is another server's", n.port)
		}
		return "", nil
	})
	if err != nil {
		n.kill()
	}
	return err
}

// kill stops the node with SIGKILL and waits until the process is gone.
func (n *node) kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	<-n.exited
	n.cmd = nil
}

// restart starts the nodes that are not running again.
func restart(ctx context.Context, nodes []*node) error {
	for _, n := range nodes {
		if !n.alive() {
			if err := n.start(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// alive reports whether the node's process runs.
func (n *node) alive() bool { return n.cmd != nil }

// client returns a plain client of this one node (no retries: a poll
// retries).
func (n *node) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1, DialerRetries: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
}

// tail returns the last lines of the node's log.
func (n *node) tail() string {
	b, _ := os.ReadFile(n.log())
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-80):], "\n")
}

// dumpLogs logs every node's log tail when the test failed.
func dumpLogs(t testing.TB, nodes []*node) {
	if !t.Failed() {
		return
	}
	for _, n := range nodes {
		t.Logf("log of %s:\n%s", n.addr(), n.tail())
	}
}

// own returns n free ports and a directory for a topology's nodes, and,
// when t ends, logs the nodes' logs (if t failed) and kills them; nodes
// returns them then.
func own(t *testing.T, n int, nodes func() []*node) (ports []int, dir string) {
	t.Helper()
	ports, err := freePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir() // removed after the cleanup below, which reads the logs in it
	t.Cleanup(func() {
		ns := nodes()
		dumpLogs(t, ns)
		for _, n := range ns {
			n.kill()
		}
	})
	return ports, dir
}

// freePorts returns n distinct loopback ports in 20000–29999 that are free,
// each with its cluster bus port (+10000) free too (below the ephemeral
// range, so that no outgoing connection takes one between a kill and the
// node's restart).
func freePorts(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for range 1000 {
		if len(ports) == n {
			return ports, nil
		}
		p := 20000 + rand.IntN(10000)
		if !seen[p] && !seen[p+10000] && !seen[p-10000] && free(p) && free(p+10000) {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return nil, errors.New("no free loopback ports")
}

func free(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// poll calls cond every 10ms until it returns an empty wait (the condition
// holds), returns an error, or within (or ctx) ends; the error then ends
// with cond's last wait, which says what it still waits for.
func poll(ctx context.Context, within time.Duration, cond func() (wait string, err error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		wait, err := cond()
		if err != nil || wait == "" {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), wait)
		case <-tick.C:
		}
	}
}

// infoField returns field's value in an INFO reply ("" when absent).
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}
