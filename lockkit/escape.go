package lockkit

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable returns s for a terminal or a page: every byte or character
// that is not printable (control bytes such as ESC or a newline, invalid
// UTF-8, format characters such as U+202E) is written as Go writes it in a
// quoted string (\x1b, \n, \u202e), and '\' as \\, so that a key, owner
// or label shown to an operator can neither drive the terminal, nor forge a
// row, nor hide text, and reads unambiguously. A printable s without '\'
// is returned as it is.
func Printable(s string) string {
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

// escapeKey writes '%', '{' and '}' as %25, %7B and %7D, so that the first
// '{' of a Redis key is always the one that opens its hash tag and the tag is
// never empty: any key and any prefix work on Redis Cluster.
func escapeKey(s string) string { return escape(s, "%{}") }

// escapeLabel writes '%' and ':' as %25 and %3A, so that a label is the text
// after the last ':' of a holder's member.
func escapeLabel(s string) string { return escape(s, "%:") }

func escape(s, special string) string {
	if !strings.ContainsAny(s, special) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if strings.IndexByte(special, c) >= 0 {
			b.WriteByte('%')
			b.WriteString(strings.ToUpper(strconv.FormatUint(uint64(c), 16)))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// unescape reverses escapeKey and escapeLabel.
func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(n))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
