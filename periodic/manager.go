package periodic

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// defaultSyncInterval is how often a PeriodicTaskManager reads its configs
// when PeriodicTaskManagerOpts.SyncInterval is zero, as in asynq.
const defaultSyncInterval = 3 * time.Minute

// PeriodicTaskManager is a drop-in for asynq.PeriodicTaskManager that every
// replica can run: it keeps a Scheduler's entries in line with the configs
// of a PeriodicTaskConfigProvider, and each tick of each config is enqueued
// once across the replicas (see the package doc for configs that change).
type PeriodicTaskManager struct {
	s        *Scheduler
	p        asynq.PeriodicTaskConfigProvider
	interval time.Duration

	mu      sync.Mutex
	ids     map[string]bool // entry IDs registered from the provider
	stop    chan struct{}
	stopped bool
	wg      sync.WaitGroup
}

// NewPeriodicTaskManager takes asynq's options (the provider, the Redis
// connection or client, SchedulerOpts and SyncInterval, which defaults to 3
// minutes when zero, as in asynq) and this package's Scheduler options. It
// returns an error matching ErrInvalid for a nil
// provider, no Redis, or an invalid option.
func NewPeriodicTaskManager(opts asynq.PeriodicTaskManagerOpts, options ...Option) (*PeriodicTaskManager, error) {
	if opts.PeriodicTaskConfigProvider == nil {
		return nil, fmt.Errorf("%w: PeriodicTaskConfigProvider is nil", ErrInvalid)
	}
	c := opts.RedisUniversalClient
	if c == nil {
		if opts.RedisConnOpt == nil {
			return nil, fmt.Errorf("%w: give RedisConnOpt or RedisUniversalClient", ErrInvalid)
		}
		var ok bool
		if c, ok = opts.RedisConnOpt.MakeRedisClient().(redis.UniversalClient); !ok {
			return nil, fmt.Errorf("%w: %T makes no redis.UniversalClient", ErrInvalid, opts.RedisConnOpt)
		}
	}
	s := NewSchedulerFromRedisClient(c, opts.SchedulerOpts, options...)
	if s.err != nil {
		return nil, s.err
	}
	interval := opts.SyncInterval
	if interval <= 0 {
		interval = defaultSyncInterval
	}
	return &PeriodicTaskManager{s: s, p: opts.PeriodicTaskConfigProvider, interval: interval, ids: map[string]bool{}, stop: make(chan struct{})}, nil
}

// Start reads the configs, registers them, starts the Scheduler and then
// syncs every SyncInterval. It returns the provider's error or an invalid
// config's (ErrInvalid); nothing is started then.
func (m *PeriodicTaskManager) Start() error {
	if err := m.sync(); err != nil {
		return err
	}
	if err := m.s.Start(); err != nil {
		return err
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(m.interval)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				if err := m.sync(); err != nil {
					m.s.cfg.logger.Warn("periodic: syncing the periodic task configs", "err", err)
				}
			}
		}
	}()
	return nil
}

// Run starts the manager and blocks until SIGTERM or SIGINT, then shuts it
// down.
func (m *PeriodicTaskManager) Run() error {
	if err := m.Start(); err != nil {
		return err
	}
	waitForSignal()
	m.Shutdown()
	return nil
}

// Shutdown stops syncing and the Scheduler.
func (m *PeriodicTaskManager) Shutdown() {
	m.mu.Lock()
	if !m.stopped {
		m.stopped = true
		close(m.stop)
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.s.Shutdown()
}

// sync registers the configs that are new and unregisters the ones gone.
// Every config is checked before anything changes.
func (m *PeriodicTaskManager) sync() error {
	configs, err := m.p.GetConfigs()
	if err != nil {
		return fmt.Errorf("periodic: GetConfigs: %w", err)
	}
	want := make(map[string]*asynq.PeriodicTaskConfig, len(configs))
	for i, c := range configs {
		if c == nil || c.Task == nil || c.Cronspec == "" {
			return fmt.Errorf("%w: config #%d: Cronspec and Task are required", ErrInvalid, i+1)
		}
		if _, err := parse(c.Cronspec, m.s.opts.Location); err != nil {
			return fmt.Errorf("%w: config #%d: spec %q: %v", ErrInvalid, i+1, c.Cronspec, err)
		}
		want[entryID(c.Cronspec, m.s.opts.Location, c.Task, c.Opts)] = c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for id := range m.ids {
		if want[id] == nil {
			if err := m.s.Unregister(id); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			delete(m.ids, id)
		}
	}
	for id, c := range want {
		if m.ids[id] {
			continue
		}
		if _, err := m.s.Register(c.Cronspec, c.Task, c.Opts...); err != nil {
			errs = append(errs, err)
			continue
		}
		m.ids[id] = true
	}
	return errors.Join(errs...)
}
