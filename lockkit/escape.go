package lockkit

import (
	"strconv"
	"strings"
)

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
