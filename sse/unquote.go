package sse

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// SWAR constants: a word has a byte equal to b when hasZero(w ^ b*ones).
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

func hasZero(w uint64) uint64 { return (w - ones) &^ w & highs }

// AppendString consumes a string value, appends its decoded text to dst
// and returns the extended slice. A value that is not a string, or a
// string that is unterminated or holds an invalid escape, makes the input
// Bad; dst then ends with whatever was decoded.
//
// Prompt text is mostly runs of plain bytes between escapes (a "\n" every
// line of code), so it copies eight bytes at a time until a word holds a
// quote or a backslash. Decoded text is never longer than its JSON, which
// bounds the room it needs. Lone surrogates decode to U+FFFD, as
// encoding/json decodes them.
func (s *Scanner) AppendString(dst []byte) []byte {
	if s.Peek() != '"' {
		s.Fail()
		return dst
	}
	b, i := s.b, s.i+1
	dst = slices.Grow(dst, len(b)-i)
	n, out := len(dst), dst[:cap(dst)]
	for {
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			binary.LittleEndian.PutUint64(out[n:], w) // room: see above
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
			s.i = i + 1
			return out[:n]
		case '\\':
			if i+1 < len(b) && shortEscapes[b[i+1]] != 0 {
				out[n] = shortEscapes[b[i+1]]
				n, i = n+1, i+2
				continue
			}
			var ok bool
			if n, i, ok = unescape(out, n, b, i); !ok {
				s.Fail()
				return out[:n]
			}
		default: // the last few bytes
			out[n] = ch
			n, i = n+1, i+1
		}
	}
	s.Fail()
	return out[:n]
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
