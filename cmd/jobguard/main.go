// Command jobguard looks at and frees jobguard locks in Redis: the keys held,
// who holds them, and an operator's release of a stuck key.
//
//	go install github.com/jobguard/jobguard/cmd/jobguard@latest
//	jobguard ls 'asynq:report:build:*'
//	jobguard inspect 'asynq:report:build:tenant_id="acme"'
//	jobguard release 'asynq:report:build:tenant_id="acme"' --owner worker-7:4121:9f2c
//	jobguard watch
//
// Run jobguard -h for every flag and the exit codes, jobguard COMMAND -h
// for one command's.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/decisionlog"
	"github.com/jobguard/jobguard/internal/glob"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/printable"
	"github.com/jobguard/jobguard/internal/rediskey"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1 // Redis unreachable, a failed call
	exitUsage    = 2 // bad command line
	exitNotHeld  = 3 // inspect or release found no holder, why no decision, ls no key under the prefix
	exitDeclined = 4 // release was not confirmed
)

const usage = `jobguard: look at and free jobguard locks in Redis.

Usage:
  jobguard [flags] ls [PATTERN]      keys with a live holder (Redis glob; default *)
  jobguard [flags] inspect KEY       holders (owner, label, token, TTL) and waiters of KEY
  jobguard [flags] release KEY       cancel the runs holding KEY (all, --owner ID's or --token N's); asks first unless --yes;
                                     --force frees KEY at once instead, while the runs may still be going
  jobguard [flags] watch [PATTERN]   show the held keys every --interval until interrupted (a Redis error is printed, and watch goes on)
  jobguard [flags] why TASK-ID       why a task did not run (yet), or its run ended early (singleton's decision log)

Examples (keys as singleton derives them: KeyByType "asynq:<type>",
KeyByFields("tenant_id") "asynq:<type>:tenant_id=<JSON value>"):
  REDIS_ADDR=redis:6379 jobguard ls 'asynq:report:build:*'
  jobguard --json inspect 'asynq:report:build:tenant_id="acme"'
  jobguard release 'asynq:report:build:tenant_id="acme"' --owner worker-7:4121:9f2c --yes
  jobguard release asynq:cache:rebuild --token 1795637778862563   # the holder inspect showed
  jobguard --cluster 10.0.0.1:7000,10.0.0.2:7000 --tls watch --interval 2s

A release acts only on the holders it showed (by fencing token): if the key
changed hands before the answer, it touches nothing of the new holder and
exits 3 naming it. It asks their runs to stop (lockkit's Locker.CancelRun):
their ctx is cancelled at once with lockkit.ErrCancelled (their Locker
listens on the operators' channel; at its next renewal, TTL/3 by default,
if it missed the notice), and the key stays held, shown by inspect as
"cancelling", until the run returns; then it goes to the next task. A run
whose process died lets the key go at its TTL. release --force frees the
key at once (Locker.ForceRelease; reservations too): the run may still be
going, a new run may start beside it, and only their fencing tokens tell
their writes apart.

why reads the stream the asynq middleware adds to for every task that
completes without running, is put back (requeued, or parked behind its
key's holder: when it comes back) or is refused and archived, every run
that a newer task preempted or that failed after losing its lease, every
enqueue Unique refused, and every task that ran under WithShadow although
it would have been refused and archived ("jobguard:decisions", about the
last 10,000: see singleton.WithDecisionLog): the reason, the key, and the
run or task that held (since when), covered or took over the key. It finds
the task by its ID or, for a Requeue copy, by its first task's ID; an
enqueue Unique refused also by the ID or the key its error names. It reads
the log newest first, 1,000 entries per read, and stops at the end of the
read in which it finds the task, or after --max-entries (20,000) entries.

An inspect of a key that the prefix does not hold says so and names the
closest key it holds; an ls that finds no key at all under the prefix (a
wrong --prefix or --db) says so, names the prefixes found, and exits 3.

Exit codes: 0 ok, 1 error (Redis unreachable...), 2 bad usage, 3 no holder
(or, for why, no decision; for ls, no key under the prefix) found, 4 release
not confirmed. jobguard COMMAND -h prints one command's help.

Flags (before or after the command):
`

// commandHelp is what jobguard COMMAND -h prints: the command's usage, what
// it does, examples, and the names of its own flags (the connection flags
// follow them).
var commandHelp = map[string]struct {
	text  string
	flags []string
}{
	"ls": {`Usage: jobguard [flags] ls [PATTERN]

Lists the keys matching PATTERN (a Redis glob; default *) that have a live
holder: holders, waiters, parked jobs, owners and the shortest TTL. When the
prefix holds no key at all (a wrong --prefix or --db), it says so, names the
prefixes found in the database, and exits 3.

Examples:
  jobguard ls 'asynq:report:build:*'
  jobguard --prefix myapp: --db 2 ls --json
`, []string{"json"}},
	"inspect": {`Usage: jobguard [flags] inspect KEY

Prints the holders of KEY (owner, label, fencing token, TTL, state), its
waiters and its parked jobs; exits 3 when nobody holds it. A KEY that the
prefix does not hold is named as such, with the closest key it holds.

Examples:
  jobguard inspect 'asynq:report:build:tenant_id="acme"'
  jobguard --json inspect asynq:cache:rebuild
`, []string{"json"}},
	"release": {`Usage: jobguard [flags] release KEY

Cancels the runs holding KEY (all, --owner ID's or --token N's), after
asking unless --yes; the key stays held until they return. --force frees
KEY at once instead, while the runs may still be going. It acts only on the
holders it showed: if KEY changed hands meanwhile, it exits 3 naming who
holds it now.

Examples:
  jobguard release 'asynq:report:build:tenant_id="acme"' --owner worker-7:4121:9f2c
  jobguard release asynq:cache:rebuild --token 1795637778862563 --yes
`, []string{"owner", "token", "yes", "force", "json"}},
	"watch": {`Usage: jobguard [flags] watch [PATTERN]

Shows the keys matching PATTERN (a Redis glob; default *) that have a live
holder, every --interval until interrupted (Ctrl-C, exit 0). A Redis error
is printed, and watch goes on.

Examples:
  jobguard watch 'asynq:report:build:*' --interval 2s
  jobguard watch --json
`, []string{"interval", "json"}},
	"why": {`Usage: jobguard [flags] why TASK-ID

Prints what the asynq middleware recorded in its decision log about the
task (by its ID or, for a Requeue copy, its first task's ID), newest first:
why it completed without running, or why its run ended early. Exits 3 when
nothing is recorded.

Examples:
  jobguard why 0c636fe2-2986-4526-941b-fe6074c0ec56
  jobguard --json why 0c636fe2-2986-4526-941b-fe6074c0ec56
`, []string{"decisions", "max-entries", "json"}},
}

// connectionFlags are the flags of every command.
var connectionFlags = []string{"redis", "cluster", "sentinel", "master", "password", "db", "tls", "tls-ca", "tls-insecure", "prefix"}

type options struct {
	addr, cluster, password, prefix, owner, tlsCA string
	sentinel, master                              string
	decisions                                     string
	db, maxEntries                                int
	token                                         int64
	tls, tlsInsecure, json, yes, force            bool
	interval                                      time.Duration
}

func main() {
	// go-redis logs failed dials through its own logger: the CLI says in
	// one line of its own what went wrong.
	redis.SetLogger(silent{})
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// silent is go-redis's logger in the CLI: it drops every line.
type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}

// flags defines jobguard's flags on fs, into o.
func flags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.addr, "redis", envOr("REDIS_ADDR", "127.0.0.1:6379"), "Redis address (env REDIS_ADDR)")
	fs.StringVar(&o.cluster, "cluster", os.Getenv("REDIS_CLUSTER_ADDRS"), "comma-separated Redis Cluster seed addresses; overrides --redis (env REDIS_CLUSTER_ADDRS)")
	fs.StringVar(&o.sentinel, "sentinel", os.Getenv("REDIS_SENTINEL_ADDRS"), "comma-separated Redis Sentinel addresses, with --master: the master they name, followed across failovers; overrides --redis (env REDIS_SENTINEL_ADDRS)")
	fs.StringVar(&o.master, "master", os.Getenv("REDIS_SENTINEL_MASTER"), "with --sentinel: the name of the master (env REDIS_SENTINEL_MASTER)")
	fs.StringVar(&o.password, "password", os.Getenv("REDIS_PASSWORD"), "Redis password (env REDIS_PASSWORD)")
	fs.IntVar(&o.db, "db", 0, "Redis database (not with --cluster)")
	fs.BoolVar(&o.tls, "tls", false, "connect with TLS")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "PEM file of the CA that signed the server's certificate (implies --tls)")
	fs.BoolVar(&o.tlsInsecure, "tls-insecure", false, "with --tls, do not verify the server's certificate")
	fs.StringVar(&o.prefix, "prefix", lockcore.DefaultPrefix, "key prefix the Lockers use (lockkit.WithPrefix)")
	fs.BoolVar(&o.json, "json", false, "print JSON")
	fs.StringVar(&o.owner, "owner", "", "release: only this owner's holders")
	fs.Int64Var(&o.token, "token", 0, "release: only the holder of this fencing token (as inspect shows it)")
	fs.BoolVar(&o.yes, "yes", false, "release: do not ask for confirmation")
	fs.BoolVar(&o.force, "force", false, "release: free the key at once, while the runs may still be going (a new run may start beside them)")
	fs.DurationVar(&o.interval, "interval", time.Second, "watch: time between two views")
	fs.StringVar(&o.decisions, "decisions", decisionlog.Stream, "why: the decision log's stream (the one the asynq middleware writes: singleton.WithDecisionLog)")
	fs.IntVar(&o.maxEntries, "max-entries", defaultWhyMax, "why: look through at most this many of the log's newest entries, 1,000 per read")
}

// printHelp prints the help of cmd (the whole usage when cmd is no command)
// with its flags' defaults.
func printHelp(w io.Writer, cmd string) {
	fresh := flag.NewFlagSet("jobguard", flag.ContinueOnError)
	flags(fresh, &options{})
	fresh.SetOutput(w)
	h, ok := commandHelp[cmd]
	if !ok {
		fmt.Fprint(w, usage)
		fresh.PrintDefaults()
		return
	}
	some := func(title string, names []string) {
		sub := flag.NewFlagSet("jobguard", flag.ContinueOnError)
		sub.SetOutput(w)
		for _, n := range names {
			f := fresh.Lookup(n)
			sub.Var(f.Value, f.Name, f.Usage)
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		sub.PrintDefaults()
	}
	fmt.Fprint(w, h.text)
	some("Flags (before or after the command)", h.flags)
	some("Connection flags (every command)", connectionFlags)
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("jobguard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // printed below, for the command given
	flags(fs, &o)
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		cmd := ""
		if len(pos) > 0 {
			cmd = pos[0]
		}
		printHelp(stderr, cmd)
		return exitOK
	}
	if err != nil {
		printHelp(stderr, "")
		return exitUsage
	}
	if len(pos) == 0 {
		printHelp(stderr, "")
		return exitUsage
	}
	cmd, rest := pos[0], pos[1:]
	badArgs := func(want string) int {
		fmt.Fprintf(stderr, "jobguard %s: want %s, got %d argument(s); see jobguard -h\n", cmd, want, len(rest))
		return exitUsage
	}
	switch cmd {
	case "ls", "watch":
		if len(rest) > 1 {
			return badArgs("at most one PATTERN")
		}
	case "inspect", "release":
		if len(rest) != 1 {
			return badArgs("one KEY")
		}
	case "why":
		if len(rest) != 1 || rest[0] == "" {
			return badArgs("one TASK-ID")
		}
	default:
		fmt.Fprintf(stderr, "jobguard: unknown command %q; see jobguard -h\n", cmd)
		return exitUsage
	}
	if cmd == "why" && o.maxEntries < 1 {
		fmt.Fprintf(stderr, "jobguard why: --max-entries %d must be positive\n", o.maxEntries)
		return exitUsage
	}
	if cmd == "watch" && o.interval <= 0 {
		fmt.Fprintf(stderr, "jobguard watch: --interval %s must be positive\n", o.interval)
		return exitUsage
	}
	client, err := o.client()
	if err != nil {
		fmt.Fprintln(stderr, "jobguard:", err)
		return exitUsage
	}
	defer client.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cmd != "watch" { // watch says so at each look, and goes on
		if err := client.Ping(ctx).Err(); err != nil {
			fmt.Fprintf(stderr, "jobguard: Redis at %s: %v\n", o.where(), err)
			return exitError
		}
	}
	locker, err := lockcore.NewRedis(client, lockcore.WithPrefix(o.prefix), lockcore.WithOwner("jobguard-cli"))
	if err != nil {
		fmt.Fprintln(stderr, "jobguard:", err)
		return exitError
	}
	defer locker.Close(context.Background())
	c := &cli{o: o, l: locker, rdb: client, stdin: stdin, out: stdout, errOut: stderr}
	pattern := "*"
	if len(rest) == 1 {
		pattern = rest[0]
	}
	switch cmd {
	case "ls":
		return c.ls(ctx, pattern)
	case "inspect":
		return c.inspect(ctx, rest[0])
	case "release":
		return c.release(ctx, rest[0])
	case "why":
		return c.why(ctx, client, rest[0])
	default:
		return c.watch(ctx, pattern)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// parseInterleaved parses flags wherever they are among the arguments and
// returns the others in order (on an error, those before it).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return pos, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil // Parse took the "--": no flags after it
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func (o options) client() (redis.UniversalClient, error) {
	var tc *tls.Config
	if o.tls || o.tlsCA != "" {
		tc = &tls.Config{InsecureSkipVerify: o.tlsInsecure} //nolint:gosec // asked for with --tls-insecure
		if o.tlsCA != "" {
			pem, err := os.ReadFile(o.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", o.tlsCA)
			}
			tc.RootCAs = pool
		}
	}
	switch {
	case o.sentinel != "" && o.cluster != "":
		return nil, errors.New("--sentinel and --cluster: give one of them")
	case o.sentinel != "" && o.master == "":
		return nil, errors.New("--sentinel: give the master's name with --master")
	case o.master != "" && o.sentinel == "":
		return nil, errors.New("--master: give the Sentinel addresses with --sentinel")
	case o.sentinel != "":
		return redis.NewFailoverClient(&redis.FailoverOptions{SentinelAddrs: strings.Split(o.sentinel, ","), MasterName: o.master,
			Password: o.password, DB: o.db, TLSConfig: tc}), nil
	}
	if o.cluster != "" {
		if o.db != 0 {
			return nil, errors.New("--db: a Redis Cluster has only database 0")
		}
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(o.cluster, ","), Password: o.password, TLSConfig: tc}), nil
	}
	return redis.NewClient(&redis.Options{Addr: o.addr, Password: o.password, DB: o.db, TLSConfig: tc}), nil
}

// where names the Redis that o connects to, as errors show it.
func (o options) where() string {
	if o.cluster != "" {
		return "cluster " + o.cluster
	}
	if o.sentinel != "" {
		return fmt.Sprintf("master %q of sentinels %s", o.master, o.sentinel)
	}
	if o.db != 0 {
		return fmt.Sprintf("%s (db %d)", o.addr, o.db)
	}
	return o.addr
}

type cli struct {
	o      options
	l      *lockcore.RedisLocker
	rdb    redis.UniversalClient
	stdin  io.Reader
	out    io.Writer
	errOut io.Writer
}

// keyView is one key as printed.
type keyView struct {
	Key     string       `json:"key"`
	Holders []holderView `json:"holders"`
	Waiters int          `json:"waiters"`
	Parked  int          `json:"parked"`
	// ParkedIDs are the ids of the first 20 parked jobs, oldest first.
	ParkedIDs []string `json:"parked_ids,omitempty"`
}

type holderView struct {
	Owner string `json:"owner"`
	Label string `json:"label,omitempty"`
	Token int64  `json:"token"`
	TTLms int64  `json:"ttl_ms"`
	// Reserved: a reservation, which runs nothing.
	Reserved bool `json:"reserved,omitempty"`
	// Cancelling: an operator asked the run to stop CancelMs ago; the key
	// stays held until it returns.
	Cancelling bool  `json:"cancelling,omitempty"`
	CancelMs   int64 `json:"cancel_ms,omitempty"`
}

func view(info *lockcore.Info) keyView {
	v := keyView{Key: info.Key, Waiters: info.Waiters, Parked: info.Parked, ParkedIDs: info.ParkedIDs, Holders: []holderView{}}
	for _, h := range info.Holders {
		v.Holders = append(v.Holders, holderView{Owner: h.Owner, Label: h.Label, Token: h.Token, TTLms: h.TTL.Milliseconds(),
			Reserved: h.Reserved, Cancelling: h.Cancelling, CancelMs: h.CancelAge.Milliseconds()})
	}
	return v
}

func (c *cli) fail(err error) int {
	fmt.Fprintln(c.errOut, "jobguard:", err)
	return exitError
}

// held returns the keys matching pattern with their holders.
func (c *cli) held(ctx context.Context, pattern string) ([]keyView, error) {
	keys, err := c.l.Keys(ctx, pattern)
	if err != nil {
		return nil, err
	}
	out := make([]keyView, 0, len(keys))
	for _, k := range keys {
		info, err := c.l.Inspect(ctx, k)
		if err != nil {
			return nil, err
		}
		if len(info.Holders) > 0 {
			out = append(out, view(info))
		}
	}
	return out, nil
}

func (c *cli) printKeys(keys []keyView) {
	if c.o.json {
		_ = json.NewEncoder(c.out).Encode(keys)
		return
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHOLDERS\tWAITERS\tPARKED\tOWNERS\tTTL")
	for _, k := range keys {
		owners := map[string]bool{}
		ttl := int64(-1)
		for _, h := range k.Holders {
			owners[h.Owner] = true
			if ttl < 0 || h.TTLms < ttl {
				ttl = h.TTLms
			}
		}
		names := make([]string, 0, len(owners))
		for o := range owners {
			names = append(names, o)
		}
		sort.Strings(names)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", shown(k.Key), len(k.Holders), k.Waiters, k.Parked, shown(strings.Join(names, ",")), time.Duration(ttl)*time.Millisecond)
	}
	_ = tw.Flush()
}

func (c *cli) ls(ctx context.Context, pattern string) int {
	keys, err := c.held(ctx, pattern)
	if err != nil {
		return c.fail(err)
	}
	if len(keys) == 0 {
		// Nothing held: say whether the prefix holds any key at all.
		names, err := c.scan(ctx, glob.Escape(c.o.prefix)+"{*}:h", 1)
		if err != nil {
			return c.fail(err)
		}
		if len(names) == 0 {
			if c.o.json {
				_ = json.NewEncoder(c.out).Encode(keys)
			}
			fmt.Fprintf(c.errOut, "jobguard ls: no key under prefix %q in %s%s\n", c.o.prefix, c.o.where(), c.elsewhere(ctx))
			return exitNotHeld
		}
	}
	c.printKeys(keys)
	return exitOK
}

// scanBudget bounds the SCAN calls (COUNT 1000) that ls and inspect make
// on each node to find prefixes and keys when a look finds nothing.
const scanBudget = 100

// scan returns up to limit (0: no limit) Redis key names matching the
// server glob match, from at most scanBudget SCAN calls on each node.
func (c *cli) scan(ctx context.Context, match string, limit int) ([]string, error) {
	var out []string
	one := func(ctx context.Context, n redis.Cmdable) error {
		var cursor uint64
		for calls := 0; calls < scanBudget; calls++ {
			found, next, err := n.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return err
			}
			out = append(out, found...)
			if cursor = next; cursor == 0 || (limit > 0 && len(out) >= limit) {
				return nil
			}
		}
		return nil
	}
	var err error
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock() // one node at a time: out is shared
			defer mu.Unlock()
			return one(ctx, n)
		})
	} else {
		err = one(ctx, c.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("scan %q: %w", match, err)
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// elsewhere names where jobguard keys are, for a prefix that holds none:
// the prefixes found in the database, or the databases that hold keys.
func (c *cli) elsewhere(ctx context.Context) string {
	names, err := c.scan(ctx, "*}:h", 0)
	if err != nil {
		return ""
	}
	count := map[string]int{}
	for _, n := range names {
		inner := strings.TrimSuffix(n, ":h")
		if i := strings.LastIndexByte(inner, '{'); i >= 0 && strings.HasSuffix(inner, "}") {
			count[inner[:i]]++
		}
	}
	if len(count) > 0 {
		prefixes := make([]string, 0, len(count))
		for p := range count {
			prefixes = append(prefixes, p)
		}
		sort.Strings(prefixes)
		for i, p := range prefixes {
			prefixes[i] = fmt.Sprintf("%q (%d key(s))", p, count[p])
		}
		return "; prefixes found there: " + strings.Join(prefixes, ", ") + " (--prefix)"
	}
	if _, ok := c.rdb.(*redis.ClusterClient); ok {
		return "; no jobguard key found there under any prefix"
	}
	info, err := c.rdb.Info(ctx, "keyspace").Result()
	if err != nil {
		return "; no jobguard key found there under any prefix"
	}
	var dbs []string
	for _, line := range strings.Split(info, "\n") {
		if db, rest, ok := strings.Cut(strings.TrimSpace(line), ":keys="); ok && strings.HasPrefix(db, "db") && db != fmt.Sprintf("db%d", c.o.db) {
			n, _, _ := strings.Cut(rest, ",")
			dbs = append(dbs, fmt.Sprintf("%s (%s key(s))", db, n))
		}
	}
	if len(dbs) == 0 {
		return "; no jobguard key found there under any prefix, and no other database holds keys"
	}
	return "; no jobguard key found there under any prefix; databases with keys: " + strings.Join(dbs, ", ") + " (--db)"
}

func (c *cli) inspect(ctx context.Context, key string) int {
	info, err := c.l.Inspect(ctx, key)
	if err != nil {
		return c.fail(err)
	}
	v := view(info)
	if len(v.Holders) == 0 && v.Waiters == 0 && v.Parked == 0 {
		n, err := c.rdb.Exists(ctx, rediskey.Base(c.o.prefix, key)+":h").Result()
		if err != nil {
			return c.fail(err)
		}
		if n == 0 {
			return c.noSuchKey(ctx, key, v)
		}
	}
	if c.o.json {
		_ = json.NewEncoder(c.out).Encode(v)
	} else {
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "key %s: %d holder(s), %d waiter(s), %d parked\n", shown(key), len(v.Holders), v.Waiters, v.Parked)
		if len(v.Holders) > 0 {
			fmt.Fprintln(tw, "OWNER\tLABEL\tTOKEN\tTTL\tSTATE")
			for _, h := range v.Holders {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", shown(h.Owner), shown(h.Label), h.Token, time.Duration(h.TTLms)*time.Millisecond, stateOf(h))
			}
		}
		for _, id := range v.ParkedIDs {
			fmt.Fprintf(tw, "parked: %s\n", shown(id))
		}
		_ = tw.Flush()
	}
	if len(v.Holders) == 0 {
		return exitNotHeld
	}
	return exitOK
}

// noSuchKey tells that the prefix holds no key named key (neither held nor
// released lately), with the closest key it holds or, when it holds none,
// where jobguard keys are.
func (c *cli) noSuchKey(ctx context.Context, key string, v keyView) int {
	if c.o.json {
		_ = json.NewEncoder(c.out).Encode(v)
	}
	names, err := c.scan(ctx, glob.Escape(c.o.prefix)+"{*}:h", 0)
	if err != nil {
		return c.fail(err)
	}
	fmt.Fprintf(c.errOut, "jobguard inspect: no key %s under prefix %q in %s", shown(key), c.o.prefix, c.o.where())
	if len(names) == 0 {
		fmt.Fprintf(c.errOut, "%s\n", c.elsewhere(ctx))
		return exitNotHeld
	}
	// The closest: the longest common beginning (keys name the type
	// first, then fields), then the fewest edits, then the first in order.
	best, bestP, bestD := "", -1, 0
	for _, n := range names {
		k := rediskey.Unescape(strings.TrimSuffix(strings.TrimPrefix(n, c.o.prefix+"{"), "}:h"))
		p, d := commonPrefix(key, k), distance(key, k)
		if p > bestP || (p == bestP && (d < bestD || (d == bestD && k < best))) {
			best, bestP, bestD = k, p, d
		}
	}
	fmt.Fprintf(c.errOut, "; the closest of its %d key(s): %s\n", len(names), shown(best))
	return exitNotHeld
}

// commonPrefix is the length of the longest common beginning of a and b.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// stateOf says what a holder is doing: running, reserved, or being cancelled.
func stateOf(h holderView) string {
	switch {
	case h.Cancelling:
		return fmt.Sprintf("cancelling: waiting for the run to return, asked %s ago", (time.Duration(h.CancelMs) * time.Millisecond).Round(time.Second))
	case h.Reserved:
		return "reserved"
	}
	return "running"
}

func (c *cli) release(ctx context.Context, key string) int {
	info, err := c.l.Inspect(ctx, key)
	if err != nil {
		return c.fail(err)
	}
	var targets []lockcore.Holder
	for _, h := range info.Holders {
		if (c.o.owner == "" || h.Owner == c.o.owner) && (c.o.token == 0 || h.Token == c.o.token) {
			targets = append(targets, h)
		}
	}
	if len(targets) == 0 && c.o.token != 0 {
		now := "nobody"
		if len(info.Holders) > 0 {
			hs := make([]string, len(info.Holders))
			for i, h := range info.Holders {
				hs[i] = fmt.Sprintf("owner %q label %q token %d", h.Owner, h.Label, h.Token)
			}
			now = strings.Join(hs, ", ")
		}
		fmt.Fprintf(c.errOut, "jobguard release: %q: the holder of token %d%s no longer holds it; held now by %s\n",
			key, c.o.token, ownerNote(c.o.owner), now)
		return exitNotHeld
	}
	if len(targets) == 0 {
		fmt.Fprintf(c.errOut, "jobguard release: %q has no holder%s\n", key, ownerNote(c.o.owner))
		return exitNotHeld
	}
	if !c.o.force {
		// Only runs can be cancelled: a reservation runs nothing.
		runs := targets[:0:0]
		for _, h := range targets {
			if !h.Reserved {
				runs = append(runs, h)
			}
		}
		if len(runs) == 0 {
			fmt.Fprintf(c.errOut, "jobguard release: %q%s is held only by reservations, which run nothing: free them with --force\n", key, ownerNote(c.o.owner))
			return exitNotHeld
		}
		targets = runs
	}
	if !c.o.yes {
		if c.o.force {
			tokens := make([]string, len(targets))
			for i, h := range targets {
				tokens[i] = fmt.Sprint(h.Token)
			}
			fmt.Fprintf(c.errOut, "Free %q%s now? The run is still going: a new run may start beside it; its writes carry fencing token %s. [y/N] ",
				key, ownerNote(c.o.owner), strings.Join(tokens, ", "))
		} else {
			fmt.Fprintf(c.errOut, "Release %d holder(s) of %q%s? Their runs are cancelled; the key goes to the next task when they return. [y/N] ", len(targets), key, ownerNote(c.o.owner))
		}
		line, _ := bufio.NewReader(c.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(c.errOut, "not released")
			return exitDeclined
		}
	}
	// Only the holders shown: the key may have changed hands meanwhile.
	op := c.l.CancelRun
	if c.o.force {
		op = c.l.ForceRelease
	}
	n, gone := 0, false
	for _, h := range targets {
		_, err := op(ctx, key, lockcore.Select{Token: h.Token})
		switch {
		case err == nil:
			n++
		case errors.Is(err, lockcore.ErrNotHeld):
			fmt.Fprintln(c.errOut, "jobguard:", err)
			gone = true
		default:
			return c.fail(err)
		}
	}
	switch {
	case c.o.json:
		_ = json.NewEncoder(c.out).Encode(map[string]any{"key": key, "released": n, "force": c.o.force})
	case c.o.force:
		fmt.Fprintf(c.out, "freed %d holder(s) of %s (their runs may still be going)\n", n, shown(key))
	default:
		fmt.Fprintf(c.out, "released %d holder(s) of %s: their runs are cancelled, and the key goes to the next task when they return\n", n, shown(key))
	}
	if n == 0 || gone {
		return exitNotHeld
	}
	return exitOK
}

// shown is s as a table prints it: keys, owners and labels come from task
// IDs and payloads, so their control bytes are escaped (printable.String)
// and never reach the terminal nor break a row.
func shown(s string) string { return printable.String(s) }

func ownerNote(owner string) string {
	if owner == "" {
		return ""
	}
	return fmt.Sprintf(" owned by %q", owner)
}

func (c *cli) watch(ctx context.Context, pattern string) int {
	t := time.NewTicker(c.o.interval)
	defer t.Stop()
	for {
		keys, err := c.held(ctx, pattern)
		if ctx.Err() != nil {
			return exitOK
		}
		switch {
		case err != nil:
			// Redis restarts and failovers pass: say so, and look again.
			fmt.Fprintf(c.errOut, "%s  jobguard watch: %v; trying again in %s\n", time.Now().Format("15:04:05"), err, c.o.interval)
		case c.o.json:
			_ = json.NewEncoder(c.out).Encode(map[string]any{"at": time.Now().UTC().Format(time.RFC3339Nano), "keys": keys})
		default:
			if f, ok := c.out.(*os.File); ok && isTerminal(f) {
				fmt.Fprint(c.out, "\033[H\033[2J") // clear the screen
			}
			fmt.Fprintf(c.out, "%s  %d key(s) held matching %q (every %s; Ctrl-C to stop)\n", time.Now().Format("15:04:05"), len(keys), pattern, c.o.interval)
			c.printKeys(keys)
			fmt.Fprintln(c.out)
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-t.C:
		}
	}
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// why reads the decision log newest first, decisionChunk entries per
// XREVRANGE, and stops at the end of the chunk in which it finds the task,
// or after --max-entries entries (defaultWhyMax: twice the log's default
// length, 10,000: singleton.WithDecisionLog).
const (
	decisionChunk = 1000
	defaultWhyMax = 20000
)

// decisionView is one decision as --json prints it: the stream entry's
// fields, and when (the entry's ID, the Redis server's time in ms).
type decisionView struct {
	At     string            `json:"at"`
	Fields map[string]string `json:"fields"`
}

// why prints the decisions recorded for task id (its ID, or the origin of a
// Requeue copy), newest first: those of the first chunk of the log, read
// newest first, in which it finds one, within --max-entries entries.
func (c *cli) why(ctx context.Context, client redis.UniversalClient, id string) int {
	var found []decisionlog.Decision
	calls := decisionlog.Calls{}
	read, from, end := 0, "+", false
	for len(found) == 0 && read < c.o.maxEntries && !end {
		n := min(decisionChunk, c.o.maxEntries-read)
		entries, err := client.XRevRangeN(ctx, c.o.decisions, from, "-", int64(n)).Result()
		if err != nil {
			return c.fail(err)
		}
		read += len(entries)
		end = len(entries) < n
		if len(entries) > 0 {
			from = "(" + entries[len(entries)-1].ID
		}
		found = decisionsOf(entries, id, calls, found)
	}
	if c.o.json {
		views := make([]decisionView, len(found))
		for i, d := range found {
			views[i] = decisionView{At: d.AtText(), Fields: d.Fields}
		}
		if found == nil {
			views = nil
		}
		_ = json.NewEncoder(c.out).Encode(views)
	} else if len(found) == 0 {
		fmt.Fprintf(c.out, "no decision recorded for task %s in %s: it ran (or waits to), or its record is older than the log keeps", shown(id), shown(c.o.decisions))
		if !end {
			fmt.Fprintf(c.out, " or than the newest %d entries looked through (--max-entries)", read)
		}
		fmt.Fprintln(c.out)
	} else {
		c.printDecisions(found)
	}
	if len(found) == 0 {
		return exitNotHeld
	}
	return exitOK
}

// decisionsOf appends to found the entries about task id, one per call
// (calls: the calls seen): those of the task or of its copies, and the
// enqueues Unique refused whose error named id (the task holding the key,
// or the key itself), since the caller of a refused enqueue may have no
// other ID.
func decisionsOf(entries []redis.XMessage, id string, calls decisionlog.Calls, found []decisionlog.Decision) []decisionlog.Decision {
	for _, e := range entries {
		d := decisionlog.Decode(e)
		named := d.Task == id || d.Origin == id || (d.Reason == decisionlog.ReasonRefused && (d.ByTask == id || d.Key == id))
		if !named || calls.Repeated(d) {
			continue // another task's, or a write go-redis sent again
		}
		found = append(found, d)
	}
	return found
}

// printDecisions prints found as a table does (not with --json). A cause is
// an error's text, whose keys are quoted already: it is shown with its
// control bytes escaped (shownCause), not its quotes' backslashes doubled.
func (c *cli) printDecisions(found []decisionlog.Decision) {
	for _, d := range found {
		what := "completed without running: " + shown(d.Reason)
		switch {
		case d.Action == decisionlog.ActionParked:
			what = "was parked behind its key's holder, not run then (" + shown(d.Reason) + "): the run that frees the key resumes it"
		case d.Action == decisionlog.ActionRequeued:
			what = "was put back, not run then (" + shown(d.Reason) + ")"
		case d.Action != "":
			what = "was not run then: " + shown(d.Reason) + ", " + shown(d.Action)
		}
		switch d.Reason {
		case decisionlog.ReasonArchived:
			what = "did not run: the middleware refused it, and asynq archives it"
		case decisionlog.ReasonPreempted:
			what = "was preempted while it ran (a newer task of its key cancelled it; not retried)"
		case decisionlog.ReasonLost:
			what = "lost its lease while it ran, and failed (asynq retries it while it has retries left)"
		case decisionlog.ReasonRefused:
			what = "was refused at enqueue (Unique): its key was reserved"
		case decisionlog.ReasonWouldArchive:
			what = "ran under WithShadow; without it, it would have been refused and archived"
		}
		fmt.Fprintf(c.out, "%s task %s (%s, queue %s) %s", d.AtText(), shown(d.Task), shown(d.Type), shown(d.Queue), what)
		if d.Key != "" {
			fmt.Fprintf(c.out, ", key %s", shown(d.Key))
		}
		if d.ByTask != "" {
			fmt.Fprintf(c.out, ", by task %s", shown(d.ByTask))
		}
		if d.ByOwner != "" {
			fmt.Fprintf(c.out, ", run by %s", shown(d.ByOwner))
		}
		if d.ByToken != 0 {
			fmt.Fprintf(c.out, " (token %d", d.ByToken)
			if since := d.Since(); !since.IsZero() {
				fmt.Fprintf(c.out, ", since %s", since.Format(time.RFC3339Nano))
			}
			fmt.Fprint(c.out, ")")
		}
		if d.ByState != "" {
			fmt.Fprintf(c.out, " (%s)", shown(d.ByState))
		}
		if d.BackIn > 0 {
			fmt.Fprintf(c.out, "; it comes back by itself in %s", d.BackIn)
			if back := d.Back(); !back.IsZero() {
				fmt.Fprintf(c.out, " (at %s)", back.Format(time.RFC3339Nano))
			}
			if d.Action == decisionlog.ActionParked {
				fmt.Fprint(c.out, " should the holder's release never come (its process died)")
			}
		}
		if d.Cause != "" {
			fmt.Fprintf(c.out, ": %s", shownCause(d.Cause))
		}
		fmt.Fprintln(c.out)
	}
}

// shownCause is an error's text as why prints it: its control bytes,
// invalid UTF-8 and format characters escaped as shown escapes them, its
// backslashes left as they are (the quotes of a key the error names are
// escaped already, and doubling them would escape the key twice).
func shownCause(s string) string {
	parts := strings.Split(s, `\`)
	for i, p := range parts {
		parts[i] = shown(p)
	}
	return strings.Join(parts, `\`)
}
