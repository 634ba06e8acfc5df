package lockkit

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

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
		{"coalesce", AcquireOptions{Coalesce: true}, true},
		{"supersede", AcquireOptions{Supersede: true, Order: 5}, true},
		{"preempt", AcquireOptions{Preempt: true}, true},
		{"park", AcquireOptions{Label: "job", Park: "id"}, false},
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

// holdKey writes a live holder into a holders key (KEYS[1]) for ARGV[1] ms.
const holdKey = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), t[1] .. '000000:hold:other:')
redis.call('PEXPIRE', KEYS[1], ARGV[1])`

func benchAcquireMode(b *testing.B, opt AcquireOptions, wait, held bool) {
	ctx := context.Background()
	client := testredis.Client(b)
	prefix := testredis.Prefix(b, client)
	l, err := NewRedis(client, WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close(ctx) })
	k := l.r.keys("job")
	all := []string{k.holders, k.meta, k.queue, k.waiters, k.fence, k.cover, k.parked, k.follow}
	call := func() {
		r, err := l.e.cfg.request("job", &opt)
		if err != nil {
			b.Fatal(err)
		}
		if wait {
			r.waiter = randomID(8)
			if r.coalesce {
				r.waiter = "y" + r.waiter
			}
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
