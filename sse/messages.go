package sse

// classifyMessages reads one Anthropic Messages event, or a whole message
// body. The type is in the JSON "type", and in the SSE event field as a
// fallback.
func classifyMessages(evType, data []byte, c *Chunk) bool {
	s := NewScanner(data)
	if !s.Object() {
		return false
	}
	typ := messagesObject(&s, c, 0)
	if len(typ) == 0 {
		typ = evType
	}
	switch string(typ) {
	case "message_stop":
		c.Flags |= FlagDone
	case "ping":
		c.Flags |= FlagPing
	case "error":
		c.Flags |= FlagError
	}
	return len(typ) > 0 && !s.Bad()
}

// maxMessagesDepth bounds the recursion of messagesObject: an event holds a
// message, which holds content blocks.
const maxMessagesDepth = 2

// messagesObject reads the keys of an event, a message, a content block or
// a delta, and returns its type. Their keys do not collide, so the key alone
// tells the kind of output: "text" in text blocks and text_delta,
// "thinking" in thinking blocks and thinking_delta, "partial_json" in
// input_json_delta, "name" in tool_use blocks. signature_delta carries none
// of them.
func messagesObject(s *Scanner, c *Chunk, depth int) []byte {
	var typ []byte
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "type":
			typ = s.Str()
		case "message", "content_block", "delta":
			messagesChild(s, c, depth)
		case "content":
			messagesBlocks(s, c, depth)
		case "text":
			c.Flags |= flagIf(s.nonEmpty(), FlagContent)
		case "thinking":
			c.Flags |= flagIf(s.nonEmpty(), FlagReasoning)
		case "partial_json", "name":
			c.Flags |= flagIf(s.nonEmpty(), FlagToolCall)
		case "stop_reason":
			c.Flags |= flagIf(s.present(), FlagFinish)
		case "usage":
			anthropicUsage(s, c)
		case "error":
			c.Flags |= flagIf(s.present(), FlagError)
		default:
			s.Skip()
		}
	}
	return typ
}

func messagesChild(s *Scanner, c *Chunk, depth int) {
	if depth >= maxMessagesDepth {
		s.Skip()
		return
	}
	if s.Object() {
		messagesObject(s, c, depth+1)
	}
}

func messagesBlocks(s *Scanner, c *Chunk, depth int) {
	if depth >= maxMessagesDepth {
		s.Skip()
		return
	}
	if !s.Array() {
		return
	}
	for s.Elem() {
		messagesChild(s, c, depth)
	}
}
