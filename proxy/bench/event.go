package bench

import (
	"bytes"
	"errors"
	"strconv"
	"time"
)

// epoch is the shared clock of the emitter and the clients, which run in
// the same process: an event carries its send time as nanoseconds since
// epoch, read from the monotonic clock, and the client subtracts it from its
// own reading when the event arrives.
var epoch = time.Now()

// now returns the monotonic nanoseconds since epoch.
func now() int64 { return int64(time.Since(epoch)) }

// An event on the wire is one OpenAI chat-completion chunk whose content
// delta carries the event's sequence number and send time in fixed-width
// decimal, padded to the configured size:
//
//	data: {"id":"chatcmpl-anvilbench",...,"delta":{"content":"0000000007 00000000001234567890 xxxx"},...}\n\n
//
// Fixed widths let the emitter stamp a prebuilt event in place and the
// client check every byte of it: an event that arrives with any other
// length or frame is counted as corrupt.
const (
	eventPrefix = `data: {"id":"chatcmpl-anvilbench","object":"chat.completion.chunk","created":1767225600,"model":"anvilbench","choices":[{"index":0,"delta":{"content":"`
	eventSuffix = `"},"finish_reason":null}]}` + "\n\n"
	seqDigits   = 10
	timeDigits  = 20
	padByte     = 'x'

	// MinEventBytes is the smallest event the format allows.
	MinEventBytes = len(eventPrefix) + seqDigits + 1 + timeDigits + len(eventSuffix)

	// doneEvent ends a stream, after the finish chunk.
	doneEvent = "data: [DONE]\n\n"

	finishPrefix = `data: {"id":"chatcmpl-anvilbench","object":"chat.completion.chunk","created":1767225600,"model":"anvilbench","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":`
)

var errEventFormat = errors.New("bench: event is not in the bench format")

// eventTemplate returns an event of exactly size bytes (at least
// MinEventBytes) with sequence 0 and time 0.
func eventTemplate(size int) []byte {
	size = max(size, MinEventBytes)
	b := make([]byte, 0, size)
	b = append(b, eventPrefix...)
	b = appendFixed(b, 0, seqDigits)
	b = append(b, ' ')
	b = appendFixed(b, 0, timeDigits)
	for i := 0; len(b) < size-len(eventSuffix); i++ {
		c := byte(padByte)
		if i%16 == 0 {
			c = ' ' // words, as a real delta has
		}
		b = append(b, c)
	}
	return append(b, eventSuffix...)
}

// stampEvent writes seq and the send time t into an event made by
// eventTemplate.
func stampEvent(ev []byte, seq uint64, t int64) {
	putFixed(ev[len(eventPrefix):len(eventPrefix)+seqDigits], seq)
	off := len(eventPrefix) + seqDigits + 1
	putFixed(ev[off:off+timeDigits], uint64(t))
}

// parseEvent reads the sequence number and send time of one whole event
// (with its blank-line terminator) made by eventTemplate of the given size.
func parseEvent(ev []byte, size int) (seq uint64, sent int64, err error) {
	size = max(size, MinEventBytes)
	if len(ev) != size || !bytes.HasPrefix(ev, []byte(eventPrefix)) || !bytes.HasSuffix(ev, []byte(eventSuffix)) {
		return 0, 0, errEventFormat
	}
	body := ev[len(eventPrefix) : len(ev)-len(eventSuffix)]
	if body[seqDigits] != ' ' {
		return 0, 0, errEventFormat
	}
	seq, ok := parseFixed(body[:seqDigits])
	t, ok2 := parseFixed(body[seqDigits+1 : seqDigits+1+timeDigits])
	if !ok || !ok2 {
		return 0, 0, errEventFormat
	}
	for _, c := range body[seqDigits+1+timeDigits:] {
		if c != padByte && c != ' ' {
			return 0, 0, errEventFormat
		}
	}
	return seq, int64(t), nil
}

// appendFinish appends the last two events of a stream of n content
// events: the finish chunk with usage, and [DONE].
func appendFinish(b []byte, n int) []byte {
	b = append(b, finishPrefix...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(n)+16, 10)
	b = append(b, "}}\n\n"...)
	return append(b, doneEvent...)
}

func appendFixed(b []byte, v uint64, width int) []byte {
	start := len(b)
	for range width {
		b = append(b, '0')
	}
	putFixed(b[start:], v)
	return b
}

// putFixed writes v in decimal right-aligned into b, zero-padded; digits
// beyond len(b) are dropped.
func putFixed(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
}

func parseFixed(b []byte) (uint64, bool) {
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// Request bodies. Each carries a unique id in its message, as agents' do:
// identical bodies from one client would look like retries to the proxy's
// retry tracker (docs/design.md "Retries").

// appendStreamRequest appends the body of a streamed chat request for
// events content events gap apart.
func appendStreamRequest(b []byte, events int, gap time.Duration, worker, n int) []byte {
	b = append(b, `{"model":"anvilbench","stream":true,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(events), 10)
	b = append(b, `,"bench_gap_us":`...)
	b = strconv.AppendInt(b, gap.Microseconds(), 10)
	return appendMessages(b, worker, n)
}

// appendSmallRequest appends the body of a non-streamed chat request.
func appendSmallRequest(b []byte, worker, n int) []byte {
	b = append(b, `{"model":"anvilbench","stream":false,"max_tokens":8`...)
	return appendMessages(b, worker, n)
}

func appendMessages(b []byte, worker, n int) []byte {
	b = append(b, `,"messages":[{"role":"user","content":"bench request `...)
	b = strconv.AppendInt(b, int64(worker), 10)
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, `"}]}`...)
}

// smallResponse is the emitter's answer to a non-streamed request: a small
// chat completion, about the size of a short tool-call reply.
const smallResponse = `{"id":"chatcmpl-anvilbench","object":"chat.completion","created":1767225600,"model":"anvilbench",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":16,"completion_tokens":1,"total_tokens":17}}`

// intField reads the non-negative integer that follows key in a JSON body,
// or -1. It is the emitter's whole request parser: the bench writes the
// bodies itself.
func intField(body []byte, key string) int64 {
	i := bytes.Index(body, []byte(key))
	if i < 0 {
		return -1
	}
	rest := body[i+len(key):]
	var v int64
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' && n < 18 {
		v = v*10 + int64(rest[n]-'0')
		n++
	}
	if n == 0 {
		return -1
	}
	return v
}
