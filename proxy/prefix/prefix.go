// Package prefix tracks prompt-prefix drift: for every request it tells how
// much of the prompt an engine's prefix cache could reuse, which earlier
// request of the same conversation it continues, and, when the request
// rewrites that earlier prompt before its end, where and why (docs/design.md "Prefix drift").
// Users otherwise find out by diffing request bodies by hand after their hit
// rate falls from 99% to 2%: a timestamp in the system prompt, tools in a
// new order, history cut short.
//
// Use: one Tracker per proxy. After each response, Observe the request body
// (off the streaming path) and, once usage is known, Cache the Result with
// the engine's prompt and cached token counts. Export the Result per
// request, Stats as counters and gauges, RecentDrifts in snapshots.
//
// # Segments
//
// A prompt is cut into segments in the order chat templates render them:
// system (leading system and developer messages, Responses instructions,
// the Anthropic system field), then tools (the whole tools array, one
// segment), then each message or Responses input item in order. A
// completions prompt is cut into 4 KiB chunks. Each segment's canonical
// text is built from the JSON (see canon): a message's content text comes
// first, so that drift offsets in a system prompt or a plain message are
// byte offsets into the string the client sent. Request members that never
// reach the engine's prefix cache (model, temperature, stream, max_tokens,
// metadata, user…) and Anthropic cache_control hints are ignored.
//
// # Conversations and drift
//
// The index is a trie of segment prefixes (see index). A request continues
// the most recent earlier prompt that shares its longest prefix reaching
// into the messages; if it differs before its first message (a new system
// prompt, new tools), the most recent prompt holding one of its messages
// (32 bytes or longer) instead. A request that shares only a system prompt
// and tools starts a new conversation, so sessions of one agent are told
// apart. A drift is a continuing request that differs from that prompt
// before its end; a request that stops early (a rewind) or extends the
// prompt's last segment does not drift. Conversations are identified by
// content alone: two sessions that open with byte-identical messages are one
// conversation until they part.
//
// # Offsets
//
// Drift.Offset is exact in the first 64 KiB of a segment (wrong with
// probability 2⁻⁸ per event, and then late, inside the same 64-byte
// block), the start of the differing 64-byte block up to 1 MiB, and 1 MiB
// beyond; see firstDiff. Drift.Exact says which.
//
// # Memory and cost
//
// The index keeps about 1.2 bytes per distinct prompt byte (a fine hash per
// byte of the first 64 KiB of each segment, a block hash per 64 bytes,
// nodes and map entries) and evicts least recently used prefixes to stay
// under Config.MaxIndexBytes; Stats.IndexBytes is its accounted size, which
// errs high against the heap. Segments the index already holds are only
// parsed and hashed; new ones are fingerprinted too, about four times the
// work (see BenchmarkObserve).
//
// # Privacy
//
// Prompt text is never stored, logged or exported. Segments are hashed with
// hash/maphash under a random per-process seed, and the index keeps only
// fingerprints: keyed hashes, lengths and offsets. Results, drift events and
// stats hold numbers and enums. The fine hashes are one lossy byte per
// prefix, so someone holding both the key and a memory image could confirm
// guesses of the text byte by byte; both stay in process memory, like the
// request in flight.
package prefix

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/anvilproxy/anvilproxy/sse"
)

// Defaults for the zero Config.
const (
	DefaultMaxIndexBytes = 64 << 20
	DefaultMaxBodyBytes  = 32 << 20
	DefaultBytesPerToken = 4
)

const (
	promptChunk    = 4 << 10 // completions prompt segment size
	minAnchorBytes = 32      // shorter messages ("ok", "continue") are too common to identify a conversation
	ringSize       = 256     // drift events kept for RecentDrifts
	missMinTokens  = 256     // smaller shortfalls are block granularity and template tokens, not misses
)

// Config configures a Tracker. The zero value is ready to use.
type Config struct {
	// MaxIndexBytes caps the memory of the prefix index; 0 means
	// DefaultMaxIndexBytes (64 MiB). The index costs about 1.3 bytes per
	// distinct prompt byte (see Stats.IndexBytes), so the default remembers
	// some 12 million tokens: more than one GPU's KV cache holds.
	MaxIndexBytes int64
	// VolatileFields are JSON members dropped before hashing, as dotted key
	// paths matched against the end of each member's path inside a
	// message, item, tool or content block: "id" drops every id,
	// "tool_calls.id" only tool call ids. Array indexes are not part of
	// paths. Members outside the prompt (metadata, user…) are never hashed
	// anyway. Text parts' text is not subject to fields; use patterns.
	VolatileFields []string
	// VolatilePatterns are regular expressions (RE2 syntax) whose matches in
	// segment text are replaced by one placeholder byte before hashing,
	// such as `\d{4}-\d\d-\d\dT[\d:.]+Z?` for an ISO timestamp. They run
	// only on segments the index has not met (Go's regexp is several times
	// slower than the rest of Observe).
	VolatilePatterns []string
	// BytesPerToken converts bytes to estimated tokens; 0 means 4.
	BytesPerToken int
	// MaxBodyBytes skips larger bodies (Untracked TooLarge); 0 means
	// DefaultMaxBodyBytes (32 MiB).
	MaxBodyBytes int
	// MaxWorkBytes bounds the scratch memory of Observe calls in progress
	// together; a call waits for its share. 0 means DefaultMaxWorkBytes.
	MaxWorkBytes int64
}

// Tracker observes request bodies and keeps the prefix index. It is safe
// for concurrent use. Parsing, hashing and fingerprinting run outside its
// lock; only the index update is serialized.
type Tracker struct {
	keys
	cfg      Config
	fields   [][][]byte
	patterns []*regexp.Regexp
	masking  bool
	pool     sync.Pool   // *scratch
	work     *workBudget // bounds the scratch of Observe calls in progress

	mu       sync.Mutex
	ix       index
	ring     [ringSize]DriftEvent
	ringNext int
	ringLen  int
	stats    Stats
}

// New returns a Tracker for cfg, or an error if a field path or pattern is
// invalid.
func New(cfg Config) (*Tracker, error) {
	if cfg.MaxIndexBytes < 0 || cfg.BytesPerToken < 0 || cfg.MaxBodyBytes < 0 {
		return nil, errors.New("prefix: negative limit")
	}
	if cfg.MaxIndexBytes == 0 {
		cfg.MaxIndexBytes = DefaultMaxIndexBytes
	}
	if cfg.BytesPerToken == 0 {
		cfg.BytesPerToken = DefaultBytesPerToken
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxWorkBytes <= 0 {
		cfg.MaxWorkBytes = DefaultMaxWorkBytes
	}
	t := &Tracker{cfg: cfg, work: newWorkBudget(cfg.MaxWorkBytes)}
	for _, f := range cfg.VolatileFields {
		var path [][]byte
		for _, k := range strings.Split(f, ".") {
			if k == "" {
				return nil, fmt.Errorf("prefix: volatile field %q: empty key", f)
			}
			path = append(path, []byte(k))
		}
		t.fields = append(t.fields, path)
	}
	for _, p := range cfg.VolatilePatterns {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("prefix: volatile pattern: %w", err)
		}
		t.patterns = append(t.patterns, re)
	}
	t.masking = len(t.fields)+len(t.patterns) > 0
	t.seed = maphash.MakeSeed()
	var k [8]byte
	rand.Read(k[:])
	t.chain = binary.LittleEndian.Uint64(k[:])
	t.ix.init(cfg.MaxIndexBytes)
	t.pool.New = func() any { return new(scratch) }
	return t, nil
}

// Observe canonicalizes and hashes the prompt in body, looks it up in the
// index, records it, and returns what it found. body is only read during
// the call. Its cost grows with the body; call it after the response, off
// the streaming path.
func (t *Tracker) Observe(proto sse.Protocol, body []byte, at time.Time) Result {
	if len(body) > t.cfg.MaxBodyBytes {
		return t.untracked(UntrackedTooLarge)
	}
	sc := t.pool.Get().(*scratch)
	n := len(body) + len(body)/8 // the canonical copy build makes
	big := n > maxPooled
	if big {
		sc.canon.dst = t.work.acquire(n)
	}
	defer func() {
		if big {
			buf := sc.canon.dst
			sc.canon.dst = nil
			t.work.release(n, buf)
		}
		t.release(sc)
	}()
	sc.proto = proto
	if reason := t.build(sc, body); reason != TrackedOK {
		return t.untracked(reason)
	}

	t.resolve(sc)
	system, tools, history, last := composition(sc.segs)

	// Fingerprint only the segments the index does not hold yet, outside
	// the lock; the ones it holds stay pinned meanwhile.
	t.mu.Lock()
	for i, f := range sc.fps {
		if f == nil {
			sc.fps[i] = t.ix.pin(sc.segs[i].hash)
		}
	}
	t.mu.Unlock()
	for i, f := range sc.fps {
		if f == nil {
			sc.fps[i] = t.fingerprint(sc, i)
		}
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	for i, f := range sc.fps {
		if f.refs == 0 {
			sc.fps[i] = t.ix.adopt(f)
		}
		if sc.segs[i].memo {
			t.ix.remember(sc.segs[i].pre, sc.fps[i])
		}
	}
	res := t.match(sc)
	res.SystemBytes, res.ToolsBytes, res.HistoryBytes, res.LastTurnBytes = system, tools, history, last
	for _, f := range sc.fps {
		t.ix.unpin(f)
	}
	t.ix.shrink()
	t.count(&res, at)
	return res
}

func (t *Tracker) untracked(r UntrackedReason) Result {
	t.mu.Lock()
	t.stats.Untracked[r]++
	t.mu.Unlock()
	return Result{Untracked: r, Reuse: -1}
}

// match finds the request's longest indexed prefix and the earlier prompt
// it continues, records its path, and returns the Result. Called with the
// lock held.
func (t *Tracker) match(sc *scratch) Result {
	x := &t.ix
	segs, fps := sc.segs, sc.fps
	n := len(segs)

	// The longest prefix some earlier request had, plus the common start of
	// the next segment with the most recent request that had that prefix.
	path := sc.path[:0]
	cur := &x.root
	for len(path) < n {
		nd := x.nodes[segs[len(path)].cum]
		if nd == nil {
			break
		}
		path = append(path, nd)
		cur = nd
	}
	k := len(path)
	res := Result{Tracked: true, Segments: n, PromptBytes: segs[n-1].total, ReusableBytes: cur.cum, Chain: chainOf(segs)}
	if k < n && cur.next != nil && sameSlot(fps[k], cur.next.fp) {
		off, _ := firstDiff(fps[k], cur.next.fp)
		res.ReusableBytes += int64(off)
	}

	// The conversation: the most recent prompt through the deepest shared
	// message; or, when the request diverged before its first message (a
	// new system prompt or tools), the most recent prompt holding one of
	// its messages; or none, and this request starts a conversation.
	prev := sc.prev[:0]
	dropped := false
	var conv uint64
	turn := 0
	if k > 0 && history(segs[k-1].kind) {
		conv, turn = cur.conv, int(cur.turn)+1
		prev = promptThrough(prev, cur)
	} else if m, i := t.anchored(segs, k); m != nil {
		conv, turn = m.conv, int(m.turn)+1
		prev = promptThrough(prev, m)
		dropped = int(m.depth)-1 > i // that message sat later in the previous prompt
	} else {
		conv = mix(segs[n-1].cum) | 1
	}
	res.ConversationID, res.Turn = conv, turn

	limit := min(n, len(prev))
	if j := divergence(segs, prev); j >= 0 {
		res.Drift = t.drift(sc, prev, j, n < len(prev) || dropped)
		if res.Drift.Happened {
			limit = j
		}
	}
	if t.masking {
		cmp := prev
		if len(cmp) == 0 {
			cmp, limit = path, k
		}
		for i := range limit {
			if segs[i].raw != cmp[i].raw {
				res.Masked = true
				break
			}
		}
	}

	// Record the path: new nodes below the shared prefix, next pointers
	// along it, leaf to root in the LRU.
	parent := &x.root
	for i := range n {
		var nd *node
		if i < k {
			nd = path[i]
		} else {
			nd = x.add(segs[i].cum, parent, fps[i], &segs[i], i+1, conv)
			path = append(path, nd)
		}
		parent.next = nd
		nd.turn, nd.raw = int32(min(turn, 1<<31-1)), segs[i].raw
		if history(segs[i].kind) && segs[i].size >= minAnchorBytes {
			x.anchor(segs[i].hash, nd)
		}
		parent = nd
	}
	parent.next = nil
	for i := n - 1; i >= 0; i-- {
		x.touch(path[i])
	}
	sc.path, sc.prev = path, prev
	return res
}

// anchored returns the most recent indexed node holding one of the
// messages of segs from index k on, and that message's index.
func (t *Tracker) anchored(segs []segment, k int) (*node, int) {
	for i := k; i < len(segs); i++ {
		if s := &segs[i]; history(s.kind) && s.size >= minAnchorBytes {
			if m := t.ix.anchors[s.hash]; m != nil {
				return m, i
			}
		}
	}
	return nil, -1
}

// divergence returns the first index where segs and the previous prompt
// differ, or -1 if one is a prefix of the other.
func divergence(segs []segment, prev []*node) int {
	for i := range min(len(segs), len(prev)) {
		if segs[i].hash != prev[i].fp.hash {
			return i
		}
	}
	return -1
}

// drift describes the divergence at segment j from the previous prompt
// prev. A request whose segment j only extends the previous prompt's last
// segment has not drifted.
func (t *Tracker) drift(sc *scratch, prev []*node, j int, fewer bool) Drift {
	seg, r, p := &sc.segs[j], sc.fps[j], prev[j]
	off, exact := 0, true
	if sameSlot(r, p.fp) {
		off, exact = firstDiff(r, p.fp)
	}
	if j == len(prev)-1 && off >= p.fp.size {
		return Drift{}
	}
	d := Drift{
		Happened:     true,
		Segment:      seg.kind,
		MessageIndex: seg.index,
		Role:         seg.role,
		Offset:       seg.base + int64(off),
		Exact:        exact,
		Class:        classify(r, p.fp, off, exact, fewer),
		LostBytes:    prev[len(prev)-1].cum - (p.cum - int64(p.fp.size)) - int64(off),
	}
	if seg.kind == SegmentTools {
		d.MessageIndex = toolAt(r.parts, off)
	}
	return d
}
