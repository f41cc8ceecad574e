package histo

import (
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
	r := newSlotReplay(3)
	c0, c1 := convChain(1, 0), convChain(2, 0)
	r.put(0, &c0, 0, at)
	r.put(1, &c1, 0, at)
	c2, c3 := convChain(2, 1), convChain(3, 0)
	require.Equal(t, 1, r.pick(&c2, at), "its own previous turn")
	require.Equal(t, 0, r.pick(&c3, at), "the system prompt ties: the lowest-numbered")
	r.slots[0].end = at.Add(time.Second)
	require.Equal(t, 1, r.pick(&c3, at), "slot 0 is still busy")
	r.slots[1].end = at.Add(time.Second / 2)
	r.put(2, &prefix.Chain{}, 0, at.Add(2*time.Second))
	require.Equal(t, 1, r.pick(&c3, at), "none free: the first to end")
	empty := newSlotReplay(3)
	require.Equal(t, 0, empty.pick(&c3, at))
}

// TestSlotCacheCounts: the cached tokens of a turn are the previous
// prompt's when it continues it, the prompt less one when it repeats
// it, and the shared part's at the learned tokens per byte otherwise.
func TestSlotCacheCounts(t *testing.T) {
	var c slotCache
	prev, ch := newSlotReplay(2), convChain(1, 0)
	prev.put(0, &ch, 200, time.Time{})
	next := slotTurn{chain: convChain(1, 1), tokens: 420}
	require.Equal(t, int64(200), c.cachedFrom(&prev, 0, &next, nil))
	same := slotTurn{chain: convChain(1, 0), tokens: 200}
	require.Equal(t, int64(199), c.cachedFrom(&prev, 0, &same, nil))
	other := slotTurn{chain: convChain(2, 1), tokens: 430}
	// No tokens per byte yet: the bytes' share (100 of 400 bytes).
	require.Equal(t, int64(108), c.cachedFrom(&prev, 0, &other, nil))
	c.learnPerByte(&prev, 0, &next) // 220 tokens over 200 bytes
	require.InDelta(t, 1.1, c.perByte, 1e-9)
	require.Equal(t, int64(430-330), c.cachedFrom(&prev, 0, &other, nil))
	var m commonMemo
	m.begin()
	for range 2 { // computed, then from the memo
		require.Equal(t, int64(430-330), c.cachedFrom(&prev, 0, &other, &m))
	}
	require.Zero(t, c.cachedFrom(&prev, 1, &other, nil), "an empty slot")
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
	benchSlotCache(b, slotBounds{lo: 4},
		func(i int) prefix.Chain { return convChain(uint64(i%80), i/80) },
		func(i int) prefix.Chain { return convChain(uint64(i%80), 4+i/80) })
}

// BenchmarkSlotCacheDistinct is the non-stream bench's shape: every
// prompt distinct, so no pick stops early, and a learned count of 64 (64
// clients at once), so the prediction reads the 64-slot replay.
func BenchmarkSlotCacheDistinct(b *testing.B) {
	benchSlotCache(b, slotBounds{lo: 64},
		func(i int) prefix.Chain { return convChain(uint64(i), 1) },
		func(i int) prefix.Chain { return convChain(uint64(1000+i), 1) })
}

// benchSlotCache fills a slot cache with 256 requests of the prompts seed
// gives, then predicts and records one per op, cycling through 640 of
// next's.
func benchSlotCache(b *testing.B, bounds slotBounds, seed, next func(int) prefix.Chain) {
	var c slotCache
	at := time.Unix(1000, 0)
	for i := range 256 {
		c.record(slotTurn{id: uint64(i + 1), held: true, ran: true, start: at, end: at, chain: seed(i), tokens: 800})
	}
	chains := make([]prefix.Chain, 80*8)
	for i := range chains {
		chains[i] = next(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t := slotTurn{id: uint64(257 + i), held: true, ran: true, start: at, end: at,
			chain: chains[i%len(chains)], tokens: 800}
		c.predict(&t, bounds)
		c.record(t)
	}
}

// pickByRule is ollama's rule as TestSlotPickOllamaRule states it, over
// every slot: the reference for pickWith's memo and early stop.
func pickByRule(r *slotReplay, ch *prefix.Chain, start time.Time, except int) int {
	best, longest := -1, int64(-2)
	for k, s := range r.slots {
		if k == except || s.used && s.end.After(start.Add(freeSlack)) {
			continue
		}
		_, b := prefix.Common(&r.chains[k], ch)
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

// TestSlotPickMemo: a pick through the memo, stopping at a slot that
// holds the whole prompt, is the pick by the rule over every slot, for
// slots holding repeated and distinct prompts of several conversations,
// busy and free, and for each replay of one placement in turn (the
// memo begun once for them all, as place does); and a memo whose stamp
// wrapped holds no stale entry.
func TestSlotPickMemo(t *testing.T) {
	at := time.Unix(1000, 0)
	var m commonMemo
	replays := make([]slotReplay, len(cacheSlotCounts))
	for i, n := range cacheSlotCounts {
		replays[i] = newSlotReplay(n)
		for k := range n - n/5 { // some left empty
			ch := convChain(uint64((i+k)%7), (i*k)%5)
			replays[i].put(k, &ch, 0, at.Add(time.Duration((i*31+k*17)%9-4)*time.Millisecond))
		}
	}
	for conv := range uint64(8) {
		for turn := range 6 {
			ch := convChain(conv, turn)
			m.begin()
			for i := range replays {
				for _, except := range []int{-1, 0} {
					want := pickByRule(&replays[i], &ch, at, except)
					require.Equal(t, want, replays[i].pickWith(&ch, at, except, nil), "replay %d, conversation %d turn %d", i, conv, turn)
					require.Equal(t, want, replays[i].pickWith(&ch, at, except, &m), "replay %d, conversation %d turn %d, memo", i, conv, turn)
				}
			}
		}
	}
	// An entry of stamp 1 (another target's) must not be current after the
	// stamp wraps back to 1.
	s, a, b := convChain(1, 4), convChain(1, 4), convChain(2, 4)
	ad, _ := prefix.Common(&s, &a)
	bd, _ := prefix.Common(&s, &b)
	require.NotEqual(t, ad, bd, "the two targets must share different depths with s")
	m = commonMemo{}
	m.begin()
	m.common(idOf(&s), &s, &a)
	m.stamp = ^uint32(0)
	m.begin()
	require.Equal(t, uint32(1), m.stamp)
	got, _ := m.common(idOf(&s), &s, &b)
	require.Equal(t, bd, got, "a stale entry survived the stamp's wrap")
}
