package readme

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobguard/jobguard/internal/testredis"
)

// The README's complete program runs on its own in a new module outside
// the repository that requires jobguard through one replace directive (as
// before a release): go mod tidy resolves it, and against a Redis of its own
// it prints that Redis and builds the three reports, acme's two one after
// the other. Without REDIS_ADDR it refuses to start.
func TestREADMEProgramRunsInAFreshModule(t *testing.T) {
	var program []string
	for _, b := range blocks(t, filepath.Join(root, "README.md")) {
		if len(b) > 0 && strings.TrimSpace(b[0]) == "package main" {
			program = b
			break
		}
	}
	if program == nil {
		t.Fatal("the README has no complete program (a go block that starts with package main)")
	}
	repo, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module quickstart\n\ngo 1.24.0\n\nrequire github.com/jobguard/jobguard v0.0.0-00010101000000-000000000000\n\nreplace github.com/jobguard/jobguard => " + repo + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(strings.Join(program, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := testredis.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	exe := filepath.Join(dir, "quickstart")
	run := func(redisAddr string, name string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "REDIS_ADDR="+redisAddr)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", exe, "."}} {
		if out, err := run(srv.Addr(), "go", args...); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Without REDIS_ADDR it says so and stops, rather than use whatever
	// listens on localhost:6379.
	if out, err := run("", exe); err == nil || !strings.Contains(out, "set REDIS_ADDR") {
		t.Fatalf("without REDIS_ADDR: want an error that asks for it, got %v:\n%s", err, out)
	}
	out, err := run(srv.Addr(), exe)
	if err != nil {
		t.Fatalf("quickstart: %v\n%s", err, out)
	}
	if !strings.Contains(out, "redis: "+srv.Addr()+"\n") {
		t.Fatalf("want the Redis it uses printed (redis: %s), got:\n%s", srv.Addr(), out)
	}
	var reports []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "building the report of ") {
			reports = append(reports, strings.TrimPrefix(line, "building the report of "))
		}
	}
	if len(reports) != 3 {
		t.Fatalf("want 3 reports built, got %d:\n%s", len(reports), out)
	}
	if strings.Count(strings.Join(reports, "\n"), `"acme"`) != 2 || !strings.Contains(strings.Join(reports, "\n"), `"globex"`) {
		t.Fatalf("want acme's two reports and globex's, got:\n%s", out)
	}
}
