package sse

// classifyResponses reads one event of the OpenAI Responses API. What an
// event means depends on its type, which is both the SSE event field and
// the JSON "type"; the JSON wins.
func classifyResponses(evType, data []byte, c *Chunk) bool {
	s := NewScanner(data)
	if !s.Object() {
		return false
	}
	typ, delta, item := evType, false, Flags(0)
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "type":
			if t := s.Str(); t != nil {
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
			s.Skip()
		}
	}
	c.Flags |= responsesFlags(typ, delta)
	if string(typ) == "response.output_item.added" {
		// A function call is announced with its name, the first output of a
		// call, like the first tool_calls delta of a chat stream. Other added
		// items are still empty.
		c.Flags |= item & FlagToolCall
	}
	return len(typ) > 0 && !s.Bad()
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
	s := NewScanner(body)
	return responseObject(&s, c, true) && !s.Bad()
}

// responseObject consumes a response object and reports whether the value
// was one. Its output is read only for a whole body: in a stream, the
// response of response.completed repeats output that the deltas already
// carried.
func responseObject(s *Scanner, c *Chunk, body bool) bool {
	if !s.Object() {
		return false
	}
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "usage":
			openaiUsage(s, c)
		case "error":
			c.Flags |= flagIf(s.present(), FlagError)
		case "status":
			c.Flags |= statusFlags(s.Str())
		case "output":
			if body {
				responsesOutput(s, c)
			} else {
				s.Skip()
			}
		default:
			s.Skip()
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

func responsesOutput(s *Scanner, c *Chunk) {
	if !s.Array() {
		return
	}
	for s.Elem() {
		c.Flags |= outputItem(s)
	}
}

// outputItem consumes one output item and returns the kind of output it
// holds: text parts of a message are content, summary or content parts of
// a reasoning item are reasoning, and a function call's name or arguments
// are a tool call.
func outputItem(s *Scanner) Flags {
	if !s.Object() {
		return 0
	}
	var typ []byte
	text, call := false, false
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "type":
			typ = s.Str()
		case "content", "summary":
			text = textParts(s) || text
		case "name", "arguments", "input":
			call = s.nonEmpty() || call
		default:
			s.Skip()
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
func textParts(s *Scanner) bool {
	found := false
	if !s.Array() {
		return false
	}
	for s.Elem() {
		if !s.Object() {
			continue
		}
		for k := s.Key(); k != nil; k = s.Key() {
			switch string(k) {
			case "text", "refusal":
				found = s.nonEmpty() || found
			default:
				s.Skip()
			}
		}
	}
	return found
}
