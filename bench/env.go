package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// cpuTime returns the user plus system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// info returns the fields of Redis INFO section.
func info(ctx context.Context, c *redis.Client, section string) (map[string]string, error) {
	s, err := c.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	m := make(map[string]string)
	for _, line := range strings.Split(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// redisCPU returns the user plus system CPU time the Redis server has used.
func redisCPU(ctx context.Context, c *redis.Client) (time.Duration, error) {
	m, err := info(ctx, c, "cpu")
	if err != nil {
		return 0, err
	}
	var total float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(m[k], 64)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return time.Duration(total * float64(time.Second)), nil
}

// redisCmdTime returns the time Redis has spent executing the named commands,
// from INFO commandstats. A script's time includes the commands it calls,
// which commandstats also counts under their own names; naming only the
// commands a client sent counts each execution once.
func redisCmdTime(ctx context.Context, c *redis.Client, names []string) (time.Duration, error) {
	stats, err := commandStats(ctx, c)
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, n := range names {
		total += stats[strings.ToLower(n)].d
	}
	return total, nil
}

// redisStats is the Redis server's CPU time and its execution time of some
// commands.
type redisStats struct{ cpu, cmd time.Duration }

func (b *bench) redisStats(ctx context.Context, names []string) (redisStats, error) {
	cpu, err := redisCPU(ctx, b.admin)
	if err != nil {
		return redisStats{}, err
	}
	cmd, err := redisCmdTime(ctx, b.admin, names)
	return redisStats{cpu, cmd}, err
}

// environment describes the machine, the toolchain, Redis and the library
// versions, as rows of the report.
func environment(ctx context.Context, admin *redis.Client, addr string) [][]string {
	rows := [][]string{
		{"date", time.Now().UTC().Format("2006-01-02 15:04 MST")},
		{"CPU", cpuModel() + " (" + strconv.Itoa(runtime.NumCPU()) + " logical CPUs, GOMAXPROCS " + strconv.Itoa(runtime.GOMAXPROCS(0)) + ")"},
		{"OS", runtime.GOOS + "/" + runtime.GOARCH + " " + readTrim("/proc/sys/kernel/osrelease")},
		{"Go", runtime.Version()},
	}
	if m, err := info(ctx, admin, "server"); err == nil {
		where := addr
		if host, _, err := net.SplitHostPort(addr); err == nil {
			if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
				where += ", loopback"
			}
		}
		rows = append(rows, []string{"Redis", "redis-server " + m["redis_version"] + " (" + where + ")"})
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/jobguard/jobguard":
				v := "this checkout"
				if rev := gitRev(); rev != "" {
					v += " (" + rev + ")"
				}
				rows = append(rows, []string{"jobguard (lockkit, singleton, cronguard)", v})
			case "github.com/bsm/redislock", "github.com/go-redsync/redsync/v4", "github.com/redis/go-redis/v9",
				"github.com/hibiken/asynq", "github.com/robfig/cron/v3":
				rows = append(rows, []string{d.Path, d.Version})
			}
		}
	}
	return rows
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// gitRev returns the commit of the enclosing checkout, marked when the tree
// has uncommitted changes; "" when git is unavailable.
func gitRev() string {
	out, err := exec.Command("git", "-C", "..", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", "..", "status", "--porcelain").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		rev += ", with uncommitted changes"
	}
	return rev
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}
