package decisionlog

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// message is the stream entry of values as XREVRANGE returns it.
func message(id string, values []any) redis.XMessage {
	m := redis.XMessage{ID: id, Values: map[string]any{}}
	for i := 0; i+1 < len(values); i += 2 {
		m.Values[values[i].(string)] = values[i+1]
	}
	return m
}

// An entry is written with the fields, in the order, that earlier versions
// wrote, and reads back as written.
func TestEntryIsWrittenAsBeforeAndReadsBack(t *testing.T) {
	for _, c := range []struct {
		name string
		e    Entry
		want []any
	}{
		{"skipped", Entry{Call: "c1", Task: "t-1", Origin: "t-0", Type: "report", Queue: "default", Key: "asynq:report", Reason: "covered",
			ByTask: "t-0", ByOwner: "worker-7", ByToken: 1795650000000000},
			[]any{"call", "c1", "task", "t-1", "origin", "t-0", "type", "report", "queue", "default", "key", "asynq:report", "reason", "covered",
				"by_task", "t-0", "by_owner", "worker-7", "by_token", "1795650000000000"}},
		{"preempted", Entry{Call: "c2", Task: "t-2", Origin: "t-2", Type: "sync", Queue: "q", Key: "asynq:sync", Reason: ReasonPreempted,
			Cause: "lockkit: lease lost: preempted", ByTask: "t-3", ByOwner: "worker-9", ByToken: 7},
			[]any{"call", "c2", "task", "t-2", "origin", "t-2", "type", "sync", "queue", "q", "key", "asynq:sync", "reason", "preempted",
				"cause", "lockkit: lease lost: preempted", "by_task", "t-3", "by_owner", "worker-9", "by_token", "7"}},
		{"refused", Entry{Call: "c3", Task: "t-4", Origin: "t-4", Type: "sync", Queue: "q", Key: "asynq:sync", Reason: ReasonRefused,
			ByTask: "t-5", ByState: "active"},
			[]any{"call", "c3", "task", "t-4", "origin", "t-4", "type", "sync", "queue", "q", "key", "asynq:sync", "reason", "refused",
				"by_task", "t-5", "by_state", "active"}},
		{"parked", Entry{Call: "c5", Task: "t-7", Origin: "t-7", Type: "sync", Queue: "q", Key: "asynq:sync", Reason: "held",
			ByTask: "t-8", ByOwner: "worker-1", ByToken: 1795650000000000, Action: ActionParked, BackIn: 30 * time.Second},
			[]any{"call", "c5", "task", "t-7", "origin", "t-7", "type", "sync", "queue", "q", "key", "asynq:sync", "reason", "held",
				"by_task", "t-8", "by_owner", "worker-1", "by_token", "1795650000000000", "action", "parked", "back_in_ms", "30000"}},
		{"archived", Entry{Call: "c6", Task: "t-9", Origin: "t-9", Type: "sync", Queue: "q", Reason: ReasonArchived, Cause: "no key"},
			[]any{"call", "c6", "task", "t-9", "origin", "t-9", "type", "sync", "queue", "q", "key", "", "reason", "archived", "cause", "no key"}},
		{"shadowed, no key", Entry{Call: "c4", Task: "t-6", Type: "sync", Queue: "q", Reason: ReasonWouldArchive, Cause: "no key"},
			[]any{"call", "c4", "task", "t-6", "origin", "", "type", "sync", "queue", "q", "key", "", "reason", "would_archive", "cause", "no key"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := AddArgs(500, c.e)
			require.Equal(t, Stream, args.Stream)
			require.EqualValues(t, 500, args.MaxLen)
			require.True(t, args.Approx)
			require.Equal(t, c.want, args.Values)
			d := Decode(message("1795650000123-0", c.want))
			require.Equal(t, c.e, d.Entry)
			require.Equal(t, "2026-11-25T23:40:00.123Z", d.AtText())
			require.Len(t, d.Fields, len(c.want)/2)
		})
	}
}

// An entry written before entries had a call, or with a field this version
// does not know, reads: its fields as stored, never a repeat.
func TestEarlierEntryReads(t *testing.T) {
	calls := Calls{}
	old := Decode(message("x", []any{"task", "t-1", "type", "report", "queue", "default", "key", "k", "reason", "held", "by_token", "x", "extra", "v"}))
	require.Equal(t, Entry{Task: "t-1", Type: "report", Queue: "default", Key: "k", Reason: "held"}, old.Entry)
	require.Equal(t, "v", old.Fields["extra"])
	require.Equal(t, "x", old.Fields["by_token"])
	require.True(t, old.At.IsZero())
	require.Empty(t, old.AtText())
	require.False(t, calls.Repeated(old))
	require.False(t, calls.Repeated(old), "no call: never a repeat")

	d := Decode(message("1-0", []any{"call", "c1", "task", "t-1"}))
	require.Equal(t, time.UnixMilli(1).UTC(), d.At)
	require.False(t, calls.Repeated(d))
	require.True(t, calls.Repeated(d), "a write go-redis sent again")
}

// A put back task's entry says when it comes back (the entry's time plus
// back_in_ms), and a fencing token says since when its run held the key; a
// token that is no time (before 2001) and a malformed back_in_ms say
// nothing.
func TestSinceAndBack(t *testing.T) {
	d := Decode(message("1795650000123-0", []any{"by_token", "1795649990000000", "action", "parked", "back_in_ms", "30000"}))
	require.Equal(t, time.Date(2026, 11, 25, 23, 39, 50, 0, time.UTC), d.Since())
	require.Equal(t, time.Date(2026, 11, 25, 23, 40, 30, 123e6, time.UTC), d.Back())
	d = Decode(message("1795650000123-0", []any{"by_token", "7", "back_in_ms", "soon"}))
	require.True(t, d.Since().IsZero())
	require.True(t, d.Back().IsZero())
	require.Zero(t, d.BackIn)
	d = Decode(message("x", []any{"back_in_ms", "1000"}))
	require.Equal(t, time.Second, d.BackIn)
	require.True(t, d.Back().IsZero(), "no time: no stream ID")
}
