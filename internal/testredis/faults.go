package testredis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fault is what a Faults hook does to a command it matches.
type Fault int

// Faults a Faults hook injects.
const (
	// Pass sends the command as usual.
	Pass Fault = iota
	// Repeat runs the command twice and returns the second reply, as
	// go-redis does when a reply is lost or late and it retries.
	Repeat
	// DropReply runs the command and returns a timeout error instead of its
	// reply, as when the connection fails after Redis ran it.
	DropReply
	// Late runs the command, waits until the caller's ctx ends (or
	// Faults.Delay), and then returns a timeout error: the reply came after
	// the client gave up.
	Late
)

var faultNames = [...]string{"pass", "repeat", "drop-reply", "late"}

func (f Fault) String() string { return faultNames[f] }

// ErrInjected is the error a DropReply or Late command returns.
var ErrInjected = fmt.Errorf("testredis: injected fault: %w", context.DeadlineExceeded)

// Faults is a go-redis hook that injects one Fault into the commands (and
// pipelines) it matches. Match sees each command's name and arguments; a
// pipeline matches when any of its commands does. Set it up before use; Arm
// and Disarm switch it. Add it with client.AddHook.
type Faults struct {
	// Match selects the commands to fault; nil matches every command.
	Match func(cmd redis.Cmder) bool
	// Delay bounds how long Late waits when the ctx has no deadline.
	Delay time.Duration
	// Before, when set, is called before a matched command runs (for
	// example to block it until the test is ready): once per Arm, before
	// the first faulted command.
	Before func(cmd redis.Cmder)
	// After, when set, is called when a faulted command has returned (not
	// one answered NOSCRIPT, whose fault is given back).
	After func(cmd redis.Cmder)

	mu      sync.Mutex
	fault   Fault
	times   int  // how many more commands to fault; < 0 for all
	before  bool // Before was called since the last Arm
	hits    atomic.Int64
	done    atomic.Int64
	carried atomic.Int64
}

// Arm makes the next n matching commands (all of them when n < 0) suffer f.
func (h *Faults) Arm(f Fault, n int) {
	h.mu.Lock()
	h.fault, h.times, h.before = f, n, false
	h.mu.Unlock()
}

// Pending returns the fault the hook is armed with.
func (h *Faults) Pending() Fault {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fault
}

// Disarm lets every command pass.
func (h *Faults) Disarm() { h.Arm(Pass, 0) }

// Hits returns how many commands were faulted.
func (h *Faults) Hits() int64 { return h.hits.Load() }

// Carried returns how many commands the last faulted round trip carried:
// 1 for a command, the length of a pipeline.
func (h *Faults) Carried() int64 { return h.carried.Load() }

// Done returns how many matching commands (and pipelines) have returned,
// faulted or not, leaving out a script call answered NOSCRIPT (go-redis then
// sends the script itself): a test waits on it to arm the hook between two
// calls rather than while one is in flight.
func (h *Faults) Done() int64 { return h.done.Load() }

func (h *Faults) matches(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if h.Match == nil || h.Match(c) {
			return true
		}
	}
	return false
}

func (h *Faults) take(cmds []redis.Cmder) Fault {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fault == Pass || h.times == 0 {
		return Pass
	}
	for _, c := range cmds {
		if h.Match == nil || h.Match(c) {
			if h.times > 0 {
				h.times--
			}
			h.hits.Add(1)
			h.carried.Store(int64(len(cmds)))
			return h.fault
		}
	}
	return Pass
}

// DialHook implements redis.Hook.
func (h *Faults) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *Faults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f := h.take([]redis.Cmder{cmd})
		if f != Pass && h.Before != nil && h.firstBefore() {
			h.Before(cmd)
		}
		back, err := h.apply(ctx, f, func() error { return next(context.WithoutCancel(ctx), cmd) }, func(err error) { cmd.SetErr(err) },
			func(err error) bool { return noScript(err, []redis.Cmder{cmd}) })
		if f != Pass && !back && h.After != nil {
			h.After(cmd)
		}
		if h.matches([]redis.Cmder{cmd}) && !noScript(err, []redis.Cmder{cmd}) {
			h.done.Add(1)
		}
		return err
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *Faults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		f := h.take(cmds)
		if f != Pass && h.Before != nil && h.firstBefore() {
			h.Before(cmds[0])
		}
		back, err := h.apply(ctx, f, func() error { return next(context.WithoutCancel(ctx), cmds) }, func(err error) {
			for _, c := range cmds {
				c.SetErr(err)
			}
		}, func(err error) bool { return noScript(err, cmds) })
		if f != Pass && !back && h.After != nil {
			h.After(cmds[0])
		}
		if h.matches(cmds) && !noScript(err, cmds) {
			h.done.Add(1)
		}
		return err
	}
}

// apply runs a matched command (or pipeline) with fault f. A command that
// Redis answers NOSCRIPT did not run: its reply passes unchanged and the
// fault is given back, for the script that go-redis (or lockkit) sends next.
// It reports whether it gave the fault back.
func (h *Faults) apply(ctx context.Context, f Fault, run func() error, fail func(error), noscript func(error) bool) (bool, error) {
	if f == Pass {
		return false, run()
	}
	err := run()
	if noscript(err) {
		h.giveBack(f)
		return true, err
	}
	switch f {
	case Repeat:
		return false, run()
	case DropReply:
		fail(ErrInjected)
		return false, ErrInjected
	case Late:
		d := h.Delay
		if d <= 0 {
			d = time.Second
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		fail(ErrInjected)
		return false, ErrInjected
	}
	return false, err
}

// firstBefore reports whether Before is yet to be called since the last
// Arm, and records that it is.
func (h *Faults) firstBefore() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	first := !h.before
	h.before = true
	return first
}

// giveBack re-arms the fault f that a NOSCRIPT reply did not use.
func (h *Faults) giveBack(f Fault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fault == f && h.times >= 0 {
		h.times++
	}
	h.hits.Add(-1)
}

// noScript reports whether Redis answered NOSCRIPT: err, what the command
// (or pipeline) returned, or the error of any of cmds.
func noScript(err error, cmds []redis.Cmder) bool {
	is := func(err error) bool {
		return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
	}
	if is(err) {
		return true
	}
	for _, c := range cmds {
		if is(c.Err()) {
			return true
		}
	}
	return false
}

// IsScript reports whether cmd runs a Lua script (EVAL or EVALSHA) whose
// source contains marker; it is a Match helper. src is the script source.
func IsScript(src string) func(cmd redis.Cmder) bool {
	sha := redis.NewScript(src).Hash()
	return func(cmd redis.Cmder) bool {
		args := cmd.Args()
		if len(args) < 2 {
			return false
		}
		switch strings.ToLower(fmt.Sprint(args[0])) {
		case "evalsha":
			return fmt.Sprint(args[1]) == sha
		case "eval":
			return fmt.Sprint(args[1]) == src
		}
		return false
	}
}

var _ redis.Hook = (*Faults)(nil)

// ScriptWithKeys is a Match helper: it matches EVAL and EVALSHA calls of
// scripts with n keys.
func ScriptWithKeys(n int) func(cmd redis.Cmder) bool { return ScriptShape(n, -1) }

// ScriptShape is a Match helper: it matches EVAL and EVALSHA calls with n
// keys and, unless args < 0, args arguments. lockkit's scripts: acquire 8
// keys and 20 arguments, release 8 and 11 (every mode's script of each),
// extend 2 and 4, inspect 3 and 1.
func ScriptShape(n, args int) func(cmd redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		a := cmd.Args()
		if len(a) < 3 {
			return false
		}
		switch strings.ToLower(fmt.Sprint(a[0])) {
		case "eval", "evalsha":
			return fmt.Sprint(a[2]) == fmt.Sprint(n) && (args < 0 || len(a)-3-n == args)
		}
		return false
	}
}
