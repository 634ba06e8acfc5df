package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Event kinds of a history.
const (
	evEnqueue  = "enqueue"  // an enqueue: Accepted, or refused with Err
	evDeliver  = "deliver"  // asynq called the worker's handler chain
	evStart    = "start"    // the guarded handler began (the work runs)
	evEnd      = "end"      // the guarded handler returned: Outcome, Cause, Lost
	evCancel   = "cancel"   // the run's ctx was cancelled while it ran: Cause
	evDecision = "decision" // a guard event: Kind, Reason, Action
	evReturn   = "return"   // the middleware returned to asynq: Err
	evFault    = "fault"    // the driver injected a fault: Fault, Proc
	evClock    = "clock"    // the Redis server's clock (RedisUS) at T
	evExit     = "exit"     // the process is about to exit
	evReady    = "ready"    // the worker's server started
	evLeft     = "left"     // a task still in the queue when the run did not drain: Kind (its state), Sent (when it is next due), Retry, Err
	// evWrite is a write of a fenced family's run (fencer.write): Kind (the
	// write: writeBegin, writeEnd or writeLast), Run, Token (the writer's),
	// Outcome ("ok", with Entry for an entry of the stream; "stale", with
	// Newest: the fence refused it; "error", with Err).
	evWrite = "write"
	// evEntry is an entry of a fenced family's key's stream, read by the
	// driver once the run was quiet: Entry (its ID), Kind, Token, Task, Run,
	// and By, the process that wrote it.
	evEntry = "entry"
)

// Record is one line of a history. T is the wall clock (Unix ns; every process
// runs on one host), Mono the process's monotonic clock (ns since it
// started), Seq the record's number within its process.
type Record struct {
	Proc string `json:"p"`
	Seq  int64  `json:"seq"`
	T    int64  `json:"t"`
	Mono int64  `json:"mono"`
	Ev   string `json:"ev"`

	Task string `json:"task,omitempty"` // the chaos task name (payload "id")
	AID  string `json:"aid,omitempty"`  // the asynq task ID of this delivery
	Fam  string `json:"fam,omitempty"`
	Key  string `json:"key,omitempty"` // the family's key value (payload "k")
	N    int    `json:"n,omitempty"`   // the task's number within its key, in enqueue order

	Accepted bool   `json:"accepted,omitempty"`
	Stamp    int64  `json:"stamp,omitempty"` // asynqkey.EnqueuedAtHeader, Unix µs on Redis's clock
	Outcome  string `json:"outcome,omitempty"`
	Cause    string `json:"cause,omitempty"`
	Kind     string `json:"kind,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Action   string `json:"action,omitempty"`
	Token    int64  `json:"token,omitempty"`
	Err      string `json:"err,omitempty"`
	Fault    string `json:"fault,omitempty"`
	Target   string `json:"target,omitempty"` // the process a fault hit
	Killed   int64  `json:"killed,omitempty"` // a pub/sub cut: how many connections it closed
	Offset   int64  `json:"offset,omitempty"` // a worker's ready record: its Scheduler's clock offset (ns)
	Sent     int64  `json:"sent,omitempty"`   // an enqueue: the wall clock when the call began (T is when it returned)
	Holder   string `json:"holder,omitempty"` // a refused Unique enqueue: the asynq ID of the task holding the key
	RedisUS  int64  `json:"redis_us,omitempty"`
	Retry    int    `json:"retry,omitempty"`
	Run      int64  `json:"run,omitempty"`    // the Seq of the run's start record, on its end, cancel, guard and write events
	Entry    string `json:"entry,omitempty"`  // a stream entry's ID ("<ms>-<n>"), of a write or a stream's entry
	Newest   int64  `json:"newest,omitempty"` // a stale write: the newest token that had written to its key
	By       string `json:"by,omitempty"`     // a stream's entry: the process that wrote it
	Limit    int    `json:"limit,omitempty"`  // a run's start in a LimitFunc family: the limit its worker gave the task
	// Extra is a run's start in an ExtraKeys family: the extra keys its
	// task names, with their limits (payload "x"), which the run holds
	// besides its own key.
	Extra map[string]int `json:"extra,omitempty"`
	// Lost is a run's end: "preempted" if a newer task's acquire preempted
	// the run's lease after its ctx was cancelled for another cause (an
	// operator's release, say: Cause is the ctx's first cause only); else
	// empty.
	Lost string `json:"lost,omitempty"`
}

func (r Record) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// recorder appends a process's records to its history file, one JSON object
// a line, written through at once so that a killed process loses nothing
// it recorded.
type recorder struct {
	proc  string
	begin time.Time
	mu    sync.Mutex
	seq   int64
	f     *os.File
}

func newRecorder(path, proc string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{proc: proc, begin: time.Now(), f: f}, nil
}

func (r *recorder) add(rec Record) Record {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	rec.Proc, rec.Seq, rec.T, rec.Mono = r.proc, r.seq, now.UnixNano(), int64(now.Sub(r.begin))
	b, _ := json.Marshal(rec)
	_, _ = r.f.Write(append(b, '\n'))
	return rec
}

func (r *recorder) close() error { return r.f.Close() }

// readHistory reads every *.jsonl file of dir, ordered by wall clock (then
// by process and sequence). A torn last line (a killed writer) is dropped.
func readHistory(dir string) ([]Record, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, name := range files {
		recs, err := readFile(name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		out = append(out, recs...)
	}
	slices.SortStableFunc(out, func(a, b Record) int {
		switch {
		case a.T != b.T:
			return cmpInt(a.T, b.T)
		case a.Proc != b.Proc:
			if a.Proc < b.Proc {
				return -1
			}
			return 1
		}
		return cmpInt(a.Seq, b.Seq)
	})
	return out, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
