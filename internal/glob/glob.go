// Package glob matches strings against Redis glob patterns, the syntax of
// lockkit's Keys and ScanKeys (and of SCAN MATCH), for a view that filters
// other records of keys (such as a log of decisions) the same way.
package glob

import "strings"

// Match reports whether s matches pattern in Redis glob syntax: '*'
// matches any run of bytes (also '/'), '?' any one byte, "[abc]", "[^abc]"
// and "[a-z]" one byte of (or not of) a set, and '\' makes the next byte
// literal.
func Match(pattern, s string) bool {
	// One pass with one backtrack point: each token but '*' matches one
	// byte, so on a mismatch the last '*' takes one byte more. Linear in
	// practice, and never exponential whatever the pattern.
	p, i := 0, 0
	star, from := -1, 0
	for i < len(s) {
		if p < len(pattern) {
			if pattern[p] == '*' {
				for p < len(pattern) && pattern[p] == '*' {
					p++
				}
				if p == len(pattern) {
					return true
				}
				star, from = p, i
				continue
			}
			if ok, next := matchOne(pattern, p, s[i]); ok {
				p, i = next, i+1
				continue
			}
		}
		if star < 0 {
			return false
		}
		from++
		p, i = star, from
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// matchOne matches c against the one-byte token at pattern[p] ('?', a
// class, an escaped or a plain byte) and returns the index after it.
func matchOne(pattern string, p int, c byte) (bool, int) {
	switch pattern[p] {
	case '?':
		return true, p + 1
	case '[':
		ok, rest := matchClass(pattern[p+1:], c)
		return ok, len(pattern) - len(rest)
	case '\\':
		if p+1 < len(pattern) {
			return pattern[p+1] == c, p + 2
		}
	}
	return pattern[p] == c, p + 1
}

// matchClass matches c against the class that p starts with (after its '[')
// and returns the pattern after the class.
func matchClass(p string, c byte) (bool, string) {
	not := len(p) > 0 && p[0] == '^'
	if not {
		p = p[1:]
	}
	match := false
	for len(p) > 0 && p[0] != ']' {
		switch {
		case p[0] == '\\' && len(p) > 1:
			match = match || p[1] == c
			p = p[2:]
		case len(p) > 2 && p[1] == '-' && p[2] != ']':
			lo, hi := min(p[0], p[2]), max(p[0], p[2])
			match = match || (c >= lo && c <= hi)
			p = p[3:]
		default:
			match = match || p[0] == c
			p = p[1:]
		}
	}
	if len(p) > 0 {
		p = p[1:] // the closing ']'
	}
	return match != not, p
}

// Escape escapes the glob characters of s ('*', '?', '[', ']', '\'), so
// that a pattern starting with Escape(prefix) matches prefix literally (a
// SCAN's MATCH).
func Escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
