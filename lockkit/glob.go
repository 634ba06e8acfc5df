package lockkit

// globMatch reports whether s matches pattern in Redis glob syntax, the
// syntax of Keys on every Locker: '*' matches any run of bytes (also '/'),
// '?' any one byte, "[abc]", "[^abc]" and "[a-z]" one byte of (or not of) a
// set, and '\' makes the next byte literal.
func globMatch(pattern, s string) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			for len(pattern) > 1 && pattern[1] == '*' {
				pattern = pattern[1:]
			}
			if len(pattern) == 1 {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if globMatch(pattern[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if len(s) == 0 {
				return false
			}
		case '[':
			if len(s) == 0 {
				return false
			}
			var ok bool
			if ok, pattern = matchClass(pattern[1:], s[0]); !ok {
				return false
			}
			s = s[1:]
			continue
		case '\\':
			if len(pattern) > 1 {
				pattern = pattern[1:]
			}
			fallthrough
		default:
			if len(s) == 0 || pattern[0] != s[0] {
				return false
			}
		}
		pattern, s = pattern[1:], s[1:]
	}
	return len(s) == 0
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
