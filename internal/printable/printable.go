// Package printable escapes what an operator's terminal or page must not
// show raw: the keys, owners and labels the jobguard command and opsview
// print come from task IDs and payloads.
package printable

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s for a terminal or a page: every byte or character
// that is not printable (control bytes such as ESC or a newline, invalid
// UTF-8, format characters such as U+202E) is written as Go writes it in a
// quoted string (\x1b, \n, \u202e), and '\' as \\, so that a key, owner
// or label shown to an operator can neither drive the terminal, nor forge a
// row, nor hide text, and reads unambiguously. A printable s without '\'
// is returned as it is.
func String(s string) string {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == '\\' || (r == utf8.RuneError && n == 1) || !unicode.IsPrint(r) {
			break
		}
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case r == '\\':
			b.WriteString(`\\`)
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r) // '\n', '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
