package histo

import (
	"math"
	"sync"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// The per-slot cache (docs/engines.md "Cached tokens of an engine with a
// cache per slot"): ollama and llama.cpp keep one KV sequence per slot,
// the prompt (and answer) that ran in it last, and give a request the
// free slot whose sequence shares the longest prefix with its prompt.
// Under concurrent conversations a turn often finds its slot taken by
// another conversation and reuses only the system prompt they share,
// however much of its history the proxy saw sent before: against ollama
// v0.17.4, 8 conversations on 1 and on 4 slots reused 612–631 tokens (the
// shared system prompt) on nearly every turn. Learned from the proxy's
// reuse, the cost model read prefills of 600 new tokens as prefills of
// 200, and the timing's figure missed the engine's reuse by −15% to −90%
// on one slot.
//
// slotCache replays the engine's choice with the proxy's own prefix
// fingerprints (prefix.Chain: keyed hashes and byte counts, no text): S
// slots, each holding the chain and prompt tokens of the last request
// that ran in it, assignment as ollama's runner does it (LoadCacheSlot,
// findLongestCacheSlot: among the free slots the one with the longest
// common prefix, the lowest-numbered among equals, which is also the one
// taken when none shares anything). What a turn reuses depends on S
// beyond the concurrency the proxy sees (an idle slot still holds a
// conversation), and the occupancy's count is a lower bound, so the
// replay runs for every slot count in cacheSlotCounts at once, and the
// one whose cached tokens explain the measured prefills best (the
// relative error of the cost model's time at its new tokens, smoothed)
// among those the evidence allows (at least the learned count; the hint
// while it stands) gives each request's cached tokens (predict), which
// the cost model learns from and the inferred figure is. Requests are
// placed in the order the engine admitted them (their IDs, given at the
// proxy's admission; the engine's queue is FIFO), not the order they
// end: a request is held until every request admitted before it was
// recorded, at most reorderRing requests back, and a prediction places
// the held ones first. Only requests the engine ran (usage with prompt
// tokens) take a slot.

// Bounds of the slot cache: the slot counts replayed (an engine with
// more keeps a cache per slot only as llama.cpp and ollama do, with a
// few), requests held for admission order, the byte difference two
// prompts need to tell tokens per byte, and how much later than a
// request's start a slot's holder may end and still count as free then
// (the split's start is a holder's end, read on another clock).
var cacheSlotCounts = [...]int{1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64}

const (
	reorderRing  = 64
	perByteApart = 16
	freeSlack    = 2 * time.Millisecond
	// scoreEvery is the smoothing of a replay's error (1/16 per sample);
	// a prefill within scoreSlack of the cost model's time at a replay's
	// new tokens does not count against it.
	scoreEvery = 16
	scoreSlack = 1.25
	// scoreMargin: a replay of more slots is chosen over one of fewer
	// only when its score is lower by this much. A run's first scores
	// rest on a few prefills, which a loaded host stretches: without it,
	// a loaded capture's conversation (histo/testdata/ollama/loaded/
	// agents-p4-s8run10.json) read +21% of ollama's reuse, with it +2%,
	// and no other moved past TestReplayInferredCache's bar.
	scoreMargin = 0.05
)

// slotTurn is one request as the slot cache sees it.
type slotTurn struct {
	id         uint64
	held       bool // the ring position holds it
	ran        bool // the engine ran it: its slot holds its prompt after
	start, end time.Time
	first      time.Time // its first output; zero when none came
	chain      prefix.Chain
	tokens     int64 // prompt tokens; ≤ 0 unknown
	// score: its prefill (seconds) scores the replays once it is placed,
	// judged by rs, the cost model as it was before this turn taught it
	// (a replay is never graded by a model its own count just trained);
	// rs also bounds its prefill for ranFirst.
	score   bool
	prefill float64
	rs      rates
}

// cacheSlot is one modelled slot: the last sequence that ran in it, its
// chain by reference (an entry of the slot cache's chainTable), with the
// chain's identity: what a pick reads of every slot, 32 bytes, where a
// chain is 264 (the replays hold 242 slots, and mostly the same few
// recent prompts).
type cacheSlot struct {
	used   bool
	entry  uint16 // the chain's entry in the chainTable, when used
	depth  int32  // with hash, the chain's identity (chainID), packed beside used
	hash   uint64
	tokens int64
	end    int64 // the holder's end, an instant
}

// slotEpoch is the origin of the instants the slots' ends are kept as
// (instant): a pick compares 242 of them, where time.Time's After was
// half its time.
var slotEpoch = time.Now()

// instant is t as nanoseconds from slotEpoch: by the monotonic clock
// when t has a reading (slotEpoch has one), else by the wall clock (tests
// and captured timelines). Instants order as t.After orders times only
// when the stamps of one cache are alike, all monotonic or all wall (the
// proxy's all come from time.Now): After reads the wall clock when either
// lacks a reading, instant reads each stamp on its own. Times
// more than 292 years from slotEpoch, the zero time among them, saturate
// to the extremes, before or after all others.
// A placement converts its times once: 30 conversions, one per pick and
// per slot written, were a fifth of its time.
func instant(t time.Time) int64 { return int64(t.Sub(slotEpoch)) }

// freeBy is the instant by which a slot's holder must have ended for the
// slot to be free at start (freeSlack after it).
func freeBy(start time.Time) int64 { return instant(start.Add(freeSlack)) }

// id is the identity of s's chain.
func (s *cacheSlot) id() chainID { return chainID{s.depth, s.hash} }

// chainID is a chain's identity: its depth and whole-prompt hash (a keyed
// 64-bit hash of the canonical prompt, as the prefix tracker's trie
// trusts it). Equal identities are the same prompt's chains, hence equal
// marks.
type chainID struct {
	depth int32
	hash  uint64
}

func idOf(ch *prefix.Chain) chainID {
	return chainID{int32(ch.Depth), ch.Tail[prefix.ChainEnds-1].Hash}
}

// slotReplay is the engine replayed with one slot count. Its slots' chains
// are entries of a chainTable, each slot holding a reference.
type slotReplay struct {
	slots []cacheSlot
	// hi bounds the used slots: slots[hi:] are all empty. The engine
	// gives an empty slot only when no used one is free, the
	// lowest-numbered, so the used slots are the first ones and a pick
	// stops at hi.
	hi    int
	score float64 // smoothed relative error of the prefills it predicts
}

// newSlotReplay is a replay of n empty slots.
func newSlotReplay(n int) slotReplay {
	return slotReplay{slots: make([]cacheSlot, n)}
}

// put leaves a sequence of chain ch, ending at the instant end, in slot
// k; a repeated prompt keeps its entry.
func (r *slotReplay) put(tab *chainTable, k int, ch *prefix.Chain, tokens, end int64) {
	s := &r.slots[k]
	if id := idOf(ch); !s.used || s.id() != id {
		e := tab.hold(ch)
		if s.used {
			tab.release(s.entry)
		}
		s.entry, s.depth, s.hash = e, id.depth, id.hash
	}
	s.used, s.tokens, s.end = true, tokens, end
	r.hi = max(r.hi, k+1)
}

// copyFrom makes r a copy of o, reusing r's array; r must hold no
// reference (new, or cleared).
func (r *slotReplay) copyFrom(tab *chainTable, o *slotReplay) {
	r.slots, r.hi = append(r.slots[:0], o.slots...), o.hi
	for k := range r.hi {
		if r.slots[k].used {
			tab.ref(r.slots[k].entry)
		}
	}
}

// clear drops r's slots and their references.
func (r *slotReplay) clear(tab *chainTable) {
	for k := range r.hi {
		if r.slots[k].used {
			tab.release(r.slots[k].entry)
		}
	}
	r.slots, r.hi = r.slots[:0], 0
}

// slotBounds are the slot counts the evidence allows: at least lo; exact
// when a hint stands (0: none).
type slotBounds struct{ lo, exact int }

// boundsOf reads the occupancy's slot figures.
func boundsOf(s SlotsSection) slotBounds {
	b := slotBounds{lo: max(int(s.Learned), 1)}
	if s.Hint > 0 && s.Effective == int(s.Hint) {
		b.exact = int(s.Hint)
	}
	return b
}

// slotCache models an engine's per-slot prompt cache. It is safe for
// concurrent use; its mutex is held for the placement of the requests a
// Record releases (about half a microsecond each with every slot free,
// BenchmarkSlotCache, and 1.2 µs with every slot used and nearly all
// busy, BenchmarkSlotCacheBusy, prediction included: every replay), and it takes
// the cost model's lock inside its own (never the other way).
type slotCache struct {
	mu      sync.Mutex
	replays [len(cacheSlotCounts)]slotReplay
	next    uint64 // the lowest ID not placed yet; 0 before the first
	ring    [reorderRing]slotTurn
	// perByte is prompt tokens per canonical byte past a common prefix,
	// learned from pairs of prompts that share one (0 before any).
	perByte float64
	scratch slotReplay // predict's copy of a replay, cleared after
	tab     chainTable // the chains the slots hold, and one target's common prefixes with them
}

// turnOf is tr's slotTurn: its slot start (the split's, else its arrival
// at the engine), its end and its prompt's chain.
func turnOf(tr *proxy.Trace, sp split) slotTurn {
	t := slotTurn{id: tr.ID, held: true, ran: tr.UsageSeen && tr.PromptTokens > 0, end: engineEnd(tr), first: tr.FirstOutput, tokens: tr.PromptTokens}
	if tr.Prefix.Tracked {
		t.chain = tr.Prefix.Chain
	}
	t.start = tr.Recv
	if !tr.Admit.IsZero() {
		t.start = tr.Admit.Add(tr.Connect)
	}
	if sp.OK {
		t.start = t.start.Add(sp.Queue)
	}
	return t
}

// record takes t, recorded now, and places it and every request it was
// holding back; the placed requests due to (slotTurn.score) score the
// replays by the cost model each carries.
func (c *slotCache) record(t slotTurn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.id == 0 {
		c.place(&t) // not numbered (tests): no order to keep
		return
	}
	if c.next == 0 {
		c.next = t.id // those admitted before it and still in flight are placed when they end
	}
	if t.id < c.next {
		c.place(&t) // held back too long, or admitted before the first recorded
		return
	}
	for t.id >= c.next+reorderRing { // give up on the oldest missing ones
		c.advance()
	}
	c.ring[t.id%reorderRing] = t
	for c.ring[c.next%reorderRing].held && c.ring[c.next%reorderRing].id == c.next {
		c.advance()
	}
}

// predict is the prompt tokens of t that the best allowed replay's slot
// serves (or, when t ran before any of its slots came free, the smallest
// larger replay's where it could have: ranFirst): the replay as it stands, with the requests it holds back that
// were admitted before t placed first (on a copy), so that a turn is
// never predicted from a slot missing its conversation's previous turn
// because another request admitted before that turn is still running.
// alt is what t gets if its slot was taken first by another request: one
// still in flight, which the replay cannot know of (its prompt is read
// when it ends), or one the replay placed elsewhere (the split's start
// times decide which slots were free): the best other slot's count.
// inFlight reports that a request admitted before t had not been
// recorded: one that may have taken t's slot. Both counts 0 for a
// request the engine did not run. It changes nothing but the tokens per
// byte, learned from the pair.
func (c *slotCache) predict(t *slotTurn, b slotBounds) (cached, alt int64, inFlight bool) {
	if !t.ran {
		return 0, 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	free := freeBy(t.start)
	var view *slotReplay
	for i := c.choose(b); ; i++ {
		view, inFlight = c.viewFor(i, t)
		// Proven: the occupancy saw that many streams at once (a count of
		// one is the bound's default, not evidence).
		proven := cacheSlotCounts[i] > 1 && cacheSlotCounts[i] <= b.lo
		if i == len(cacheSlotCounts)-1 || !c.ranFirst(view, t, proven) {
			break
		}
		c.drop(view)
	}
	c.tab.begin(&t.chain)
	k := view.pickWith(&c.tab, &t.chain, free, -1)
	c.learnPerByte(view, k, t)
	cached = c.cachedFrom(view, k, t)
	alt = cached
	if len(view.slots) > 1 {
		alt = c.cachedFrom(view, view.pickWith(&c.tab, &t.chain, free, k), t)
	}
	c.drop(view)
	return cached, alt, inFlight
}

// viewFor is replay i as t's prediction reads it: as it stands unless a
// request admitted before t is held back, then a copy (up to 2 KB of
// slots and their references, so only then) with those placed first.
// inFlight reports that one admitted before t was not recorded yet. The
// caller drops the view.
func (c *slotCache) viewFor(i int, t *slotTurn) (view *slotReplay, inFlight bool) {
	r := &c.replays[i]
	if len(r.slots) == 0 {
		*r = newSlotReplay(cacheSlotCounts[i])
	}
	view = r
	if t.id == 0 || c.next == 0 {
		return view, false
	}
	for id := c.next; id < t.id && id < c.next+reorderRing; id++ {
		h := &c.ring[id%reorderRing]
		if !h.held || h.id != id {
			inFlight = true
			continue
		}
		if h.ran {
			if view == r {
				c.scratch.copyFrom(&c.tab, r)
				view = &c.scratch
			}
			c.tab.begin(&h.chain)
			view.put(&c.tab, view.pickWith(&c.tab, &h.chain, freeBy(h.start), -1), &h.chain, h.tokens, instant(h.end))
		}
	}
	return view, inFlight
}

// drop lets go of a view viewFor gave: clears the copy, if it is one.
func (c *slotCache) drop(view *slotReplay) {
	if view == &c.scratch {
		c.scratch.clear(&c.tab)
	}
}

// ranFirst reports whether t's first output came before any slot of r
// came free, with none free at its start: then r cannot be the engine
// (t ran before any of its slots was free), and the prediction moves on
// to the smallest larger replay where t could have run. The learned
// count trails the engine's in a run's first turns, when every slot
// fills at once. proven says the occupancy saw r's count of streams at
// once: then an end may come overlapTolerance past t's first output, the
// occupancy's own rule for two streams (a loaded host flushes an end and
// another's first output together, tens of milliseconds after the slot
// changed hands), less the least prefill of what t would not find cached
// in that slot (prefillFloor): t prefilled after its slot came free.
// Without the floor, against ollama on 4 slots with 3 proven, a first
// turn that had an empty slot and prefilled 663 ms, the system prompt's
// holder ending 21 ms after its first output, was credited with that
// prompt (+37% of ollama's reuse over its conversation,
// histo/testdata/ollama/agents-p4-s20run02.json). An unproven count (the
// scores chose it) is refuted by any end after the first output, less
// freeSlack, and no floor: a loaded host reads a holder's end and the
// next turn's first output at one instant, and one slot's turns were
// sent to empty slots. The split's start alone is not the test: one some
// milliseconds early, before the slot t waited for came free, would send
// a turn to an empty slot of a replay with slots to spare.
func (c *slotCache) ranFirst(r *slotReplay, t *slotTurn, proven bool) bool {
	if t.first.IsZero() || r.hi < len(r.slots) {
		return false
	}
	by := t.first.Add(-freeSlack)
	if proven {
		by = t.first.Add(overlapTolerance)
	}
	free, last := freeBy(t.start), instant(by)
	if proven {
		c.tab.begin(&t.chain) // cachedFrom's target
	}
	for k := range r.hi {
		s := &r.slots[k]
		if !s.used || s.end <= free {
			return false
		}
		floor := 0.0
		if proven {
			cached := c.cachedFrom(r, k, t)
			floor = prefillFloor(t.rs, float64(t.tokens-cached), float64(cached), false)
		}
		if s.end <= last-int64(seconds(floor)) {
			return false
		}
	}
	return true
}

// advance places the request numbered c.next, if held, and moves on.
func (c *slotCache) advance() {
	p := &c.ring[c.next%reorderRing]
	if p.held && p.id == c.next {
		t := *p
		p.held = false
		c.place(&t)
	}
	c.next++
}

// place gives t, in every replay, the slot the engine would have given
// it; scores the replays by t's prefill, if t is due; and leaves t's
// prompt in the slots.
func (c *slotCache) place(t *slotTurn) {
	if !t.ran {
		return
	}
	var picked [len(cacheSlotCounts)]int
	var cached [len(cacheSlotCounts)]int64
	c.tab.begin(&t.chain) // one target for all replays: their slots hold the same recent prompts
	free, end := freeBy(t.start), instant(t.end)
	for i := range c.replays {
		r := &c.replays[i]
		if len(r.slots) == 0 {
			*r = newSlotReplay(cacheSlotCounts[i])
		}
		picked[i] = r.pickWith(&c.tab, &t.chain, free, -1)
		cached[i] = c.cachedFrom(r, picked[i], t)
	}
	if t.score && t.tokens > 0 {
		if rs := t.rs; rs.any {
			for i := range c.replays {
				est := reference(rs, float64(t.tokens-cached[i]), float64(cached[i]))
				c.replays[i].score += (replayError(t.prefill, est) - c.replays[i].score) / scoreEvery
			}
		}
	}
	for i := range c.replays {
		c.replays[i].put(&c.tab, picked[i], &t.chain, t.tokens, end)
	}
}

// replayError is how far a prefill of t seconds denies a replay whose
// new tokens cost est by the cost model: 0 within [est/scoreSlack,
// est·scoreSlack], else the relative distance to that range, at most 1.
func replayError(t, est float64) float64 {
	if t <= 0 {
		return 0
	}
	lo, hi := est/scoreSlack, est*scoreSlack
	return min(abs(t-min(max(t, lo), hi))/t, 1)
}

// choose is the replay the evidence allows that predicts the prefills
// best, a larger count only when its score is lower by scoreMargin: with
// a hint that stands, the first replayed count at or above it; otherwise
// those at or above the learned count (the largest when it is above them
// all).
func (c *slotCache) choose(b slotBounds) int {
	lo := max(b.lo, b.exact)
	first := len(cacheSlotCounts) - 1
	for i, s := range cacheSlotCounts {
		if s >= lo {
			first = i
			break
		}
	}
	if b.exact > 0 {
		return first
	}
	best := first
	for i := first + 1; i < len(cacheSlotCounts); i++ {
		if c.replays[i].score < c.replays[best].score-scoreMargin {
			best = i
		}
	}
	return best
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// pickWith is the slot the engine gives a prompt with chain ch (the
// target tab was begun for), by ollama's rule: among the slots free then,
// the one sharing the longest prefix, the lowest-numbered among equals, a
// used one before an empty one when none shares a segment. A slot is free
// when its holder ended by the instant free (freeBy the request's start);
// when none did by the proxy's clock, the one whose holder ended first (it
// is the one the request waited for). except (-1: none) is left out: the
// request goes elsewhere when another took its slot first. It stops where
// no later slot can share more: at a slot that holds all of ch (the first
// to share that much wins), and at hi (the rest are empty).
func (r *slotReplay) pickWith(tab *chainTable, ch *prefix.Chain, free int64, except int) int {
	best, longest := -1, int64(-2)
	first := -1 // while none is free: the one whose holder ended first
	whole := ch.Tail[prefix.ChainEnds-1].Bytes
	for k := range r.hi {
		s := &r.slots[k]
		if k == except {
			continue
		}
		if s.used && s.end > free {
			if best < 0 && (first < 0 || s.end < r.slots[first].end) {
				first = k
			}
			continue
		}
		// Any prompt of the model shares its first tokens (BOS, the
		// template's) with a used slot's, so ollama's count puts every
		// used slot above an empty one (-1).
		b := int64(-1)
		if s.used {
			_, b = tab.common(s.entry, ch)
		}
		if b > longest {
			best, longest = k, b
			if b >= whole {
				break
			}
		}
	}
	if best >= 0 {
		return best
	}
	for k := r.hi; k < len(r.slots); k++ { // none free below hi: the first empty one
		if k != except {
			return k
		}
	}
	return max(first, 0)
}

// cachedFrom is the prompt tokens of t that slot k's sequence serves: its
// whole prompt when t continues it (the engine's count can be higher by
// the answer's tokens, which the next prompt repeats), all of t but one
// token when t is a prefix of it (the engine leaves one to sample), else
// t's tokens less its bytes past the common prefix at the learned tokens
// per byte (the chat template's fixed tokens stay with the shared part),
// never more than either prompt. c.tab must be begun for t's chain.
func (c *slotCache) cachedFrom(r *slotReplay, k int, t *slotTurn) int64 {
	s := &r.slots[k]
	if !s.used || t.tokens <= 0 {
		return 0
	}
	d, common := c.tab.common(s.entry, &t.chain)
	switch {
	case d == 0:
		return 0
	case d == t.chain.Depth:
		return t.tokens - 1
	case d == int(s.depth) && s.tokens > 0:
		return min(s.tokens, t.tokens-1)
	}
	tb := t.chain.Tail[prefix.ChainEnds-1].Bytes
	est := float64(t.tokens) * float64(common) / float64(max(tb, 1))
	if c.perByte > 0 {
		est = float64(t.tokens) - float64(tb-common)*c.perByte
	}
	limit := t.tokens - 1
	if s.tokens > 0 {
		limit = min(limit, s.tokens)
	}
	return min(max(int64(est+0.5), 0), limit)
}

// learnPerByte follows the tokens per byte past the common prefix of s's
// prompt and t's, smoothed, when they share one and their sizes differ
// enough to tell. c.tab must be begun for t's chain.
func (c *slotCache) learnPerByte(r *slotReplay, k int, t *slotTurn) {
	s := &r.slots[k]
	if !s.used || s.tokens <= 0 {
		return
	}
	if d, _ := c.tab.common(s.entry, &t.chain); d == 0 {
		return
	}
	db := t.chain.Tail[prefix.ChainEnds-1].Bytes - c.tab.chains[s.entry].Tail[prefix.ChainEnds-1].Bytes
	if db > -perByteApart && db < perByteApart {
		return
	}
	x := float64(t.tokens-s.tokens) / float64(db)
	switch {
	case x <= 0:
	case c.perByte == 0:
		c.perByte = x
	default:
		c.perByte += (x - c.perByte) / 16
	}
}

// chainTable holds the chains of the replays' slots, each distinct prompt
// once however many slots hold it (the fifteen replays hold the same
// recent prompts many times over), with a count of the slots that
// reference it: an entry is free again when none does. A placement
// writes the new prompt's chain once, not once per replay, and moving a
// prompt between slots copies no chain.
//
// It is also the memo of one target chain's common prefix with each
// entry (begin starts a target), so that a placement compares each
// distinct prompt once: a cell's memo is valid while its stamp is the
// table's. Not safe for concurrent use: the slot cache's mutex guards it.
type chainTable struct {
	chains []prefix.Chain
	cells  []chainCell // beside chains, index for index
	free   []uint16    // entries no slot references
	stamp  uint32
	target chainID
	same   int // an entry of the target's identity, found this stamp; -1 none
}

// chainCell is an entry's reference count and memo. The replays' 242
// slots and the prediction's copy of the largest replay (64) reference
// at most 306 entries, so 16 bits count and index them.
type chainCell struct {
	stamp  uint32
	common int32 // the segments shared with the target, at stamp
	bytes  int64 // the bytes shared, at stamp
	refs   uint16
}

// begin starts a new target chain.
func (t *chainTable) begin(ch *prefix.Chain) {
	t.stamp++
	if t.stamp == 0 { // wrapped: no cell may look current
		for i := range t.cells {
			t.cells[i].stamp = 0
		}
		t.stamp = 1
	}
	t.target, t.same = idOf(ch), -1
}

// common is prefix.Common(chain of entry e, ch), for the target ch of
// begin.
func (t *chainTable) common(e uint16, ch *prefix.Chain) (depth int, bytes int64) {
	c := &t.cells[e]
	if c.stamp == t.stamp {
		return int(c.common), c.bytes
	}
	s := &t.chains[e]
	d, b := prefix.Common(s, ch)
	c.stamp, c.common, c.bytes = t.stamp, int32(d), b
	if idOf(s) == t.target { // found while comparing: hold reuses it, writing the chain once
		t.same = int(e)
	}
	return d, b
}

// hold is an entry of chain ch with one more reference: for the target,
// one of its identity that common found or an earlier hold made; else a
// new one.
func (t *chainTable) hold(ch *prefix.Chain) uint16 {
	e := t.same
	if e < 0 || idOf(ch) != t.target {
		e = t.alloc(ch)
		if idOf(ch) == t.target {
			t.same = e
		}
	}
	t.ref(uint16(e))
	return uint16(e)
}

// ref adds a reference to entry e.
func (t *chainTable) ref(e uint16) { t.cells[e].refs++ }

// alloc is a free entry holding ch, unreferenced yet, with no memo.
func (t *chainTable) alloc(ch *prefix.Chain) int {
	var e int
	if n := len(t.free); n > 0 {
		e, t.free = int(t.free[n-1]), t.free[:n-1]
	} else {
		e = len(t.chains)
		if e > math.MaxUint16 { // bounded far below (refs are at most 306): a bug, not load
			panic("histo: slot cache chain table past 16 bits")
		}
		t.chains, t.cells = append(t.chains, prefix.Chain{}), append(t.cells, chainCell{})
	}
	t.chains[e], t.cells[e] = *ch, chainCell{}
	return e
}

// release drops a reference to entry e, freeing it with the last.
func (t *chainTable) release(e uint16) {
	if t.cells[e].refs--; t.cells[e].refs == 0 {
		t.free = append(t.free, e)
		if int(e) == t.same { // hold must not revive a freed entry
			t.same = -1
		}
	}
}
