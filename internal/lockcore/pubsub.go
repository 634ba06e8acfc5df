package lockcore

// Pub/sub: one connection per Locker for the waiters' wake-ups, the
// watched leases' preemption notices and the operators' channel.

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// wakeups shares one pub/sub connection among all waiters of the Locker; a
// channel is subscribed while at least one waiter needs it. It returns once
// Redis has confirmed the subscription (or after subscribeWait), so that a
// release after it is never missed.
func (b *redisBackend) wakeups(key, waiter string) (<-chan int64, func()) {
	ch := make(chan int64, 1)
	name := b.keys(key).channel
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return ch, func() {}
	}
	set := b.subscribeLocked(name)
	set.chans[ch] = waiter
	b.mu.Unlock()
	t := time.NewTimer(subscribeWait)
	select {
	case <-set.ready:
	case <-t.C:
	}
	t.Stop()
	return ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(set.chans, ch)
		b.dropLocked(name, set)
	}
}

// watch tells l, through its key's channel, when a Preempt acquire preempts
// it. It does not wait for Redis to confirm the subscription: once Redis
// does, the lease is renewed at once, which finds a preemption sent before.
// On a channel already subscribed (a waiting acquire's), a preemption of l
// received after its acquire was sent, before l listened, is applied now.
func (b *redisBackend) watch(l *Lease, sent time.Time) func() {
	name := b.keys(l.key).channel
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return func() {}
	}
	set := b.subscribeLocked(name)
	set.leases[l] = struct{}{}
	missed := set.preempted >= l.token && !set.preemptedAt.Before(sent)
	b.mu.Unlock()
	if missed {
		l.preempt()
	}
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(set.leases, l)
		b.dropLocked(name, set)
	}
}

// operators is the channel on which evict.lua tells every Locker of the
// prefix which holders a ForceRelease removed. A key's channels are
// "<prefix>{<key>}:r": no key's channel is this one.
func (b *redisBackend) operators() string { return b.prefix + "!operators" }

// watchOperators subscribes, for the Locker's life, to the operators'
// channel: evicted is called with the key and the notice of every
// ForceRelease of the prefix. A failed subscribe only costs latency: a
// removed lease still learns of it at its next renewal.
func (b *redisBackend) watchOperators(evicted func(key, notice string)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done || b.onOperators != nil {
		return
	}
	b.onOperators = evicted
	b.subscribeLocked(b.operators()).operators = true
}

// subscribeLocked returns the subscribers of channel name, subscribing to
// it first if nobody listens yet. b.mu is held.
func (b *redisBackend) subscribeLocked(name string) *subscribers {
	if b.ps == nil {
		b.ps = b.c.Subscribe(context.Background())
		msgs := b.ps.ChannelWithSubscriptions()
		b.wg.Add(1)
		go b.dispatch(msgs)
	}
	set := b.subs[name]
	if set == nil {
		set = &subscribers{chans: make(map[chan int64]string), leases: make(map[*Lease]struct{}), ready: make(chan struct{})}
		b.subs[name] = set
		// A failed subscribe only costs latency: waiters fall back to
		// polling, preempted leases to their renewal.
		_ = b.ps.Subscribe(context.Background(), name)
	}
	return set
}

// dropLocked unsubscribes from channel name when set has nobody left. b.mu
// is held.
func (b *redisBackend) dropLocked(name string, set *subscribers) {
	if len(set.chans) == 0 && len(set.leases) == 0 && !set.operators && b.subs[name] == set {
		delete(b.subs, name)
		if !b.done {
			_ = b.ps.Unsubscribe(context.Background(), name)
		}
	}
}

// subscribeWait bounds how long a waiter waits for Redis to confirm its
// subscription before it relies on polling alone.
const subscribeWait = time.Second

type subscribers struct {
	chans     map[chan int64]string // waiters' wake-ups, by waiter id
	leases    map[*Lease]struct{}   // held leases that a Preempt acquire may end
	ready     chan struct{}         // closed when Redis confirms the subscription
	confirmed bool
	operators bool // the operators' channel (watchOperators): never dropped
	// The highest token a preemption notice named, and when it came.
	preempted   int64
	preemptedAt time.Time
}

// dispatch delivers channel messages: "p<token>" preempts the watched leases
// with a token up to it, "f<token>:<owner>" tells those of owner (or all, for
// "") that ForceRelease removed them, "t<token>" the one of that token,
// "g<token>:<waiter>" tells a waiter that
// a release handed it the key (the others sleep on); anything else (a
// release) wakes the waiters.
func (b *redisBackend) dispatch(msgs <-chan any) {
	defer b.wg.Done()
	for m := range msgs {
		var preempted, evicted, check []*Lease
		var operatorNotices [][2]string
		b.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			set := b.subs[m.Channel]
			if set == nil || m.Kind != "subscribe" {
				break
			}
			if !set.confirmed {
				set.confirmed = true
				close(set.ready)
			} else {
				// Subscribed again after a reconnect: a release sent
				// meanwhile was missed too.
				for ch := range set.chans {
					select {
					case ch <- 0:
					default:
					}
				}
			}
			// A preemption before the subscription (or during the outage)
			// was missed: the leases' renewal, made due now, finds it.
			for l := range set.leases {
				check = append(check, l)
			}
		case *redis.Message:
			set := b.subs[m.Channel]
			if set == nil {
				break
			}
			if set.operators {
				if n, rest, ok := strings.Cut(m.Payload, ":"); ok {
					if size, err := strconv.Atoi(n); err == nil && size >= 0 && size <= len(rest) {
						operatorNotices = append(operatorNotices, [2]string{rest[:size], rest[size:]})
					}
				}
				break
			}
			if top, ok := strings.CutPrefix(m.Payload, "p"); ok {
				upTo, _ := strconv.ParseInt(top, 10, 64)
				set.preempted, set.preemptedAt = max(set.preempted, upTo), time.Now()
				for l := range set.leases {
					if l.token <= upTo {
						preempted = append(preempted, l)
					}
				}
				break
			}
			if rest, ok := strings.CutPrefix(m.Payload, "g"); ok {
				top, waiter, _ := strings.Cut(rest, ":")
				token, _ := strconv.ParseInt(top, 10, 64)
				for ch, w := range set.chans {
					if w == waiter && token > 0 {
						grant(ch, token)
					}
				}
				break
			}
			if rest, ok := strings.CutPrefix(m.Payload, "t"); ok {
				token, _ := strconv.ParseInt(rest, 10, 64)
				for l := range set.leases {
					if l.token == token {
						evicted = append(evicted, l)
					}
				}
			}
			if rest, ok := strings.CutPrefix(m.Payload, "f"); ok {
				top, owner, _ := strings.Cut(rest, ":")
				upTo, _ := strconv.ParseInt(top, 10, 64)
				for l := range set.leases {
					if l.token <= upTo && (owner == "" || owner == l.owner) {
						evicted = append(evicted, l)
					}
				}
			}
			for ch := range set.chans {
				select {
				case ch <- 0:
				default:
				}
			}
		}
		onOperators := b.onOperators
		b.mu.Unlock()
		for _, n := range operatorNotices {
			onOperators(n[0], n[1])
		}
		for _, l := range preempted {
			l.preempt()
		}
		for _, l := range evicted {
			l.evicted()
		}
		for _, l := range check {
			l.e.renewNow(l)
		}
	}
}

// grant puts token in ch, in place of a wake-up already waiting there.
func grant(ch chan int64, token int64) {
	for {
		select {
		case ch <- token:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

func (b *redisBackend) close() error {
	b.mu.Lock()
	b.done = true
	ps := b.ps
	b.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	b.wg.Wait()
	return err
}
