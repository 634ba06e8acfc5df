package lockcore

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/testredis"
)

// BenchmarkAcquireModes measures one acquire script run per mode on the Redis
// at REDIS_ADDR, on a free key (the call takes it) and on a held key (the
// call waits, parks or is told who holds it), and reports the server's own
// cost of the script from INFO commandstats, read before and after each
// call: the microseconds of EVALSHA (the median call, and the tenth
// percentile) and the commands the script ran (redis.call) per call; and
// the server's main thread CPU time per call and its setup, which a busy
// machine's waits do not count. Each call starts from a clean key: its setup
// deletes the lock's keys and, for a held key, writes a holder. Run it on a
// Redis nobody else uses.
func BenchmarkAcquireModes(b *testing.B) {
	modes := []struct {
		name string
		opt  AcquireOptions
		wait bool
	}{
		{"wait", AcquireOptions{}, true},
		{"fair", AcquireOptions{Fair: true}, true},
		{"epoch", AcquireOptions{Epoch: 7}, true},
		{"coalesce", AcquireOptions{FollowUp: Coalesce{}}, true},
		{"supersede", AcquireOptions{FollowUp: KeepNewest{Order: 5}}, true},
		{"preempt", AcquireOptions{FollowUp: Preempt{}}, true},
		{"park", AcquireOptions{Label: "job", Park: &Parking{ID: "id"}}, false},
	}
	for _, held := range []bool{false, true} {
		for _, m := range modes {
			name := m.name + "/free"
			if held {
				name = m.name + "/held"
			}
			b.Run(name, func(b *testing.B) { benchAcquireMode(b, m.opt, m.wait, held) })
		}
	}
}

// benchLocker is a RedisLocker on the Redis at REDIS_ADDR, under a prefix of
// its own, with its client.
func benchLocker(b *testing.B) (redis.UniversalClient, *RedisLocker) {
	client := testredis.Client(b)
	l, err := NewRedis(client, WithPrefix(testredis.Prefix(b, client)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close(context.Background()) })
	return client, l
}

// holdKey writes a live holder into a holders key (KEYS[1]) for ARGV[1] ms.
const holdKey = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), t[1] .. '000000:hold:other:')
redis.call('PEXPIRE', KEYS[1], ARGV[1])`

func benchAcquireMode(b *testing.B, opt AcquireOptions, wait, held bool) {
	ctx := context.Background()
	client, l := benchLocker(b)
	k := l.r.keys("job")
	all := []string{k.holders, k.meta, k.queue, k.waiters, k.fence, k.cover, k.parked, k.follow}
	call := func() {
		r, err := l.e.cfg.request("job", &opt)
		if err != nil {
			b.Fatal(err)
		}
		if wait {
			r.waiter = randomID(8)
			if ttl := handOverTTL(&r); ttl > 0 {
				r.waiter = handOverID(r.waiter, ttl, &r)
			}
		}
		_, _ = client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, all...)
			if held {
				p.Eval(ctx, holdKey, []string{k.holders}, 60000)
			}
			return nil
		})
		b.StartTimer()
		res, err := l.r.acquire(ctx, &r)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		if res.ok == held {
			b.Fatalf("acquired %v on a held=%v key: %+v", res.ok, held, res)
		}
	}
	call() // caches the script
	b.StopTimer()
	cpu0 := mainThreadCPU(b, client)
	for range b.N {
		call()
	}
	cpu := float64(mainThreadCPU(b, client)-cpu0) / float64(b.N)
	usec := make([]int64, b.N)
	var cmds int64
	b.ResetTimer()
	for i := range b.N {
		calls0, usec0, all0 := commandStats(b, client)
		call()
		calls1, usec1, all1 := commandStats(b, client)
		if calls1 != calls0+1 {
			b.Fatalf("%d EVALSHA calls, want 1", calls1-calls0)
		}
		usec[i] = usec1 - usec0
		cmds += all1 - all0 - 2 // the first INFO and the EVALSHA
	}
	// The median and the tenth percentile: a busy machine delays some
	// calls a lot.
	slices.Sort(usec)
	b.ReportMetric(float64(usec[b.N/2]), "redis-µs/call")
	b.ReportMetric(float64(usec[b.N/10]), "redis-µs-p10/call")
	b.ReportMetric(float64(cmds)/float64(b.N), "cmds/call")
	b.ReportMetric(cpu, "redis-cpu-µs/op")
}

// mainThreadCPU reads the CPU time (µs, user and system) of the server's
// main thread from INFO cpu.
func mainThreadCPU(b *testing.B, c redis.UniversalClient) int64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var cpu float64
	for _, line := range strings.Split(info, "\n") {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_user_main_thread" || name == "used_cpu_sys_main_thread" {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		}
	}
	return int64(cpu * 1e6)
}

// commandStats reads INFO commandstats: the calls and microseconds of
// EVALSHA, and the calls of every command.
func commandStats(b *testing.B, c redis.UniversalClient) (calls, usec, all int64) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, rest, _ := strings.Cut(rest, ":")
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch {
			case k == "calls":
				all += n
				if name == "evalsha" {
					calls = n
				}
			case k == "usec" && name == "evalsha":
				usec = n
			}
		}
	}
	return calls, usec, all
}

// BenchmarkReleaseModes measures one release script run per set of the
// release's options (HoldAtLeast, a Coalesce success record, a completion
// record, a parked-job reservation) on the Redis at REDIS_ADDR, on a key
// with only the released holder ("alone"), with a plain waiter behind it
// ("waiter": the key is handed over) and with a parked job behind it
// ("parked": a release with the reservation reserves the key for it), and
// reports what BenchmarkAcquireModes does. Each call starts from a clean
// key: its setup deletes the lock's keys and writes the holder (and the
// waiter or the parked job). Run it on a Redis nobody else uses.
//
// With JOBGUARD_BENCH_OLD_RELEASE naming a former release.lua (as from git
// show <commit>:internal/lockcore/scripts/release.lua, lockkit/scripts/ in
// commits before the engine moved there), each call is followed by one
// of that script on the same setup, keys and arguments, whose costs are
// reported beside (old-…): a busy machine slows both alike.
func BenchmarkReleaseModes(b *testing.B) {
	var old *redis.Script
	if path := os.Getenv("JOBGUARD_BENCH_OLD_RELEASE"); path != "" {
		src, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		old = redis.NewScript(promoteSrc + string(src))
	}
	for _, behind := range []string{"alone", "waiter", "parked"} {
		for m := range releaseAll + 1 {
			b.Run(releaseModeName(m)+"/"+behind, func(b *testing.B) { benchReleaseMode(b, m, behind, old) })
		}
	}
}

// releaseModeName names the options of m, "plain" for none.
func releaseModeName(m releaseMode) string {
	var names []string
	for i, name := range []string{"hold", "cover", "done", "park"} {
		if m&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "plain"
	}
	return strings.Join(names, "+")
}

// waitKey writes a plain waiter into the waiters key (KEYS[1]).
const waitKey = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + 60000, 'gw:1000:waid:wlabel:other')
redis.call('PEXPIRE', KEYS[1], 60000)`

// benchReleaseMode runs the release script of the options m; with old not
// nil, it runs old as well, call by call in turn.
func benchReleaseMode(b *testing.B, m releaseMode, behind string, old *redis.Script) {
	ctx := context.Background()
	client, l := benchLocker(b)
	k := l.r.keys("job")
	lease := &Lease{e: l.e, key: "job", owner: "other", label: "job", aid: "hold", ttl: time.Minute}
	var end ending
	if m&releaseHold != 0 {
		lease.hold = time.Minute
	}
	if m&releaseCoalesce != 0 {
		end.coalesce = time.Minute
	}
	if m&releaseDone != 0 {
		end.done = time.Minute
	}
	if m&releasePark != 0 {
		lease.onParked = func(string, string) {}
	}
	script, keys, args := l.r.releaseCall(lease, end)
	if script != releaseScripts[m] {
		b.Fatalf("the release of %s runs another script", releaseModeName(m))
	}
	// call sets the key up, and runs s: its holder is the lease, with the
	// token of the current second (see holdKey).
	call := func(s *redis.Script) {
		_, _ = client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, append(keys, k.meta, k.follow)...)
			p.Eval(ctx, holdKey, []string{k.holders}, 60000)
			switch behind {
			case "waiter":
				p.Eval(ctx, waitKey, []string{k.waiters})
			case "parked":
				p.ZAdd(ctx, k.parked, redis.Z{Score: 1, Member: "1000:plabel:pid"})
			}
			return nil
		})
		members, err := client.ZRange(ctx, k.holders, 0, -1).Result()
		if err != nil || len(members) != 1 {
			b.Fatalf("holders %v: %v", members, err)
		}
		lease.member = members[0]
		_, keys, args = l.r.releaseCall(lease, end)
		b.StartTimer()
		v, err := s.Run(ctx, client, keys, args...).Result()
		b.StopTimer()
		if err != nil || (toInt(v) != 1 && fmt.Sprint(v) != "[1 pid]") {
			b.Fatalf("release %s: %v, %v", releaseModeName(m), v, err)
		}
	}
	scripts := []*redis.Script{script}
	if old != nil {
		scripts = append(scripts, old)
	}
	for _, s := range scripts {
		call(s) // caches the script
	}
	b.StopTimer()
	usec := make([][]int64, len(scripts))
	cmds := make([]int64, len(scripts))
	b.ResetTimer()
	for range b.N {
		for j, s := range scripts {
			calls0, usec0, all0 := commandStats(b, client)
			call(s)
			calls1, usec1, all1 := commandStats(b, client)
			if calls1 != calls0+1 {
				b.Fatalf("%d EVALSHA calls, want 1", calls1-calls0)
			}
			usec[j] = append(usec[j], usec1-usec0)
			// The first INFO, the setup's DEL, EVAL (and the 3 commands
			// it runs) and ZRANGE (the waiter's EVAL: 4 more; the parked
			// job's ZADD: 1), and the EVALSHA.
			setup := map[string]int64{"alone": 8, "waiter": 12, "parked": 9}[behind]
			cmds[j] += all1 - all0 - setup
		}
	}
	for j, name := range []string{"", "old-"}[:len(scripts)] {
		slices.Sort(usec[j])
		b.ReportMetric(float64(usec[j][b.N/2]), name+"redis-µs/call")
		b.ReportMetric(float64(usec[j][b.N/10]), name+"redis-µs-p10/call")
		// The mean of the faster half: finer than the whole microseconds
		// of one call.
		half := max(1, b.N/2)
		var low int64
		for _, u := range usec[j][:half] {
			low += u
		}
		b.ReportMetric(float64(low)/float64(half), name+"redis-µs-fast-half/call")
		b.ReportMetric(float64(cmds[j])/float64(b.N), name+"cmds/call")
	}
}
