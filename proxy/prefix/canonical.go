package prefix

import (
	"bytes"

	"github.com/anvilproxy/anvilproxy/sse"
)

// maxDepth bounds the nesting compact follows; deeper JSON is an unknown
// shape rather than a deep recursion.
const maxDepth = 256

// Separators inside canonical text. They are control bytes that JSON
// strings can only carry escaped, so decoded text rarely contains them.
const (
	sepMember = 0x1f // before each non-content member of a message
	sepTool   = '\n' // between tools
)

// canon writes canonical text, in one pass over the body:
//
//   - a message or item: its content text first (the "content" member, or
//     a Responses item's "output": a string decoded, or the text of its
//     text parts concatenated, other parts as compact JSON), then each other
//     member (tool_calls, tool_call_id, name, type, call_id…) as
//     0x1f key ':' compact JSON, in the order sent. role is hashed apart.
//   - system text: the string, or its text blocks concatenated.
//   - tools: each tool as compact JSON, joined by '\n'.
//
// Drift offsets count bytes of this text, so for a system prompt or a plain
// message they are byte offsets in the decoded string the client sent.
// cache_control members are dropped everywhere (Anthropic cache hints are
// not prompt), and so are Config.VolatileFields when drop is set.
type canon struct {
	dst    []byte
	rest   []byte // an element's other members, until its content is written
	fields [][][]byte
	drop   bool
	path   [][]byte
	parts  []uint32 // tools: start of each tool, relative to its text
	err    UntrackedReason
}

func (c *canon) fail(r UntrackedReason) {
	if c.err == TrackedOK {
		c.err = r
	}
}

// segment writes the canonical text of the value at s as src.form says,
// and records where the value and the text are. It reports false for a
// null value, which is no segment, and on errors.
func (c *canon) segment(s *sse.Scanner, src *source) bool {
	if s.Null() {
		return false
	}
	src.start = s.Pos()
	src.text = len(c.dst)
	src.content = -1
	src.pstart = len(c.parts)
	c.path = c.path[:0]
	switch src.form {
	case formElement:
		src.role, src.content = c.element(s)
	case formText:
		c.text(s)
	case formTools:
		c.tools(s, src.text)
	case formPrompt:
		c.prompt(s)
	}
	src.end, src.tend, src.pend = s.Pos(), len(c.dst), len(c.parts)
	if src.content < 0 {
		src.content = src.tend - src.text
	}
	if s.Bad() {
		c.fail(UntrackedNotJSON)
	}
	return c.err == TrackedOK
}

// element writes one message or Responses item and returns its role and
// the length of its content text. Content goes first whatever the member
// order, so the other members wait in c.rest.
func (c *canon) element(s *sse.Scanner) (Role, int) {
	if !s.Object() {
		c.fail(UntrackedUnknownShape)
		return RoleOther, 0
	}
	start, rest := len(c.dst), len(c.rest)
	role, hasRole := RoleOther, false
	var typ []byte
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "role":
			r := s.Str()
			role, hasRole = roleOf(r), r != nil
			continue
		case "content", "output":
			if len(c.path) == 0 {
				c.text(s)
				continue
			}
		}
		if !c.push(k) {
			s.Skip()
			c.pop()
			continue
		}
		vstart := s.Pos()
		c.dst, c.rest = c.rest, c.dst
		c.dst = append(c.dst, sepMember)
		c.dst = append(c.dst, k...)
		c.dst = append(c.dst, ':')
		c.compact(s, 1)
		c.dst, c.rest = c.rest, c.dst
		c.pop()
		if string(k) == "type" {
			t := sse.NewScanner(s.Since(vstart))
			typ = t.Str()
		}
	}
	content := len(c.dst) - start
	c.dst = append(c.dst, c.rest[rest:]...)
	c.rest = c.rest[:rest]
	if !hasRole {
		role = itemRole(typ)
	}
	return role, content
}

// text writes a content value: a string decoded, an array part by part,
// null as nothing, anything else as compact JSON.
func (c *canon) text(s *sse.Scanner) {
	switch s.Peek() {
	case '"':
		c.str(s)
	case '[':
		s.Array()
		for s.Elem() {
			switch s.Peek() {
			case '"':
				c.str(s)
			case '{':
				c.part(s)
			default:
				c.compact(s, 1)
			}
		}
	default:
		if !s.Null() {
			c.compact(s, 0)
		}
	}
}

// part writes one content part or block: the text of a text part
// ("text", "input_text", "output_text"), else the part as compact JSON.
// The text is decoded as it is met and taken back if the part turns out
// not to be text.
func (c *canon) part(s *sse.Scanner) {
	start, mark := s.Pos(), len(c.dst)
	s.Object()
	var typ []byte
	isText := false
	for k := s.Key(); k != nil; k = s.Key() {
		switch {
		case string(k) == "type":
			typ = s.Str()
		case string(k) == "text" && !isText && s.Peek() == '"':
			c.str(s)
			isText = true
		default:
			s.Skip()
		}
	}
	if isText {
		switch string(typ) {
		case "text", "input_text", "output_text", "":
			return
		}
	}
	c.dst = c.dst[:mark]
	whole := sse.NewScanner(s.Since(start))
	c.compact(&whole, 1)
}

func (c *canon) tools(s *sse.Scanner, base int) {
	if !s.Array() {
		c.fail(UntrackedUnknownShape)
		return
	}
	first := len(c.parts)
	for s.Elem() {
		if len(c.parts) > first {
			c.dst = append(c.dst, sepTool)
		}
		c.parts = append(c.parts, uint32(len(c.dst)-base))
		c.compact(s, 0)
	}
}

// prompt writes a completions prompt: a string, a one-string array, or an
// array of token ids. A batch of several prompts is not one prefix.
func (c *canon) prompt(s *sse.Scanner) {
	switch s.Peek() {
	case '"':
		c.str(s)
		return
	case '[':
	default:
		c.fail(UntrackedUnknownShape)
		s.Skip()
		return
	}
	start := s.Pos()
	s.Array()
	if !s.Elem() {
		c.fail(UntrackedUnknownShape)
		return
	}
	switch s.Peek() {
	case '"':
		c.str(s)
		if s.Elem() {
			c.fail(UntrackedUnknownShape)
			s.Fail()
		}
	case '[', '{':
		c.fail(UntrackedUnknownShape)
		s.Fail()
	default:
		s.Seek(start)
		c.compact(s, 0)
	}
}

// str decodes the string at s into c.dst. A broken string or escape is
// not JSON.
func (c *canon) str(s *sse.Scanner) {
	c.dst = s.AppendString(c.dst)
	if s.Bad() {
		c.fail(UntrackedNotJSON)
	}
}

// compact writes one value as compact JSON: whitespace between tokens
// dropped, strings and numbers byte for byte, members in the order sent.
func (c *canon) compact(s *sse.Scanner, depth int) {
	if depth > maxDepth {
		c.fail(UntrackedUnknownShape)
		s.Fail()
		return
	}
	switch s.Peek() {
	case '{':
		s.Object()
		c.dst = append(c.dst, '{')
		n := 0
		for k := s.Key(); k != nil; k = s.Key() {
			if c.push(k) {
				if n > 0 {
					c.dst = append(c.dst, ',')
				}
				n++
				c.dst = append(c.dst, '"')
				c.dst = append(c.dst, k...)
				c.dst = append(c.dst, '"', ':')
				c.compact(s, depth+1)
			} else {
				s.Skip()
			}
			c.pop()
		}
		c.dst = append(c.dst, '}')
	case '[':
		s.Array()
		c.dst = append(c.dst, '[')
		for n := 0; s.Elem(); n++ {
			if n > 0 {
				c.dst = append(c.dst, ',')
			}
			c.compact(s, depth+1)
		}
		c.dst = append(c.dst, ']')
	case '"':
		c.dst = append(c.dst, '"')
		c.dst = append(c.dst, s.Str()...)
		c.dst = append(c.dst, '"')
	default: // a number or a literal; Scalar fails on anything else
		c.dst = append(c.dst, s.Scalar()...)
	}
}

// push enters member k and reports whether it is kept: cache_control never
// is, and neither is a volatile field when drop is set. Every push is
// followed by a pop.
func (c *canon) push(k []byte) bool {
	c.path = append(c.path, k)
	if string(k) == "cache_control" {
		return false
	}
	if !c.drop {
		return true
	}
	for _, f := range c.fields {
		if len(f) <= len(c.path) && pathEnds(c.path, f) {
			return false
		}
	}
	return true
}

func (c *canon) pop() { c.path = c.path[:len(c.path)-1] }

func pathEnds(path, suffix [][]byte) bool {
	off := len(path) - len(suffix)
	for i, k := range suffix {
		if !bytes.Equal(path[off+i], k) {
			return false
		}
	}
	return true
}
