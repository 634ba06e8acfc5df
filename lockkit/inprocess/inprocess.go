// Package inprocess runs lockkit without a Redis server. A Store is an
// embedded Redis (miniredis, serving on a loopback port of this process
// behind a password of its own) whose keys expire as real time passes; its
// Lockers are lockkit's Lockers, so they run the same scripts with the
// same semantics: holder limits, renewal and lost leases, fencing tokens,
// fair queues, epochs, and Keys listing the held locks. Lockers made from
// one Store share leases as processes sharing one Redis do. Nothing outlives
// the process: use it for a single-process deployment, a demo, or tests
// (package lockkittest wraps it for them).
//
//	store, err := inprocess.Start()
//	if err != nil { ... }
//	defer store.Close()
//	locker, err := store.Locker(lockkit.WithTTL(30 * time.Second))
//	if err != nil { ... }
//	defer locker.Close(ctx)
package inprocess

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/jobguard/jobguard/lockkit"
)

// Store is an embedded Redis and a client of it. Build it with Start.
type Store struct {
	mr     *miniredis.Miniredis
	client *redis.Client
}

// Start starts an empty Store on a free loopback port, behind a random
// password that only the Store's client knows, so that other processes of
// the machine cannot touch its keys. Its keys expire in real time, as on
// Redis (miniredis' own TTLs only move when told to).
func Start() (*Store, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	password := hex.EncodeToString(b)
	mr := miniredis.NewMiniRedis()
	mr.RequireAuth(password)
	if err := mr.Start(); err != nil {
		return nil, fmt.Errorf("inprocess: start: %w", err)
	}
	mr.ClockTTL(true)
	return &Store{mr: mr, client: redis.NewClient(&redis.Options{Addr: mr.Addr(), Password: password})}, nil
}

// Locker returns a new Locker on the Store, as lockkit.NewRedis does on a
// Redis. It returns an error matching lockkit.ErrInvalid for an invalid
// option. Close the Locker before the Store.
func (s *Store) Locker(opts ...lockkit.Option) (*lockkit.Locker, error) {
	return lockkit.NewRedis(s.client, opts...)
}

// Client returns the Store's client, which its Lockers use; other users of
// Redis in the process (an asynq server, for example) can share it. Close
// closes it.
func (s *Store) Client() *redis.Client { return s.client }

// Close closes the client and stops the embedded Redis, forgetting every key.
func (s *Store) Close() error {
	err := s.client.Close()
	s.mr.Close()
	return err
}
