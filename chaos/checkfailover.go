package main

// What the checkers know of the failovers of a Sentinel run: when Redis did
// not serve, and which writes a failover may have lost.

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// lossPad is how long before a failover's cut of the replicas (or, plain,
// its kill of the master) a write acknowledged by the master may still be
// missing on the replica promoted: replication on one host lags by far less.
const lossPad = time.Second

// failover is a failover in a history: one of the failover faults, or one
// the sentinels made on their own (a change of master no fault explains).
type failover struct {
	at      int64 // the fault's record (after the cut of the replicas, or just before the kill); an unplanned one's announcement
	killed  int64 // the master's kill (its record); an unplanned one's: at
	up      int64 // when the clients reached the new master (promoted), or the history's end
	lossy   bool
	planned bool
	master  string // the master it killed: "<ip> <port>", as the sentinels name it
}

// loss is when a write acknowledged may be missing on the replica
// promoted: from lossPad before the replicas were cut off (plain: before
// the kill) until the clients reached the new master. After the kill no
// server is the master the run goes on with, so a write acknowledged then
// was acknowledged by a server the sentinels had demoted or will demote (a
// master of a failover they made on their own just before, which a stopped
// replica did not hear of): its writes go when it resyncs. For a failover
// the sentinels made on their own, from before they could have found the
// master down to a little after the announcement (until the clients left
// the old master).
func (f failover) loss() interval {
	if !f.planned {
		return interval{f.at - int64(downAfter+lossPad+time.Second), f.at + int64(lossPad)}
	}
	return interval{f.at - int64(lossPad), max(f.killed, f.up)}
}

// down is when the clients could not reach a master: from a second before
// the kill to a second after they reached the new one.
func (f failover) down() interval {
	return interval{f.killed - int64(time.Second), f.up + int64(time.Second)}
}

func (f failover) describe(base int64) string {
	kind := "failover"
	switch {
	case !f.planned:
		return fmt.Sprintf("failover the sentinels made on their own (announced at +%.3fs)", time.Duration(f.at-base).Seconds())
	case f.lossy:
		kind = "lossy failover"
	}
	return fmt.Sprintf("%s at +%.3fs (master killed at +%.3fs)", kind, time.Duration(f.at-base).Seconds(), time.Duration(f.killed-base).Seconds())
}

// indexFailovers finds the failovers of the history: each failover fault
// with its kill and its promotion, and each change of master a sentinel
// announced (stepSwitch) but those from the master a failover fault killed
// (announced once the other replicas follow the new master, which may be
// after the clients reached it).
func (h *history) indexFailovers() {
	var cur *failover
	for _, r := range h.records {
		if r.Ev != evFault {
			continue
		}
		switch r.Fault {
		case faultFailover, faultFailoverLossy:
			addr := strings.TrimPrefix(r.Target, "redis ")
			h.failovers = append(h.failovers, failover{at: r.T, killed: r.T, up: h.lastT, lossy: r.Fault == faultFailoverLossy, planned: true,
				master: strings.Replace(addr, ":", " ", 1)})
			cur = &h.failovers[len(h.failovers)-1]
		case stepMasterKilled:
			if cur != nil {
				cur.killed = r.T
			}
		case stepPromoted:
			if cur != nil {
				cur.up = r.T
			}
		case stepSwitch:
			// "<name> <old ip> <old port> <new ip> <new port>"
			if f := strings.Fields(r.Target); cur != nil && len(f) == 5 && f[1]+" "+f[2] == cur.master {
				continue
			}
			h.failovers = append(h.failovers, failover{at: r.T, killed: r.T, up: r.T, planned: false})
			cur = nil
		}
	}
}

// asynqLoss says which write of asynq's own about task t (its enqueue, the
// dequeue of a delivery, the write that follows a delivery's return: done,
// retry) a failover may have lost, and which failover: "" if none. A lost
// enqueue leaves an accepted task that never runs; a lost dequeue or done
// write, one that asynq delivers again and runs twice. jobguard cannot
// prevent either: asynq's writes are asynq's.
func (h *history) asynqLoss(t *taskHist) string {
	if len(h.failovers) == 0 || t == nil {
		return ""
	}
	type write struct {
		what     string
		from, to int64 // the write ran in between
	}
	var ws []write
	if t.enq != nil && t.enq.Accepted {
		from := t.enq.T
		if t.enq.Sent > 0 {
			from = t.enq.Sent
		}
		ws = append(ws, write{"its enqueue, acknowledged", from, t.enq.T})
	}
	for _, d := range t.delivs {
		ws = append(ws, write{"the dequeue of its delivery on " + d.Proc, d.T, d.T})
	}
	for _, r := range h.records {
		if r.Ev == evReturn && r.Task == t.name {
			ws = append(ws, write{"the write after its delivery on " + r.Proc + " returned", r.T, r.T})
		}
	}
	for _, f := range h.failovers {
		l := f.loss()
		if i := slices.IndexFunc(ws, func(w write) bool { return w.from <= l.to && w.to >= l.from }); i >= 0 {
			return fmt.Sprintf("%s at +%.3fs may have been lost with the %s", ws[i].what, time.Duration(ws[i].to-h.base).Seconds(), f.describe(h.base))
		}
	}
	return ""
}

// advise makes v advisory for reason, when there is one.
func advise(v Violation, reason string) Violation {
	v.Advisory = reason
	return v
}
