package sse

// classifyResponses reads one event of the OpenAI Responses API. What an
// event means depends on its type, which is both the SSE event field and
// the JSON "type"; the JSON wins.
func classifyResponses(evType, data []byte, c *Chunk) bool {
	s := scanner{b: data}
	if !s.object() {
		return false
	}
	typ, delta, item := evType, false, Flags(0)
	for k := s.key(); k != nil; k = s.key() {
		switch string(k) {
		case "type":
			if t := s.str(); t != nil {
				typ = t
			}
		case "delta":
			delta = s.nonEmpty()
		case "item":
			item = outputItem(&s)
		case "response":
			responseObject(&s, c, false)
		case "error":
			c.Flags |= flagIf(s.present(), FlagError)
		default:
			s.skip()
		}
	}
	c.Flags |= responsesFlags(typ, delta)
	if string(typ) == "response.output_item.added" {
		// A function call is announced with its name, the first output of a
		// call, like the first tool_calls delta of a chat stream. Other added
		// items are still empty.
		c.Flags |= item & FlagToolCall
	}
	return len(typ) > 0 && !s.bad
}

func responsesFlags(typ []byte, delta bool) Flags {
	switch string(typ) {
	case "response.output_text.delta", "response.refusal.delta":
		return flagIf(delta, FlagContent)
	case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
		return flagIf(delta, FlagReasoning)
	case "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		return flagIf(delta, FlagToolCall)
	case "response.completed", "response.incomplete":
		return FlagFinish | FlagDone
	case "response.failed":
		return FlagError | FlagDone
	case "error":
		return FlagError
	}
	return 0
}

// classifyResponseBody reads a whole response object.
func classifyResponseBody(body []byte, c *Chunk) bool {
	s := scanner{b: body}
	return responseObject(&s, c, true) && !s.bad
}

// responseObject consumes a response object and reports whether the value
// was one. Its output is read only for a whole body: in a stream, the
// response of response.completed repeats output that the deltas already
// carried.
func responseObject(s *scanner, c *Chunk, body bool) bool {
	if !s.object() {
		return false
	}
	for k := s.key(); k != nil; k = s.key() {
		switch string(k) {
		case "usage":
			openaiUsage(s, c)
		case "error":
			c.Flags |= flagIf(s.present(), FlagError)
		case "status":
			c.Flags |= statusFlags(s.str())
		case "output":
			if body {
				responsesOutput(s, c)
			} else {
				s.skip()
			}
		default:
			s.skip()
		}
	}
	return true
}

func statusFlags(status []byte) Flags {
	switch string(status) {
	case "completed", "incomplete":
		return FlagFinish
	case "failed":
		return FlagError
	}
	return 0
}

func responsesOutput(s *scanner, c *Chunk) {
	if !s.array() {
		return
	}
	for s.elem() {
		c.Flags |= outputItem(s)
	}
}

// outputItem consumes one output item and returns the kind of output it
// holds: text parts of a message are content, summary or content parts of
// a reasoning item are reasoning, and a function call's name or arguments
// are a tool call.
func outputItem(s *scanner) Flags {
	if !s.object() {
		return 0
	}
	var typ []byte
	text, call := false, false
	for k := s.key(); k != nil; k = s.key() {
		switch string(k) {
		case "type":
			typ = s.str()
		case "content", "summary":
			text = textParts(s) || text
		case "name", "arguments", "input":
			call = s.nonEmpty() || call
		default:
			s.skip()
		}
	}
	switch string(typ) {
	case "message":
		return flagIf(text, FlagContent)
	case "reasoning":
		return flagIf(text, FlagReasoning)
	case "function_call", "custom_tool_call":
		return flagIf(call, FlagToolCall)
	}
	return 0
}

// textParts consumes an array of content parts and reports whether any has
// a non-empty text or refusal.
func textParts(s *scanner) bool {
	found := false
	if !s.array() {
		return false
	}
	for s.elem() {
		if !s.object() {
			continue
		}
		for k := s.key(); k != nil; k = s.key() {
			switch string(k) {
			case "text", "refusal":
				found = s.nonEmpty() || found
			default:
				s.skip()
			}
		}
	}
	return found
}
