package opsview_test

import (
	"net/http"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/opsview"
)

// The README's mount, compiled: requireAdmin stands for the user's own
// authentication.
func ExampleNew() {
	var locker *lockkit.Locker // lockkit.NewRedis(rdb)
	requireAdmin := func(h http.Handler) http.Handler { return h }
	run := func() error {
		h, err := opsview.New(locker, opsview.WithRelease()) // read-only without WithRelease
		if err != nil {
			return err
		}
		http.Handle("/locks/", http.StripPrefix("/locks", requireAdmin(h))) // your own authentication
		return nil
	}
	_ = run
}
