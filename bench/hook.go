package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// counter is a go-redis hook that counts what a client sends: a command sent
// alone is one command and one round trip; a pipeline is one round trip
// carrying all of its commands. Pub/sub connections bypass hooks, so SUBSCRIBE
// and UNSUBSCRIBE are not counted.
type counter struct {
	cmds  atomic.Int64
	rts   atomic.Int64
	npipe atomic.Int64 // round trips that were pipelines
	wait  atomic.Int64 // nanoseconds spent in round trips (summed over callers)
	// notify, when set, is closed after the next command or pipeline returns.
	notify atomic.Pointer[chan struct{}]

	mu    sync.Mutex
	names map[string]bool // names of the commands sent
	rec   bool
	pipes []pipeline // every pipeline since record
}

var _ redis.Hook = (*counter)(nil)

// pipeline is one pipelined round trip.
type pipeline struct {
	start time.Time
	dur   time.Duration
	cmds  int
}

func (p pipeline) end() time.Time { return p.start.Add(p.dur) }

// counts is what a client sent: commands, round trips, how many of those
// round trips were pipelines, and the time callers spent waiting on them.
type counts struct {
	cmds, rts, pipes int64
	wait             time.Duration
}

func (c *counter) counts() counts {
	return counts{c.cmds.Load(), c.rts.Load(), c.npipe.Load(), time.Duration(c.wait.Load())}
}

func (a counts) sub(b counts) counts {
	return counts{a.cmds - b.cmds, a.rts - b.rts, a.pipes - b.pipes, a.wait - b.wait}
}

func (a counts) add(b counts) counts {
	return counts{a.cmds + b.cmds, a.rts + b.rts, a.pipes + b.pipes, a.wait + b.wait}
}

// afterNext returns a channel that is closed when the next command or
// pipeline sent through the client has returned.
func (c *counter) afterNext() <-chan struct{} {
	ch := make(chan struct{})
	c.notify.Store(&ch)
	return ch
}

// record starts keeping every pipeline.
func (c *counter) record() {
	c.mu.Lock()
	c.rec = true
	c.mu.Unlock()
}

// commandNames returns the names of the commands sent so far.
func (c *counter) commandNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.names {
		out = append(out, n)
	}
	return out
}

func (c *counter) saw(cmds ...redis.Cmder) {
	if c.names == nil {
		c.names = make(map[string]bool)
	}
	for _, cmd := range cmds {
		if n := cmd.Name(); !c.names[n] {
			c.names[n] = true
		}
	}
}

// pipelines returns the pipelines sent since record.
func (c *counter) pipelines() []pipeline {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]pipeline(nil), c.pipes...)
}

func (c *counter) done() {
	if ch := c.notify.Swap(nil); ch != nil {
		close(*ch)
	}
}

// DialHook implements redis.Hook.
func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.cmds.Add(1)
		c.rts.Add(1)
		c.mu.Lock()
		c.saw(cmd)
		c.mu.Unlock()
		start := time.Now()
		err := next(ctx, cmd)
		c.wait.Add(int64(time.Since(start)))
		c.done()
		return err
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.cmds.Add(int64(len(cmds)))
		c.rts.Add(1)
		c.npipe.Add(1)
		start := time.Now()
		err := next(ctx, cmds)
		c.wait.Add(int64(time.Since(start)))
		c.mu.Lock()
		c.saw(cmds...)
		if c.rec {
			c.pipes = append(c.pipes, pipeline{start, time.Since(start), len(cmds)})
		}
		c.mu.Unlock()
		c.done()
		return err
	}
}
