package prefix

import (
	"bytes"
	"hash/maphash"
	"slices"

	"github.com/anvilproxy/anvilproxy/sse"
)

// volatilePlaceholder replaces each match of a volatile pattern.
var volatilePlaceholder = []byte{0x1a}

// segment is one canonical segment of the request in flight.
type segment struct {
	kind         SegmentKind
	role         Role
	index        int
	base         int64 // completions chunks: offset of the chunk in the prompt
	start, end   int   // canonical text in scratch.canon.dst
	size         int   // canonical bytes (end-start, once masked)
	content      int   // length of the content text at its start (see canon)
	pstart, pend int   // tools: part offsets in scratch.canon.parts
	hash         uint64
	raw          uint64 // hash before volatile masking (= hash without masks)
	cum          uint64 // cumulative hash of the segments up to this one
	total        int64  // canonical bytes up to and including this one
	// With volatile patterns, a segment is hashed before the patterns run
	// (pre); if the index has met that text, it knows the masked result and
	// the patterns need not run again (see resolve).
	pre     uint64
	pending bool // text not masked yet
	memo    bool // record pre → fingerprint once indexed
}

// scratch holds one Observe call's buffers; pooled.
type scratch struct {
	proto sse.Protocol
	srcs  []source
	segs  []segment
	fps   []*fingerprint
	path  []*node
	prev  []*node
	canon canon
	masks maskBufs
}

// maxPooled bounds the buffers a pooled scratch keeps.
const maxPooled = 4 << 20

func (t *Tracker) release(sc *scratch) {
	clear(sc.fps)
	clear(sc.path)
	clear(sc.prev)
	clear(sc.canon.path[:cap(sc.canon.path)]) // views of the borrowed body
	sc.canon.path = sc.canon.path[:0]
	if cap(sc.canon.dst) > maxPooled || cap(sc.masks.digits) > maxPooled {
		sc.canon.dst, sc.masks = nil, maskBufs{}
	}
	t.pool.Put(sc)
}

// build parses body into sc.segs and hashes each segment. Segments left
// pending await resolve; chain then links them.
func (t *Tracker) build(sc *scratch, body []byte) UntrackedReason {
	c := &sc.canon
	c.fields, c.drop = t.fields, len(t.fields) > 0
	c.dst = slices.Grow(c.dst[:0], len(body)+len(body)/8)
	srcs, reason := c.parse(sc.proto, body, sc.srcs[:0])
	sc.srcs = srcs
	if reason != TrackedOK {
		return reason
	}
	segs := sc.segs[:0]
	for i := range srcs {
		src := &srcs[i]
		raw := t.raw(c, body, src)
		pending := len(t.patterns) > 0 && src.form != formPrompt
		if len(t.patterns) > 0 && !pending {
			t.maskSource(c, src)
		}
		text := c.dst[src.text:src.tend]
		size := len(text)
		if src.form == formPrompt {
			size = promptChunk
		}
		for off := 0; ; off += size {
			end := min(off+size, len(text))
			s := segment{kind: src.kind, role: src.role, index: src.index, base: int64(off),
				start: src.text + off, end: src.text + end, size: end - off, content: src.content,
				pstart: src.pstart, pend: src.pend, pending: pending}
			if src.form == formPrompt {
				s.content = end - off
			}
			h := t.segHash(s.kind, s.role, text[off:end])
			switch {
			case pending:
				s.pre = h
			default:
				s.hash = h
			}
			s.raw = h
			if t.masking {
				s.raw = raw ^ uint64(off)
			}
			segs = append(segs, s)
			if end == len(text) {
				break
			}
		}
	}
	sc.segs = segs
	return TrackedOK
}

// raw returns the hash of the text of src as sent, before any masking,
// when masks are configured. The volatile fields were dropped while
// parsing, so with fields the segment is parsed again keeping them.
func (t *Tracker) raw(c *canon, body []byte, src *source) uint64 {
	switch {
	case !t.masking:
		return 0
	case len(t.fields) == 0:
		return t.segHash(src.kind, src.role, c.dst[src.text:src.tend])
	}
	s, again := sse.NewScanner(body[:src.end]), *src
	s.Seek(src.start)
	c.drop = false
	c.segment(&s, &again)
	c.drop = true
	raw := t.segHash(src.kind, src.role, c.dst[again.text:again.tend])
	c.dst, c.parts = c.dst[:again.text], c.parts[:again.pstart]
	return raw
}

// resolve masks the pending segments: from the index's memory of their
// text when it has one (pinning the fingerprint into sc.fps), else by
// running the patterns. Then it links the segments' totals and cumulative
// hashes.
func (t *Tracker) resolve(sc *scratch) {
	sc.fps = slices.Grow(sc.fps[:0], len(sc.segs))[:len(sc.segs)]
	if len(t.patterns) > 0 {
		t.mu.Lock()
		for i := range sc.segs {
			if s := &sc.segs[i]; s.pending {
				if f := t.ix.remembered(s.pre); f != nil {
					f.refs++
					sc.fps[i] = f
					s.hash, s.size, s.content, s.pending = f.hash, f.size, f.content, false
				}
			}
		}
		t.mu.Unlock()
		c := &sc.canon
		for i := range sc.segs {
			if s := &sc.segs[i]; s.pending {
				src := source{kind: s.kind, form: formText, text: s.start, tend: s.end, content: s.content, pstart: s.pstart, pend: s.pend}
				if s.kind == SegmentTools {
					src.form = formTools
				}
				t.maskSource(c, &src)
				s.start, s.end, s.size, s.content, s.pstart, s.pend = src.text, src.tend, src.tend-src.text, src.content, src.pstart, src.pend
				s.hash = t.segHash(s.kind, s.role, c.dst[s.start:s.end])
				s.pending, s.memo = false, true
			}
		}
	}
	var total int64
	var cum uint64
	for i := range sc.segs {
		s := &sc.segs[i]
		total += int64(s.size)
		cum = maphash.Comparable(t.seed, [2]uint64{cum, s.hash})
		s.total, s.cum = total, cum
	}
}

// maskSource applies the volatile patterns to the canonical text of src,
// content and other members apart so that the content length stays known.
// Masked text is appended to c.dst and src moved to it.
func (t *Tracker) maskSource(c *canon, src *source) {
	head := t.maskPatterns(c.dst[src.text : src.text+src.content])
	tail := t.maskPatterns(c.dst[src.text+src.content : src.tend])
	if head == nil && tail == nil {
		return
	}
	if head == nil {
		head = c.dst[src.text : src.text+src.content]
	}
	if tail == nil {
		tail = c.dst[src.text+src.content : src.tend]
	}
	text := len(c.dst)
	c.dst = append(c.dst, head...)
	c.dst = append(c.dst, tail...)
	src.text, src.tend, src.content = text, len(c.dst), len(head)
	if src.form == formTools { // the tools moved: find them again
		src.pstart = len(c.parts)
		for off, rest := 0, c.dst[text:]; ; {
			c.parts = append(c.parts, uint32(off))
			i := bytes.IndexByte(rest[off:], sepTool)
			if i < 0 {
				break
			}
			off += i + 1
		}
		src.pend = len(c.parts)
	}
}

// maskPatterns returns text with the volatile patterns replaced, or nil if
// none matched.
func (t *Tracker) maskPatterns(text []byte) []byte {
	var out []byte
	for _, re := range t.patterns {
		if re.Match(text) {
			text = re.ReplaceAll(text, volatilePlaceholder)
			out = text
		}
	}
	return out
}

// segHash hashes a segment's kind, role and canonical text.
func (t *Tracker) segHash(kind SegmentKind, role Role, text []byte) uint64 {
	return mix(maphash.Bytes(t.seed, text) + (uint64(kind)<<8|uint64(role))*mulMix)
}

// fingerprint computes the fingerprint of segment i of sc.
func (t *Tracker) fingerprint(sc *scratch, i int) *fingerprint {
	s := &sc.segs[i]
	var parts []uint32
	if s.kind == SegmentTools {
		parts = sc.canon.parts[s.pstart:s.pend]
	}
	return t.newFingerprint(s, sc.canon.dst[s.start:s.end], parts, &sc.masks)
}

// composition splits the prompt's bytes into system, tools, history and
// last turn (see Result.SystemBytes). The last turn starts after the last
// assistant message: what the agent added since the model last spoke. A
// completions prompt has no parts.
func composition(segs []segment) (system, tools, history, last int64) {
	split := -1 // index of the last assistant message
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].kind == SegmentMessage && segs[i].role == RoleAssistant {
			split = i
			break
		}
	}
	for i := range segs {
		s := &segs[i]
		n := int64(s.size)
		switch {
		case s.kind == SegmentSystem:
			system += n
		case s.kind == SegmentTools:
			tools += n
		case s.kind != SegmentMessage:
			return 0, 0, 0, 0
		case i <= split:
			history += n
		default:
			last += n
		}
	}
	return system, tools, history, last
}
