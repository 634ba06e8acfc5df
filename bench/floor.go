package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// floorCalls is how many calls each round-trip floor measurement makes.
const floorCalls = 50000

// rtFloor is what one round trip costs the Redis server, whatever the guard
// sends in it: the floor under a guard's Redis CPU per task.
type rtFloor struct {
	ping, script time.Duration // Redis CPU per PING, per no-op EVALSHA
}

// roundTripFloor measures the Redis CPU of a PING and of a script that
// only returns, each sent alone by b.concurrency goroutines as asynq's
// workers send theirs.
func (b *bench) roundTripFloor(ctx context.Context) (rtFloor, error) {
	c := redis.NewClient(&redis.Options{Addr: b.addr})
	defer c.Close()
	noop := redis.NewScript(`return 1`)
	measure := func(call func() error) (time.Duration, error) {
		if err := call(); err != nil { // connection set-up and script load
			return 0, err
		}
		cpu0, err := redisCPU(ctx, b.admin)
		if err != nil {
			return 0, err
		}
		var wg sync.WaitGroup
		errs := make(chan error, b.concurrency)
		for w := range b.concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < floorCalls; i += b.concurrency {
					if err := call(); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return 0, err
		}
		cpu1, err := redisCPU(ctx, b.admin)
		return (cpu1 - cpu0) / floorCalls, err
	}
	var f rtFloor
	var err error
	if f.ping, err = measure(func() error { return c.Ping(ctx).Err() }); err != nil {
		return f, err
	}
	f.script, err = measure(func() error { return noop.Run(ctx, c, []string{b.prefix + "floor"}).Err() })
	return f, err
}

// floorText says what the round-trip floor means for the no-op workload's
// Redis CPU per task.
func (r *report) floorText() string {
	if r.floor.ping == 0 {
		return ""
	}
	var bare []float64
	for _, x := range r.tputRes {
		if x.name != "no-op" {
			continue
		}
		for _, run := range x.of(false) {
			bare = append(bare, float64(run.redisCPU)/float64(x.tasks))
		}
	}
	if len(bare) == 0 {
		return ""
	}
	per := time.Duration(median(bare))
	var w strings.Builder
	fmt.Fprintf(&w, "The floor under a guard's Redis CPU per task, measured in the same run (%d calls each, %d goroutines, each call a round trip of its own): "+
		"a PING costs the Redis server %s of CPU, a script that only returns (`EVALSHA`) %s. The bare no-op task costs %s (median of the bare runs). "+
		"A guard that takes its lease before the handler and gives it back after makes two more round trips per task, "+
		"so even if both were PINGs it would cost %.2f× bare asynq's Redis CPU per task, and %.2f× if both were scripts that do nothing; "+
		"the guarded runs' ratio above is what the acquire's and the release's work adds to that.\n\n",
		floorCalls, r.concurrency, us(r.floor.ping), us(r.floor.script), us(per),
		float64(per+2*r.floor.ping)/float64(per), float64(per+2*r.floor.script)/float64(per))
	return w.String()
}
