package proxy

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/anvilproxy/anvilproxy/sse"
)

// injectIncludeUsage returns body with stream_options.include_usage=true
// when body is a streamed request that did not ask for usage, and false
// when it must be left alone (not JSON, not streamed, already asking).
//
// Without stream_options the option is spliced in after the opening brace,
// keeping every other byte; with stream_options present but not asking,
// (or null) the object is re-encoded, which sorts its keys (engines
// ignore order).
func injectIncludeUsage(body []byte) ([]byte, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return nil, false
	}
	if s := top["stream"]; !bytes.Equal(bytes.TrimSpace(s), []byte("true")) {
		return nil, false
	}
	raw, ok := top["stream_options"]
	if !ok {
		i := bytes.IndexByte(body, '{')
		out := make([]byte, 0, len(body)+40)
		out = append(out, body[:i+1]...)
		out = append(out, `"stream_options":{"include_usage":true},`...)
		return append(out, body[i+1:]...), true
	}
	opts := map[string]json.RawMessage{}
	if !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) && json.Unmarshal(raw, &opts) != nil {
		return nil, false
	}
	if bytes.Equal(bytes.TrimSpace(opts["include_usage"]), []byte("true")) {
		return nil, false
	}
	opts["include_usage"] = json.RawMessage("true")
	top["stream_options"], _ = json.Marshal(opts)
	out, err := json.Marshal(top)
	return out, err == nil
}

// injectedUsageEvent reports whether an event is the usage-only chunk that
// --inject-usage asked for: usage (and engine timing) and nothing else.
func injectedUsageEvent(f sse.Flags) bool {
	return f&sse.FlagUsage != 0 && f&^(sse.FlagUsage|sse.FlagTiming) == 0
}

// filter is the relay path for requests whose usage was injected: it parses
// each read before forwarding, forwards every complete event except the
// injected usage-only one, and holds back an incomplete event until its end
// arrives. It returns the bytes to forward now, valid until the next call.
// This path measures before it forwards, so it is opt-in (docs/design.md "Stamps and phases").
// Trace.RespBytes counts what is forwarded, so the hidden event is not in
// it: response_bytes is what the client received (WriteTo adds the held
// tail it forwards at EOF).
func (r *relay) filter(b []byte, t time.Time) []byte {
	r.hold = append(r.hold, b...)
	r.parser.Feed(b)
	out, cut := r.out[:0], 0
	for r.nextEvent() {
		r.onEvent(t)
		start := int(r.ev.Offset - r.holdOff)
		end := start + r.ev.Len
		if start >= cut && end <= len(r.hold) && injectedUsageEvent(r.chunk.Flags) {
			out = append(out, r.hold[cut:start]...)
		} else if end > cut {
			out = append(out, r.hold[cut:end]...)
		}
		if end > cut {
			cut = end
		}
	}
	if len(r.hold)-cut > r.maxHold {
		out = append(out, r.hold[cut:]...) // an oversized event goes through unfiltered
		cut = len(r.hold)
	}
	r.holdOff += int64(cut)
	r.hold = r.hold[:copy(r.hold, r.hold[cut:])]
	r.out = out
	r.tr.RespBytes += int64(len(out))
	return out
}
