package elect_test

import (
	"context"
	"fmt"

	"github.com/jobguard/jobguard/lockkit/elect"
	"github.com/jobguard/jobguard/lockkit/inprocess"
)

// Two replicas campaign for one key: the first leads, the second waits
// until the first resigns and leads with a greater term.
func ExampleElect() {
	ctx := context.Background()
	store, err := inprocess.Start()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	a, _ := store.Locker()
	defer a.Close(ctx)
	b, _ := store.Locker()
	defer b.Close(ctx)

	err = elect.Elect(ctx, a, "reports:leader", nil, func(ctx context.Context, term int64) error {
		c, err := elect.New(b, "reports:leader", nil)
		if err != nil {
			return err
		}
		defer c.Stop(ctx)
		_, leads := c.Leader()
		fmt.Println("a leads; b leads too:", leads)
		return nil
	})
	fmt.Println(err)
	// Output:
	// a leads; b leads too: false
	// <nil>
}
