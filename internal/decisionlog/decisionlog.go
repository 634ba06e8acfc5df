// Package decisionlog names the decision log, the Redis stream in which the
// asynq adapter (singleton) records every task that completed without
// running, every task it put back (Requeue, parked behind its key's
// holder), every task it refused (asynq archives it), every run that ended
// before its work did, every enqueue Unique refused and every task that ran
// under WithShadow although it would have been refused, and writes and
// reads its entries: singleton writes them
// (Add, AddArgs), the operators' page (opsview) and the jobguard command
// read them (Decode, Calls). Its field names are what deployments have
// stored: an entry written by an earlier version reads.
package decisionlog

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Stream is the decision log's Redis stream (singleton.WithDecisionLog
// documents it).
const Stream = "jobguard:decisions"

// The reasons of a run that ended early, of a refused enqueue, of a refused
// task and of a shadowed refusal; a task that completed without running,
// or was put back, has the middleware's reason (held, claimed, superseded,
// throttled, covered, completed).
const (
	// ReasonPreempted: a newer task of the key cancelled the run
	// (middleware.Preempt); ByTask is the newer task.
	ReasonPreempted = "preempted"
	// ReasonLost: the run's lease was lost while it ran; Cause says why.
	ReasonLost = "lost"
	// ReasonRefused: Unique refused the enqueue; ByTask holds the key and
	// ByState is its asynq state.
	ReasonRefused = "refused"
	// ReasonWouldArchive: the task ran under WithShadow although it would
	// have been refused and archived; Cause is the refusal.
	ReasonWouldArchive = "would_archive"
	// ReasonArchived: the middleware refused the task, which did not run
	// and which asynq archives (its key could not be derived, its key
	// header differed, or it was parked at enqueue under a limit above
	// one); Cause is the refusal.
	ReasonArchived = "archived"
)

// The actions of an entry whose task did not run: "" for a task that
// completed without running (and for every other reason), or one of these
// for a task put back to run later (Entry.BackIn says when).
const (
	// ActionRequeued: the task was put back (Requeue, or a throttle's
	// ActionRequeue) and comes back after BackIn.
	ActionRequeued = "requeued"
	// ActionParked: the task was parked behind its key's holder: the run
	// that frees the key resumes it, and it comes back by itself after
	// BackIn (the backstop) should that run's release never come.
	ActionParked = "parked"
)

// Entry is one decision, as singleton writes it.
type Entry struct {
	// Call names the write: go-redis sends an XADD again when its reply was
	// lost, and both entries have the same Call (Calls shows one).
	Call string
	// Task is the task's ID; Origin the first task's ID of a Requeue copy
	// (the task's own otherwise).
	Task, Origin string
	// Type and Queue are the task's asynq type and queue.
	Type, Queue string
	// Key is the task's key ("" when none could be derived).
	Key string
	// Reason says why the task did not run, or its run ended early.
	Reason string
	// Cause is the error that ended a run, or the refusal of a shadowed
	// task; "" for none.
	Cause string
	// ByTask, ByOwner and ByToken name the run or task that held, covered,
	// completed or took over the work, those that are known ("", 0 when
	// not).
	ByTask, ByOwner string
	ByToken         int64
	// ByState is the asynq state of ByTask, for a refused enqueue.
	ByState string
	// Action is ActionRequeued or ActionParked for a task put back, ""
	// otherwise.
	Action string
	// BackIn is, for a task put back, when it comes back by itself, from
	// the entry's time; 0 otherwise.
	BackIn time.Duration
}

// Field names of an entry in the stream.
const (
	fieldCall    = "call"
	fieldTask    = "task"
	fieldOrigin  = "origin"
	fieldType    = "type"
	fieldQueue   = "queue"
	fieldKey     = "key"
	fieldReason  = "reason"
	fieldCause   = "cause"
	fieldByTask  = "by_task"
	fieldByOwner = "by_owner"
	fieldByToken = "by_token"
	fieldByState = "by_state"
	fieldAction  = "action"
	fieldBackIn  = "back_in_ms"
)

// values is e as the fields of a stream entry: call, task, origin, type,
// queue, key and reason always, the others where set.
func (e Entry) values() []any {
	v := []any{fieldCall, e.Call, fieldTask, e.Task, fieldOrigin, e.Origin, fieldType, e.Type, fieldQueue, e.Queue,
		fieldKey, e.Key, fieldReason, e.Reason}
	if e.Cause != "" {
		v = append(v, fieldCause, e.Cause)
	}
	if e.ByTask != "" {
		v = append(v, fieldByTask, e.ByTask)
	}
	if e.ByOwner != "" {
		v = append(v, fieldByOwner, e.ByOwner)
	}
	if e.ByToken != 0 {
		v = append(v, fieldByToken, strconv.FormatInt(e.ByToken, 10))
	}
	if e.ByState != "" {
		v = append(v, fieldByState, e.ByState)
	}
	if e.Action != "" {
		v = append(v, fieldAction, e.Action)
	}
	if e.BackIn > 0 {
		v = append(v, fieldBackIn, strconv.FormatInt(e.BackIn.Milliseconds(), 10))
	}
	return v
}

// AddArgs is the XADD of e to Stream, which keeps about maxLen entries
// (MAXLEN ~), for a pipeline.
func AddArgs(maxLen int, e Entry) *redis.XAddArgs {
	return &redis.XAddArgs{Stream: Stream, MaxLen: int64(maxLen), Approx: true, Values: e.values()}
}

// Add adds e to Stream, which keeps about maxLen entries: one XADD. It is
// safe to send again (an entry with the same Call).
func Add(ctx context.Context, rdb redis.Cmdable, maxLen int, e Entry) error {
	return rdb.XAdd(ctx, AddArgs(maxLen, e)).Err()
}

// Decision is an entry as read from the stream.
type Decision struct {
	Entry
	// ID is the entry's stream ID.
	ID string
	// At is the time in ID, the Redis server's time of the decision; zero
	// when ID is not a stream ID.
	At time.Time
	// Fields are all the entry's fields as stored, those of Entry and any
	// other, for a view that shows them all.
	Fields map[string]string
}

// Decode reads m, an entry of Stream; a missing or malformed field is
// left zero in Entry.
func Decode(m redis.XMessage) Decision {
	d := Decision{ID: m.ID, Fields: make(map[string]string, len(m.Values))}
	if ms, _, ok := strings.Cut(m.ID, "-"); ok {
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
			d.At = time.UnixMilli(n).UTC()
		}
	}
	for k, x := range m.Values {
		s, _ := x.(string)
		d.Fields[k] = s
	}
	f := d.Fields
	d.Entry = Entry{Call: f[fieldCall], Task: f[fieldTask], Origin: f[fieldOrigin], Type: f[fieldType], Queue: f[fieldQueue],
		Key: f[fieldKey], Reason: f[fieldReason], Cause: f[fieldCause], ByTask: f[fieldByTask], ByOwner: f[fieldByOwner],
		ByState: f[fieldByState], Action: f[fieldAction]}
	d.ByToken, _ = strconv.ParseInt(f[fieldByToken], 10, 64)
	if ms, err := strconv.ParseInt(f[fieldBackIn], 10, 64); err == nil && ms > 0 {
		d.BackIn = time.Duration(ms) * time.Millisecond
	}
	return d
}

// minTokenTime is the least fencing token read as a time: a token is at
// least the Redis server's time in microseconds when its run took the key,
// so one from before 2001 is no time.
const minTokenTime = 1e15

// Since is when the run named by ByToken took the key (its fencing token is
// at least the Redis server's time in microseconds then), zero when ByToken
// is none or not a time.
func (d Decision) Since() time.Time {
	if d.ByToken < minTokenTime {
		return time.Time{}
	}
	return time.UnixMicro(d.ByToken).UTC()
}

// Back is when a task put back comes back by itself (At plus BackIn), zero
// when it was not put back or At is zero.
func (d Decision) Back() time.Time {
	if d.BackIn <= 0 || d.At.IsZero() {
		return time.Time{}
	}
	return d.At.Add(d.BackIn)
}

// AtText is At as a view shows it (RFC 3339 with the milliseconds, UTC),
// "" when zero.
func (d Decision) AtText() string {
	if d.At.IsZero() {
		return ""
	}
	return d.At.Format(time.RFC3339Nano)
}

// Calls remembers the calls of the entries a reader has shown, so that a
// write go-redis sent again (two entries, one Call) is shown once.
type Calls map[string]bool

// Repeated reports whether d is a write already seen, and remembers it
// otherwise. An entry without a call (none was written before calls were)
// is never a repeat.
func (c Calls) Repeated(d Decision) bool {
	if d.Call == "" {
		return false
	}
	if c[d.Call] {
		return true
	}
	c[d.Call] = true
	return false
}
