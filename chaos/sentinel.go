package main

// A Sentinel topology of the run's own (-failover): a master, its replicas
// and the sentinels that watch them, every server running from a config
// file of its own that the sentinels rewrite as they change its role; and
// the failover fault (faultFailover), which kills the master and lets the
// sentinels promote a replica.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

const (
	sentinelMaster   = "chaos" // the master's name in the sentinels' config
	sentinelReplicas = 2
	sentinelCount    = 3
	sentinelQuorum   = 2
	// downAfter is the sentinels' down-after-milliseconds: a master that
	// answered nothing for that long is down. Half a second made the
	// sentinels, on a loaded host, fail over a master they had just promoted.
	downAfter = time.Second
	// failoverTimeout is the sentinels' failover-timeout.
	failoverTimeout = 3 * time.Second
	// promoteWait bounds the wait for a failover's promotion; resyncWait
	// the wait for a restarted master to be a replica in sync (the sentinels
	// turn it into one some 8 s after it is back).
	promoteWait = 30 * time.Second
	resyncWait  = 60 * time.Second
)

// sentinelSet is a Sentinel topology the run started.
type sentinelSet struct {
	data      []*redisServer // the master and its replicas, as started (failovers change their roles)
	sentinels []*redisServer
}

// servers returns every server of the set.
func (s *sentinelSet) servers() []*redisServer { return append(slices.Clone(s.data), s.sentinels...) }

// addrs returns the sentinels' addresses.
func (s *sentinelSet) addrs() []string {
	var out []string
	for _, n := range s.sentinels {
		out = append(out, n.addr)
	}
	return out
}

// dataConf is the config of a data server on port, a replica of the server
// on master unless master is 0. Nothing is persisted: a killed master
// comes back empty, and the sentinels make it a replica of the new master,
// which it copies whole.
func dataConf(port int, dir string, master int) string {
	c := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %q\nsave \"\"\nappendonly no\nrepl-diskless-sync-delay 0\n", port, dir)
	if master != 0 {
		c += fmt.Sprintf("replicaof 127.0.0.1 %d\n", master)
	}
	return c
}

// sentinelConf is the config of a sentinel on port that watches the master
// on master.
func sentinelConf(port int, dir string, master int) string {
	return fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %q\nsentinel monitor %s 127.0.0.1 %d %d\n"+
		"sentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s %d\n",
		port, dir, sentinelMaster, master, sentinelQuorum,
		sentinelMaster, downAfter.Milliseconds(), sentinelMaster, failoverTimeout.Milliseconds())
}

// startConf starts a server on a free port from the config file conf
// writes into dir.
func startConf(dir string, sentinel bool, conf func(port int, dir string) string) (*redisServer, error) {
	if err := mkdir(dir); err != nil {
		return nil, err
	}
	return startFree(func(port int) (*redisServer, error) {
		s := &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", port), dir: dir, port: port, conf: filepath.Join(dir, "redis.conf"), sentinel: sentinel}
		return s, os.WriteFile(s.conf, []byte(conf(port, dir)), 0o644)
	})
}

// startSentinel starts a master, its replicas and the sentinels in
// subdirectories of dir, and waits until the replicas are in sync and
// every sentinel knows them and the other sentinels (a failover needs a
// majority of the sentinels to agree).
func startSentinel(dir string) (*sentinelSet, error) {
	set := &sentinelSet{}
	fail := func(err error) (*sentinelSet, error) {
		for _, n := range set.servers() {
			n.stop()
		}
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for i := range 1 + sentinelReplicas {
		master := 0
		if i > 0 {
			master = set.data[0].port
		}
		n, err := startConf(filepath.Join(abs, fmt.Sprint("node", i)), false, func(port int, d string) string { return dataConf(port, d, master) })
		if err != nil {
			return fail(err)
		}
		set.data = append(set.data, n)
	}
	ctx := context.Background()
	// Replicas in sync before the sentinels start: their first look at the
	// master finds them.
	if !waitUntil(10*time.Second, func() bool { return replicasInSync(ctx, set.data[0].addr) == sentinelReplicas }) {
		return fail(errors.New("the replicas did not sync with the master"))
	}
	for i := range sentinelCount {
		n, err := startConf(filepath.Join(abs, fmt.Sprint("sentinel", i)), true, func(port int, d string) string { return sentinelConf(port, d, set.data[0].port) })
		if err != nil {
			return fail(err)
		}
		set.sentinels = append(set.sentinels, n)
	}
	if !waitUntil(20*time.Second, func() bool { return set.ready(ctx) }) {
		return fail(errors.New("the sentinels did not find the replicas and each other"))
	}
	return set, nil
}

// waitUntil calls cond every 50ms until it holds, for at most d.
func waitUntil(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// info returns the INFO section of the server at addr, "" if it does not
// answer within a second.
func info(ctx context.Context, addr, section string) string {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s, _ := c.Info(ctx, section).Result()
	return s
}

// replicasInSync counts the replicas of the master at addr that are online.
func replicasInSync(ctx context.Context, addr string) int {
	s := info(ctx, addr, "replication")
	if !strings.Contains(s, "role:master") {
		return 0
	}
	return strings.Count(s, ",state=online,")
}

// replicaOf reports whether the server at addr is a replica of the master
// at master whose link is up.
func replicaOf(ctx context.Context, addr, master string) bool {
	s := info(ctx, addr, "replication")
	host, port, _ := strings.Cut(master, ":")
	return strings.Contains(s, "role:slave\r\n") && strings.Contains(s, "master_host:"+host+"\r\n") &&
		strings.Contains(s, "master_port:"+port+"\r\n") && strings.Contains(s, "master_link_status:up\r\n")
}

// caughtUp waits, for at most d, until the replica at addr has applied
// everything the master at master had written when caughtUp began: a
// replica whose link just came up has loaded the master's snapshot, but the
// writes made meanwhile are still on their way, and a master killed then
// would lose them with a replica promoted that seemed in sync.
func caughtUp(ctx context.Context, addr, master string, d time.Duration) bool {
	want, ok := replOffset(info(ctx, master, "replication"), "master_repl_offset")
	if !ok {
		return false
	}
	return waitUntil(d, func() bool {
		got, ok := replOffset(info(ctx, addr, "replication"), "slave_repl_offset")
		return ok && got >= want
	})
}

// replOffset reads the offset named field from INFO replication's text.
func replOffset(s, field string) (int64, bool) {
	_, rest, ok := strings.Cut(s, field+":")
	if !ok {
		return 0, false
	}
	v, _, _ := strings.Cut(rest, "\r\n")
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// ready reports whether every sentinel sees the master up, with all its
// replicas and every other sentinel.
func (s *sentinelSet) ready(ctx context.Context) bool {
	for _, n := range s.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: n.addr})
		m, err := c.Master(ctx, sentinelMaster).Result()
		c.Close()
		if err != nil || m["flags"] != "master" || m["num-slaves"] != fmt.Sprint(sentinelReplicas) || m["num-other-sentinels"] != fmt.Sprint(sentinelCount-1) {
			return false
		}
	}
	return true
}

// master returns the address every sentinel names for the master, "" while
// they disagree or one does not answer.
func (s *sentinelSet) master(ctx context.Context) string {
	addr := ""
	for i, n := range s.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: n.addr})
		a, err := c.GetMasterAddrByName(ctx, sentinelMaster).Result()
		c.Close()
		if err != nil || len(a) != 2 || i > 0 && a[0]+":"+a[1] != addr {
			return ""
		}
		addr = a[0] + ":" + a[1]
	}
	return addr
}

// server returns the data server at addr, nil if none is.
func (s *sentinelSet) server(addr string) *redisServer {
	for _, n := range s.data {
		if n.addr == addr {
			return n
		}
	}
	return nil
}

// Records of a failover, after its fault record (faultFailover or
// faultFailoverLossy), all evFault with Target "redis <addr>"; and of any
// change of master the sentinels announce.
const (
	stepMasterKilled = "master-killed" // the master was SIGKILLed
	stepPromoted     = "promoted"      // every sentinel names a new master, which the clients reached (Err if not within promoteWait)
	stepRestarted    = "restarted"     // the killed server was started again (empty: a master until the sentinels turn it into a replica)
	stepResynced     = "resynced"      // the restarted server is a replica of the new master that has applied its writes (Err if not within resyncWait)
	stepSwitch       = "switch-master" // a sentinel announced a new master (+switch-master; Target is its message)
)

var clientName = regexp.MustCompile(`\bname=(\S+)`)

// failover is the failover fault: SIGKILL the master, wait until the
// sentinels promote a replica and the clients reach it, then start the
// killed server again, which the sentinels make a replica of the new
// master. Lossy (Fault.Lossy), the replicas are cut off first, just before
// a long run's task is due if one is within 5 s (awaitLongDue): SIGSTOPped,
// so that they cannot reconnect, and their connections closed on the master
// (CLIENT KILL TYPE replica), while the workers go on writing for Hold;
// then the master is killed and the replicas continued, so that the
// replica promoted lacks what was written meanwhile.
func (r *seedRun) failover(f Fault) {
	ctx := context.Background()
	set := r.sentinel
	// A server the previous failover restarted must be a replica in sync
	// first: the sentinels would otherwise be free to promote it, empty.
	r.waitResynced()
	addr := set.master(ctx)
	old := set.server(addr)
	if old == nil {
		fmt.Fprintf(os.Stderr, "chaos: failover: the sentinels name no master of the run's (%q)\n", addr)
		return
	}
	var replicas []*redisServer
	for _, n := range set.data {
		if n != old {
			replicas = append(replicas, n)
		}
	}
	target := "redis " + old.addr
	if f.Lossy {
		r.awaitLongDue(5 * time.Second)
		rec := Record{Ev: evFault, Fault: faultFailoverLossy, Target: target}
		for _, n := range replicas {
			_ = n.cmd.Process.Signal(syscall.SIGSTOP)
		}
		c := redis.NewClient(&redis.Options{Addr: old.addr})
		k, err := c.ClientKillByFilter(ctx, "TYPE", "replica").Result()
		c.Close()
		rec.Killed = k
		if err != nil {
			rec.Err = err.Error()
		}
		r.rec.add(rec)
		time.Sleep(f.Hold)
	} else {
		r.rec.add(Record{Ev: evFault, Fault: faultFailover, Target: target})
	}
	old.stop()
	r.rec.add(Record{Ev: evFault, Fault: stepMasterKilled, Target: target})
	for _, n := range replicas {
		_ = n.cmd.Process.Signal(syscall.SIGCONT)
	}
	next, err := r.promoted(ctx, old.addr)
	rec := Record{Ev: evFault, Fault: stepPromoted, Target: "redis " + next}
	if err != nil {
		rec.Err = err.Error()
		fmt.Fprintln(os.Stderr, "chaos: failover:", err)
	}
	r.rec.add(rec)
	rec = Record{Ev: evFault, Fault: stepRestarted, Target: target}
	if err := old.start(); err != nil {
		rec.Err = err.Error()
		fmt.Fprintln(os.Stderr, "chaos: restart redis-server:", err)
	}
	r.rec.add(rec)
	done := make(chan struct{})
	r.resynced = done
	go func() {
		defer close(done)
		rec := Record{Ev: evFault, Fault: stepResynced, Target: target}
		deadline := time.Now().Add(resyncWait)
		m := ""
		if !waitUntil(resyncWait, func() bool { m = set.master(ctx); return m != "" && replicaOf(ctx, old.addr, m) }) ||
			!caughtUp(ctx, old.addr, m, time.Until(deadline)) {
			rec.Err = fmt.Sprintf("not a replica in sync within %s", resyncWait)
		}
		r.rec.add(rec)
	}()
}

// awaitLongDue waits, for at most d, until just before a task whose run
// outlasts a failover (Op.Dur at least longRun) is due: asynq moves it from
// its scheduled tasks to the pending ones at the turn of the second it is
// due (its score), a worker dequeues it and takes its key. A lossy
// failover's cut made then leaves those writes on the master alone: the
// promoted replica has the task still due and its key free, while its
// first run goes on.
func (r *seedRun) awaitLongDue(d time.Duration) {
	long := map[string]bool{}
	for _, op := range r.w.Ops {
		long[op.ID] = op.Dur >= longRun
	}
	insp := asynq.NewInspectorFromRedisClient(r.rdb)
	infos, err := insp.ListScheduledTasks(r.queue, asynq.PageSize(10000))
	if err != nil {
		return
	}
	var due time.Time
	now := time.Now()
	for _, info := range infos {
		var p payload
		_ = json.Unmarshal(info.Payload, &p)
		at := info.NextProcessAt
		if long[p.ID] && at.After(now.Add(50*time.Millisecond)) && at.Before(now.Add(d)) && (due.IsZero() || at.Before(due)) {
			due = at
		}
	}
	if !due.IsZero() {
		time.Sleep(time.Until(due) - 20*time.Millisecond)
	}
}

// promoted waits until every sentinel names a master other than old, that
// server says it is one, and the clients reach it: the driver's client, and
// the one every live worker's Locker, middleware and Scheduler share, each
// have a connection named after them open on it (asynq's server has a
// client of its own, unnamed, which asks the same sentinels); it returns
// the new master's address.
func (r *seedRun) promoted(ctx context.Context, old string) (string, error) {
	deadline := time.Now().Add(promoteWait)
	next := ""
	ok := waitUntil(promoteWait, func() bool {
		next = r.sentinel.master(ctx)
		return next != "" && next != old && strings.Contains(info(ctx, next, "replication"), "role:master\r\n")
	})
	if !ok {
		return next, fmt.Errorf("no replica of %s promoted within %s", old, promoteWait)
	}
	r.mu.Lock()
	want := []string{"chaos-driver"}
	for _, p := range r.live {
		want = append(want, "chaos-"+p.name)
	}
	r.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: next})
	defer c.Close()
	missing := want
	ok = waitUntil(time.Until(deadline), func() bool {
		if r.rdb.Ping(ctx).Err() != nil {
			return false
		}
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			return false
		}
		named := map[string]bool{}
		for _, m := range clientName.FindAllStringSubmatch(list, -1) {
			named[m[1]] = true
		}
		missing = slices.DeleteFunc(slices.Clone(want), func(n string) bool { return named[n] })
		return len(missing) == 0
	})
	if !ok {
		return next, fmt.Errorf("clients %v did not reach the new master %s within %s", missing, next, promoteWait)
	}
	return next, nil
}

// waitResynced waits until the server the last failover restarted is a
// replica in sync (or its wait gave up).
func (r *seedRun) waitResynced() {
	if r.resynced != nil {
		<-r.resynced
	}
}

// watchSwitches records every change of master a sentinel announces
// (stepSwitch), those of the failover faults and any other; stop ends it.
func (r *seedRun) watchSwitches() (stop func(), err error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: r.sentinel.sentinels[0].addr})
	ctx := context.Background()
	ps := c.Subscribe(ctx, "+switch-master")
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		c.Close()
		return nil, err
	}
	done := make(chan struct{})
	ch := ps.Channel()
	go func() {
		defer close(done)
		for m := range ch {
			r.rec.add(Record{Ev: evFault, Fault: stepSwitch, Target: m.Payload})
		}
	}()
	return func() {
		ps.Close()
		<-done
		c.Close()
	}, nil
}
