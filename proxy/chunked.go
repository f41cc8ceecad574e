package proxy

import "errors"

// errBadChunk is a chunked body the decoder cannot read: the upstream
// response is broken (ErrUpstreamBroken), as fasthttp's ErrBrokenChunk.
var errBadChunk = errors.New("upstream sent a malformed chunked body")

// chunkDecoder reads a chunked body (RFC 9112 §7.1) piece by piece, as the
// event-loop relay gets it from the socket, and decodes it in place: the
// data bytes are moved to the front of the piece, the framing dropped.
// Its syntax is fasthttp's (parseChunkSize, readCrLf): hex digits, then
// optional whitespace or one ;extension, CRLF; the data, CRLF; trailer
// lines after the last chunk are skipped. The zero value is ready for a
// body's first byte. It is owned by the one relay reading the body.
type chunkDecoder struct {
	state  chunkState
	digits int
	left   int64 // data bytes left in the current chunk; the size while reading it
	ows    bool  // whitespace seen after the size
}

type chunkState uint8

const (
	chunkSize        chunkState = iota // the size's hex digits
	chunkSizeTail                      // whitespace or an extension, up to CR
	chunkExt                           // inside an extension, up to CR
	chunkSizeLF                        // the LF after the size line's CR
	chunkData                          // left bytes of data
	chunkDataCR                        // the CR after the data
	chunkDataLF                        // the LF after the data
	chunkTrailer                       // the start of a trailer line, or the final CRLF
	chunkTrailerLine                   // inside a trailer line, up to LF
	chunkEndLF                         // the LF of the final CRLF
	chunkDone                          // the body ended
)

// done reports whether the body's end (the last chunk and its trailers)
// was read.
func (d *chunkDecoder) done() bool { return d.state == chunkDone }

// decode reads b, moves its data bytes to b[:n] and returns n and the
// number of bytes of b that belonged to the body: used < len(b) only once
// the body ended before b did (bytes beyond the response). A malformed
// body is errBadChunk; the bytes before the fault are still in b[:n].
func (d *chunkDecoder) decode(b []byte) (n, used int, err error) {
	i := 0
	for i < len(b) && d.state != chunkDone {
		if d.state == chunkData {
			k := min(int64(len(b)-i), d.left)
			n += copy(b[n:], b[i:i+int(k)])
			i += int(k)
			d.left -= k
			if d.left == 0 {
				d.state = chunkDataCR
			}
			continue
		}
		c := b[i]
		i++
		if !d.step(c) {
			return n, i, errBadChunk
		}
	}
	return n, i, nil
}

// step reads one framing byte; false means the body is malformed.
func (d *chunkDecoder) step(c byte) bool {
	switch d.state {
	case chunkSize:
		if v, ok := unhex(c); ok {
			if d.digits == 15 { // more than 2^60 bytes: nobody's chunk
				return false
			}
			d.left = d.left<<4 | int64(v)
			d.digits++
			return true
		}
		if d.digits == 0 {
			return false
		}
		d.state = chunkSizeTail
		return d.step(c)
	case chunkSizeTail:
		switch c {
		case '\r':
			d.state = chunkSizeLF
		case ' ', '\t':
			d.ows = true
		case ';':
			if d.ows {
				return false
			}
			d.state = chunkExt
		default:
			return false
		}
	case chunkExt:
		switch c {
		case '\r':
			d.state = chunkSizeLF
		case '\n':
			return false // a newline in an extension: a smuggling vector
		}
	case chunkSizeLF:
		if c != '\n' {
			return false
		}
		d.digits, d.ows = 0, false
		if d.left == 0 {
			d.state = chunkTrailer
		} else {
			d.state = chunkData
		}
	case chunkDataCR:
		if c != '\r' {
			return false
		}
		d.state = chunkDataLF
	case chunkDataLF:
		if c != '\n' {
			return false
		}
		d.state = chunkSize
	case chunkTrailer:
		switch c {
		case '\r':
			d.state = chunkEndLF
		case '\n':
			d.state = chunkDone
		default:
			d.state = chunkTrailerLine
		}
	case chunkTrailerLine:
		if c == '\n' {
			d.state = chunkTrailer
		}
	case chunkEndLF:
		if c != '\n' {
			return false
		}
		d.state = chunkDone
	}
	return true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// appendChunkSize appends n in hex and CRLF: a chunk's size line.
func appendChunkSize(b []byte, n int) []byte {
	const hexdigits = "0123456789abcdef"
	var tmp [16]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = hexdigits[n&15]
		n >>= 4
		if n == 0 {
			break
		}
	}
	return append(append(b, tmp[i:]...), '\r', '\n')
}
