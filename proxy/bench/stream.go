package bench

import (
	"bytes"
	"fmt"
	"time"
)

// eventScanner splits a stream's body into SSE events, checks each one
// against the bench format and its sequence, and keeps each event's
// latency: its arrival (the read that delivered its last byte) minus the
// send time it carries. Events split across reads or chunks are joined.
//
// An eventScanner is reused by one worker, stream after stream.
type eventScanner struct {
	size    int      // event size on the wire
	pending []byte   // the start of an event whose end has not arrived
	lat     []int64  // latencies of this stream's events, ns
	want    int      // content events the stream should carry
	seen    []uint64 // bit set of the sequence numbers received
	next    uint64   // one past the highest sequence number received
	tally   streamTally
	onFirst func() // called when the first intact event arrives, if set
}

// streamTally counts what one stream, or many, delivered.
type streamTally struct {
	Streams   int64 `json:"streams"`
	Failed    int64 `json:"failed"`    // ended early: error, or no [DONE]
	Events    int64 `json:"events"`    // content events received intact
	Lost      int64 `json:"lost"`      // sent but never received
	Reordered int64 `json:"reordered"` // received after a later one (or twice)
	Corrupt   int64 `json:"corrupt"`   // any other bytes than those sent
	done      bool  // [DONE] seen
}

func (t *streamTally) add(o streamTally) {
	t.Streams += o.Streams
	t.Failed += o.Failed
	t.Events += o.Events
	t.Lost += o.Lost
	t.Reordered += o.Reordered
	t.Corrupt += o.Corrupt
}

// ok reports a tally with nothing lost, reordered, corrupt or failed.
func (t *streamTally) ok() bool {
	return t.Failed == 0 && t.Lost == 0 && t.Reordered == 0 && t.Corrupt == 0
}

func newEventScanner(size int) *eventScanner {
	size = max(size, MinEventBytes)
	return &eventScanner{size: size, pending: make([]byte, 0, 2*size)}
}

// reset prepares for the next stream, of want content events.
func (s *eventScanner) reset(want int) {
	s.pending = s.pending[:0]
	s.lat = s.lat[:0]
	s.want = want
	words := (want + 63) / 64
	if cap(s.seen) < words {
		s.seen = make([]uint64, words)
	}
	s.seen = s.seen[:words]
	clear(s.seen)
	s.next = 0
	s.tally = streamTally{Streams: 1}
}

// feed takes body bytes that arrived at at.
func (s *eventScanner) feed(b []byte, at int64) {
	if len(s.pending) > 0 {
		end := -1
		if s.pending[len(s.pending)-1] == '\n' && len(b) > 0 && b[0] == '\n' {
			end = 1 // the blank line straddles two reads
		} else if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
			end = i + 2
		}
		if end < 0 {
			if len(s.pending)+len(b) > 64*s.size {
				s.tally.Corrupt++ // no end in sight: drop it
				s.pending = s.pending[:0]
				return
			}
			s.pending = append(s.pending, b...)
			return
		}
		s.pending = append(s.pending, b[:end]...)
		s.event(s.pending, at)
		s.pending = s.pending[:0]
		b = b[end:]
	}
	for len(b) > 0 {
		i := bytes.Index(b, []byte("\n\n"))
		if i < 0 {
			s.pending = append(s.pending, b...)
			return
		}
		s.event(b[:i+2], at)
		b = b[i+2:]
	}
}

// event checks one whole event.
func (s *eventScanner) event(ev []byte, at int64) {
	seq, sent, err := parseEvent(ev, s.size)
	if err != nil {
		switch {
		case bytes.Equal(ev, []byte(doneEvent)):
			s.tally.done = true
		case bytes.HasPrefix(ev, []byte(finishPrefix)):
		default:
			s.tally.Corrupt++
		}
		return
	}
	if seq >= uint64(s.want) {
		s.tally.Corrupt++
		return
	}
	w, bit := seq/64, uint64(1)<<(seq%64)
	switch {
	case s.seen[w]&bit != 0:
		s.tally.Reordered++ // a repeat
		return
	case seq < s.next:
		s.tally.Reordered++ // overtaken by a later one
	default:
		s.next = seq + 1
	}
	s.seen[w] |= bit
	s.tally.Events++
	s.lat = append(s.lat, at-sent)
	if s.tally.Events == 1 && s.onFirst != nil {
		s.onFirst()
	}
}

// finish closes the stream's count: events never received are lost, and a
// stream without [DONE], or that err ended, failed.
func (s *eventScanner) finish(err error) streamTally {
	s.tally.Lost = int64(s.want) - s.tally.Events
	if err != nil || !s.tally.done {
		s.tally.Failed++
	}
	if len(s.pending) > 0 && err == nil {
		s.tally.Corrupt++ // bytes after the last event that end no event
	}
	return s.tally
}

// runStream sends one streamed request for events events gap apart on cc,
// reads the whole response, and returns its tally and time to first byte
// (the latencies are in s.lat).
func runStream(cc *clientConn, host string, s *eventScanner, body []byte, events int) (tally streamTally, ttfb time.Duration, err error) {
	s.reset(events)
	start, err := cc.send(host, body, true)
	if err != nil {
		return s.finish(err), 0, err
	}
	fr, first, err := cc.readHead()
	if err == nil {
		ttfb = time.Duration(first - start)
		err = cc.readBody(fr, s.feed)
		if err == nil && !s.tally.done {
			err = fmt.Errorf("response ended without [DONE] after %d of %d events (chunked %v, length %d)", s.tally.Events, events, fr.chunked, fr.length)
		}
	}
	if err != nil {
		cc.broken = true
	}
	return s.finish(err), ttfb, err
}

// runSmall sends one non-streamed request and reads the response, whose
// body must be the emitter's. It returns the request's latency.
func runSmall(cc *clientConn, host string, body []byte) (time.Duration, error) {
	start, err := cc.send(host, body, false)
	if err != nil {
		return 0, err
	}
	fr, _, err := cc.readHead()
	if err != nil {
		cc.broken = true
		return 0, err
	}
	n := 0
	intact := true
	err = cc.readBody(fr, func(b []byte, _ int64) {
		if n+len(b) > len(smallResponse) || string(b) != smallResponse[n:n+len(b)] {
			intact = false
		}
		n += len(b)
	})
	if err != nil {
		cc.broken = true
		return 0, err
	}
	if !intact || n != len(smallResponse) {
		return 0, errResponse
	}
	return time.Duration(now() - start), nil
}
