package sse

import "strconv"

// nonEmpty consumes a value and reports whether it is a non-empty string.
func (s *Scanner) nonEmpty() bool { return len(s.Str()) > 0 }

// present consumes a value and reports whether it is neither null nor an
// empty string.
func (s *Scanner) present() bool {
	switch s.Peek() {
	case '"':
		return len(s.quoted()) > 0
	case 'n':
		s.Skip()
		return false
	}
	s.Skip()
	return !s.Bad()
}

// int consumes a value and returns it if it is a non-negative integer
// number, or -1.
func (s *Scanner) int() int64 {
	if !s.number() {
		return -1
	}
	return parseInt(s.Scalar())
}

// float consumes a value and returns it if it is a non-negative number,
// or -1.
func (s *Scanner) float() float64 {
	if !s.number() {
		return -1
	}
	return parseFloat(s.Scalar())
}

// number reports whether the next value is a number, and skips it if not.
func (s *Scanner) number() bool {
	if c := s.Peek(); c == '-' || '0' <= c && c <= '9' {
		return true
	}
	s.Skip()
	return false
}

// parseInt parses plain digits by hand and leaves the rare "12.0", "1e3"
// or very long number to parseFloat.
func parseInt(b []byte) int64 {
	if len(b) == 0 || len(b) > 18 {
		return -1
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			if f := parseFloat(b); f < 1<<62 {
				return int64(f)
			}
			return -1
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// parseFloat parses a non-negative JSON number, or returns -1. It must not
// allocate, so it only calls strconv.ParseFloat with input that cannot fail
// (a *NumError would escape to the heap), and of at most 32 bytes, because
// the compiler backs a non-escaping string conversion that short with a
// stack buffer.
func parseFloat(b []byte) float64 {
	if len(b) > 32 || !isNumber(b) {
		return -1
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return -1
	}
	return f
}

// isNumber reports whether b is a non-negative JSON number (RFC 8259,
// section 6) with an exponent of at most two digits, which keeps
// ParseFloat from overflowing.
func isNumber(b []byte) bool {
	i := digits(b, 0)
	if i == 0 {
		return false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i || j-i > 2 {
			return false
		}
		i = j
	}
	return i == len(b)
}

// digits returns the index of the first non-digit of b at or after i.
func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}
