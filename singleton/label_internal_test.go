package singleton

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A reservation label gives back the queue and the task ID it was made of,
// whatever '/' and '%' they hold.
func TestReservationLabelNamesItsQueueAndTask(t *testing.T) {
	for _, c := range []struct{ queue, id string }{
		{"default", "4f1c"},
		{"default", "report/acme/1"},
		{"tenants/eu", "report/acme/1"},
		{"100%/2F", "%2F/%25"},
		{"", "/"},
	} {
		queue, id := splitLabel(reservationLabel(c.queue, c.id))
		require.Equal(t, c, struct{ queue, id string }{queue, id})
	}
	queue, id := splitLabel("default/4f1c")
	require.Equal(t, []string{"default", "4f1c"}, []string{queue, id}, "the labels of earlier versions, for a queue without '/' or '%'")
}
