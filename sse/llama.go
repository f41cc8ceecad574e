package sse

// classifyLlama reads an event or a whole body of llama.cpp's native
// completion routes (POST /completion, /completions without /v1; llama.cpp
// tools/server/README.md "POST /completion"). A stream is
//
//	data: {"index":0,"content":"Hel","tokens":[...],"stop":false,"id_slot":-1,"tokens_predicted":1,"tokens_evaluated":8}
//	...
//	data: {"index":0,"content":"","stop":true,"tokens_predicted":25,"tokens_evaluated":68,"tokens_cached":92,"timings":{...},...}
//
// with no choices, no usage object and no [DONE]: the event with
// "stop": true ends it (FlagFinish|FlagDone). tokens_evaluated is the
// prompt and tokens_predicted the output so far, both cumulative, so later
// events win as Usage.Merge wants. tokens_cached is the slot's whole
// cached context (prompt and output), not the prompt's cache hit: the hit
// is timings.cache_n. An event in the OpenAI completions shape (choices)
// is read as such, so that a gateway serving OpenAI at a path without /v1
// is still measured (docs/engines.md, "Which route is which").
func classifyLlama(data []byte, c *Chunk) bool {
	s := NewScanner(data)
	if !s.Object() {
		return false
	}
	known := false
	prompt, output := int64(-1), int64(-1)
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "content":
			known = true
			c.Flags |= flagIf(s.nonEmpty(), FlagContent)
		case "stop":
			known = true
			if isTrue(&s) {
				c.Flags |= FlagFinish | FlagDone
			}
		case "tokens_evaluated":
			prompt = s.int()
		case "tokens_predicted":
			output = s.int()
		case "timings":
			known = true
			llamaTimings(&s, c)
		case "choices":
			known = true
			chatChoices(&s, c)
		case "usage":
			known = true
			openaiUsage(&s, c)
		case "error":
			known = true
			c.Flags |= flagIf(s.present(), FlagError)
		default:
			s.Skip()
		}
	}
	if prompt >= 0 || output >= 0 {
		c.Flags |= FlagUsage
		c.Usage.PromptTokens, c.Usage.CompletionTokens = prompt, output
	}
	if c.Flags&FlagTiming != 0 && c.Timing.CachedTokens >= 0 && c.Flags&FlagUsage != 0 {
		c.Usage.CachedTokens = c.Timing.CachedTokens
	}
	return known && !s.Bad()
}

// isTrue consumes a value and reports whether it is the literal true.
func isTrue(s *Scanner) bool {
	if s.Peek() != 't' {
		s.Skip()
		return false
	}
	return string(s.Scalar()) == "true"
}
