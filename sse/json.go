package sse

import (
	"bytes"
	"strconv"
)

// scanner walks one JSON text in place, without allocating. It does not
// decode strings: keys and string values are returned raw, escapes intact,
// as sub-slices of the input. Escapes only matter for emptiness ("\n" is one
// character, and non-empty either way), and none of the keys the classifiers
// look for contains one.
//
// The scanner is lenient about what it does not need (commas, literals) and
// strict about structure. On malformed input it sets bad and jumps to the
// end, so that every later call returns at once and every loop ends; callers
// check bad once.
type scanner struct {
	b   []byte
	i   int
	bad bool
}

func (s *scanner) fail() {
	s.bad = true
	s.i = len(s.b)
}

// ws skips whitespace and returns the next byte, or 0 at the end.
func (s *scanner) ws() byte {
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
		default:
			return c
		}
	}
	return 0
}

// object enters the next value and reports true if it is an object, whose
// keys the caller then reads with key. Any other value is skipped.
func (s *scanner) object() bool { return s.enter('{') }

// array enters the next value and reports true if it is an array, whose
// elements the caller then reads with elem. Any other value is skipped.
func (s *scanner) array() bool { return s.enter('[') }

func (s *scanner) enter(open byte) bool {
	if s.ws() == open {
		s.i++
		return true
	}
	s.skip()
	return false
}

// key returns the next key of the current object and moves to its value,
// which the caller must consume. It returns nil after the closing brace.
func (s *scanner) key() []byte {
	c := s.ws()
	if c == ',' {
		s.i++
		c = s.ws()
	}
	if c == '}' {
		s.i++
		return nil
	}
	if c != '"' {
		s.fail()
		return nil
	}
	k := s.quoted()
	if s.ws() != ':' {
		s.fail()
		return nil
	}
	s.i++
	return k
}

// elem moves to the next element of the current array, which the caller
// must consume, and reports false after the closing bracket.
func (s *scanner) elem() bool {
	c := s.ws()
	if c == ',' {
		s.i++
		c = s.ws()
	}
	switch c {
	case ']':
		s.i++
		return false
	case 0:
		s.fail()
		return false
	}
	return true
}

// str consumes a value and returns its raw contents if it is a string, or
// nil if it is not.
func (s *scanner) str() []byte {
	if s.ws() != '"' {
		s.skip()
		return nil
	}
	return s.quoted()
}

// nonEmpty consumes a value and reports whether it is a non-empty string.
func (s *scanner) nonEmpty() bool { return len(s.str()) > 0 }

// present consumes a value and reports whether it is neither null nor an
// empty string.
func (s *scanner) present() bool {
	switch s.ws() {
	case '"':
		return len(s.quoted()) > 0
	case 'n':
		s.skip()
		return false
	}
	s.skip()
	return !s.bad
}

// int consumes a value and returns it if it is a non-negative integer
// number, or -1.
func (s *scanner) int() int64 {
	if !s.number() {
		return -1
	}
	return parseInt(s.scalar())
}

// float consumes a value and returns it if it is a non-negative number,
// or -1.
func (s *scanner) float() float64 {
	if !s.number() {
		return -1
	}
	return parseFloat(s.scalar())
}

// number reports whether the next value is a number, and skips it if not.
func (s *scanner) number() bool {
	if c := s.ws(); c == '-' || '0' <= c && c <= '9' {
		return true
	}
	s.skip()
	return false
}

// skip consumes one value of any kind.
func (s *scanner) skip() {
	switch s.ws() {
	case '"':
		s.quoted()
	case '{', '[':
		s.nested()
	default:
		s.scalar()
	}
}

// quoted consumes the string that starts at s.i and returns its raw
// contents.
func (s *scanner) quoted() []byte {
	start := s.i + 1
	for j := start; j <= len(s.b); j++ {
		k := bytes.IndexByte(s.b[j:], '"')
		if k < 0 {
			break
		}
		j += k
		if !escaped(s.b[start:j]) {
			s.i = j + 1
			return s.b[start:j]
		}
	}
	s.fail()
	return nil
}

// escaped reports whether a quote that follows b is escaped, which it is if
// b ends in an odd number of backslashes.
func escaped(b []byte) bool {
	n := 0
	for n < len(b) && b[len(b)-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

// nested consumes the object or array that starts at s.i. It counts depth
// instead of recursing, so deep nesting cannot exhaust the stack, and it
// does not check that brackets match: only the classified keys need to be
// right.
func (s *scanner) nested() {
	depth := 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			s.quoted()
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				s.i++
				return
			}
		}
		s.i++
	}
	s.fail()
}

// scalar consumes a number or literal and returns its bytes.
func (s *scanner) scalar() []byte {
	start := s.i
	for s.i < len(s.b) && isScalar(s.b[s.i]) {
		s.i++
	}
	if s.i == start {
		s.fail()
		return nil
	}
	return s.b[start:s.i]
}

func isScalar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '-' || c == '+'
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

// Results of TopLevelString.
const (
	KeyAbsent  = iota // b is an object without the key, or its value is not a string
	KeyFound          // the value is returned
	KeyUnknown        // b is not an object, is malformed, or has a key with an escape: decode it to be sure
)

// TopLevelString finds key among the top-level keys of the JSON object b
// and returns the raw contents of its string value, escapes intact. A key
// that repeats is the last one, as encoding/json and Python's json module
// read it. Keys are compared byte for byte, so a key written with an
// escape ("mod\u0065l") makes the answer KeyUnknown rather than a guess.
//
// It walks the top level only, skipping nested values at the speed of
// bytes.IndexByte over their strings, and never allocates: reading a
// request's "model" costs microseconds for a body of hundreds of KB, where
// decoding it costs milliseconds. It is safe for concurrent use.
func TopLevelString(b []byte, key string) (raw []byte, result int) {
	s := scanner{b: b}
	if !s.object() {
		return nil, KeyUnknown
	}
	result = KeyAbsent
	for {
		k := s.key()
		if s.bad {
			return nil, KeyUnknown
		}
		if k == nil {
			return raw, result
		}
		if bytes.IndexByte(k, '\\') >= 0 {
			return nil, KeyUnknown
		}
		if string(k) != key {
			s.skip()
			continue
		}
		if s.ws() == '"' {
			raw, result = s.quoted(), KeyFound
		} else {
			s.skip()
			raw, result = nil, KeyAbsent
		}
	}
}
