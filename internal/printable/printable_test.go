package printable

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestString(t *testing.T) {
	for in, want := range map[string]string{
		"":                              "",
		"tenant:42":                     "tenant:42",
		`asynq:sync:{"tenant":"é"}`:     `asynq:sync:{"tenant":"é"}`,
		"parked:default\nid-1\nid-2":    `parked:default\nid-1\nid-2`,
		"a\x1b[2Jb\tc\r\x00\x7f":        `a\x1b[2Jb\tc\r\x00\x7f`,
		"evil\u202etxt.exe\u0085\u00a0": `evil\u202etxt.exe\u0085\u00a0`,
		"bad\xffutf8":                   `bad\xffutf8`,
		`back\slash`:                    `back\\slash`,
	} {
		require.Equal(t, want, String(in), "%q", in)
	}
}
