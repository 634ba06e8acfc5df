package periodic

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/internal/every"
	"github.com/jobguard/jobguard/internal/invalid"
	"github.com/jobguard/jobguard/internal/periodickey"
)

// defaultWindow is how long after a tick a replica may still fire it and be
// refused, when WithWindow is not given: the task of a tick is kept for that
// long after it completes.
const defaultWindow = time.Minute

// Errors of the package. Compare with errors.Is.
var (
	// ErrInvalid is matched by every error returned for an invalid spec, task
	// or option; it also matches lockkit.ErrInvalid. The message names the
	// problem.
	ErrInvalid = invalid.New("periodic: invalid argument")
	// ErrNotFound is returned by Unregister for an unknown entry ID.
	ErrNotFound = errors.New("periodic: no such entry")
)

// CatchUpMode says which missed ticks CatchUp enqueues.
type CatchUpMode int

// Catch-up modes.
const (
	// CatchUpAll enqueues every missed tick, oldest first.
	CatchUpAll CatchUpMode = iota + 1
	// CatchUpLatest enqueues only the latest missed tick.
	CatchUpLatest
)

// Option configures a Scheduler beyond asynq.SchedulerOpts.
type Option func(*config)

type config struct {
	window  time.Duration
	catchUp time.Duration
	mode    CatchUpMode
	clock   func() time.Time
	logger  *slog.Logger
	prefix  string
	// beforeEnqueue, when set, is called before each enqueue (tests).
	beforeEnqueue func(entryID string, tick time.Time) hookResult
	// afterClaim, when set, is called once this replica claimed a tick,
	// before it enqueues it (tests).
	afterClaim func(tick time.Time) hookResult
	// claimTTL is how long a claim lives (claimFor; tests shorten it).
	claimTTL time.Duration
	// onClaimWait, when set, is called each time a replica waits for
	// another's claim of a tick (tests).
	onClaimWait func()
}

// hookResult is what config.beforeEnqueue makes of a tick.
type hookResult int

const (
	hookEnqueue hookResult = iota
	hookSkip               // not this tick
	hookDie                // stop the entry on this replica, as if the process died
)

// WithWindow sets how long after a tick a replica may still fire it without
// enqueueing it a second time: the completed task of a tick is kept that long
// (asynq.Retention, or the task's own Retention if longer). Make it longer
// than the clock skew between replicas plus the longest pause of a replica.
// Must be at least a second. Defaults to 1 minute.
func WithWindow(d time.Duration) Option { return func(c *config) { c.window = d } }

// CatchUp makes Start enqueue the ticks of each entry that no replica
// enqueued while all were down, within window before now: all of them oldest
// first (CatchUpAll) or only the latest (CatchUpLatest). Ticks are known from
// the last one each entry enqueued, kept in Redis; an entry that never
// enqueued has nothing to catch up. A caught-up tick has the same task ID as
// on time, so it is never enqueued twice, also when several replicas start
// at once. window must be positive; the task retention grows to it if
// WithWindow is shorter. Defaults to no catch-up.
func CatchUp(window time.Duration, mode CatchUpMode) Option {
	return func(c *config) { c.catchUp, c.mode = window, mode }
}

// WithClock sets the clock the Scheduler fires by. Must not be nil. Defaults
// to time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.clock = now } }

// WithLogger sets the logger of the Scheduler's own messages (refused
// enqueues at Debug, failures at Warn). Must not be nil. Defaults to
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithPrefix sets the prefix of the Redis keys that mark each tick enqueued
// and remember each entry's last tick (for CatchUp); every replica must use
// the same. Defaults to "jobguard:".
func WithPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// Scheduler enqueues periodic tasks like asynq.Scheduler, once per tick
// across every replica that runs the same entries (see the package doc). It
// is safe for concurrent use.
type Scheduler struct {
	rdb    redis.UniversalClient
	client *asynq.Client
	opts   asynq.SchedulerOpts
	cfg    config
	err    error  // a construction error, returned by Register and Start
	owner  string // "c:<random>": this replica's claims of ticks (claimTick)

	mu      sync.Mutex
	entries map[string]*entry
	started bool
	stopped bool
	wg      sync.WaitGroup
}

type entry struct {
	id    string
	spec  string
	sched cron.Schedule
	task  *asynq.Task
	opts  []asynq.Option
	keep  time.Duration // the retention of its tasks
	stop  chan struct{}
}

// NewScheduler returns a Scheduler on the Redis r connects to, with asynq's
// options (Location, PreEnqueueFunc, PostEnqueueFunc; the heartbeat and
// logger fields and the deprecated EnqueueErrorHandler are not used). An invalid option is
// reported by Register and Start, as an error matching ErrInvalid.
func NewScheduler(r asynq.RedisConnOpt, opts *asynq.SchedulerOpts, options ...Option) *Scheduler {
	if r == nil {
		return &Scheduler{err: fmt.Errorf("%w: NewScheduler: RedisConnOpt is nil", ErrInvalid)}
	}
	c, ok := r.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return &Scheduler{err: fmt.Errorf("%w: NewScheduler: %T makes no redis.UniversalClient", ErrInvalid, r)}
	}
	return NewSchedulerFromRedisClient(c, opts, options...)
}

// NewSchedulerFromRedisClient is NewScheduler on an existing client, which
// the Scheduler does not close.
func NewSchedulerFromRedisClient(c redis.UniversalClient, opts *asynq.SchedulerOpts, options ...Option) *Scheduler {
	s := &Scheduler{entries: make(map[string]*entry)}
	if c == nil {
		s.err = fmt.Errorf("%w: NewSchedulerFromRedisClient: client is nil", ErrInvalid)
		return s
	}
	s.rdb, s.client = c, asynq.NewClientFromRedisClient(c)
	if opts != nil {
		s.opts = *opts
	}
	if s.opts.Location == nil {
		s.opts.Location = time.UTC
	}
	s.cfg = config{window: defaultWindow, clock: time.Now, logger: slog.Default(), prefix: "jobguard:"}
	s.owner = "c:" + newOwner()
	for _, o := range options {
		if o != nil {
			o(&s.cfg)
		}
	}
	// A claim lapses well within the window, so that a replica that waited
	// for a dead claimant still enqueues the tick in time.
	s.cfg.claimTTL = min(claimFor, s.cfg.window/4)
	switch {
	case s.cfg.window < time.Second:
		s.err = fmt.Errorf("%w: WithWindow(%s): must be at least 1s", ErrInvalid, s.cfg.window)
	case s.cfg.mode != 0 && (s.cfg.catchUp <= 0 || (s.cfg.mode != CatchUpAll && s.cfg.mode != CatchUpLatest)):
		s.err = fmt.Errorf("%w: CatchUp(%s, %d): the window must be positive and the mode CatchUpAll or CatchUpLatest", ErrInvalid, s.cfg.catchUp, s.cfg.mode)
	case s.cfg.clock == nil:
		s.err = fmt.Errorf("%w: WithClock(nil)", ErrInvalid)
	case s.cfg.logger == nil:
		s.err = fmt.Errorf("%w: WithLogger(nil)", ErrInvalid)
	}
	return s
}

// Register adds an entry that enqueues task with opts on cronspec (five
// fields or a descriptor, as asynq takes them, or "@every d [offset o]",
// aligned to the epoch) in the Location of the SchedulerOpts. It returns the
// entry's ID, derived from the config (see the package doc), which
// Unregister takes. It returns an error matching ErrInvalid for a spec that
// does not parse or never fires, a nil task, an asynq.TaskID option (the
// Scheduler names each tick's task), or an entry with the same config
// registered already.
func (s *Scheduler) Register(cronspec string, task *asynq.Task, opts ...asynq.Option) (string, error) {
	if s.err != nil {
		return "", s.err
	}
	if task == nil {
		return "", fmt.Errorf("%w: Register(%q): task is nil", ErrInvalid, cronspec)
	}
	sched, err := parse(cronspec, s.opts.Location)
	if err != nil {
		return "", fmt.Errorf("%w: Register(%q): %v", ErrInvalid, cronspec, err)
	}
	if sched.Next(s.cfg.clock()).IsZero() {
		return "", fmt.Errorf("%w: Register(%q): the schedule never fires", ErrInvalid, cronspec)
	}
	keep := max(s.cfg.window, s.cfg.catchUp)
	for _, o := range opts {
		switch o.Type() {
		case asynq.TaskIDOpt:
			return "", fmt.Errorf("%w: Register(%q): asynq.TaskID: the Scheduler names each tick's task itself", ErrInvalid, cronspec)
		case asynq.RetentionOpt:
			if d, ok := o.Value().(time.Duration); ok {
				keep = max(keep, d)
			}
		}
	}
	e := &entry{id: entryID(cronspec, s.opts.Location, task, opts), spec: cronspec, sched: sched, task: task, opts: slices.Clone(opts), keep: keep, stop: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.entries[e.id]; dup {
		return "", fmt.Errorf("%w: Register(%q): an entry with the same spec, task (type, payload and headers) and options is registered (%s)", ErrInvalid, cronspec, e.id)
	}
	s.entries[e.id] = e
	if s.started && !s.stopped {
		s.runLocked(e)
	}
	return e.id, nil
}

// Unregister removes the entry with ID entryID; ticks it was enqueueing
// complete. It returns ErrNotFound for an unknown ID.
func (s *Scheduler) Unregister(entryID string) error {
	s.mu.Lock()
	e, ok := s.entries[entryID]
	delete(s.entries, entryID)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, entryID)
	}
	close(e.stop)
	return nil
}

// Start starts enqueueing, after catching up (CatchUp), and returns. It
// returns the construction error, if any, or an error if the Scheduler was
// started or shut down already.
func (s *Scheduler) Start() error {
	if s.err != nil {
		return s.err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("periodic: the Scheduler was started already")
	}
	if s.stopped {
		return errors.New("periodic: the Scheduler was shut down")
	}
	s.started = true
	for _, e := range s.entries {
		s.runLocked(e)
	}
	return nil
}

// Run starts the Scheduler and blocks until the process receives SIGTERM or
// SIGINT, then shuts it down, as asynq.Scheduler.Run does.
func (s *Scheduler) Run() error {
	if err := s.Start(); err != nil {
		return err
	}
	waitForSignal()
	s.Shutdown()
	return nil
}

// waitForSignal returns when the process receives SIGTERM or SIGINT.
func waitForSignal() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	signal.Stop(sigs)
}

// Shutdown stops enqueueing and waits for enqueues in flight.
func (s *Scheduler) Shutdown() {
	s.mu.Lock()
	if !s.stopped {
		s.stopped = true
		for _, e := range s.entries {
			close(e.stop)
		}
		clear(s.entries)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Scheduler) runLocked(e *entry) {
	s.wg.Add(1)
	go s.loop(e)
}

// loop fires e's ticks until it is stopped, after catching up.
func (s *Scheduler) loop(e *entry) {
	defer s.wg.Done()
	from := s.cfg.clock()
	if s.cfg.mode != 0 {
		// The loop goes on from where the catch-up stopped: a tick that
		// came due while it enqueued is fired next.
		to, ok := s.catchUp(e)
		if !ok {
			return
		}
		if !to.IsZero() {
			from = to
		}
	}
	next := e.sched.Next(from)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(max(next.Sub(s.cfg.clock()), 0))
		select {
		case <-e.stop:
			return
		case <-timer.C:
		}
		now := s.cfg.clock()
		if now.Before(next) {
			continue // the timer ran early on this clock
		}
		if now.Sub(next) > s.cfg.window {
			// Paused past the window: this tick and the ones up to now
			// were the other replicas' to enqueue, and may be too old to
			// be refused.
			next = e.sched.Next(now)
			continue
		}
		if !s.fire(e, next) {
			return
		}
		next = e.sched.Next(next)
	}
}

// catchUp enqueues the ticks of e missed within the catch-up window, from
// the last one enqueued, and returns the time up to which it looked (zero
// when it could not); false when the loop must stop.
func (s *Scheduler) catchUp(e *entry) (time.Time, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	last, err := s.rdb.ZScore(ctx, s.lastKey(e), "t").Result()
	cancel()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			s.cfg.logger.Warn("periodic: reading the last tick for catch-up", "entry", e.id, "spec", e.spec, "err", err)
		}
		return time.Time{}, true
	}
	now := s.cfg.clock()
	from := time.UnixMilli(int64(last)).In(s.opts.Location)
	if limit := now.Add(-s.cfg.catchUp); from.Before(limit) {
		from = limit
	}
	var missed []time.Time
	for t := e.sched.Next(from); !t.IsZero() && !t.After(now) && len(missed) < 100_000; t = e.sched.Next(t) {
		missed = append(missed, t)
	}
	if s.cfg.mode == CatchUpLatest && len(missed) > 1 {
		missed = missed[len(missed)-1:]
	}
	for _, t := range missed {
		if !s.fire(e, t) {
			return now, false
		}
	}
	return now, true
}

// fire enqueues e's task of tick; false when the entry stops on this replica.
//
// The tick's task ID refuses a second enqueue while the task exists, but a
// revoked task (asynq.RevokeTask) is deleted at once, so the tick's mark
// decides: a replica claims the tick in it (claimTick: "c:<replica>" for
// claimFor), enqueues the task, and marks the tick enqueued ("1", for the
// task's retention plus the window, with the last tick enqueued); a replica
// that finds the tick marked does not enqueue it, and one that finds it
// claimed waits until it is marked, or until the claim lapses (its claimant
// died, or its enqueue failed) and it claims the tick itself. An enqueue is
// not sent after its claim's claimMargin: a claimant stalled until its claim
// lapsed cannot enqueue a tick another replica enqueued meanwhile.
func (s *Scheduler) fire(e *entry, tick time.Time) bool {
	if s.cfg.beforeEnqueue != nil {
		switch s.cfg.beforeEnqueue(e.id, tick) {
		case hookSkip:
			return true
		case hookDie:
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mark := s.markKey(e, tick)
	// A mark that cannot be read does not stop the enqueue: the tick's task
	// ID still refuses a second one while that task exists.
	claimed, ok, err := s.claimTick(ctx, e, mark)
	switch {
	case errors.Is(err, errStopped):
		return false
	case err != nil:
		s.cfg.logger.Warn("periodic: claiming the tick; enqueueing all the same", "entry", e.id, "spec", e.spec, "tick", tick, "err", err)
	case !ok:
		s.cfg.logger.Debug("periodic: tick enqueued by another replica", "entry", e.id, "spec", e.spec, "tick", tick)
		return true
	}
	if s.cfg.afterClaim != nil && s.cfg.afterClaim(tick) == hookDie {
		return false
	}
	opts := append(slices.Clone(e.opts), asynq.TaskID(periodickey.TaskID(e.id, tick)), asynq.Retention(e.keep))
	if f := s.opts.PreEnqueueFunc; f != nil {
		f(e.task, opts)
	}
	// An enqueue sent once the tick's task and mark may have expired
	// could be accepted a second time: it is not sent (nor retried) after
	// tick + retention on this replica's clock; the mark lasts a window
	// longer than the retention, for the skew and the enqueue's own trip.
	// Nor after the claim's margin, once another replica may have claimed
	// the tick.
	left := min(tick.Add(e.keep).Sub(s.cfg.clock()), time.Until(claimed.Add(s.cfg.claimTTL-s.cfg.claimTTL/claimMargin)))
	if left <= 0 {
		s.cfg.logger.Warn("periodic: tick not enqueued: its retention or its claim passed before the enqueue", "entry", e.id, "spec", e.spec, "tick", tick)
		s.unclaim(ctx, mark)
		return true
	}
	ectx, ecancel := context.WithTimeout(ctx, left)
	info, err := s.client.EnqueueContext(ectx, e.task, opts...)
	ecancel()
	conflict := errors.Is(err, asynq.ErrTaskIDConflict)
	if conflict {
		s.cfg.logger.Debug("periodic: tick enqueued by another replica", "entry", e.id, "spec", e.spec, "tick", tick)
	} else {
		if f := s.opts.PostEnqueueFunc; f != nil {
			f(info, err)
		}
		if err != nil {
			// The enqueue may have landed (its reply lost): the claim stays
			// until it lapses, and a replica that then claims the tick is
			// refused by its task ID while the task exists.
			s.cfg.logger.Warn("periodic: enqueue failed", "entry", e.id, "spec", e.spec, "tick", tick, "err", err)
			return true
		}
	}
	// Mark the tick (also when another replica enqueued it: it may have
	// died before marking it, or lost the reply of its enqueue), and
	// remember the last tick enqueued, for CatchUp; a later tick never
	// goes back to an earlier one (GT). The two keys share a slot.
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, mark, 1, e.keep+s.cfg.window)
		if !conflict {
			p.ZAddGT(ctx, s.lastKey(e), redis.Z{Score: float64(tick.UnixMilli()), Member: "t"})
		}
		return nil
	})
	if err != nil {
		s.cfg.logger.Warn("periodic: marking the tick", "entry", e.id, "tick", tick, "err", err)
	}
	return true
}

// claimFor is how long a replica's claim of a tick lives unless it marks
// the tick enqueued first (a quarter of the window if that is shorter);
// claimMargin: its enqueue is not sent after the claim's life less a
// claimMargin-th of it (4 s).
const (
	claimFor    = 5 * time.Second
	claimMargin = 5
)

// claimPoll is how often a replica that found a tick claimed by another
// looks at its mark again.
const claimPoll = 25 * time.Millisecond

// claimScript claims a tick's mark KEYS[1] for ARGV[1] ("c:<replica>") for
// ARGV[2] ms, unless it is claimed or marked already: it returns
// "claimed", or the mark's value ("1" when marked enqueued, "c:<replica>"
// while claimed). Run twice (go-redis sending it again after a lost
// reply), the second finds this replica's claim, which is its own.
var claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  return 'claimed'
end
if v then
  return v
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 'claimed'
`)

// unclaimScript drops this replica's claim of a tick (KEYS[1], ARGV[1]),
// so that a replica waiting for it claims the tick at once.
var unclaimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// errStopped is claimTick's error when the entry stopped while it waited.
var errStopped = errors.New("periodic: the entry stopped")

// claimTick claims tick's mark for this replica (true, with when the claim
// that took it was sent: its life began no earlier) or finds it marked
// enqueued (false), waiting while another replica's claim lives. It returns
// errStopped when the entry stops meanwhile.
func (s *Scheduler) claimTick(ctx context.Context, e *entry, mark string) (time.Time, bool, error) {
	for {
		sent := time.Now()
		v, err := claimScript.Run(ctx, s.rdb, []string{mark}, s.owner, s.cfg.claimTTL.Milliseconds()).Text()
		switch {
		case err != nil:
			return sent, true, err
		case v == "claimed":
			return sent, true, nil
		case !strings.HasPrefix(v, "c:"):
			return sent, false, nil
		}
		if s.cfg.onClaimWait != nil {
			s.cfg.onClaimWait()
		}
		select {
		case <-time.After(claimPoll):
		case <-e.stop:
			return sent, false, errStopped
		case <-ctx.Done():
			return sent, true, ctx.Err()
		}
	}
}

// unclaim drops this replica's claim of a tick it did not enqueue.
func (s *Scheduler) unclaim(ctx context.Context, mark string) {
	if err := unclaimScript.Run(ctx, s.rdb, []string{mark}, s.owner).Err(); err != nil {
		s.cfg.logger.Warn("periodic: dropping the claim of a tick", "mark", mark, "err", err)
	}
}

// newOwner returns a random name for this replica's claims.
func newOwner() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// lastKey is the key that holds e's last tick enqueued.
func (s *Scheduler) lastKey(e *entry) string { return periodickey.Last(s.cfg.prefix, e.id) }

// markKey is the key that marks e's tick as enqueued.
func (s *Scheduler) markKey(e *entry, tick time.Time) string {
	return periodickey.Mark(s.cfg.prefix, e.id, tick)
}

// parse reads a spec as asynq's Scheduler does (five fields or a
// descriptor), in loc, with "@every" aligned to the epoch.
func parse(spec string, loc *time.Location) (cron.Schedule, error) {
	if e, ok, err := every.Parse(spec); ok {
		return e, err
	}
	sched, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, err
	}
	if ss, ok := sched.(*cron.SpecSchedule); ok && ss.Location == time.Local {
		ss.Location = loc // a CRON_TZ= prefix keeps its own zone
	}
	return sched, nil
}

// entryID derives an entry's identity from its config.
func entryID(spec string, loc *time.Location, task *asynq.Task, opts []asynq.Option) string {
	parts := make([]string, 0, len(opts))
	for _, o := range opts {
		parts = append(parts, o.String())
	}
	slices.Sort(parts)
	// Headers count as options named "header:" (none: the ID headers had
	// no part in).
	for _, k := range slices.Sorted(maps.Keys(task.Headers())) {
		parts = append(parts, "header:"+strconv.Itoa(len(k))+":"+k+"="+task.Headers()[k])
	}
	h := sha256.New()
	for _, p := range append([]string{spec, loc.String(), task.Type(), string(task.Payload())}, parts...) {
		h.Write([]byte(strconv.Itoa(len(p))))
		h.Write([]byte{':'})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))[:20]
}
