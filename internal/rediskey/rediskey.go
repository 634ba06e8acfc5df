// Package rediskey writes keys and labels into Redis key names as lockkit
// stores them, for lockkit and the packages that keep state beside its
// leases on the same Redis and prefix (lockkit/throttle, lockkit/debounce):
// their key names must stay byte for byte what running deployments use.
package rediskey

import (
	"strconv"
	"strings"
)

// Key writes '%', '{' and '}' as %25, %7B and %7D, so that the first '{'
// of a Redis key is always the one that opens its hash tag and the tag is
// never empty: any key and any prefix work on Redis Cluster.
func Key(s string) string { return Escape(s, "%{}") }

// Base is the name that the Redis keys of key start with under prefix,
// itself escaped (Key): the prefix, then key in a hash tag, so that all of
// key's Redis keys are in one Cluster slot.
func Base(prefix, key string) string { return prefix + "{" + Key(key) + "}" }

// Label writes '%' and ':' as %25 and %3A, so that a label is the text
// after the last ':' of a holder's member.
func Label(s string) string { return Escape(s, "%:") }

// Escape writes '%' and every other byte of s in special as '%' and two
// upper-case hex digits (special must contain '%'); Unescape reverses it.
func Escape(s, special string) string {
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

// Unescape reverses Escape, Key and Label.
func Unescape(s string) string {
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
