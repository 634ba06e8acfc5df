package cronguard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/internal/cronkey"
	"github.com/jobguard/jobguard/internal/every"
	"github.com/jobguard/jobguard/internal/guard"
	"github.com/jobguard/jobguard/internal/invalid"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/middleware"
)

// defaultTolerance is the clock skew between replicas that a Guard absorbs
// when WithTolerance is not given. For an entry whose activations are closer
// together than twice this, half the shortest interval is used instead.
const defaultTolerance = 2 * time.Second

// Errors of cronguard. Compare with errors.Is.
var (
	// ErrInvalid is wrapped by every validation error of New, Wrap and Add;
	// it also matches lockkit.ErrInvalid. The message names the option or
	// argument and the bad value.
	ErrInvalid = invalid.New("cronguard: invalid argument")
	// ErrNoTick is wrapped by the error reported (middleware.EventError and the
	// logger) when a run cannot be matched to an activation of its schedule; the
	// job is not run.
	ErrNoTick = errors.New("cronguard: no tick")
	// ErrDuplicateEntry is wrapped, with ErrInvalid, by the error of Guard.Add
	// and Guard.Wrap for an entry name the Guard already has: an entry added
	// to a Cron that still schedules it, or given to Wrap. Two entries with one
	// name would share their ticks' claims, so each tick would run only one of
	// them.
	ErrDuplicateEntry = errors.New("cronguard: entry name already used")
	// ErrSpecMismatch is wrapped by the error reported (middleware.EventError
	// and the logger), once per entry and process, when a replica finds that
	// another one claims the entry's ticks with another spec (or time zone):
	// they run at each other's ticks, or skip them. The job runs as usual.
	ErrSpecMismatch = errors.New("cronguard: replicas schedule the entry differently")
)

// Option configures a Guard: one of this package's (WithTolerance,
// WithLogger, WithClock, WithLocation, WithParser, WithSeconds) or one of
// the guard's settings, which are package middleware's options (WithPolicy,
// WithLimit, WithTTL, WithObserver, ... below). It is middleware.Option:
// middleware.New and singleton refuse this package's own with ErrInvalid.
type Option = middleware.Option

// cronOpt is an option of this package.
type cronOpt func(*config)

func (o cronOpt) Apply(s *guard.Settings) {
	c, ok := s.Adapter.(*config)
	if !ok {
		s.Refuse(errors.New("an option of package cronguard (WithTolerance, WithLogger, WithClock, WithLocation, WithParser or WithSeconds) is not an option of this constructor"))
		return
	}
	o(c)
}

type config struct {
	tol       time.Duration
	tolSet    bool
	logger    cron.Logger
	loggerSet bool
	clock     func() time.Time
	loc       *time.Location
	parser    cron.ScheduleParser
	parserSet bool // WithParser or WithSeconds was given
}

// WithTolerance sets how far apart the replicas' clocks may be, so how far
// apart in real time they may fire the same tick. A tick's claim is kept for 2
// × its interval + 2 × d, so that a replica firing up to an interval late with
// a clock up to d behind still finds it. It must not be negative and must be
// shorter than the shortest interval of every schedule wrapped (Wrap and Add
// return an error otherwise). Defaults to 2s, capped at
// half the entry's shortest interval.
func WithTolerance(d time.Duration) Option {
	return cronOpt(func(c *config) { c.tol, c.tolSet = d, true })
}

// WithLogger makes the Guard log to a cron.Logger instead of the Locker's
// slog logger (lockkit.WithLogger): job errors, panics, lost leases and Redis
// errors at Error; runs and skips at Info. Must not be nil (use
// cron.DiscardLogger for silence). Defaults to the Locker's logger, like
// every jobguard adapter.
func WithLogger(l cron.Logger) Option {
	return cronOpt(func(c *config) { c.logger, c.loggerSet = l, true })
}

// WithClock sets the clock from which runs are matched to ticks: a run
// counts for the latest activation at or before the clock's reading. It must
// read the time cron fires by (a reading earlier than the activation that
// fired the run names the activation before it). Must not be nil. Defaults to
// time.Now, the clock cron fires by.
func WithClock(now func() time.Time) Option { return cronOpt(func(c *config) { c.clock = now }) }

// WithLocation sets the time zone in which schedules without CRON_TZ are
// interpreted by Wrap; give it the same value as cron.WithLocation. Add uses
// the Cron's own location instead. Must not be nil. Defaults to time.Local,
// like cron.
func WithLocation(loc *time.Location) Option { return cronOpt(func(c *config) { c.loc = loc }) }

// WithParser sets the parser of the specs given to Wrap and Add; give it the
// same parser as cron.WithParser. Must not be nil. Defaults to the parser of
// cron.ParseStandard (five fields and descriptors such as @hourly).
func WithParser(p cron.ScheduleParser) Option {
	return cronOpt(func(c *config) { c.parser, c.parserSet = p, true })
}

// WithSeconds makes specs start with a seconds field, like cron.WithSeconds.
// The Guard parses its entries' specs itself, so a seconds field needs this
// option whatever the Cron was given; with Wrap, the Cron parses the spec
// too and needs cron.WithSeconds as well. Defaults to off (five fields): a
// spec of six fields is then refused with an error that names this option.
func WithSeconds() Option {
	return WithParser(cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor))
}

// Guard makes cron entries run once per tick across every replica that shares
// its Locker's Redis. It is safe for concurrent use and owns no goroutine.
// Each of its entries has its own name (ErrDuplicateEntry).
type Guard struct {
	mw  *guard.Guard
	cfg config
	// mu guards names: the Cron and id of each entry added (id 0 while Add
	// schedules it), a nil Cron for a name given to Wrap.
	mu    sync.Mutex
	names map[string]added
}

// added is where an entry name is in use.
type added struct {
	c  *cron.Cron
	id cron.EntryID
}

// New returns a Guard taking leases from locker. It returns an error matching
// ErrInvalid for a nil locker or an invalid option.
func New(locker *lockkit.Locker, opts ...Option) (*Guard, error) {
	if locker == nil {
		return nil, fmt.Errorf("%w: New: locker is nil", ErrInvalid)
	}
	cfg := config{
		clock:  time.Now,
		loc:    time.Local,
		parser: cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor),
	}
	settings := &guard.Settings{Adapter: &cfg}
	for _, o := range opts {
		if o != nil {
			o.Apply(settings)
		}
	}
	switch {
	case cfg.tolSet && cfg.tol < 0:
		return nil, fmt.Errorf("%w: WithTolerance(%s): must not be negative", ErrInvalid, cfg.tol)
	case cfg.loggerSet && cfg.logger == nil:
		return nil, fmt.Errorf("%w: WithLogger(nil): use cron.DiscardLogger for no logging", ErrInvalid)
	case cfg.clock == nil:
		return nil, fmt.Errorf("%w: WithClock(nil)", ErrInvalid)
	case cfg.loc == nil:
		return nil, fmt.Errorf("%w: WithLocation(nil)", ErrInvalid)
	case cfg.parser == nil:
		return nil, fmt.Errorf("%w: WithParser(nil)", ErrInvalid)
	}
	mopts := []guard.Option{settings}
	if cfg.loggerSet {
		mopts = append(mopts, guard.WithLogger(slog.New(slog.DiscardHandler)), guard.WithObserver(logObserver(cfg.logger)))
	}
	mw, err := guard.New(locker, mopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := forTicks(guard.ConfigOf(mw)); err != nil {
		return nil, err
	}
	return &Guard{mw: mw, cfg: cfg, names: make(map[string]added)}, nil
}

// forTicks refuses the guard settings that cannot apply to a cron tick,
// which cron runs once and never again: a policy that requeues, fails for a
// retry or waits to coalesce, and a throttle that requeues.
func forTicks(set guard.Config) error {
	switch {
	case guard.ModeOf(set.Policy) == guard.ModeCoalesce:
		return fmt.Errorf("%w: WithPolicy(%s): a tick that finds its entry running cannot be covered by a later run of another tick; use Skip, Wait, WaitInOrder, KeepNewest or Preempt", ErrInvalid, set.Policy)
	case guard.ModeOf(set.Policy) == guard.ModeAction && guard.ActionOf(set.Policy) != guard.ActionSkip:
		return fmt.Errorf("%w: WithPolicy(%s): cron runs a tick once and never again, so a tick cannot be requeued or failed for a retry; use Skip, Wait(max, Skip()), WaitInOrder, KeepNewest or Preempt", ErrInvalid, set.Policy)
	case set.Throttled && set.ThrottleThen != guard.ActionSkip:
		return fmt.Errorf("%w: WithThrottle(..., %s): cron runs a tick once and never again, so a throttled tick is skipped (ActionSkip)", ErrInvalid, set.ThrottleThen)
	}
	return nil
}

// claimName takes name for an entry of c (nil for Wrap), or returns an error
// matching ErrDuplicateEntry while the Guard has an entry of that name: one
// given to Wrap, or one added to a Cron that still schedules it.
func (g *Guard) claimName(name, spec string, c *cron.Cron) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if a, ok := g.names[name]; ok && (a.c == nil || a.id == 0 || a.c.Entry(a.id).Valid()) {
		return fmt.Errorf("%w: entry %q (spec %q): %w", ErrInvalid, name, spec, ErrDuplicateEntry)
	}
	g.names[name] = added{c: c}
	return nil
}

// Wrap is New(locker, opts...) followed by Guard.Wrap(name, spec). Each call
// has a Guard of its own, which cannot know of the names of other calls: for
// several entries in one process use one Guard, whose Add and Wrap refuse a
// name twice (ErrDuplicateEntry).
func Wrap(locker *lockkit.Locker, name, spec string, opts ...Option) (cron.JobWrapper, error) {
	g, err := New(locker, opts...)
	if err != nil {
		return nil, err
	}
	return g.Wrap(name, spec)
}

// Wrap returns the cron.JobWrapper of one entry: name identifies it across
// the fleet (every replica must use the same name, and no other entry may),
// spec is its schedule, parsed as WithParser says, in the time zone set by
// WithLocation. Use it as cron.NewChain(w).Then(job) for that entry's job, as
// the last (innermost) wrapper of the chain, or in cron.WithChain(w) on a Cron
// that runs only this entry; for a Cron with several entries use Add.
//
// It returns an error matching ErrInvalid for an empty name, a name the Guard
// already has (also matching ErrDuplicateEntry: the name stays taken), a spec
// that does not parse, a schedule whose ticks cannot be named the same way on every
// replica (@every, which cron counts from each replica's start: Add takes it
// and aligns its ticks; a schedule with no future activation), or a tolerance not shorter than the schedule's shortest
// interval.
func (g *Guard) Wrap(name, spec string) (cron.JobWrapper, error) {
	if _, ok, _ := every.Parse(spec); ok {
		return nil, fmt.Errorf("%w: entry %q: spec %q: cron would run it from when each replica started; schedule it with Add, which aligns its ticks", ErrInvalid, name, spec)
	}
	e, err := g.entry(name, spec, g.cfg.loc)
	if err != nil {
		return nil, err
	}
	if err := g.claimName(name, spec, nil); err != nil {
		return nil, err
	}
	return e.wrap, nil
}

// Add schedules job on c as the entry name, on spec parsed as WithParser says
// in c's time zone, and returns its id. Add also takes "@every d" and
// "@every d offset o" (d at least a millisecond; cron itself fires at most
// once a second): its ticks are the multiples of d since the Unix epoch
// (plus o), the same on every replica, where cron's own @every counts from
// each replica's start. c's own chain (cron.WithChain) wraps
// the guarded job, so cron.Recover there also catches the job's panics. It
// returns the errors of Wrap, and one matching ErrInvalid for a nil c or job.
// The name is taken until the entry is removed from c (cron.Remove): Remove
// and Add again change an entry's schedule.
func (g *Guard) Add(c *cron.Cron, name, spec string, job cron.Job) (cron.EntryID, error) {
	if c == nil {
		return 0, fmt.Errorf("%w: Add(%q): the Cron is nil", ErrInvalid, name)
	}
	if job == nil {
		return 0, fmt.Errorf("%w: Add(%q): the job is nil", ErrInvalid, name)
	}
	e, err := g.entry(name, spec, c.Location())
	if err != nil {
		return 0, err
	}
	if err := g.claimName(name, spec, c); err != nil {
		return 0, err
	}
	id := c.Schedule(e.sched, e.wrap(job))
	g.mu.Lock()
	g.names[name] = added{c: c, id: id}
	g.mu.Unlock()
	return id, nil
}

func (g *Guard) entry(name, spec string, loc *time.Location) (*entry, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: entry name is empty (spec %q)", ErrInvalid, spec)
	}
	var sched cron.Schedule
	aligned, ok, err := every.Parse(spec)
	if ok {
		sched = aligned
	} else {
		sched, err = g.cfg.parser.Parse(spec)
		if err != nil && !g.cfg.parserSet && len(strings.Fields(spec)) == 6 {
			return nil, fmt.Errorf("%w: entry %q: spec %q: %v: a seconds field needs cronguard.WithSeconds() (the Guard parses specs itself: cron.WithSeconds() on the Cron is not enough)",
				ErrInvalid, name, spec, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: entry %q: spec %q: %v", ErrInvalid, name, spec, err)
	}
	gap, err := checkSchedule(sched, g.cfg.clock().In(loc))
	if err != nil {
		return nil, fmt.Errorf("%w: entry %q: spec %q: %v", ErrInvalid, name, spec, err)
	}
	tol := min(defaultTolerance, gap/2)
	if g.cfg.tolSet {
		tol = g.cfg.tol
		if tol >= gap {
			return nil, fmt.Errorf("%w: entry %q: WithTolerance(%s) must be shorter than the schedule's shortest interval (%s of %q)",
				ErrInvalid, name, tol, gap, spec)
		}
	}
	return &entry{g: g, name: name, key: cronkey.Key(name), spec: spec, tag: specTag(spec, loc), sched: sched, loc: loc, tol: tol, gap: gap}, nil
}

// specTag is the epoch tag of an entry's claims: a hash of its spec and time
// zone, the same on every replica that schedules the entry the same way.
func specTag(spec string, loc *time.Location) string {
	h := sha256.Sum256([]byte(spec + "\x00" + loc.String()))
	return hex.EncodeToString(h[:8])
}

// entry is one guarded cron entry.
type entry struct {
	g     *Guard
	name  string
	key   string
	spec  string
	tag   string // specTag, kept with each tick's claim
	sched cron.Schedule
	loc   *time.Location
	tol   time.Duration
	gap   time.Duration // shortest interval between activations
	// mismatched is set once another spec's claim was reported.
	mismatched atomic.Bool
}

// mismatch reports, once per entry, that a replica claims the entry's ticks
// with another spec: tag is its claim's, "" when the claim was the entry's
// own spec's (or untagged).
func (e *entry) mismatch(ctx context.Context, mj guard.Job, tag string) {
	if tag == "" || tag == e.tag || !e.mismatched.CompareAndSwap(false, true) {
		return
	}
	guard.Emit(e.g.mw, ctx, guard.Event{Kind: guard.EventError, Job: mj, Err: fmt.Errorf(
		"%w: entry %q: a replica claims its ticks with another spec or time zone (hash %s) than this one's %q in %s (hash %s); give every replica the same",
		ErrSpecMismatch, e.name, tag, e.spec, e.loc, e.tag)})
}

func (e *entry) wrap(job cron.Job) cron.Job {
	return cron.FuncJob(func() { e.run(job) })
}

// run is one firing: name the tick, claim it, run the job under the lease.
func (e *entry) run(job cron.Job) {
	ctx := context.Background()
	mj := guard.Job{Key: e.key, Name: e.name}
	tick, err := tickAt(e.sched, e.g.cfg.clock().In(e.loc), e.gap)
	if err == nil && tick.UnixMilli() <= 0 {
		err = fmt.Errorf("%w: tick %s is not after 1970", ErrNoTick, tick.Format(time.RFC3339Nano))
	}
	if err == nil && job == nil {
		err = fmt.Errorf("cronguard: the wrapped job is nil")
	}
	if err != nil {
		guard.Emit(e.g.mw, ctx, guard.Event{Kind: guard.EventError, Job: mj, Err: fmt.Errorf("cronguard: entry %q: %w", e.name, err)})
		return
	}
	next := e.sched.Next(tick)
	interval := e.gap
	if !next.IsZero() {
		interval = next.Sub(tick)
	}
	mj.ID = tick.UTC().Format(time.RFC3339Nano)
	// The claim outlives every run that can name this tick: replicas up to
	// the tolerance apart, firing up to an interval late. The tick labels
	// the lease (lockkit's Holder.Label, which the ops page and `jobguard
	// inspect` show): the claim is checked before the label, so a replica
	// firing the same tick is refused by the claim, never treated as a
	// delivery of the same work.
	mj = guard.With(mj, guard.Work{Label: mj.ID, Epoch: tick.UnixMilli(), EpochTTL: min(2*interval+2*e.tol, lockcore.MaxTTL), EpochTag: e.tag})
	ctx = context.WithValue(ctx, tickKey{}, tick)
	// Every outcome is reported through the observers (events) and the logger.
	out := e.g.mw.Run(ctx, mj, func(ctx context.Context) error {
		if l, ok := lockcore.LeaseFromContext(ctx); ok {
			e.mismatch(ctx, mj, l.OtherEpochTag())
		}
		if cj, ok := job.(contextJob); ok {
			return cj.RunContext(ctx)
		}
		job.Run()
		return nil
	})
	if used := (*lockcore.EpochUsedError)(nil); errors.As(out.Err, &used) {
		e.mismatch(ctx, mj, used.OtherTag)
	}
}

// contextJob is a job that takes a context and reports an error, such as Func.
type contextJob interface {
	RunContext(ctx context.Context) error
}

// Func is the context-aware form of a job. Under a Guard, its ctx is cancelled
// with a cause matching lockkit.ErrLost if the lease is lost, Tick(ctx) gives
// the tick, lockkit.LeaseFromContext(ctx) the lease (and its fencing token),
// and a returned error is reported (EventReleased.Err and the logger). Any cron.Job with a RunContext(context.Context) error method is run
// the same way.
type Func func(ctx context.Context) error

// Run implements cron.Job for use without a Guard: it calls f with
// context.Background() and drops the error.
func (f Func) Run() { _ = f(context.Background()) }

// RunContext calls f(ctx).
func (f Func) RunContext(ctx context.Context) error { return f(ctx) }

type tickKey struct{}

// Tick returns the scheduled time of the tick being run, from the ctx a Guard
// gives to a Func job and to observers.
func Tick(ctx context.Context) (time.Time, bool) {
	t, ok := ctx.Value(tickKey{}).(time.Time)
	return t, ok
}

// logObserver reports events to l.
func logObserver(l cron.Logger) guard.Observer {
	return func(ctx context.Context, e guard.Event) {
		kv := []any{"entry", e.Job.Name}
		if e.Job.ID != "" {
			kv = append(kv, "tick", e.Job.ID)
		}
		switch e.Kind {
		case guard.EventAcquired:
			l.Info("run", kv...)
		case guard.EventWaited:
			l.Info("delayed", append(kv, "wait", e.Wait)...)
		case guard.EventClaimed:
			l.Info("skip", append(kv, "reason", "ran on another replica")...)
		case guard.EventDuplicate:
			l.Info("skip", append(kv, "reason", "still running", "holder", e.Holder, "waited", e.Wait)...)
		case guard.EventReleased:
			if e.Err != nil {
				l.Error(e.Err, "job failed", append(kv, "duration", e.Duration)...)
			} else {
				l.Info("done", append(kv, "duration", e.Duration)...)
			}
		case guard.EventLost:
			l.Error(e.Err, "lease lost", kv...)
		case guard.EventPreempted:
			l.Info("preempted", kv...)
		case guard.EventError:
			l.Error(e.Err, "guard error", kv...)
		}
	}
}
