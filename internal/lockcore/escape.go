package lockcore

import "github.com/jobguard/jobguard/internal/rediskey"

// Keys and labels are written into Redis names as package rediskey writes
// them, the one definition lockkit shares with lockkit/throttle and
// lockkit/debounce.
func escapeKey(s string) string   { return rediskey.Key(s) }
func escapeLabel(s string) string { return rediskey.Label(s) }
func unescape(s string) string    { return rediskey.Unescape(s) }
