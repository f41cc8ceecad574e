package sse

// classifyOllama reads one line of ollama's native NDJSON stream, or its
// whole non-stream body, from POST /api/generate or /api/chat (ollama
// api/types.go GenerateResponse, ChatResponse, Metrics). A stream is
//
//	{"model":"m","created_at":"…","response":"Hel","done":false}
//	...
//	{"model":"m","created_at":"…","response":"","done":true,"done_reason":"stop","context":[…],
//	 "total_duration":912345678,"load_duration":1234567,"prompt_eval_count":26,
//	 "prompt_eval_duration":345678901,"eval_count":40,"eval_duration":512345678}
//
// (/api/chat puts the text in "message":{"role","content","thinking","tool_calls"}),
// with no SSE framing and no [DONE]: the line with "done": true ends it
// (FlagFinish|FlagDone); a stream cut before it is truncated, as ollama's
// own are when it stops a repeating generation. "thinking" is reasoning;
// prompt_eval_count is the whole prompt, cache hits included (the
// llamarunner counts the sequence's inputs before its cache lookup), and
// eval_count the output; both come only on the done line. The durations
// are nanoseconds (docs/engines.md says where each starts and stops); an
// error is {"error":"…"}.
func classifyOllama(data []byte, c *Chunk) bool {
	s := NewScanner(data)
	if !s.Object() {
		return false
	}
	known := false
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "response":
			known = true
			c.Flags |= flagIf(s.nonEmpty(), FlagContent)
		case "thinking":
			c.Flags |= flagIf(s.nonEmpty(), FlagReasoning)
		case "message":
			known = true
			ollamaMessage(&s, c)
		case "tool_calls":
			c.Flags |= flagIf(toolCalls(&s), FlagToolCall)
		case "done":
			known = true
			if isTrue(&s) {
				c.Flags |= FlagFinish | FlagDone
			}
		case "prompt_eval_count":
			c.Flags |= FlagUsage
			c.Usage.PromptTokens = s.int()
		case "eval_count":
			c.Flags |= FlagUsage
			c.Usage.CompletionTokens = s.int()
		case "total_duration":
			c.Flags |= FlagTiming
			c.Timing.TotalMs = nsToMs(s.int())
		case "load_duration":
			c.Flags |= FlagTiming
			c.Timing.LoadMs = nsToMs(s.int())
		case "prompt_eval_duration":
			c.Flags |= FlagTiming
			c.Timing.PrefillMs = nsToMs(s.int())
		case "eval_duration":
			c.Flags |= FlagTiming
			c.Timing.DecodeMs = nsToMs(s.int())
		case "error":
			known = true
			c.Flags |= flagIf(s.present(), FlagError)
		default:
			s.Skip()
		}
	}
	return known && !s.Bad()
}

// ollamaMessage reads /api/chat's message: content is output text,
// thinking reasoning, tool_calls a tool call (its arguments an object, not
// a string as in OpenAI's).
func ollamaMessage(s *Scanner, c *Chunk) {
	if !s.Object() {
		return
	}
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "role":
			c.Flags |= flagIf(s.nonEmpty(), FlagRole)
		case "content":
			c.Flags |= flagIf(s.nonEmpty(), FlagContent)
		case "thinking":
			c.Flags |= flagIf(s.nonEmpty(), FlagReasoning)
		case "tool_calls":
			c.Flags |= flagIf(toolCalls(s), FlagToolCall)
		default:
			s.Skip()
		}
	}
}

// nsToMs turns a duration in nanoseconds into milliseconds; -1 stays
// unknown.
func nsToMs(ns int64) float64 {
	if ns < 0 {
		return -1
	}
	return float64(ns) / 1e6
}
