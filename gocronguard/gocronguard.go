// Package gocronguard runs go-co-op/gocron v2 jobs once across the
// schedulers of a fleet, on lockkit leases: a Locker for
// gocron.WithDistributedLocker and an Elector for
// gocron.WithDistributedElector. It is a Go module of its own, so that
// gocron is in the build of no one who does not use it.
//
// gocron passes its Locker only the job's name, not which scheduled run it
// is, so a lock released when a fast job returns lets a scheduler whose
// clock is behind run the same tick again (gocron #841). The Locker names
// the run instead:
//
//   - With WithSchedule(job, spec), the run is the activation of spec nearest
//     to the scheduler's clock (within the tolerance), claimed once as a
//     lockkit epoch: each activation runs once, however late a scheduler
//     fires it. Give the job's own cron spec (gocron.CronJob), or "@every d"
//     for jobs that fire on multiples of d since the epoch.
//   - Otherwise the key stays held for WithHoldAtLeast (default 1s) after a
//     run starts: the runs of the job start at least that long apart across
//     the fleet, and that is all this mode promises. Each run runs once only
//     if every scheduler fires it within the hold of the others, and the hold
//     is shorter than the job's interval: the same clock-aligned schedule (a
//     CronJob, or a DurationJob aligned with gocron.WithStartAt) on clocks
//     closer than the hold. A DurationJob started at different times fires at
//     each scheduler's own phase; a hold close to its interval (less the
//     schedulers' timing jitter) spaces its runs about one interval apart.
//
// With the Elector, only the leader runs jobs, and a new leader waits for
// the handover (WithHandover) before it does (see Elector).
package gocronguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"

	"github.com/jobguard/jobguard/internal/every"
	"github.com/jobguard/jobguard/internal/invalid"
	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/elect"
)

// Defaults of a Locker and an Elector.
const (
	// defaultHoldAtLeast is how long the key of a job without a schedule
	// stays held after its run starts.
	defaultHoldAtLeast = time.Second
	// defaultTolerance bounds how far from an activation a scheduler may fire
	// it and still name it, unless half the schedule's interval is shorter.
	defaultTolerance = time.Second
	// keyPrefix is prepended to a job's name to make its lockkit key.
	keyPrefix = "gocron:"
	// defaultHandover is how long an Elector that became the leader waits
	// before its scheduler runs jobs.
	defaultHandover = time.Second
)

var (
	// ErrInvalid is matched by every error for an invalid option; it also
	// matches lockkit.ErrInvalid.
	ErrInvalid = invalid.New("gocronguard: invalid option")
	// ErrNoTick is returned by Lock for a job with a schedule that fired
	// farther than the tolerance from every activation: the run is skipped.
	ErrNoTick = errors.New("gocronguard: no activation near the scheduler's clock")
)

// Option configures a Locker.
type Option func(*Locker)

// WithSchedule tells the Locker the schedule of the job named job: a cron
// spec of five fields, six with seconds, a descriptor such as "@hourly", or
// "@every d [offset o]" (aligned to the epoch). Its runs are then named by
// their activation (see the package doc). A job has one schedule: NewLocker
// refuses a second WithSchedule of the same job.
func WithSchedule(job, spec string) Option {
	return func(l *Locker) {
		if first, ok := l.specs[job]; ok && l.dup == nil {
			l.dup = fmt.Errorf("%w: WithSchedule(%q, %q): job %q has a schedule already (%q)", ErrInvalid, job, spec, job, first)
			return
		}
		l.specs[job] = spec
	}
}

// WithHoldAtLeast sets how long the key of a job without a schedule stays
// held after its run starts: the job's runs start at least that long apart
// across the fleet (see the package doc). It is one duration for every job
// without a schedule. Must be positive. Defaults to 1s.
func WithHoldAtLeast(d time.Duration) Option { return func(l *Locker) { l.hold = d } }

// WithTolerance sets how far from an activation a scheduler may fire it and
// still run it. Must be positive. Defaults to 1s, or half the schedule's
// interval when that is shorter.
func WithTolerance(d time.Duration) Option { return func(l *Locker) { l.tol = d } }

// WithClock sets the clock ticks are named by; give the gocron scheduler's.
// Must not be nil. Defaults to time.Now.
func WithClock(now func() time.Time) Option { return func(l *Locker) { l.now = now } }

// WithLocation sets the time zone of the WithSchedule specs that name none
// (no CRON_TZ= or TZ= prefix); give the scheduler's gocron.WithLocation,
// which gocron applies to such specs. Must not be nil. Defaults to
// time.Local, as gocron's.
func WithLocation(loc *time.Location) Option { return func(l *Locker) { l.loc = loc } }

// Locker is a gocron.Locker on a *lockkit.Locker. The lockkit key of a job
// is "gocron:" followed by the job's name (under the Locker's own prefix).
type Locker struct {
	l      *lockcore.RedisLocker // the engine under the *lockkit.Locker given
	hold   time.Duration
	tol    time.Duration
	now    func() time.Time
	loc    *time.Location
	specs  map[string]string
	scheds map[string]schedule
	dup    error // a second WithSchedule of a job
}

type schedule struct {
	s   cron.Schedule
	tol time.Duration
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a gocron.Locker on l. It returns an error matching
// ErrInvalid for a nil l, a spec
// that does not parse, two WithSchedule of one job, or a non-positive
// duration.
func NewLocker(l *lockkit.Locker, opts ...Option) (*Locker, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: NewLocker: locker is nil", ErrInvalid)
	}
	core, err := lockcore.Of("gocronguard.NewLocker", l)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	lk := &Locker{l: core, hold: defaultHoldAtLeast, now: time.Now, loc: time.Local, specs: map[string]string{}, scheds: map[string]schedule{}}
	for _, o := range opts {
		if o != nil {
			o(lk)
		}
	}
	switch {
	case lk.dup != nil:
		return nil, lk.dup
	case lk.hold <= 0:
		return nil, fmt.Errorf("%w: WithHoldAtLeast(%s): must be positive", ErrInvalid, lk.hold)
	case lk.tol < 0:
		return nil, fmt.Errorf("%w: WithTolerance(%s): must be positive", ErrInvalid, lk.tol)
	case lk.now == nil:
		return nil, fmt.Errorf("%w: WithClock(nil)", ErrInvalid)
	case lk.loc == nil:
		return nil, fmt.Errorf("%w: WithLocation(nil)", ErrInvalid)
	}
	for job, spec := range lk.specs {
		s, err := parse(spec, lk.loc)
		if err != nil {
			return nil, fmt.Errorf("%w: WithSchedule(%q, %q): %v", ErrInvalid, job, spec, err)
		}
		a := s.Next(lk.now())
		gap := s.Next(a).Sub(a)
		if a.IsZero() || gap <= 0 {
			return nil, fmt.Errorf("%w: WithSchedule(%q, %q): the schedule does not fire twice", ErrInvalid, job, spec)
		}
		tol := lk.tol
		if tol == 0 {
			tol = min(defaultTolerance, gap/2)
		}
		lk.scheds[job] = schedule{s: s, tol: tol}
	}
	return lk, nil
}

// parse parses spec, in loc unless it names its own time zone.
func parse(spec string, loc *time.Location) (cron.Schedule, error) {
	if e, ok, err := every.Parse(spec); ok {
		return e, err
	}
	if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
		spec = "CRON_TZ=" + loc.String() + " " + spec
	}
	if len(strings.Fields(spec)) == 7 {
		return cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor).Parse(spec)
	}
	return cron.ParseStandard(spec)
}

// Lock implements gocron.Locker: it takes the job's lease for this run, or
// returns why the run must be skipped (the run was claimed by another
// scheduler, or its key is held: an error (the tick's claim is used, or
// one matching lockkit.ErrNotAcquired); ErrNoTick; a Redis error). The lease is renewed
// until Unlock.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	opt := &lockcore.AcquireOptions{HoldAtLeast: l.hold}
	if s, ok := l.scheds[key]; ok {
		now := l.now()
		tick := s.s.Next(now.Add(-s.tol))
		if tick.IsZero() || tick.After(now.Add(s.tol)) {
			return nil, fmt.Errorf("%w: job %q fired at %s", ErrNoTick, key, now.Format(time.RFC3339Nano))
		}
		opt = &lockcore.AcquireOptions{Epoch: tick.UnixMilli(), EpochTTL: time.Hour, Label: tick.UTC().Format(time.RFC3339Nano)}
	}
	lease, err := l.l.TryAcquire(ctx, keyPrefix+key, opt)
	if err != nil {
		return nil, err
	}
	return lock{lease}, nil
}

type lock struct{ lease *lockcore.Lease }

// Unlock implements gocron.Lock.
func (k lock) Unlock(ctx context.Context) error { return k.lease.Release(ctx) }

// Elector is a gocron.Elector on an elect.Campaign: the scheduler holding
// the key is the leader, renewed while it lives; the lease's fencing token
// is the term. Losing leadership is reported by the next IsLeader.
//
// The previous leader may have run a tick up to the moment it stopped
// leading (a resign hands over within milliseconds), and a new leader whose
// clock is behind fires that tick later: a new leader runs no job until the
// handover (WithHandover) has passed since it took the key. With a handover
// longer than the clock skew between schedulers, each activation of a
// CronJob runs at most once across a leader change; the activations that
// fall within the handover run on no scheduler. The first leader waits too.
type Elector struct {
	c        *elect.Campaign
	handover time.Duration
}

var _ gocron.Elector = (*Elector)(nil)

// ElectorOption configures an Elector.
type ElectorOption func(*Elector)

// WithHandover sets how long a scheduler that became the leader waits
// before it runs jobs (see Elector). Make it longer than the clock skew
// between schedulers. Must be positive. Defaults to 1s.
func WithHandover(d time.Duration) ElectorOption { return func(e *Elector) { e.handover = d } }

// NewElector starts campaigning for key on l (opt as for lockkit.Acquire,
// nil for defaults: a dead leader is replaced within the TTL). Close it to
// resign. It returns an error matching lockkit.ErrInvalid for a nil l, an
// empty key or an invalid option (ErrInvalid).
func NewElector(l *lockkit.Locker, key string, opt *lockkit.AcquireOptions, opts ...ElectorOption) (*Elector, error) {
	e := &Elector{handover: defaultHandover}
	for _, o := range opts {
		if o != nil {
			o(e)
		}
	}
	if e.handover <= 0 {
		return nil, fmt.Errorf("%w: WithHandover(%s): must be positive", ErrInvalid, e.handover)
	}
	c, err := elect.New(l, key, opt)
	if err != nil {
		return nil, err
	}
	e.c = c
	return e, nil
}

// IsLeader implements gocron.Elector: nil while this scheduler leads and
// the handover has passed, an error matching elect.ErrNotLeader
// otherwise.
func (e *Elector) IsLeader(context.Context) error {
	_, since, ok := e.c.LeaderSince()
	if !ok {
		return elect.ErrNotLeader
	}
	if left := e.handover - time.Since(since); left > 0 {
		return fmt.Errorf("%w: the handover ends in %s", elect.ErrNotLeader, left)
	}
	return nil
}

// Term returns the current leadership term (a fencing token), if leading,
// during the handover too.
func (e *Elector) Term() (int64, bool) { return e.c.Leader() }

// Close resigns and stops campaigning, bounded by ctx.
func (e *Elector) Close(ctx context.Context) error { return e.c.Stop(ctx) }
