package guard

// WithExtraKeys: a job also holds other keys, each under its own limit, all
// or none: under a policy that does not wait it tries each once and gives
// every key back when one is full; under Wait it takes them in the order of
// their names.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobguard/jobguard/internal/lockcore"
)

// WithExtraKeys is middleware.WithExtraKeys, which documents it.
func WithExtraKeys(fn func(ctx context.Context, job Job) map[string]int) Option {
	return optionFunc(func(g *Guard) { g.extraOf, g.extraSet = fn, true })
}

// extraKey is one key a job holds besides its own, with its limit.
type extraKey struct {
	key   string
	limit int
}

// ExtraKeysOf returns job's extra keys with their limits: its Work.Extra,
// else what WithExtraKeys's function gives it (called with ctx), else
// none. An empty key, job's own key, or a limit outside 1 to
// lockcore.MaxLimit is an error naming job's key and the bad key or limit.
// An adapter that refuses such a job its own way calls it before Run and
// gives Run the keys in Work.Extra (not nil).
func ExtraKeysOf(g *Guard, ctx context.Context, job Job) (map[string]int, error) {
	m := job.w.Extra
	if m == nil && g.extraOf != nil {
		m = g.extraOf(ctx, job)
	}
	if _, err := checkExtra(job, m); err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]int{}
	}
	return m, nil
}

// extraKeysOf returns job's extra keys (ExtraKeysOf) in the order they are
// taken.
func (g *Guard) extraKeysOf(ctx context.Context, job Job) ([]extraKey, error) {
	m := job.w.Extra
	if m == nil {
		m = g.extraOf(ctx, job)
	}
	return checkExtra(job, m)
}

// checkExtra returns m's keys sorted by name (the order they are taken in),
// or an error naming the first bad key or limit.
func checkExtra(job Job, m map[string]int) ([]extraKey, error) {
	keys := make([]extraKey, 0, len(m))
	for k, n := range m {
		keys = append(keys, extraKey{k, n})
	}
	slices.SortFunc(keys, func(a, b extraKey) int { return strings.Compare(a.key, b.key) })
	for _, k := range keys {
		switch {
		case k.key == "":
			return nil, fmt.Errorf("%s: key %q: WithExtraKeys gave an empty key", job.what(), job.Key)
		case k.key == job.Key:
			return nil, fmt.Errorf("%s: key %q: WithExtraKeys gave the job's own key", job.what(), job.Key)
		case k.limit < 1 || k.limit > lockcore.MaxLimit:
			return nil, fmt.Errorf("%s: key %q: WithExtraKeys gave %q the limit %d: a limit must be between 1 and %d", job.what(), job.Key, k.key, k.limit, lockcore.MaxLimit)
		}
	}
	return keys, nil
}

// extraOptions are the options of the acquire of an extra key: its label
// (extraLabel: a delivery whose own earlier run holds the key waits for it), TTL
// and release; no parking, reservation, epoch, follow-up or hold, which
// belong to the job's own key.
func (g *Guard) extraOptions(job Job, k extraKey) *lockcore.AcquireOptions {
	opt := &lockcore.AcquireOptions{TTL: g.ttl, Limit: k.limit, Label: extraLabel(job), AsyncRelease: g.async}
	if p := g.parking; p != nil {
		// The key may be another job's own, with jobs parked for it: the
		// release starts the oldest, as every run's end does.
		opt.Park = &lockcore.Parking{OnParked: p.Resume}
	}
	return opt
}

// extraLabel is the label of job's leases on its extra keys: its own
// label with its own key, quoted (`<label>@"<key>"`, one string for each
// pair), since a label names the work only among the jobs of one key
// (cronguard's is the tick, which the entries sharing an extra key have in
// common); "" without a label.
func extraLabel(job Job) string {
	if job.w.Label == "" {
		return ""
	}
	return job.w.Label + "@" + strconv.Quote(job.Key)
}

// ownExtra reports whether err is the conflict of an extra key held by
// job's own earlier delivery.
func ownExtra(job Job, err error) bool {
	var ce *lockcore.ConflictError
	return job.w.Label != "" && errors.As(err, &ce) && ce.Label == extraLabel(job)
}

// errExtraFull gives back, without running the work and without a hold,
// the key of a job that found one of its extra keys full.
var errExtraFull = errors.New("middleware: an extra key of the job is full")

// takeExtra takes job's extra keys, in order, once the job holds its own
// key with lease. Each is tried once: a key held by the job's own earlier
// run (its label) is waited for, bounded by ctx, as its own key would be;
// any other full key, or an error, gives back every key the job took, its
// own included (a job that does not wait holds no key another waits for
// longer than a try), and returns that key (full) and its error.
func (g *Guard) takeExtra(ctx context.Context, job Job, keys []extraKey, lease *lockcore.Lease) (extra []*lockcore.Lease, full extraKey, err error) {
	for _, k := range keys {
		opt := g.extraOptions(job, k)
		l, err := g.core.TryAcquire(ctx, k.key, opt)
		if err != nil && ownExtra(job, err) {
			l, err = g.core.Acquire(ctx, k.key, opt)
		}
		if err != nil {
			g.giveBack(ctx, lease, extra)
			return nil, k, err
		}
		extra = append(extra, l)
	}
	return extra, extraKey{}, nil
}

// giveBack releases the keys of a job that does not run after all: its
// extra keys together, then its own (ending its lease as a run that did
// nothing: no hold, no completion; the key's next parked job starts).
func (g *Guard) giveBack(ctx context.Context, lease *lockcore.Lease, extra []*lockcore.Lease) {
	g.releaseExtra(ctx, extra)
	if lease != nil {
		_ = lease.Run(ctx, func(context.Context) error { return errExtraFull })
	}
}

// releaseExtra releases extra leases together (one round trip per server),
// bounded by 5 seconds of their own: ctx may have ended.
func (g *Guard) releaseExtra(ctx context.Context, extra []*lockcore.Lease) error {
	if len(extra) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return lockcore.ReleaseAll(rctx, extra)
}

// withExtra derives from wctx, the run's context under its own lease, one
// that is also cancelled when an extra lease is lost (its cause, matching
// ErrLost) or an operator cancels its run (lockkit's CancelRun: the cause
// matches ErrCancelled). stop stops watching.
func withExtra(wctx context.Context, extra []*lockcore.Lease) (context.Context, func()) {
	if len(extra) == 0 {
		return wctx, func() {}
	}
	rctx, cancel := context.WithCancelCause(wctx)
	stops := make([]func(), 0, 2*len(extra))
	for _, l := range extra {
		lctx, lcancel := l.Context(context.Background())
		stop := context.AfterFunc(lctx, func() {
			if cause := context.Cause(lctx); errors.Is(cause, lockcore.ErrLost) || errors.Is(cause, lockcore.ErrCancelled) {
				cancel(fmt.Errorf("%w: extra key %q", cause, l.Key()))
			}
		})
		stops = append(stops, func() { stop() }, lcancel)
	}
	return rctx, func() {
		for _, s := range stops {
			s()
		}
		cancel(context.Canceled)
	}
}

// extraLost is the loss of the first extra lease that was lost, or nil.
func extraLost(extra []*lockcore.Lease) error {
	for _, l := range extra {
		if err := l.Err(); err != nil && errors.Is(err, lockcore.ErrLost) {
			return fmt.Errorf("%w: extra key %q", err, l.Key())
		}
	}
	return nil
}

// acquireAll takes job's own key and its extra keys. Under a policy that
// does not wait, the own key first (acquire), then the extra keys in the
// order of their names, each tried once (takeExtra): a full one gives back
// every key the job took. Under Wait, in order (takeInOrder).
func (g *Guard) acquireAll(ctx context.Context, job Job, a *attempt, keys []extraKey) (*lockcore.Lease, []*lockcore.Lease, time.Duration, error) {
	lease, waited, err := g.acquire(ctx, job, a)
	if err != nil || len(keys) == 0 {
		return lease, nil, waited, err
	}
	extra, full, err := g.takeExtra(ctx, job, keys, lease)
	if err != nil {
		return nil, nil, waited, g.extraNotAcquired(ctx, job, full, err, waited)
	}
	return lease, extra, waited, nil
}

// takeInOrder takes job's keys under Wait: all of them, its own among
// them, in the order of their names, each waited for within the policy's
// bound counted from the job's first attempt while the job holds those
// before it. Every job takes its keys in that one order, so no two jobs
// wait for each other in a cycle (no deadlock), and a job that holds a key
// another waits for is itself waiting only for keys after it. A key held
// by the job's own earlier delivery (its label) is waited for bounded by
// ctx only, as its own key is (acquire). When a wait ends with the key
// still full, the job gives back every key it took and is a duplicate of
// that key's holder, under the wrapped policy (never parked for an extra
// key).
func (g *Guard) takeInOrder(ctx context.Context, job Job, a *attempt, keys []extraKey) (*lockcore.Lease, []*lockcore.Lease, time.Duration, error) {
	start := time.Now()
	a.until = start.Add(g.policy.wait)
	var (
		lease    *lockcore.Lease
		extra    []*lockcore.Lease
		waited   bool
		ownWaits time.Duration // acquire reports a wait for the own key itself
	)
	own := func() error {
		var err error
		lease, ownWaits, err = g.acquire(ctx, job, a)
		if err != nil {
			g.releaseExtra(ctx, extra)
		}
		return err
	}
	// A job the key may be reserved for takes its own key first: the
	// reservation holds it for the job already.
	reserved := job.w.Reserved || (g.parking != nil && g.parks() && job.w.Label != "")
	for _, k := range keys {
		if lease == nil && (reserved || job.Key < k.key) {
			if err := own(); err != nil {
				return nil, nil, time.Since(start), err
			}
		}
		opt := g.extraOptions(job, k)
		l, err := g.core.TryAcquire(ctx, k.key, opt)
		switch {
		case err != nil && ownExtra(job, err):
			l, err = g.core.Acquire(ctx, k.key, opt) // bounded by ctx only
		case err != nil && errors.Is(err, lockcore.ErrNotAcquired):
			waited = true
			wctx, cancel := context.WithDeadline(ctx, a.until)
			l, err = g.core.Acquire(wctx, k.key, opt)
			cancel()
			if err != nil && ownExtra(job, err) {
				l, err = g.core.Acquire(ctx, k.key, opt)
			}
		}
		if err != nil {
			g.giveBack(ctx, lease, extra)
			if ctx.Err() != nil {
				err = fmt.Errorf("middleware: %s: waiting for %q: %w", job.what(), k.key, err)
				g.emit(ctx, Event{Kind: EventError, Job: job, Wait: time.Since(start), Err: err})
				return nil, nil, time.Since(start), err
			}
			return nil, nil, time.Since(start), g.extraNotAcquired(ctx, job, k, err, time.Since(start))
		}
		extra = append(extra, l)
	}
	if lease == nil {
		if err := own(); err != nil {
			return nil, nil, time.Since(start), err
		}
	}
	if !waited && ownWaits == 0 {
		return lease, extra, 0, nil
	}
	if ownWaits == 0 {
		g.emit(ctx, Event{Kind: EventWaited, Job: job, Wait: time.Since(start)})
	}
	return lease, extra, time.Since(start), nil
}

// extraNotAcquired is notAcquired for the extra key k: a conflict is a
// duplicate of its holder; another error names k.
func (g *Guard) extraNotAcquired(ctx context.Context, job Job, k extraKey, err error, waited time.Duration) error {
	if errors.Is(err, lockcore.ErrNotAcquired) {
		return g.notAcquired(ctx, job, err, waited)
	}
	err = fmt.Errorf("middleware: %s: acquire its extra key %q: %w", job.what(), k.key, err)
	g.emit(ctx, Event{Kind: EventError, Job: job, Err: err})
	return err
}
