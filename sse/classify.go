package sse

import (
	"strconv"
	"strings"
)

// Protocol is the API whose events or body are classified, chosen by the
// request path.
type Protocol uint8

// The protocols Classify understands.
const (
	ProtocolUnknown     Protocol = iota
	ProtocolChat                 // POST /v1/chat/completions
	ProtocolCompletions          // POST /v1/completions (choices[].text)
	ProtocolResponses            // POST /v1/responses (OpenAI Responses API events)
	ProtocolMessages             // POST /v1/messages (Anthropic)
	ProtocolLlama                // POST /completion, /completions without /v1 (llama.cpp native)
	ProtocolOllama               // POST /api/generate, /api/chat (ollama native, NDJSON)
	numProtocols
)

// String returns the protocol's short name, such as "chat".
func (p Protocol) String() string {
	switch p {
	case ProtocolChat:
		return "chat"
	case ProtocolCompletions:
		return "completions"
	case ProtocolResponses:
		return "responses"
	case ProtocolMessages:
		return "messages"
	case ProtocolLlama:
		return "llama_completion"
	case ProtocolOllama:
		return "ollama"
	}
	return "unknown"
}

// Flags is the set of things one event (or body) carried.
type Flags uint16

// The flags of a Chunk. Reasoning, content and tool-call deltas are output;
// a role announcement and empty deltas are not. Where each comes from:
//
//   - FlagReasoning: chat delta.reasoning_content or delta.reasoning;
//     Responses response.reasoning_text.delta and
//     response.reasoning_summary_text.delta; Anthropic thinking_delta;
//     ollama native thinking (/api/generate) and message.thinking
//     (/api/chat).
//   - FlagContent: chat delta.content or delta.refusal; completions
//     choices[].text; llama.cpp native content; Responses response.output_text.delta and
//     response.refusal.delta; Anthropic text_delta; ollama native response
//     (/api/generate) and message.content (/api/chat).
//   - FlagToolCall: chat delta.tool_calls with a name or arguments;
//     Responses response.function_call_arguments.delta and a function call
//     in response.output_item.added; Anthropic input_json_delta and a
//     tool_use block start; ollama native tool_calls and
//     message.tool_calls.
//   - FlagFinish: a non-null finish_reason; Anthropic stop_reason;
//     Responses response.completed and response.incomplete; llama.cpp
//     native "stop": true; ollama native "done": true.
//   - FlagDone: data "[DONE]"; Anthropic message_stop; Responses
//     response.completed, response.incomplete and response.failed;
//     llama.cpp native "stop": true; ollama native "done": true.
//   - FlagError: an "error" SSE event, a top-level "error" object, an
//     Anthropic or Responses error event, Responses response.failed.
const (
	FlagRole      Flags = 1 << iota // a role was announced (chat delta.role)
	FlagReasoning                   // a non-empty reasoning delta
	FlagContent                     // a non-empty content delta
	FlagToolCall                    // a non-empty tool-call delta
	FlagFinish                      // a finish or stop reason
	FlagUsage                       // token usage; see Chunk.Usage
	FlagDone                        // the end-of-stream marker
	FlagError                       // an error event or object
	FlagUnparsed                    // data that is not JSON or not of a known shape; no other flag but FlagError is set
	FlagPing                        // a keep-alive with no meaning for timing (Anthropic ping)
	FlagTiming                      // engine timings; see Chunk.Timing
)

var flagNames = [...]string{
	"role", "reasoning", "content", "tool_call", "finish", "usage",
	"done", "error", "unparsed", "ping", "timing",
}

// String returns the names of the set flags joined by "|", such as
// "content|finish", or "0" for none. It allocates; it is meant for tests
// and logs.
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	var names []string
	for i, name := range flagNames {
		if f&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if rest := f &^ (1<<len(flagNames) - 1); rest != 0 {
		names = append(names, "0x"+strconv.FormatUint(uint64(rest), 16))
	}
	return strings.Join(names, "|")
}

// Chunk is what one event, or one whole non-stream body, means for timing.
// It holds only values, so copying it is safe. Classify and ClassifyBody
// overwrite all of it.
type Chunk struct {
	Flags  Flags
	Usage  Usage  // counts the event reported; -1 for the others
	Timing Timing // set when Flags has FlagTiming
}

func (c *Chunk) reset() {
	*c = Chunk{Usage: UnknownUsage(), Timing: unknownTiming()}
}

func flagIf(cond bool, f Flags) Flags {
	if cond {
		return f
	}
	return 0
}

// done is the data of the event that ends OpenAI streams.
const done = "[DONE]"

// Classify reads one event of the given protocol into c without
// allocating. It never fails: data it cannot read sets FlagUnparsed.
func Classify(proto Protocol, ev *Event, c *Chunk) {
	c.reset()
	if string(ev.Data) == done {
		c.Flags = FlagDone
		return
	}
	var ok bool
	switch proto {
	case ProtocolChat, ProtocolCompletions:
		ok = classifyChat(ev.Data, c)
	case ProtocolResponses:
		ok = classifyResponses(ev.Type, ev.Data, c)
	case ProtocolMessages:
		ok = classifyMessages(ev.Type, ev.Data, c)
	case ProtocolLlama:
		ok = classifyLlama(ev.Data, c)
	case ProtocolOllama:
		ok = classifyOllama(ev.Data, c)
	}
	if !ok {
		c.reset()
		c.Flags = FlagUnparsed
	}
	if string(ev.Type) == "error" {
		c.Flags |= FlagError
	}
}

// ClassifyBody reads a whole non-stream JSON response body of the given
// protocol into c without allocating: which kinds of output it holds, its
// finish reason, usage and engine timings.
func ClassifyBody(proto Protocol, body []byte, c *Chunk) {
	c.reset()
	var ok bool
	switch proto {
	case ProtocolChat, ProtocolCompletions:
		ok = classifyChat(body, c)
	case ProtocolResponses:
		ok = classifyResponseBody(body, c)
	case ProtocolMessages:
		ok = classifyMessages(nil, body, c)
	case ProtocolLlama:
		ok = classifyLlama(body, c)
	case ProtocolOllama:
		ok = classifyOllama(body, c)
	}
	if !ok {
		c.reset()
		c.Flags = FlagUnparsed
	}
}
