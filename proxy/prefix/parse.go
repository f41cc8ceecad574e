package prefix

import "github.com/anvilproxy/anvilproxy/sse"

// form says how a source's JSON value becomes canonical text.
type form uint8

const (
	formElement form = iota // a message, or a Responses item
	formText                // a string, or an array of content blocks
	formTools               // an array of tool definitions
	formPrompt              // a completions prompt: a string, [string] or token ids
)

// source is one prompt segment as parsed: where its JSON value sits in the
// body, and where its canonical text sits in canon.dst.
type source struct {
	kind         SegmentKind
	role         Role
	form         form
	index        int
	start, end   int // JSON value in the body
	text, tend   int // canonical text in canon.dst
	content      int // length of the content text at the start of the canonical text
	pstart, pend int // tools: offsets of the tools in canon.parts
}

// parse walks body once, writes the canonical text of every prompt segment
// to c.dst, and appends the segments to out in engine order: system, tools,
// messages (vLLM and llama.cpp chat templates render the system block first
// and put tools in or right after it). It reports why the body cannot be
// tracked, or TrackedOK.
//
// Request members that do not reach the engine's prefix cache (model,
// temperature, stream, max_tokens, metadata, user…) are skipped.
func (c *canon) parse(proto sse.Protocol, body []byte, out []source) ([]source, UntrackedReason) {
	c.dst, c.parts, c.err = c.dst[:0], c.parts[:0], TrackedOK
	s := sse.NewScanner(body)
	if !s.Object() {
		return out, UntrackedNotJSON
	}
	first := len(out)
	lead := -1 // where leading system messages end in out
	var head, tools, funcs source
	hasHead, stateful := false, false
	for k := s.Key(); k != nil && c.err == TrackedOK; k = s.Key() {
		switch member(proto, k) {
		case memberList:
			if lead >= 0 || s.Peek() != '[' {
				c.fail(UntrackedUnknownShape)
				break
			}
			out, lead = c.list(&s, out)
		case memberInput: // Responses input: an item list or a string
			if s.Peek() == '[' {
				if lead >= 0 {
					c.fail(UntrackedUnknownShape)
					break
				}
				out, lead = c.list(&s, out)
				break
			}
			src := source{kind: SegmentMessage, role: RoleUser, form: formText}
			if c.segment(&s, &src) {
				out = append(out, src)
			}
		case memberSystem:
			head = source{kind: SegmentSystem, role: RoleSystem, form: formText}
			hasHead = c.segment(&s, &head)
		case memberTools:
			tools = source{kind: SegmentTools, form: formTools}
			c.segment(&s, &tools)
		case memberFunctions:
			funcs = source{kind: SegmentTools, form: formTools}
			c.segment(&s, &funcs)
		case memberPrompt:
			src := source{kind: SegmentPrompt, form: formPrompt}
			if c.segment(&s, &src) {
				out = append(out, src)
			}
		case memberState:
			stateful = stateful || !s.Null()
			s.Skip()
		default:
			s.Skip()
		}
	}
	switch {
	case c.err != TrackedOK:
		return out[:first], c.err
	case s.Bad() || s.Peek() != 0:
		return out[:first], UntrackedNotJSON
	case stateful:
		return out[:first], UntrackedStateful
	}
	if lead < 0 {
		if proto == sse.ProtocolChat || proto == sse.ProtocolMessages {
			return out[:first], UntrackedUnknownShape // no messages
		}
		lead = len(out)
	}
	if tools.pend == tools.pstart {
		tools = funcs
	}
	if tools.pend > tools.pstart { // an empty tools array renders like none
		out = insert(out, lead, tools)
	}
	if hasHead {
		out = insert(out, first, head)
	}
	if len(out) == first || len(out) == first+1 && out[first].kind == SegmentTools {
		return out[:first], UntrackedUnknownShape // no prompt but tools
	}
	return out, TrackedOK
}

func insert(out []source, at int, src source) []source {
	out = append(out, source{})
	copy(out[at+1:], out[at:])
	out[at] = src
	return out
}

// Members of a request that carry the prompt.
const (
	memberOther = iota
	memberList
	memberInput
	memberSystem
	memberTools
	memberFunctions
	memberPrompt
	memberState
)

func member(proto sse.Protocol, k []byte) int {
	switch proto {
	case sse.ProtocolChat:
		switch string(k) {
		case "messages":
			return memberList
		case "tools":
			return memberTools
		case "functions":
			return memberFunctions
		}
	case sse.ProtocolResponses:
		switch string(k) {
		case "input":
			return memberInput
		case "instructions":
			return memberSystem
		case "tools":
			return memberTools
		case "previous_response_id", "conversation":
			// Server-side state: the body holds only the new turn.
			return memberState
		}
	case sse.ProtocolMessages:
		switch string(k) {
		case "messages":
			return memberList
		case "system":
			return memberSystem
		case "tools":
			return memberTools
		}
	case sse.ProtocolCompletions:
		if string(k) == "prompt" {
			return memberPrompt
		}
	case sse.ProtocolOllama:
		// /api/chat has messages and tools, /api/generate a prompt and a
		// system; both render the system first (ollama's templates).
		switch string(k) {
		case "messages":
			return memberList
		case "tools":
			return memberTools
		case "system":
			return memberSystem
		case "prompt":
			return memberPrompt
		case "context":
			// /api/generate's deprecated token ids of an earlier
			// exchange: the body is not the whole prompt.
			return memberState
		}
	}
	return memberOther
}

// list appends one source per element of the array at s. Leading system
// and developer messages become system segments; it returns where they end
// in out.
func (c *canon) list(s *sse.Scanner, out []source) ([]source, int) {
	s.Array()
	leading := true
	lead := len(out)
	for i := 0; s.Elem(); i++ {
		src := source{kind: SegmentMessage, form: formElement, index: i}
		if !c.segment(s, &src) {
			return out, lead
		}
		if leading && (src.role == RoleSystem || src.role == RoleDeveloper) {
			src.kind = SegmentSystem
			lead++
		} else {
			leading = false
		}
		if len(out) == maxSources {
			c.fail(UntrackedTooLarge)
			return out, lead
		}
		out = append(out, src)
	}
	return out, lead
}

// maxSources bounds the messages of one prompt the tracker follows. Agents
// send hundreds, a long session a few thousand; a body of a million tiny
// messages would cost the tracker hundreds of bytes each, and is left
// untracked (too_large) instead.
const maxSources = 1 << 16

func roleOf(r []byte) Role {
	switch string(r) {
	case "system":
		return RoleSystem
	case "developer":
		return RoleDeveloper
	case "user":
		return RoleUser
	case "assistant", "model":
		return RoleAssistant
	case "tool", "function", "ipython":
		return RoleTool
	}
	return RoleOther
}

// itemRole maps a Responses item type to the role that produced it:
// *_call and reasoning items come from the model, *_call_output items from
// tools.
func itemRole(typ []byte) Role {
	n := len(typ)
	switch {
	case n >= 7 && string(typ[n-7:]) == "_output":
		return RoleTool
	case n >= 5 && string(typ[n-5:]) == "_call", string(typ) == "reasoning":
		return RoleAssistant
	}
	return RoleOther
}
