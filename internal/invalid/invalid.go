// Package invalid makes the ErrInvalid sentinels of jobguard's packages: each
// has its own message and also matches lockkit.ErrInvalid, so one errors.Is
// check covers a bad option at any layer.
package invalid

import "github.com/jobguard/jobguard/lockkit"

type sentinel struct{ msg string }

func (e *sentinel) Error() string { return e.msg }

// Is reports whether target is lockkit.ErrInvalid.
func (e *sentinel) Is(target error) bool { return target == lockkit.ErrInvalid }

// New returns a sentinel with message msg that matches lockkit.ErrInvalid.
func New(msg string) error { return &sentinel{msg: msg} }
