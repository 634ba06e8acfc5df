package lockkittest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
)

// A test of code that takes a *lockkit.Locker: the Locker runs on an embedded
// Redis of its own, closed when the test ends. (An example is given no
// *testing.T, so this one is compiled, not run.)
func ExampleNew() {
	testReport := func(t *testing.T) {
		ctx := context.Background()
		locker := lockkittest.New(t)
		err := lockkit.Do(ctx, locker, "report:42", nil, func(ctx context.Context) error {
			// A second run of the report while the first runs finds it held.
			_, err := locker.TryAcquire(ctx, "report:42", nil)
			if !errors.Is(err, lockkit.ErrNotAcquired) {
				t.Errorf("a second run was not refused: %v", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	_ = testReport
}
