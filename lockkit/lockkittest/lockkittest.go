// Package lockkittest gives tests lockkit Lockers without a Redis server:
// Lockers on an inprocess.Store (an embedded Redis whose keys expire in real
// time) that close, with the Store, when the test ends. They run the same
// scripts as on Redis, so a test sees the semantics production has.
//
//	func TestReport(t *testing.T) {
//		locker := lockkittest.New(t)
//		err := lockkit.Do(ctx, locker, "report:42", nil, build)
//		...
//	}
//
// Several Lockers sharing leases, as processes sharing one Redis do, come
// from one Store:
//
//	store := lockkittest.NewStore(t)
//	a := store.Locker(lockkit.WithOwner("replica-a"))
//	b := store.Locker(lockkit.WithOwner("replica-b"))
package lockkittest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

// New returns a Locker built with opts on a Store of its own. It fails the
// test for an invalid option.
func New(tb testing.TB, opts ...lockkit.Option) *lockkit.Locker {
	tb.Helper()
	return NewStore(tb).Locker(opts...)
}

// Store is an inprocess.Store owned by one test. Build it with NewStore.
type Store struct {
	tb testing.TB
	s  *inprocess.Store
}

// NewStore starts an empty inprocess.Store, stopped when the test ends.
func NewStore(tb testing.TB) *Store {
	tb.Helper()
	s, err := inprocess.Start()
	if err != nil {
		tb.Fatalf("lockkittest: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return &Store{tb: tb, s: s}
}

// Locker returns a new Locker built with opts on the Store, closed when the
// test ends (before the Store). It fails the test for an invalid option.
func (s *Store) Locker(opts ...lockkit.Option) *lockkit.Locker {
	s.tb.Helper()
	l, err := s.s.Locker(opts...)
	if err != nil {
		s.tb.Fatalf("lockkittest: %v", err)
	}
	s.tb.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// Client returns the client of the Store, closed when the test ends.
func (s *Store) Client() *redis.Client { return s.s.Client() }
