// Package sse parses text/event-stream as defined by the WHATWG HTML
// "Server-sent events" section (Parser), splits newline-delimited JSON
// into lines (Lines: ollama's native streams), and classifies the events
// of OpenAI-, Anthropic-, llama.cpp- and ollama-style LLM streams without
// unmarshalling them.
//
// Both halves sit on the proxy's hot path. Once a Parser's buffers have grown
// to the largest event of a stream, parsing and classifying an event allocate
// nothing.
//
// The classifiers read JSON with Scanner, the module's one in-place JSON
// reader, which TopLevelString (the request's "model") and the prefix
// tracker (proxy/prefix) use too; Protocol names the API for both.
package sse

import (
	"bytes"
	"errors"
	"math"
)

// DefaultMaxEventBytes is the event size limit of a Parser made by
// NewParser(0).
const DefaultMaxEventBytes = 1 << 20

// ErrEventTooLarge is returned by Parser.Next when the lines of one event
// exceed the Parser's limit. The Parser has then dropped that event and
// continues after its terminating blank line.
var ErrEventTooLarge = errors.New("sse: event too large")

// Event is one dispatched event. Its byte fields alias the Parser's buffers
// and are valid only until the next call to Feed or Next; copy what must be
// kept.
type Event struct {
	Type []byte // value of the last "event" field; empty means the default "message"
	Data []byte // the "data" fields joined by '\n', without the final newline
	ID   []byte // value of the last "id" field of this event; nil if it had none
	// Retry is the value of the last valid "retry" field of this event in
	// milliseconds, or -1.
	Retry int64
	// Offset is where the event's raw bytes start in the whole stream.
	Offset int64
	// Len is the number of raw bytes from Offset up to and including the
	// blank line that dispatched the event. The range includes comments,
	// events without data and events dropped as too large that came before
	// it, so the ranges of successive events tile the stream. When a chunk
	// ends between the CR and the LF of the blank line, the event is
	// dispatched at once and the LF opens the next range.
	Len int
}

// Parser splits a text/event-stream byte stream, fed in pieces of any size,
// into events. A Parser is not safe for concurrent use. The zero value is not
// usable; use NewParser.
type Parser struct {
	max int

	chunk []byte // the piece being parsed, borrowed from Feed's caller
	pos   int    // next unread byte of chunk
	lf    int    // index of the first LF at or after pos, len(chunk) if none, or < pos if unknown
	base  int64  // stream offset of chunk[0]
	start int64  // stream offset where the next event's range starts
	carry []byte // unread rest of a chunk that Feed replaced

	line  []byte // the start of a line split across chunks
	data  []byte
	typ   []byte
	id    []byte
	hasID bool
	retry int64
	size  int // bytes of the current event's lines, without line ends

	skipLF  bool // the last chunk ended in CR: an LF that starts the next one ends the same line
	discard bool // skipping the rest of an event that is too large
	inLine  bool // while discarding: part of the current line is already skipped
	started bool // the first line has been read, so no BOM can follow
}

// NewParser returns a Parser that drops events whose lines, not counting line
// ends, add up to more than maxEventBytes. A limit of 0 or less means
// DefaultMaxEventBytes. The limit bounds the Parser's memory.
func NewParser(maxEventBytes int) *Parser {
	if maxEventBytes <= 0 {
		maxEventBytes = DefaultMaxEventBytes
	}
	p := &Parser{max: maxEventBytes, id: make([]byte, 0, 64)}
	p.Reset()
	return p
}

// Reset prepares p for a new stream and keeps its buffers, unless one grew
// beyond keptBytes.
func (p *Parser) Reset() {
	*p = Parser{
		max:   p.max,
		lf:    -1,
		retry: -1,
		carry: kept(p.carry),
		line:  kept(p.line),
		data:  kept(p.data),
		typ:   kept(p.typ),
		id:    kept(p.id),
	}
}

// keptBytes bounds a buffer Reset keeps: one long event may grow a buffer
// to the limit (1 MiB by default), and a pooled parser should not pin that
// for the next stream, whose events are likely short.
const keptBytes = 64 << 10

// kept is b emptied for reuse, or nil when it grew beyond keptBytes.
func kept(b []byte) []byte {
	if cap(b) > keptBytes {
		return nil
	}
	return b[:0]
}

// Feed hands p the next piece of the stream. p keeps a reference to chunk
// until Next returns false with a nil error, so the caller must not modify
// chunk before then. If Feed is called earlier, p copies the unread rest of
// the previous chunk.
func (p *Parser) Feed(chunk []byte) {
	if p.pos < len(p.chunk) {
		p.carry = append(append(p.carry[:0], p.chunk[p.pos:]...), chunk...)
		chunk = p.carry
	}
	p.base += int64(p.pos)
	p.chunk, p.pos, p.lf = chunk, 0, -1
}

// Pending returns the number of bytes fed to p that belong to no returned
// event yet: a partial line, an event without its blank line, or trailing
// comments and blank lines. At the end of a stream a non-zero Pending means
// the stream did not end on an event boundary.
func (p *Parser) Pending() int {
	return int(p.base + int64(len(p.chunk)) - p.start)
}

// Next fills ev with the next complete event and returns true. It returns
// false with a nil error when it needs more input. It returns
// ErrEventTooLarge once for each event that exceeds the limit; the caller
// should then call Next again.
func (p *Parser) Next(ev *Event) (bool, error) {
	for {
		if p.discard && !p.skipEvent() {
			return false, nil
		}
		line, ok := p.readLine()
		if p.size > p.max {
			p.drop(!ok)
			return false, ErrEventTooLarge
		}
		if !ok {
			return false, nil
		}
		if len(line) > 0 {
			p.field(line)
			continue
		}
		if p.dispatch(ev) {
			return true, nil
		}
	}
}

// bom is the UTF-8 byte order mark. The stream is UTF-8 decoded, and the
// decoder strips one leading BOM (WHATWG "Parsing an event stream").
var bom = []byte("\xEF\xBB\xBF")

// readLine returns the next line without its line end, or false when the
// chunk ends first; the start of the line is then kept in p.line.
func (p *Parser) readLine() ([]byte, bool) {
	p.skipPendingLF()
	end, next := p.lineEnd()
	if end < 0 {
		tail := p.chunk[p.pos:]
		p.pos = len(p.chunk)
		p.size += len(tail)
		if p.size <= p.max {
			p.line = append(p.line, tail...)
		}
		return nil, false
	}
	line := p.chunk[p.pos:end]
	p.pos = next
	p.size += len(line)
	if len(p.line) > 0 && p.size <= p.max {
		p.line = append(p.line, line...)
		line, p.line = p.line, p.line[:0]
	}
	if !p.started {
		p.started = true
		line = bytes.TrimPrefix(line, bom)
	}
	return line, true
}

// lineEnd returns the index of the end of the line that starts at p.pos and
// of the byte after that end, or -1 if the chunk ends first. A line ends in
// CRLF, LF or CR (WHATWG "Parsing an event stream"). p.lf caches the next LF
// so that a chunk is searched in linear time whichever line ends it uses.
func (p *Parser) lineEnd() (end, next int) {
	if p.lf < p.pos {
		p.lf = len(p.chunk)
		if i := bytes.IndexByte(p.chunk[p.pos:], '\n'); i >= 0 {
			p.lf = p.pos + i
		}
	}
	if i := bytes.IndexByte(p.chunk[p.pos:p.lf], '\r'); i >= 0 {
		end = p.pos + i
		switch {
		case end+1 == len(p.chunk):
			p.skipLF = true
		case p.chunk[end+1] == '\n':
			return end, end + 2
		}
		return end, end + 1
	}
	if p.lf < len(p.chunk) {
		return p.lf, p.lf + 1
	}
	return -1, len(p.chunk)
}

// skipPendingLF drops the LF of a CRLF pair split across two chunks, so the
// pair ends one line, not two.
func (p *Parser) skipPendingLF() {
	if p.skipLF && p.pos < len(p.chunk) {
		p.skipLF = false
		if p.chunk[p.pos] == '\n' {
			p.pos++
		}
	}
}

// field processes one non-blank line (WHATWG "Interpreting an event stream").
func (p *Parser) field(line []byte) {
	if line[0] == ':' {
		return // a comment
	}
	name, value := line, line[len(line):]
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		name, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "data":
		p.data = append(append(p.data, value...), '\n')
	case "event":
		p.typ = append(p.typ[:0], value...)
	case "id":
		// An id containing NUL is ignored, so that it cannot truncate
		// the Last-Event-ID header a client would send back.
		if bytes.IndexByte(value, 0) < 0 {
			p.id = append(p.id[:0], value...)
			p.hasID = true
		}
	case "retry":
		if n, ok := parseRetry(value); ok {
			p.retry = n
		}
	}
}

// parseRetry parses a "retry" value, which counts only if it is all ASCII
// digits. A value too large for int64 saturates.
func parseRetry(v []byte) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (math.MaxInt64-9)/10 {
			n = math.MaxInt64
			continue
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// dispatch ends the current event at a blank line and reports whether it
// filled ev. An event with an empty data buffer is not dispatched (WHATWG
// "Interpreting an event stream"), but its bytes stay in the range of the
// next event.
func (p *Parser) dispatch(ev *Event) bool {
	if len(p.data) == 0 {
		p.clearEvent()
		return false
	}
	end := p.base + int64(p.pos)
	*ev = Event{
		Type:   p.typ,
		Data:   p.data[:len(p.data)-1],
		Retry:  p.retry,
		Offset: p.start,
		Len:    int(end - p.start),
	}
	if p.hasID {
		ev.ID = p.id
	}
	p.start = end
	p.clearEvent()
	return true
}

// clearEvent empties the buffers of the current event. They keep their
// contents until the next append, so the last Event stays valid.
func (p *Parser) clearEvent() {
	p.data, p.typ, p.id = p.data[:0], p.typ[:0], p.id[:0]
	p.hasID, p.retry, p.size = false, -1, 0
}

// drop abandons an event that is too large and skips the rest of it;
// midLine tells whether the Parser stopped inside a line.
func (p *Parser) drop(midLine bool) {
	p.clearEvent()
	p.line = p.line[:0]
	p.discard, p.inLine, p.started = true, midLine, true
}

// skipEvent consumes lines up to and including the next blank line and
// reports whether it found one before the chunk ended.
func (p *Parser) skipEvent() bool {
	for {
		p.skipPendingLF()
		end, next := p.lineEnd()
		if end < 0 {
			p.inLine = p.inLine || p.pos < len(p.chunk)
			p.pos = len(p.chunk)
			return false
		}
		blank := end == p.pos && !p.inLine
		p.pos, p.inLine = next, false
		if blank {
			p.discard = false
			p.clearEvent()
			return true
		}
	}
}
