// Package periodickey names what periodic's Scheduler keeps in Redis for
// each entry, and the asynq task ID of each tick, for the Scheduler and for
// the programs that read them back (the benchmarks, the chaos run): they
// must stay byte for byte what running deployments use.
package periodickey

import (
	"strconv"
	"strings"
	"time"
)

// TaskID is the asynq task ID of entry's tick: "periodic:<entry>:<ms>",
// the same on every replica.
func TaskID(entry string, tick time.Time) string {
	return "periodic:" + entry + ":" + strconv.FormatInt(tick.UnixMilli(), 10)
}

// Mark is the key, under prefix, that marks entry's tick as claimed or
// enqueued: "<prefix>periodic:{<entry>}:tick:<ms>".
func Mark(prefix, entry string, tick time.Time) string {
	return prefix + "periodic:{" + entry + "}:tick:" + strconv.FormatInt(tick.UnixMilli(), 10)
}

// Last is the key, under prefix, that holds the last tick of entry
// enqueued (for CatchUp): "<prefix>periodic:{<entry>}:last".
func Last(prefix, entry string) string { return prefix + "periodic:{" + entry + "}:last" }

// Tick reads the tick (Unix ms) that s names: a Mark key, a TaskID, or
// asynq's key of the task of a TaskID.
func Tick(s string) (int64, bool) {
	i := strings.Index(s, ":tick:")
	if i < 0 {
		if i = strings.Index(s, "periodic:"); i < 0 {
			return 0, false
		}
		i = strings.LastIndexByte(s, ':')
	} else {
		i += len(":tick:") - 1
	}
	ms, err := strconv.ParseInt(s[i+1:], 10, 64)
	return ms, err == nil
}

// IsMark reports whether key is a Mark key.
func IsMark(key string) bool { return strings.Contains(key, ":tick:") }
