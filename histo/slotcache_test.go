package histo

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// chainOfSegs is the Chain of a prompt whose segments have the given
// cumulative hashes, each 100 bytes.
func chainOfSegs(cum ...uint64) prefix.Chain {
	c := prefix.Chain{Depth: len(cum)}
	for i := range min(prefix.ChainEnds, len(cum)) {
		c.Head[i] = prefix.Mark{Hash: cum[i], Bytes: int64(100 * (i + 1))}
	}
	for i := range prefix.ChainEnds {
		if d := len(cum) - prefix.ChainEnds + 1 + i; d >= 1 {
			c.Tail[i] = prefix.Mark{Hash: cum[d-1], Bytes: int64(100 * d)}
		}
	}
	return c
}

// convChain is turn k of conversation conv: a shared system prompt (hash
// 1), then the conversation's own segments, two a turn.
func convChain(conv uint64, k int) prefix.Chain {
	cum := []uint64{1}
	for i := range 1 + 2*k {
		cum = append(cum, conv<<32|uint64(i+2))
	}
	return chainOfSegs(cum...)
}

// TestSlotPickOllamaRule: a request gets the free slot sharing the longest
// prefix with it, the lowest-numbered among equals (an empty slot shares
// nothing); a slot whose holder had not ended is not free; with none free
// by the proxy's clock, the one whose holder ended first.
func TestSlotPickOllamaRule(t *testing.T) {
	at := time.Unix(1000, 0)
	var tab chainTable
	r := newSlotReplay(3)
	c0, c1 := convChain(1, 0), convChain(2, 0)
	r.put(&tab, 0, &c0, 0, instant(at))
	r.put(&tab, 1, &c1, 0, instant(at))
	c2, c3 := convChain(2, 1), convChain(3, 0)
	require.Equal(t, 1, r.pick(&tab, &c2, at), "its own previous turn")
	require.Equal(t, 0, r.pick(&tab, &c3, at), "the system prompt ties: the lowest-numbered")
	r.slots[0].end = instant(at.Add(time.Second))
	require.Equal(t, 1, r.pick(&tab, &c3, at), "slot 0 is still busy")
	r.slots[1].end = instant(at.Add(time.Second / 2))
	r.put(&tab, 2, &prefix.Chain{}, 0, instant(at.Add(2*time.Second)))
	require.Equal(t, 1, r.pick(&tab, &c3, at), "none free: the first to end")
	empty := newSlotReplay(3)
	require.Equal(t, 0, empty.pick(&tab, &c3, at))
}

// TestSlotCacheCounts: the cached tokens of a turn are the previous
// prompt's when it continues it, the prompt less one when it repeats
// it, and the shared part's at the learned tokens per byte otherwise.
func TestSlotCacheCounts(t *testing.T) {
	var c slotCache
	prev, ch := newSlotReplay(2), convChain(1, 0)
	prev.put(&c.tab, 0, &ch, 200, instant(time.Time{}))
	cachedFrom := func(k int, t *slotTurn) int64 {
		c.tab.begin(&t.chain)
		return c.cachedFrom(&prev, k, t)
	}
	next := slotTurn{chain: convChain(1, 1), tokens: 420}
	require.Equal(t, int64(200), cachedFrom(0, &next))
	same := slotTurn{chain: convChain(1, 0), tokens: 200}
	require.Equal(t, int64(199), cachedFrom(0, &same))
	other := slotTurn{chain: convChain(2, 1), tokens: 430}
	// No tokens per byte yet: the bytes' share (100 of 400 bytes).
	require.Equal(t, int64(108), cachedFrom(0, &other))
	c.tab.begin(&next.chain)
	c.learnPerByte(&prev, 0, &next) // 220 tokens over 200 bytes
	require.InDelta(t, 1.1, c.perByte, 1e-9)
	c.tab.begin(&other.chain)
	for range 2 { // computed, then from the memo
		require.Equal(t, int64(430-330), c.cachedFrom(&prev, 0, &other))
	}
	require.Zero(t, cachedFrom(1, &other), "an empty slot")
}

// feedSlots is Record's use of the slot cache for t: the cost model
// learns its prefill at the predicted new tokens, then t is recorded
// (placed in admission order, scoring the replays).
func feedSlots(c *slotCache, m *rateModel, t slotTurn, b slotBounds) {
	pred, _, _ := c.predict(&t, b)
	rs := m.read()
	m.learnSample(float64(t.tokens-pred), float64(pred), t.prefill, rs)
	t.score, t.rs = true, rs
	c.record(t)
}

// TestSlotCacheLearnsSlotCount: three conversations take turns on an
// engine with three slots, each turn starting while the other two
// conversations' run, so that each keeps its own slot; the occupancy has
// proven one slot only. The replays with fewer than three slots predict
// misses that the prefill times deny, so the three-slot replay is chosen
// and the cost model learns the true new tokens: its cold rate comes out
// exact. Requests are recorded out of their admission order, and a turn
// is predicted from its conversation's previous one even while that is
// still held back.
func TestSlotCacheLearnsSlotCount(t *testing.T) {
	var c slotCache
	var m rateModel
	const perToken = 1e-4
	at := time.Unix(1000, 0)
	id := uint64(1)
	tokens := func(k int) int64 { return 600 + 220*int64(k) }
	var held []slotTurn
	b := slotBounds{lo: 1}
	for k := range 8 {
		for conv := uint64(1); conv <= 3; conv++ {
			n := tokens(k)
			if k > 0 {
				n -= tokens(k - 1)
			}
			tt := slotTurn{id: id, held: true, ran: true, start: at, end: at.Add(25 * time.Millisecond),
				chain: convChain(conv, k), tokens: tokens(k), prefill: perToken * float64(n)}
			id++
			at = at.Add(10 * time.Millisecond)
			if conv == 2 { // recorded after the next one
				held = append(held, tt)
				continue
			}
			feedSlots(&c, &m, tt, b)
			for _, h := range held {
				feedSlots(&c, &m, h, b)
			}
			held = held[:0]
		}
	}
	require.Equal(t, 3, cacheSlotCounts[c.choose(b)])
	rate, ok := m.rate()
	require.True(t, ok)
	require.InDelta(t, 1/perToken, rate, 0.02/perToken)
	next := slotTurn{ran: true, start: at, chain: convChain(1, 8), tokens: tokens(8)}
	require.Equal(t, tokens(7), first(c.predict(&next, b)))
	// With a hint of one slot that stands, the one-slot replay: its slot
	// holds conversation 3's turn, which shares the system prompt only.
	require.Less(t, first(c.predict(&next, slotBounds{lo: 1, exact: 1})), tokens(0))

	// A turn whose previous one is held back (a request admitted before
	// it has not ended) is predicted from it all the same.

	c.record(slotTurn{id: id + 1, held: true, ran: true, start: at, end: at.Add(time.Millisecond), chain: convChain(1, 8), tokens: tokens(8)})

	after := slotTurn{id: id + 2, ran: true, start: at.Add(time.Second), chain: convChain(1, 9), tokens: tokens(9)}
	require.Equal(t, tokens(8), first(c.predict(&after, b)), "id %d is missing: %d is held", id, id+1)
}

func first(cached, _ int64, _ bool) int64 { return cached }

// BenchmarkSlotCache is Record's slot cache work for one request on a
// per-slot engine: the prediction (the held requests placed first, on a
// copy of the chosen replay) and the placement in every replay, with
// every slot holding a conversation.
func BenchmarkSlotCache(b *testing.B) {
	benchSlotCache(b, slotBounds{lo: 4}, 0,
		func(i int) prefix.Chain { return convChain(uint64(i%80), i/80) },
		func(i int) prefix.Chain { return convChain(uint64(i%80), 4+i/80) })
}

// BenchmarkSlotCacheDistinct is the non-stream bench's shape: every
// prompt distinct, so no pick stops early, and a learned count of 64 (64
// clients at once), so the prediction reads the 64-slot replay.
func BenchmarkSlotCacheDistinct(b *testing.B) {
	benchSlotCache(b, slotBounds{lo: 64}, 0,
		func(i int) prefix.Chain { return convChain(uint64(i), 1) },
		func(i int) prefix.Chain { return convChain(uint64(1000+i), 1) })
}

// BenchmarkSlotCacheBusy is the two above's requests under load: each
// starts while the 63 before it run (1 ms apart, 64 ms long), so the
// replays' slots are all used and nearly all busy, and a pick reads
// every slot (in BenchmarkSlotCache and BenchmarkSlotCacheDistinct every
// slot is free at every start, and the replays hold one used slot: a
// prompt that shares the system prompt only goes to the lowest-numbered).
// Distinct prompts, and 80 conversations taking turns.
func BenchmarkSlotCacheBusy(b *testing.B) {
	b.Run("distinct", func(b *testing.B) {
		benchSlotCache(b, slotBounds{lo: 64}, 64,
			func(i int) prefix.Chain { return convChain(uint64(i), 1) },
			func(i int) prefix.Chain { return convChain(uint64(1000+i), 1) })
	})
	b.Run("conversations", func(b *testing.B) {
		benchSlotCache(b, slotBounds{lo: 4}, 64,
			func(i int) prefix.Chain { return convChain(uint64(i%80), i/80) },
			func(i int) prefix.Chain { return convChain(uint64(i%80), 4+i/80) })
	})
}

// benchSlotCache fills a slot cache with 256 requests of the prompts seed
// gives, then predicts and records one per op, cycling through 640 of
// next's. Each request starts 1 ms after the previous one and lasts
// inFlight ms (0: all start and end at once).
func benchSlotCache(b *testing.B, bounds slotBounds, inFlight int, seed, next func(int) prefix.Chain) {
	var c slotCache
	at := time.Unix(1000, 0)
	when := func(i int) (start, end time.Time) {
		if inFlight == 0 {
			return at, at
		}
		start = at.Add(time.Duration(i) * time.Millisecond)
		return start, start.Add(time.Duration(inFlight) * time.Millisecond)
	}
	for i := range 256 {
		start, end := when(i)
		c.record(slotTurn{id: uint64(i + 1), held: true, ran: true, start: start, end: end, chain: seed(i), tokens: 800})
	}
	chains := make([]prefix.Chain, 80*8)
	for i := range chains {
		chains[i] = next(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start, end := when(256 + i)
		t := slotTurn{id: uint64(257 + i), held: true, ran: true, start: start, end: end,
			chain: chains[i%len(chains)], tokens: 800}
		c.predict(&t, bounds)
		c.record(t)
	}
}

// pickByRule is ollama's rule as TestSlotPickOllamaRule states it, over
// every slot: the reference for pickWith's memo and early stops.
func pickByRule(tab *chainTable, r *slotReplay, ch *prefix.Chain, start time.Time, except int) int {
	best, longest := -1, int64(-2)
	for k, s := range r.slots {
		if k == except || s.used && s.end > instant(start.Add(freeSlack)) {
			continue
		}
		b := int64(-1)
		if s.used {
			_, b = prefix.Common(&tab.chains[s.entry], ch)
		}
		if b > longest {
			best, longest = k, b
		}
	}
	if best >= 0 {
		return best
	}
	for k, s := range r.slots {
		if k != except && (best < 0 || s.end < r.slots[best].end) {
			best = k
		}
	}
	return max(best, 0)
}

// TestSlotPickMemo: a pick through the memo, stopping at a slot that
// holds the whole prompt or at the last used slot, is the pick by the
// rule over every slot, for slots holding repeated and distinct prompts
// of several conversations, busy, free and empty (some between used
// ones), and for each replay of one placement in turn (the memo begun
// once for them all, as place does); and a table whose stamp wrapped
// holds no stale memo.
func TestSlotPickMemo(t *testing.T) {
	at := time.Unix(1000, 0)
	var tab chainTable
	replays := make([]slotReplay, len(cacheSlotCounts))
	for i, n := range cacheSlotCounts {
		replays[i] = newSlotReplay(n)
		for k := range n - n/5 { // some left empty
			if k%7 == 3 {
				continue // an empty slot below a used one
			}
			ch := convChain(uint64((i+k)%7), (i*k)%5)
			replays[i].put(&tab, k, &ch, 0, instant(at.Add(time.Duration((i*31+k*17)%9-4)*time.Millisecond)))
		}
	}
	for conv := range uint64(8) {
		for turn := range 6 {
			ch := convChain(conv, turn)
			tab.begin(&ch)
			for i := range replays {
				for _, except := range []int{-1, 0, 3} {
					want := pickByRule(&tab, &replays[i], &ch, at, except)
					require.Equal(t, want, replays[i].pickWith(&tab, &ch, freeBy(at), except), "replay %d, conversation %d turn %d", i, conv, turn)
				}
			}
		}
	}
	// A memo of stamp 1 (another target's) must not be current after the
	// stamp wraps back to 1.
	s, a, b := convChain(1, 4), convChain(1, 4), convChain(2, 4)
	ad, _ := prefix.Common(&s, &a)
	bd, _ := prefix.Common(&s, &b)
	require.NotEqual(t, ad, bd, "the two targets must share different depths with s")
	tab = chainTable{}
	r := newSlotReplay(1)
	r.put(&tab, 0, &s, 0, instant(at))
	tab.begin(&a)
	tab.common(r.slots[0].entry, &a)
	tab.stamp = ^uint32(0)
	tab.begin(&b)
	require.Equal(t, uint32(1), tab.stamp)
	got, _ := tab.common(r.slots[0].entry, &b)
	require.Equal(t, bd, got, "a stale memo survived the stamp's wrap")
}

// pick is pickWith for a prompt starting at start, with ch begun as
// tab's target: the tests' entry point.
func (r *slotReplay) pick(tab *chainTable, ch *prefix.Chain, start time.Time) int {
	tab.begin(ch)
	return r.pickWith(tab, ch, freeBy(start), -1)
}

// refCache is the slot cache as it was before its chain table (session
// 11), frozen on purpose (it must not follow later edits of slotcache.go
// but for changes of the rules: the replay a prediction reads, session
// 19's ranFirst and scoreMargin, session 20's prefill floor in ranFirst):
// each slot holding its chain inline, every pick comparing the target
// with every free slot (pickByRule's loop), every count comparing again.
// It is the reference TestSlotCacheEquivalent holds slotCache to: the
// same picks, counts, scores and tokens per byte, in the same order.
type refCache struct {
	replays [len(cacheSlotCounts)]refReplay
	next    uint64
	ring    [reorderRing]slotTurn
	perByte float64
}

// refSlot is a refCache slot: its chain inline.
type refSlot struct {
	used   bool
	chain  prefix.Chain
	tokens int64
	end    time.Time
}

type refReplay struct {
	slots []refSlot
	score float64
}

func (r *refReplay) put(k int, t *slotTurn) {
	r.slots[k] = refSlot{used: true, chain: t.chain, tokens: t.tokens, end: t.end}
}

func (r *refReplay) pick(ch *prefix.Chain, start time.Time, except int) int {
	best, longest := -1, int64(-2)
	for k, s := range r.slots {
		if k == except || s.used && s.end.After(start.Add(freeSlack)) {
			continue
		}
		_, b := prefix.Common(&s.chain, ch)
		if !s.used {
			b = -1
		}
		if b > longest {
			best, longest = k, b
		}
	}
	if best >= 0 {
		return best
	}
	for k, s := range r.slots {
		if k != except && (best < 0 || s.end.Before(r.slots[best].end)) {
			best = k
		}
	}
	return max(best, 0)
}

func (c *refCache) replay(i int) *refReplay {
	if r := &c.replays[i]; len(r.slots) == 0 {
		r.slots = make([]refSlot, cacheSlotCounts[i])
	}
	return &c.replays[i]
}

func (c *refCache) record(t slotTurn) {
	switch {
	case t.id == 0:
		c.place(&t)
		return
	case c.next == 0:
		c.next = t.id
	}
	if t.id < c.next {
		c.place(&t)
		return
	}
	for t.id >= c.next+reorderRing {
		c.advance()
	}
	c.ring[t.id%reorderRing] = t
	for c.ring[c.next%reorderRing].held && c.ring[c.next%reorderRing].id == c.next {
		c.advance()
	}
}

func (c *refCache) advance() {
	if p := &c.ring[c.next%reorderRing]; p.held && p.id == c.next {
		t := *p
		p.held = false
		c.place(&t)
	}
	c.next++
}

func (c *refCache) place(t *slotTurn) {
	if !t.ran {
		return
	}
	var picked [len(cacheSlotCounts)]int
	var cached [len(cacheSlotCounts)]int64
	for i := range c.replays {
		r := c.replay(i)
		picked[i] = r.pick(&t.chain, t.start, -1)
		cached[i] = c.cachedFrom(r, picked[i], t)
	}
	if t.score && t.tokens > 0 && t.rs.any {
		for i := range c.replays {
			est := reference(t.rs, float64(t.tokens-cached[i]), float64(cached[i]))
			c.replays[i].score += (replayError(t.prefill, est) - c.replays[i].score) / scoreEvery
		}
	}
	for i := range c.replays {
		c.replays[i].put(picked[i], t)
	}
}

func (c *refCache) predict(t *slotTurn, b slotBounds) (cached, alt int64, inFlight bool) {
	if !t.ran {
		return 0, 0, false
	}
	var view *refReplay
	for i := c.choose(b); ; i++ {
		view, inFlight = c.view(i, t)
		if i == len(cacheSlotCounts)-1 || !c.ranFirst(view, t, cacheSlotCounts[i] > 1 && cacheSlotCounts[i] <= b.lo) {
			break
		}
	}
	k := view.pick(&t.chain, t.start, -1)
	c.learnPerByte(view, k, t)
	cached = c.cachedFrom(view, k, t)
	alt = cached
	if len(view.slots) > 1 {
		alt = c.cachedFrom(view, view.pick(&t.chain, t.start, k), t)
	}
	return cached, alt, inFlight
}

func (c *refCache) view(i int, t *slotTurn) (view *refReplay, inFlight bool) {
	r := c.replay(i)
	view = r
	if t.id != 0 && c.next != 0 {
		for id := c.next; id < t.id && id < c.next+reorderRing; id++ {
			h := &c.ring[id%reorderRing]
			if !h.held || h.id != id {
				inFlight = true
				continue
			}
			if h.ran {
				if view == r {
					view = &refReplay{slots: slices.Clone(r.slots)}
				}
				view.put(view.pick(&h.chain, h.start, -1), h)
			}
		}
	}
	return view, inFlight
}

func (c *refCache) ranFirst(r *refReplay, t *slotTurn, proven bool) bool {
	if t.first.IsZero() {
		return false
	}
	by := t.first.Add(-freeSlack)
	if proven {
		by = t.first.Add(overlapTolerance)
	}
	for k, s := range r.slots {
		if !s.used || !s.end.After(t.start.Add(freeSlack)) {
			return false
		}
		if proven {
			cached := c.cachedFrom(r, k, t)
			if !s.end.After(by.Add(-seconds(prefillFloor(t.rs, float64(t.tokens-cached), float64(cached), false)))) {
				return false
			}
		} else if !s.end.After(by) {
			return false
		}
	}
	return true
}

func (c *refCache) choose(b slotBounds) int {
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

func (c *refCache) cachedFrom(r *refReplay, k int, t *slotTurn) int64 {
	s := &r.slots[k]
	if !s.used || t.tokens <= 0 {
		return 0
	}
	d, common := prefix.Common(&s.chain, &t.chain)
	switch {
	case d == 0:
		return 0
	case d == t.chain.Depth:
		return t.tokens - 1
	case d == s.chain.Depth && s.tokens > 0:
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

func (c *refCache) learnPerByte(r *refReplay, k int, t *slotTurn) {
	s := &r.slots[k]
	if !s.used || s.tokens <= 0 {
		return
	}
	if d, _ := prefix.Common(&s.chain, &t.chain); d == 0 {
		return
	}
	db := t.chain.Tail[prefix.ChainEnds-1].Bytes - s.chain.Tail[prefix.ChainEnds-1].Bytes
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

// chainOfMarks is the Chain of a prompt whose segment boundaries are
// marks.
func chainOfMarks(marks []prefix.Mark) prefix.Chain {
	c := prefix.Chain{Depth: len(marks)}
	for i := range min(prefix.ChainEnds, len(marks)) {
		c.Head[i] = marks[i]
	}
	for i := range prefix.ChainEnds {
		if d := len(marks) - prefix.ChainEnds + 1 + i; d >= 1 {
			c.Tail[i] = marks[d-1]
		}
	}
	return c
}

// convGen makes random conversations as a slot cache sees them: a few
// system prompts, conversations that grow by a message or two, repeat a
// prompt (a retry), regenerate their last message, branch off another's
// history, and start afresh; long ones pass ChainEnds segments at both
// ends, so that chains tell only a lower bound. Each segment's mark is
// random, so equal marks are equal prefixes.
type convGen struct {
	rng        *rand.Rand
	sys, convs [][]prefix.Mark
}

func (g *convGen) segment(prev []prefix.Mark) []prefix.Mark {
	var last int64
	if len(prev) > 0 {
		last = prev[len(prev)-1].Bytes
	}
	return append(slices.Clip(prev), prefix.Mark{Hash: g.rng.Uint64(), Bytes: last + 1 + g.rng.Int64N(400)})
}

// next is the marks of the next prompt.
func (g *convGen) next() []prefix.Mark {
	if len(g.sys) == 0 {
		for range 3 { // system prompts, some of two segments
			sys := g.segment(nil)
			if g.rng.IntN(2) == 0 {
				sys = g.segment(sys)
			}
			g.sys = append(g.sys, sys)
		}
		g.convs = append(g.convs, g.segment(g.sys[0]))
	}
	i := g.rng.IntN(len(g.convs))
	c := g.convs[i]
	switch p := g.rng.IntN(100); {
	case p < 10: // a new conversation on one of the system prompts
		c = g.segment(g.sys[g.rng.IntN(len(g.sys))])
		g.convs = append(g.convs, c)
		return c
	case p < 20: // branched off another's history
		c = g.segment(c[:1+g.rng.IntN(len(c))])
		g.convs = append(g.convs, c)
		return c
	case p < 35: // the same prompt again
	case p < 45 && len(c) > 2: // its last message regenerated
		c = g.segment(c[:len(c)-1])
	case len(c) > 40: // too long: it ends, a new one begins
		c = g.segment(c[:1])
	default: // the next turn: one or two messages more
		c = g.segment(c)
		if g.rng.IntN(2) == 0 {
			c = g.segment(c)
		}
	}
	g.convs[i] = c
	return c
}

// TestSlotCacheEquivalent: slotCache (the chain table, the memo, the early
// stops) predicts and places exactly as refCache, the algorithm before
// them, over random conversations that branch, repeat and switch slots
// (requests overlapping, so that slots are busy), recorded out of their
// admission order, some never, some unnumbered, some not run by the
// engine, with the bounds varying, on the wall clock and the monotonic: every prediction equal, and after
// every fourth record the replays' slots, scores and the tokens per byte
// equal.
// The chain table's references are the slots' and the prediction's copy
// holds none after it.
func TestSlotCacheEquivalent(t *testing.T) {
	for seed := range uint64(12) {
		var c slotCache
		var ref refCache
		g := convGen{rng: rand.New(rand.NewPCG(seed, 1))}
		rng := g.rng
		rs := rates{any: true, fit: costFit{typical: 1e-4, fastest: 1e-4}}
		at := time.Unix(1000, 0)
		if seed%2 == 1 {
			at = time.Now() // stamps with monotonic readings, as the proxy's
		}
		id := uint64(0)
		var pending []slotTurn
		for op := range 1500 {
			at = at.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
			id++
			marks := g.next()
			tt := slotTurn{id: id, held: true, ran: rng.IntN(20) > 0, start: at,
				end:   at.Add(time.Duration(rng.IntN(3000)) * time.Millisecond),
				first: at.Add(time.Duration(rng.IntN(400)) * time.Millisecond),
				chain: chainOfMarks(marks), tokens: marks[len(marks)-1].Bytes/4 + rng.Int64N(30) - 5}
			switch rng.IntN(40) {
			case 0:
				continue // never recorded
			case 1:
				tt.id = 0
			case 2:
				tt.tokens = 0
			}
			pending = append(pending, tt)
			if rng.IntN(4) == 0 && op < 1499 {
				continue
			}
			// Record some pending turns, in a random order.
			rng.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
			n := 1 + rng.IntN(len(pending))
			for _, p := range pending[:n] {
				b := slotBounds{lo: 1 + rng.IntN(70)}
				if rng.IntN(5) == 0 {
					b.exact = b.lo
				}
				if rng.IntN(10) == 0 {
					rs.ready, rs.fit = true, costFit{t0: 0.01, a: 1e-4 * (1 + rng.Float64()), b: 1e-9, fastest: 1e-4 * rng.Float64()}
				}
				p.rs = rs // as Record sets it: ranFirst reads it
				got0, got1, got2 := c.predict(&p, b)
				want0, want1, want2 := ref.predict(&p, b)
				require.Equal(t, [3]any{want0, want1, want2}, [3]any{got0, got1, got2}, "seed %d op %d: predict", seed, op)
				p.score, p.prefill = rng.IntN(3) > 0, reference(rs, float64(p.tokens-got0), float64(got0))*(0.5+rng.Float64())
				c.record(p)
				ref.record(p)
				if op%4 == 0 { // the predictions compare the rest
					requireSameCache(t, &c, &ref, "seed %d op %d", seed, op)
				}
			}
			pending = slices.Delete(pending, 0, n)
		}
		requireSameCache(t, &c, &ref, "seed %d, the end", seed)
	}
}

// requireSameCache fails unless c and ref hold the same slots, scores and
// tokens per byte, and c's chain table counts exactly its slots'
// references. (Compared directly: require's reflection over 242 slots
// after every record took most of a minute.)
func requireSameCache(t *testing.T, c *slotCache, ref *refCache, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	require.True(t, ref.next == c.next && ref.perByte == c.perByte, msg)
	refs := make([]int, len(c.tab.chains))
	for i := range c.replays {
		r, w := &c.replays[i], &ref.replays[i]
		require.True(t, w.score == r.score && len(w.slots) == len(r.slots), msg)
		for k, s := range r.slots {
			ws := &w.slots[k]
			if !s.used {
				require.False(t, ws.used, msg)
				continue
			}
			same := ws.used && k < r.hi && ws.chain == c.tab.chains[s.entry] && idOf(&ws.chain) == s.id() &&
				ws.tokens == s.tokens && instant(ws.end) == s.end
			require.True(t, same, "replay %d slot %d: %s", i, k, msg)
			refs[s.entry]++
		}
	}
	require.Empty(t, c.scratch.slots, msg)
	free := 0
	for e, n := range refs {
		require.Equal(t, n, int(c.tab.cells[e].refs), msg)
		if n == 0 {
			free++
		}
	}
	require.Len(t, c.tab.free, free, msg)
}
