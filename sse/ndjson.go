package sse

import "bytes"

// Lines splits a newline-delimited JSON stream (NDJSON, served as
// application/x-ndjson: ollama's /api/generate and /api/chat), fed in
// pieces of any size, into one Event per line, as Parser does for
// text/event-stream. An Event's Data is the line without its LF (or CRLF);
// Type and ID are nil, Retry is -1, and Offset and Len tile the stream as
// Parser's do: a blank or dropped line's bytes belong to the next line's
// range.
// Blank lines are skipped.
//
// A line whose bytes exceed the limit is squeezed: the contents of an array
// of numbers it holds are left out of its Data ("context":[1,2,…] reads as
// "context":[]), so that what follows them is still read. That is ollama's
// /api/generate done line: the conversation's token ids (about 6 bytes a
// token) come before the counts and durations, and past ~170k tokens they
// alone exceed 1 MiB. Data is then valid JSON whenever the line is, with
// those arrays empty; Offset and Len still cover the line's bytes as
// received (the relay never changes them). A line that squeezing cannot
// bring under the limit is dropped: Next returns ErrEventTooLarge once for
// it and goes on after its LF.
//
// A Lines is not safe for concurrent use. The zero value is not usable;
// use NewLines. Once its buffer has grown to the longest line split
// across two reads (at most the limit), it allocates nothing.
type Lines struct {
	max int

	chunk []byte // the piece being split, borrowed from Feed's caller
	pos   int    // next unread byte of chunk
	base  int64  // stream offset of chunk[0]
	start int64  // stream offset where the next event's range starts
	carry []byte // unread rest of a chunk that Feed replaced

	line    []byte // the line's kept bytes: one split across chunks, or squeezed; at most max
	size    int    // bytes of the current line read so far, as received
	elide   bool   // inside an array of numbers whose contents a squeeze leaves out
	discard bool   // skipping the rest of a line that is too large
}

// NewLines returns a Lines that squeezes or drops lines longer than
// maxLineBytes, not counting the line end. A limit of 0 or less means
// DefaultMaxEventBytes. The limit bounds its memory.
func NewLines(maxLineBytes int) *Lines {
	if maxLineBytes <= 0 {
		maxLineBytes = DefaultMaxEventBytes
	}
	return &Lines{max: maxLineBytes}
}

// Reset prepares l for a new stream and keeps its buffers, unless a long
// line grew one beyond 64 KiB (Parser.Reset's rule).
func (l *Lines) Reset() {
	*l = Lines{max: l.max, carry: kept(l.carry), line: kept(l.line)}
}

// Feed hands l the next piece of the stream, with Parser.Feed's contract:
// l keeps a reference to chunk until Next returns false with a nil error.
func (l *Lines) Feed(chunk []byte) {
	if l.pos < len(l.chunk) {
		l.carry = append(append(l.carry[:0], l.chunk[l.pos:]...), chunk...)
		chunk = l.carry
	}
	l.base += int64(l.pos)
	l.chunk, l.pos = chunk, 0
}

// Pending returns the number of bytes of a line begun and not yet ended by
// its LF. At the end of a stream a non-zero Pending means the stream was
// cut inside a line. Trailing blank lines are not pending.
func (l *Lines) Pending() int {
	return l.size + len(l.chunk) - l.pos
}

// Flush ends the stream: it fills ev with a last line no LF ended (JSON
// Lines allows one) and returns true, or returns false when what is
// pending is blank or a line dropped as too large. Call it once, when the
// stream has ended cleanly; a stream cut inside a line keeps it pending.
func (l *Lines) Flush(ev *Event) bool {
	if l.pos < len(l.chunk) {
		_ = l.partial(l.chunk[l.pos:]) // what Next left of the last chunk
	}
	if l.discard || l.elide {
		return false // dropped, or cut inside a squeezed array: not JSON
	}
	line := bytes.TrimSuffix(l.line, []byte("\r"))
	end := l.base + int64(l.pos)
	if len(bytes.TrimSpace(line)) == 0 {
		l.size, l.line = 0, l.line[:0] // trailing blanks: not a cut line
		return false
	}
	*ev = Event{Data: line, Retry: -1, Offset: l.start, Len: int(end - l.start)}
	l.start, l.size, l.line = end, 0, l.line[:0]
	return true
}

// Next fills ev with the next complete line and returns true. It returns
// false with a nil error when it needs more input, and ErrEventTooLarge
// once for each line dropped as too large; the caller then calls Next
// again.
func (l *Lines) Next(ev *Event) (bool, error) {
	for {
		rest := l.chunk[l.pos:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return false, l.partial(rest)
		}
		line := rest[:i]
		l.pos += i + 1
		end := l.base + int64(l.pos)
		if l.size > 0 || i > l.max {
			// A line begun in an earlier chunk, or one to squeeze: it is
			// gathered in l.line. line aliases l.line's array until the
			// next append to it, which only a later Next makes: the
			// Event stays valid.
			err := l.add(line)
			if l.elide && err == nil {
				err = ErrEventTooLarge // it ended inside the array: not JSON
			}
			dropped := l.discard || l.elide
			line = l.line
			l.size, l.line, l.elide, l.discard = 0, l.line[:0], false, false
			if dropped {
				// Its bytes join the next line's range, as Parser's
				// dropped events do.
				if err != nil {
					return false, err
				}
				continue
			}
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(bytes.TrimSpace(line)) == 0 {
			continue // a blank line: its bytes join the next line's range
		}
		*ev = Event{Data: line, Retry: -1, Offset: l.start, Len: int(end - l.start)}
		l.start = end
		return true, nil
	}
}

// partial keeps the start of a line the chunk ended inside.
func (l *Lines) partial(rest []byte) error {
	l.pos = len(l.chunk)
	return l.add(rest)
}

// add appends b, more of the current line, to l.line, squeezing the line
// when it would exceed the limit. When a squeeze cannot make room it drops
// the line: it returns ErrEventTooLarge, once, and discards the rest.
func (l *Lines) add(b []byte) error {
	l.size += len(b)
	for !l.discard && len(b) > 0 {
		if l.elide {
			k := bytes.IndexByte(b, ']')
			if k < 0 {
				k = len(b)
			}
			if !numbers(b[:k]) {
				return l.drop()
			}
			if k == len(b) {
				return nil
			}
			l.line, l.elide, b = append(l.line, ']'), false, b[k+1:]
			continue
		}
		room := l.max - len(l.line)
		if len(b) <= room {
			l.line = append(l.line, b...)
			return nil
		}
		l.line, b = append(l.line, b[:room]...), b[room:]
		if !l.squeeze() {
			return l.drop()
		}
	}
	return nil
}

// drop gives up on the current line.
func (l *Lines) drop() error {
	l.discard, l.elide, l.line = true, false, l.line[:0]
	return ErrEventTooLarge
}

// squeeze makes room in the full l.line by leaving out the contents of its
// last array of numbers: one still open at its end (the rest of its
// contents are then skipped as they arrive: l.elide), else the last one
// closed. It reports false when there is none, or it holds nothing. Only
// bytes that can be nothing but the array's contents are left out: the
// ones between its '[' and ']' when all are digits, signs, points,
// exponents, commas or blanks (a string in between would hold a quote).
func (l *Lines) squeeze() bool {
	b := l.line
	i := len(b)
	for i > 0 && numberByte[b[i-1]] {
		i--
	}
	if i > 0 && b[i-1] == '[' && i < len(b) {
		l.line, l.elide = b[:i], true
		return true
	}
	j := bytes.LastIndexByte(b, ']')
	if j < 0 {
		return false
	}
	i = j
	for i > 0 && numberByte[b[i-1]] {
		i--
	}
	if i == 0 || b[i-1] != '[' || i == j {
		return false
	}
	l.line = append(b[:i], b[j:]...)
	return true
}

// numberByte is true for the bytes of a JSON array of numbers between its
// brackets.
var numberByte = func() (t [256]bool) {
	for _, c := range []byte("0123456789+-.eE, \t\r") {
		t[c] = true
	}
	return t
}()

// numbers reports whether b holds only numberByte bytes.
func numbers(b []byte) bool {
	for _, c := range b {
		if !numberByte[c] {
			return false
		}
	}
	return true
}
