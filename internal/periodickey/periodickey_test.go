package periodickey

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The names are those running deployments use, and Tick reads the tick
// back from each, and from asynq's key of the tick's task.
func TestNamesAndTheirTick(t *testing.T) {
	tick := time.UnixMilli(1795650000000)
	require.Equal(t, "periodic:0a1b:1795650000000", TaskID("0a1b", tick))
	require.Equal(t, "jobguard:periodic:{0a1b}:tick:1795650000000", Mark("jobguard:", "0a1b", tick))
	require.Equal(t, "jobguard:periodic:{0a1b}:last", Last("jobguard:", "0a1b"))
	for _, s := range []string{TaskID("0a1b", tick), Mark("jobguard:", "0a1b", tick), "asynq:{default}:t:" + TaskID("0a1b", tick)} {
		ms, ok := Tick(s)
		require.True(t, ok, s)
		require.EqualValues(t, 1795650000000, ms, s)
	}
	require.True(t, IsMark(Mark("p:", "0a1b", tick)))
	require.False(t, IsMark(TaskID("0a1b", tick)))
	for _, s := range []string{"", "asynq:{default}:pending", Last("p:", "0a1b"), "periodic:0a1b:x"} {
		_, ok := Tick(s)
		require.False(t, ok, s)
	}
}
