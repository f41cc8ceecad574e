package sse

// classifyChat reads a chat or completions chunk, or a whole response body:
// choices[].delta in a stream, choices[].message in a body, choices[].text
// for completions. It reports false unless data is a JSON object with
// choices, usage, engine timings or an error.
func classifyChat(data []byte, c *Chunk) bool {
	s := NewScanner(data)
	if !s.Object() {
		return false
	}
	known := false
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "choices":
			known = true
			chatChoices(&s, c)
		case "usage":
			known = true
			openaiUsage(&s, c)
		case "metrics":
			known = true
			vllmMetrics(&s, c)
		case "timings":
			known = true
			llamaTimings(&s, c)
		case "error":
			known = true
			c.Flags |= flagIf(s.present(), FlagError)
		case "object":
			// vLLM streamed errors as {"object":"error","message":...}
			// before it used {"error":{...}}.
			if string(s.Str()) == "error" {
				known = true
				c.Flags |= FlagError
			}
		default:
			s.Skip()
		}
	}
	return known && !s.Bad()
}

func chatChoices(s *Scanner, c *Chunk) {
	if !s.Array() {
		return
	}
	for s.Elem() {
		if !s.Object() {
			continue
		}
		for k := s.Key(); k != nil; k = s.Key() {
			switch string(k) {
			case "delta", "message":
				chatMessage(s, c)
			case "text":
				c.Flags |= flagIf(s.nonEmpty(), FlagContent)
			case "finish_reason":
				c.Flags |= flagIf(s.present(), FlagFinish)
			default:
				s.Skip()
			}
		}
	}
}

// chatMessage reads a delta or a message. Engines name the reasoning
// channel reasoning_content (DeepSeek, llama.cpp, older vLLM) or reasoning
// (newer vLLM, OpenRouter). A refusal is output text.
func chatMessage(s *Scanner, c *Chunk) {
	if !s.Object() {
		return
	}
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "role":
			c.Flags |= flagIf(s.nonEmpty(), FlagRole)
		case "content", "refusal":
			c.Flags |= flagIf(s.nonEmpty(), FlagContent)
		case "reasoning_content", "reasoning":
			c.Flags |= flagIf(s.nonEmpty(), FlagReasoning)
		case "tool_calls":
			c.Flags |= flagIf(toolCalls(s), FlagToolCall)
		case "function_call":
			c.Flags |= flagIf(toolFunction(s), FlagToolCall)
		default:
			s.Skip()
		}
	}
}

// toolCalls consumes a tool_calls array and reports whether any call
// carried a name or arguments. The first chunk of a streamed call has the
// name and empty arguments; the following ones carry arguments only.
func toolCalls(s *Scanner) bool {
	found := false
	if !s.Array() {
		return false
	}
	for s.Elem() {
		if !s.Object() {
			continue
		}
		for k := s.Key(); k != nil; k = s.Key() {
			if string(k) == "function" {
				found = toolFunction(s) || found
			} else {
				s.Skip()
			}
		}
	}
	return found
}

// toolFunction consumes a {"name","arguments"} object and reports whether
// either is non-empty.
func toolFunction(s *Scanner) bool {
	found := false
	if !s.Object() {
		return false
	}
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "name", "arguments":
			found = s.nonEmpty() || found
		default:
			s.Skip()
		}
	}
	return found
}
