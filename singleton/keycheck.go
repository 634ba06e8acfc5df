package singleton

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/internal/asynqkey"
	"github.com/jobguard/jobguard/internal/guard"
)

// ErrKeyMismatch is matched by the error a task fails with when the
// Middleware derives a key other than the one the Client derived for it
// (the task header "jobguard-key": see NewClient): they were given
// different key options. The task does not run and is not treated as a duplicate: the error also matches asynq.SkipRetry,
// so asynq archives the task, where it can be run again once both are given
// the same options. Its message names both key options. Under WithShadow the
// task runs instead, and the error is reported.
var ErrKeyMismatch = errors.New("singleton: the Client and the Middleware derive different keys")

// keyHeader returns the asynqkey.KeyHeader value of key, derived with the
// options named name.
func keyHeader(key, name string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8]) + " " + name
}

// keyOptions names the key options of m, as asynqkey.KeyHeader records them.
func (m *guarded) keyOptions() string {
	name := m.keyName
	if name == "" {
		name = "KeyByType()"
	}
	if m.perQueue {
		name += " PerQueue()"
	}
	return name
}

// checkKey returns an error matching ErrKeyMismatch and asynq.SkipRetry
// when t carries an asynqkey.KeyHeader that key, derived by m, does not match.
func (m *guarded) checkKey(t *asynq.Task, job guard.Job, key string) error {
	h, ok := t.Headers()[asynqkey.KeyHeader]
	if !ok {
		return nil
	}
	mine := keyHeader(key, m.keyOptions())
	sum, theirs, _ := strings.Cut(h, " ")
	if sum == mine[:16] {
		return nil
	}
	if theirs == "" {
		theirs = "unknown options"
	}
	err := fmt.Errorf("%w: task %q (id %s) was enqueued keyed by %s (key %s) but this Middleware keys it by %s (key %s): "+
		"give NewClient and Middleware the same key options; the task did not run (%w)",
		ErrKeyMismatch, t.Type(), job.ID, theirs, sum, m.keyOptions(), mine[:16], asynq.SkipRetry)
	return err
}
