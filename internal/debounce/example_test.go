package debounce_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobguard/jobguard/internal/debounce"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

// A Debouncer records each request of a burst as the key's newest; when
// the requests come due, only the newest one is claimed and runs.
func ExampleDebouncer() {
	ctx := context.Background()
	srv, _ := inprocess.Start()
	defer srv.Close()
	debouncer, _ := debounce.New(srv.Client())
	var reqs []debounce.Request
	for _, id := range []string{"task-1", "task-2", "task-3"} {
		r, _ := debouncer.Debounce(ctx, "reindex:tenant-42", id, time.Second, 10*time.Second)
		reqs = append(reqs, r)
	}
	for _, r := range reqs { // each one, when it comes due
		newest, claimed, _ := debouncer.Claim(ctx, "reindex:tenant-42", r.Gen, false)
		if claimed {
			fmt.Println(r.ID, "runs")
		} else {
			fmt.Println(r.ID, "gives way to", newest.ID)
		}
	}
	// Output:
	// task-1 gives way to task-3
	// task-2 gives way to task-3
	// task-3 runs
}
