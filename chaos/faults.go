package main

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/internal/testredis"
)

// Reply faults a worker's go-redis client injects into the lock scripts
// (lockkit's EVAL and EVALSHA calls on keys under the lock key prefix), as
// recorded in its history (Record.Fault; Record.Key is the script's first key).
const (
	faultReplyRepeat = "reply-repeat" // the script runs twice, the second reply returned: go-redis sent it again
	faultReplyDrop   = "reply-drop"   // the script runs, its reply is lost: the call fails
	faultReplyLate   = "reply-late"   // the script runs, its reply comes after the caller gave up (Workload.ReplyDelay)
)

var replyFaults = map[string]testredis.Fault{
	faultReplyRepeat: testredis.Repeat,
	faultReplyDrop:   testredis.DropReply,
	faultReplyLate:   testredis.Late,
}

// replyInjector arms a testredis.Faults hook on a worker's client with one
// fault at a time, at gaps drawn from the seed and the worker's name, and
// records each fault once its command has returned.
type replyInjector struct {
	hook *testredis.Faults
	rec  *recorder
	proc string
	r    *rand.Rand
	gap  time.Duration
	done chan string // the fault of the command that returned
	stop chan struct{}
	wg   sync.WaitGroup
}

// injectReplyFaults adds the hook to rdb and starts arming it, unless the
// workload draws no reply faults. stop ends it.
func injectReplyFaults(rdb redis.UniversalClient, rec *recorder, w Workload, proc, prefix string) (stop func()) {
	if w.ReplyGap == 0 {
		return func() {}
	}
	h := fnv.New64a()
	h.Write([]byte(proc))
	in := &replyInjector{rec: rec, proc: proc, r: rand.New(rand.NewPCG(w.Seed, h.Sum64())), gap: w.ReplyGap,
		done: make(chan string, 1), stop: make(chan struct{})}
	var mu sync.Mutex
	armed := ""
	in.hook = &testredis.Faults{Match: lockScript(prefix), Delay: w.ReplyDelay, After: func(cmd redis.Cmder) {
		mu.Lock()
		f := armed
		mu.Unlock()
		rec.add(Record{Ev: evFault, Fault: f, Target: proc, Key: firstKey(cmd)})
		select {
		case in.done <- f:
		default:
		}
	}}
	rdb.AddHook(in.hook)
	kinds := []string{faultReplyRepeat, faultReplyDrop, faultReplyLate}
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		for {
			t := time.NewTimer(in.gap/2 + time.Duration(in.r.Int64N(int64(in.gap))))
			select {
			case <-in.stop:
				t.Stop()
				return
			case <-t.C:
			}
			f := kinds[in.r.IntN(len(kinds))]
			mu.Lock()
			armed = f
			mu.Unlock()
			in.hook.Arm(replyFaults[f], 1)
			select {
			case <-in.stop:
				return
			case <-in.done:
			}
		}
	}()
	return func() {
		in.hook.Disarm()
		close(in.stop)
		in.wg.Wait()
	}
}

// lockScript matches a script call (EVAL, EVALSHA) whose first key is
// under the lock key prefix: lockkit's scripts, not asynq's.
func lockScript(prefix string) func(cmd redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		a := cmd.Args()
		if len(a) < 4 {
			return false
		}
		switch strings.ToLower(fmt.Sprint(a[0])) {
		case "eval", "evalsha":
			return fmt.Sprint(a[2]) != "0" && strings.HasPrefix(fmt.Sprint(a[3]), prefix)
		}
		return false
	}
}

func firstKey(cmd redis.Cmder) string {
	if a := cmd.Args(); len(a) >= 4 {
		return fmt.Sprint(a[3])
	}
	return ""
}
