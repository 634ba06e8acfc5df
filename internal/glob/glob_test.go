package glob

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// globReference is the plain recursive reading of Redis glob syntax, which
// Match must agree with.
func globReference(pattern, s string) bool {
	if pattern == "" {
		return s == ""
	}
	if pattern[0] == '*' {
		for i := 0; i <= len(s); i++ {
			if globReference(pattern[1:], s[i:]) {
				return true
			}
		}
		return false
	}
	if s == "" {
		return false
	}
	ok, next := matchOne(pattern, 0, s[0])
	return ok && globReference(pattern[next:], s[1:])
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"tenant:*", "tenant:42", true},
		{"tenant:?2", "tenant:42", true},
		{"tenant:[0-9][0-9]", "tenant:42", true},
		{"tenant:[^4]2", "tenant:42", false},
		{`a\*b`, "a*b", true},
		{`a\*b`, "axb", false},
		{"*:{*}", `sync:{"id":1}`, true},
		{"a*b*c", "abbbc", true},
		{"a*b*c", "abbb", false},
		{"", "", true},
		{"*", "", true},
		{"?", "", false},
	} {
		require.Equal(t, c.want, Match(c.pattern, c.s), "%q ~ %q", c.pattern, c.s)
	}
	// Random patterns and keys over a small alphabet agree with the
	// reference.
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(alphabet []string, n int) string {
		var b strings.Builder
		for range r.IntN(n) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 20000 {
		p := pick([]string{"a", "b", "*", "?", "[ab]", "[^a]", `\*`, "*"}, 6)
		s := pick([]string{"a", "b", "*"}, 8)
		require.Equal(t, globReference(p, s), Match(p, s), "%q ~ %q", p, s)
	}
}

// A pattern an operator types matches a long key in linear time: the
// recursive matcher took exponential time on many stars (the operator page
// and the CLI hung).
func TestMatchManyStars(t *testing.T) {
	done := make(chan bool, 1)
	go func() { done <- Match(strings.Repeat("*a", 16)+"*b", strings.Repeat("a", 200)) }()
	select {
	case got := <-done:
		require.False(t, got)
	case <-time.After(10 * time.Second):
		t.Fatal("Match did not return")
	}
}

// Escape makes a prefix with glob characters match only itself.
func TestEscape(t *testing.T) {
	for _, s := range []string{"plain:", `a*b?c[d]e\f:`, "[^x]-"} {
		if !Match(Escape(s)+"*", s+"key") {
			t.Errorf("Escape(%q)* does not match %q", s, s+"key")
		}
	}
	if Match(Escape("a*")+"b", "axxb") || Match(Escape("a?")+"b", "axb") || Match(Escape("[ab]"), "a") {
		t.Error("an escaped glob character matched more than itself")
	}
}
