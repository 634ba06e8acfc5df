// Package logbuf is a log destination for tests: slog handlers write to it
// from the background goroutines of a Locker while the test reads it.
package logbuf

import (
	"strings"
	"sync"
)

// Buffer collects what is written to it; safe for concurrent use. The zero
// value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p; it never fails.
func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns everything written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
