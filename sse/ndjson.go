package sse

import "bytes"

// Lines splits a newline-delimited JSON stream (NDJSON, served as
// application/x-ndjson: ollama's /api/generate and /api/chat), fed in
// pieces of any size, into one Event per line, as Parser does for
// text/event-stream. An Event's Data is the line without its LF (or CRLF);
// Type and ID are nil, Retry is -1, and Offset and Len tile the stream as
// Parser's do: a blank or dropped line's bytes belong to the next line's
// range.
// Blank lines are skipped. A line whose bytes exceed the limit is dropped:
// Next returns ErrEventTooLarge once for it and goes on after its LF.
//
// A Lines is not safe for concurrent use. The zero value is not usable;
// use NewLines. Once its buffer has grown to the longest line split
// across two reads, it allocates nothing.
type Lines struct {
	max int

	chunk []byte // the piece being split, borrowed from Feed's caller
	pos   int    // next unread byte of chunk
	base  int64  // stream offset of chunk[0]
	start int64  // stream offset where the next event's range starts
	carry []byte // unread rest of a chunk that Feed replaced

	line    []byte // the start of a line split across chunks
	size    int    // bytes of the current line read so far
	discard bool   // skipping the rest of a line that is too large
}

// NewLines returns a Lines that drops lines longer than maxLineBytes, not
// counting the line end. A limit of 0 or less means DefaultMaxEventBytes.
// The limit bounds its memory.
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
	line := bytes.TrimSuffix(l.line, []byte("\r"))
	if l.discard {
		return false
	}
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
// once for each line beyond the limit; the caller then calls Next again.
func (l *Lines) Next(ev *Event) (bool, error) {
	for {
		rest := l.chunk[l.pos:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return false, l.partial(rest)
		}
		line := rest[:i]
		l.pos += i + 1
		l.size += i
		end := l.base + int64(l.pos)
		if l.discard || l.size > l.max {
			tooLarge := !l.discard
			// Its bytes join the next line's range, as Parser's
			// dropped events do.
			l.discard, l.size, l.line = false, 0, l.line[:0]
			if tooLarge {
				return false, ErrEventTooLarge
			}
			continue
		}
		if len(l.line) > 0 {
			// line aliases l.line's array until the next append to it,
			// which only a later Next makes: the Event stays valid.
			l.line = append(l.line, line...)
			line, l.line = l.line, l.line[:0]
		}
		l.size = 0
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(bytes.TrimSpace(line)) == 0 {
			continue // a blank line: its bytes join the next line's range
		}
		*ev = Event{Data: line, Retry: -1, Offset: l.start, Len: int(end - l.start)}
		l.start = end
		return true, nil
	}
}

// partial keeps the start of a line the chunk ended inside, or notes that
// it grew beyond the limit (ErrEventTooLarge, once).
func (l *Lines) partial(rest []byte) error {
	l.pos = len(l.chunk)
	l.size += len(rest)
	if l.discard {
		return nil
	}
	if l.size > l.max {
		l.discard, l.line = true, l.line[:0]
		return ErrEventTooLarge
	}
	l.line = append(l.line, rest...)
	return nil
}
