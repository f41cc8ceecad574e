package prefix

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner walks one JSON text in place. Keys and strings come back raw,
// escapes intact, as sub-slices of the input. It is lenient about what the
// tracker does not need (commas, literals) and strict about structure: on
// malformed input it sets bad and jumps to the end, so that every later call
// returns at once and every loop ends; callers check bad once. (Same shape
// as the sse package's scanner, which stays unexported there.)
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
	case 0, '}':
		s.fail()
		return false
	}
	return true
}

// str consumes a value and returns its raw contents and true if it is a
// string.
func (s *scanner) str() ([]byte, bool) {
	if s.ws() != '"' {
		s.skip()
		return nil, false
	}
	return s.quoted(), !s.bad
}

// skip consumes one value of any kind.
func (s *scanner) skip() {
	switch s.ws() {
	case '"':
		s.quoted()
	case '{', '[':
		s.nested()
	case 0, '}', ']', ',', ':':
		s.fail()
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
// instead of recursing, so deep nesting cannot exhaust the stack; it does
// not check that brackets match (compact, which does recurse, does).
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

// scalar consumes a number or literal and returns it.
func (s *scanner) scalar() []byte {
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return s.b[start:s.i]
		case '"', '{', '[', ':':
			s.fail()
			return nil
		}
	}
	return s.b[start:s.i]
}

// null reports whether the next value is null, consuming it if so.
func (s *scanner) null() bool {
	if s.ws() == 'n' && bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// SWAR constants: a word has a byte equal to b when hasZero(w ^ b*ones).
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

func hasZero(w uint64) uint64 { return (w - ones) &^ w & highs }

// str decodes the JSON string at s into c.dst and moves past it. Prompt
// text is mostly runs of plain bytes between escapes (a "\n" every line of
// code), so it copies eight bytes at a time until a word holds a quote or
// a backslash. Decoded text is never longer than its JSON, which bounds the
// room it needs.
func (c *canon) str(s *scanner) {
	b, i := s.b, s.i+1
	c.dst = slices.Grow(c.dst, len(b)-i)
	n, dst := len(c.dst), c.dst[:cap(c.dst)]
	for {
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			binary.LittleEndian.PutUint64(dst[n:], w) // room: see above
			m := hasZero(w^('"'*ones)) | hasZero(w^('\\'*ones))
			if m == 0 {
				n, i = n+8, i+8
				continue
			}
			k := bits.TrailingZeros64(m) >> 3 // the lowest match is exact
			n, i = n+k, i+k
			break
		}
		if i >= len(b) {
			break
		}
		switch ch := b[i]; ch {
		case '"':
			c.dst, s.i = dst[:n], i+1
			return
		case '\\':
			if i+1 < len(b) && shortEscapes[b[i+1]] != 0 {
				dst[n] = shortEscapes[b[i+1]]
				n, i = n+1, i+2
				continue
			}
			var ok bool
			if n, i, ok = unescape(dst, n, b, i); !ok {
				c.dst = dst[:n]
				c.fail(UntrackedNotJSON)
				s.fail()
				return
			}
		default: // the last few bytes
			dst[n] = ch
			n, i = n+1, i+1
		}
	}
	c.dst = dst[:n]
	s.fail()
}

// shortEscapes decodes the two-byte escapes; code has one every line.
var shortEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// unescape decodes the escape at b[i] into dst[n:] and returns the new
// positions.
func unescape(dst []byte, n int, b []byte, i int) (int, int, bool) {
	if i+1 >= len(b) {
		return n, i, false
	}
	var ch byte
	switch b[i+1] {
	case '"', '\\', '/':
		ch = b[i+1]
	case 'b':
		ch = '\b'
	case 'f':
		ch = '\f'
	case 'n':
		ch = '\n'
	case 'r':
		ch = '\r'
	case 't':
		ch = '\t'
	case 'u':
		r, ok := hex4(b[i+2:])
		if !ok {
			return n, i, false
		}
		i += 6
		if utf16.IsSurrogate(r) && i+6 <= len(b) && b[i] == '\\' && b[i+1] == 'u' {
			if r2, ok := hex4(b[i+2:]); ok {
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					r = d
					i += 6
				}
			}
		}
		return n + utf8.EncodeRune(dst[n:], r), i, true
	default:
		return n, i, false
	}
	dst[n] = ch
	return n + 1, i + 2, true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
