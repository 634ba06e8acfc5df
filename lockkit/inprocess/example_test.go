package inprocess_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

// Two Lockers of one Store share leases, as two processes sharing one Redis
// do.
func Example() {
	ctx := context.Background()
	store, err := inprocess.Start()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	a, _ := store.Locker(lockkit.WithOwner("worker-a"))
	defer a.Close(ctx)
	b, _ := store.Locker(lockkit.WithOwner("worker-b"))
	defer b.Close(ctx)

	err = lockkit.Do(ctx, a, "report:42", nil, func(ctx context.Context) error {
		_, err := b.TryAcquire(ctx, "report:42", nil)
		var conflict *lockkit.ConflictError
		if errors.As(err, &conflict) {
			fmt.Println("worker-b finds it held by", conflict.Owner)
		}
		return nil
	})
	fmt.Println("worker-a:", err)
	keys, _ := a.Keys(ctx, "report:*")
	fmt.Println("held now:", keys)
	// Output:
	// worker-b finds it held by worker-a
	// worker-a: <nil>
	// held now: []
}
