package main

// The fenced family's writes: each run of a key appends to the key's stream
// as it begins and once its work is done, and sets the key's last value,
// through a fence.Writer with its lease's token (fence.FromContext). The
// driver reads the streams once the run is quiet (recordEntries), and the
// checker (checkFenced) finds them in the order of their tokens.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit/fence"
)

// The writes of a fenced family's run (Record.Kind of evWrite and evEntry).
const (
	writeBegin = "begin" // an entry of the key's stream, as the run begins
	writeEnd   = "end"   // an entry of the key's stream, once the run's work is done
	writeLast  = "last"  // the key's last value (SET), after writeEnd
)

// fencedWriteTimeout bounds one write of a fenced run.
const fencedWriteTimeout = 5 * time.Second

// fencedKeys are the Redis keys the runs of key of fenced family fam write,
// under one hash tag: its stream and its last value.
func fencedKeys(prefix, fam, key string) (stream, last string) {
	tag := "{chaosfence:" + prefix + fam + "/" + key + "}"
	return tag + ":s", tag + ":last"
}

// fencer makes the writes of a fenced family's runs and records each
// one's outcome: through w, or with plain commands under -broken fence.
type fencer struct {
	w      *fence.Writer
	rdb    redis.UniversalClient
	rec    *recorder
	prefix string
	plain  bool
}

// newFencer returns the fencer of a worker process: its fence keys live
// under a prefix of their own, outside the lock key prefix.
func newFencer(rdb redis.UniversalClient, rec *recorder, prefix, broken string) (*fencer, error) {
	w, err := fence.New(rdb, fence.WithPrefix("fence:"+prefix))
	if err != nil {
		return nil, err
	}
	return &fencer{w: w, rdb: rdb, rec: rec, prefix: prefix, plain: broken == brokenFence}, nil
}

// write makes the write kind (writeBegin, writeEnd, writeLast) of the run
// whose start record's Seq is run, with the token of the lease in ctx, even
// when ctx has ended (a handler that does not watch its ctx), and records
// its outcome.
func (f *fencer) write(ctx context.Context, base Record, run int64, kind string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fencedWriteTimeout)
	defer cancel()
	r := base
	r.Ev, r.Run, r.Kind = evWrite, run, kind
	stream, last := fencedKeys(f.prefix, base.Fam, base.Key)
	tok, err := fence.FromContext(ctx)
	if err == nil {
		r.Token = tok.Value
		entry := []any{"token", tok.Value, "task", base.Task, "run", run, "by", f.rec.proc, "kind", kind}
		value := fmt.Sprintf("%s %d", base.Task, tok.Value)
		switch {
		case kind == writeLast && f.plain:
			err = f.rdb.Set(ctx, last, value, 0).Err()
		case kind == writeLast:
			err = f.w.Set(ctx, tok, last, value, 0)
		case f.plain:
			r.Entry, err = f.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: entry}).Result()
		default:
			r.Entry, err = f.w.XAdd(ctx, tok, stream, entry...)
		}
	}
	var stale *fence.StaleError
	switch {
	case errors.As(err, &stale):
		r.Outcome, r.Newest = "stale", stale.Newest
	case err != nil:
		r.Outcome, r.Err = "error", err.Error()
	default:
		r.Outcome = "ok"
	}
	f.rec.add(r)
}

// entryRecord is the evEntry record of entry m of the stream of key of
// fenced family fam.
func entryRecord(fam, key string, m redis.XMessage) Record {
	r := Record{Ev: evEntry, Fam: fam, Key: key, Entry: m.ID}
	r.Task, _ = m.Values["task"].(string)
	r.By, _ = m.Values["by"].(string)
	r.Kind, _ = m.Values["kind"].(string)
	if s, ok := m.Values["token"].(string); ok {
		r.Token, _ = strconv.ParseInt(s, 10, 64)
	}
	if s, ok := m.Values["run"].(string); ok {
		r.Run, _ = strconv.ParseInt(s, 10, 64)
	}
	return r
}

// recordEntries records every entry of the streams of the fenced families'
// keys, in stream order, and each key's last value (an evEntry of Kind
// writeLast, without Entry).
func (r *seedRun) recordEntries() error {
	ctx := context.Background()
	for _, f := range r.w.Families {
		if !f.Fenced {
			continue
		}
		for k := range f.Keys {
			key := fmt.Sprintf("k%d", k)
			stream, _ := fencedKeys(r.prefix, f.Name, key)
			ms, err := r.rdb.XRange(ctx, stream, "-", "+").Result()
			if err != nil {
				return fmt.Errorf("read %s: %w", stream, err)
			}
			for _, m := range ms {
				r.rec.add(entryRecord(f.Name, key, m))
			}
			_, lastKey := fencedKeys(r.prefix, f.Name, key)
			v, err := r.rdb.Get(ctx, lastKey).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", lastKey, err)
			}
			last := Record{Ev: evEntry, Fam: f.Name, Key: key, Kind: writeLast}
			if _, err := fmt.Sscan(v, &last.Task, &last.Token); err != nil {
				return fmt.Errorf("read %s: %q: %w", lastKey, v, err)
			}
			r.rec.add(last)
		}
	}
	return nil
}
