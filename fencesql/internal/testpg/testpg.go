// Package testpg gives tests a PostgreSQL server of their own: a throwaway
// cluster (initdb) in a temporary directory, served by a postgres process on
// a free loopback port with trust authentication, started at the first DB
// call and stopped when the tests end. It never uses a server the machine
// already runs.
//
//	func TestMain(m *testing.M) { os.Exit(testpg.Run(m)) }
//
//	func TestX(t *testing.T) {
//		db := testpg.DB(t) // a schema of the test's own
//		...
//	}
//
// The binaries (initdb, postgres) are looked up on PATH, then in Debian's
// /usr/lib/postgresql/<version>/bin (the newest version). PostgreSQL refuses
// to run as root: under root the server runs as the user postgres, which
// Debian's package creates, in a directory given to it.
package testpg

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
)

// errNoBinaries is returned by start when PostgreSQL's binaries are absent.
var errNoBinaries = errors.New("testpg: PostgreSQL's initdb and postgres are not installed: `make test` installs Debian's postgresql package with apt-get (or run `apt-get install postgresql`), or put a PostgreSQL's bin directory on PATH")

var (
	once     sync.Once
	shared   *server
	startErr error
)

// Run runs the tests and stops the server if one was started; TestMain
// passes its result to os.Exit.
func Run(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	return code
}

// DB returns a database handle on the shared server whose connections use a
// new schema of the test's own (search_path), closed when the test ends.
// Without PostgreSQL's binaries the test is skipped, saying how to get them,
// except under CI (CI=true), where that is a failure.
func DB(t testing.TB) *sql.DB {
	t.Helper()
	once.Do(func() { shared, startErr = start() })
	switch {
	case errors.Is(startErr, errNoBinaries) && os.Getenv("CI") == "":
		t.Skip(startErr)
	case startErr != nil:
		t.Fatal(startErr)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "t_" + strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_")) + "_" + hex.EncodeToString(b)
	if len(schema) > 63 {
		schema = schema[len(schema)-63:]
		if schema[0] >= '0' && schema[0] <= '9' {
			schema = "s" + schema[1:]
		}
	}
	admin, err := sql.Open("pgx", shared.dsn(""))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatalf("testpg: create schema %s: %v", schema, err)
	}
	db, err := sql.Open("pgx", shared.dsn(schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// server is a postgres process and its directory.
type server struct {
	dir  string // removed by stop
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// dsn is the URL of the server's database postgres, with search_path set to
// schema when it is not empty.
func (s *server) dsn(schema string) string {
	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	if schema != "" {
		u += "&search_path=" + schema
	}
	return u
}

// binDir returns the directory of initdb and postgres: PATH's, or Debian's
// newest /usr/lib/postgresql/<version>/bin.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errNoBinaries
}

// version is the major version in /usr/lib/postgresql/<version>/bin.
func version(dir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
	return v
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// start initialises a cluster in a new temporary directory and starts a
// server on it, on a free loopback port (another one if that port was taken
// meanwhile).
func start() (*server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testpg-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := command(cred, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("testpg: initdb: %v\n%s", err, out)
	}
	for try := 0; ; try++ {
		s, err := serve(cred, bin, dir)
		if err == nil || try == 2 || !strings.Contains(err.Error(), "could not bind") {
			if err != nil {
				_ = os.RemoveAll(dir)
			}
			return s, err
		}
	}
}

// credential is the user postgres under root (nil otherwise): PostgreSQL
// refuses to run as root.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("testpg: running as root, PostgreSQL must run as another user, and there is no user postgres (Debian's postgresql package creates it): %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// command is name with args, run as cred when it is not nil, killed if the
// test process dies first.
func command(cred *syscall.Credential, name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	c.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	return c
}

// serve starts postgres on the cluster in dir, on a free loopback port, and
// waits until it takes connections. Durability is off: the data is thrown
// away.
func serve(cred *syscall.Credential, bin, dir string) (*server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := command(cred, filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port), "-h", "127.0.0.1", "-k", "",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB", "-c", "max_connections=100")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testpg: start postgres: %w", err)
	}
	s := &server{dir: dir, port: port, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	db, err := sql.Open("pgx", s.dsn(""))
	if err != nil {
		s.kill()
		return nil, err
	}
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("testpg: postgres on port %d exited: %s", port, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("testpg: postgres on port %d did not take connections within 30s: %v\n%s", port, err, log)
		}
	}
}

// stop shuts the server down (fast shutdown, SIGKILL after 10s) and removes
// its directory.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.kill()
	}
	_ = os.RemoveAll(s.dir)
}

func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}
