package sse

import "bytes"

// Scanner walks one JSON text in place, without allocating. It is the one
// JSON reader of the module: the classifiers here, TopLevelString (the
// request's "model") and the prefix tracker (proxy/prefix) all walk with
// it. Keys and string values come back raw, escapes intact, as sub-slices
// of the input; AppendString decodes a string where the text matters.
// Escapes only matter for emptiness ("\n" is one character, and non-empty
// either way), and none of the keys the readers look for contains one.
//
// The scanner is lenient about what its readers do not need (commas are
// optional, literals are not spelled out, brackets skipped over are only
// counted) and strict about structure. On malformed input it sets Bad and
// jumps to the end, so that every later call returns at once and every
// loop ends; callers check Bad once. On every text encoding/json accepts it
// reads what encoding/json reads (FuzzScanner checks this).
//
// A Scanner is a small value owned by one goroutine; the input is only
// read, never kept beyond the Scanner.
type Scanner struct {
	b   []byte
	i   int
	bad bool
}

// NewScanner returns a Scanner at the start of b.
func NewScanner(b []byte) Scanner { return Scanner{b: b} }

// Bad reports whether the input was found malformed.
func (s *Scanner) Bad() bool { return s.bad }

// Fail marks the input malformed, for a reader that finds a shape it
// cannot accept, and moves to the end.
func (s *Scanner) Fail() {
	s.bad = true
	s.i = len(s.b)
}

// Pos returns the offset of the next unread byte.
func (s *Scanner) Pos() int { return s.i }

// Seek moves back to an offset Pos returned, to read a value again. It
// does nothing once the input is Bad, so that loops still end.
func (s *Scanner) Seek(pos int) {
	if !s.bad {
		s.i = pos
	}
}

// Since returns the input from offset start (from Pos) to the current
// position: the text of the values read since.
func (s *Scanner) Since(start int) []byte { return s.b[start:s.i] }

// Peek skips whitespace and returns the next byte, or 0 at the end.
func (s *Scanner) Peek() byte {
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
		default:
			return c
		}
	}
	return 0
}

// Object enters the next value and reports true if it is an object, whose
// keys the caller then reads with Key. Any other value is skipped.
func (s *Scanner) Object() bool { return s.enter('{') }

// Array enters the next value and reports true if it is an array, whose
// elements the caller then reads with Elem. Any other value is skipped.
func (s *Scanner) Array() bool { return s.enter('[') }

func (s *Scanner) enter(open byte) bool {
	if s.Peek() == open {
		s.i++
		return true
	}
	s.Skip()
	return false
}

// Key returns the next key of the current object and moves to its value,
// which the caller must consume. It returns nil after the closing brace.
func (s *Scanner) Key() []byte {
	c := s.Peek()
	if c == ',' {
		s.i++
		c = s.Peek()
	}
	if c == '}' {
		s.i++
		return nil
	}
	if c != '"' {
		s.Fail()
		return nil
	}
	k := s.quoted()
	if s.Peek() != ':' {
		s.Fail()
		return nil
	}
	s.i++
	return k
}

// Elem moves to the next element of the current array, which the caller
// must consume, and reports false after the closing bracket.
func (s *Scanner) Elem() bool {
	c := s.Peek()
	if c == ',' {
		s.i++
		c = s.Peek()
	}
	switch c {
	case ']':
		s.i++
		return false
	case 0, '}':
		s.Fail()
		return false
	}
	return true
}

// Str consumes a value and returns its raw contents if it is a string, or
// nil if it is not. An empty string is an empty slice, not nil.
func (s *Scanner) Str() []byte {
	if s.Peek() != '"' {
		s.Skip()
		return nil
	}
	return s.quoted()
}

// Null reports whether the next value is null, consuming it if so.
func (s *Scanner) Null() bool {
	if s.Peek() == 'n' && bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// Skip consumes one value of any kind.
func (s *Scanner) Skip() {
	switch s.Peek() {
	case '"':
		s.quoted()
	case '{', '[':
		s.nested()
	default:
		s.Scalar()
	}
}

// Scalar consumes a number or literal and returns its bytes. It does not
// check the spelling, only that the value is a run of letters, digits and
// ".+-" that ends where a value may end.
func (s *Scanner) Scalar() []byte {
	start := s.i
	for s.i < len(s.b) && isScalar(s.b[s.i]) {
		s.i++
	}
	if s.i == start || !s.atValueEnd() {
		s.Fail()
		return nil
	}
	return s.b[start:s.i]
}

func isScalar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '-' || c == '+'
}

// atValueEnd reports whether what follows, after any whitespace, may
// follow a value: a separator, a closing bracket, or the end. It looks
// ahead without moving, so that Pos after a value is where the value ends.
func (s *Scanner) atValueEnd() bool {
	for j := s.i; j < len(s.b); j++ {
		switch s.b[j] {
		case ' ', '\t', '\n', '\r':
		case ',', '}', ']':
			return true
		default:
			return false
		}
	}
	return true
}

// quoted consumes the string that starts at s.i and returns its raw
// contents.
func (s *Scanner) quoted() []byte {
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
	s.Fail()
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
// does not check that brackets match: what is skipped is not read.
func (s *Scanner) nested() {
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
	s.Fail()
}
