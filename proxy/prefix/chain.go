package prefix

// ChainEnds is how many segment boundaries a Chain keeps at each end of
// a prompt.
const ChainEnds = 8

// Mark is one segment boundary of a prompt: the cumulative hash of the
// segments up to it (masked as Config says) and the canonical bytes they
// hold. It holds no text.
type Mark struct {
	Hash  uint64
	Bytes int64
}

// Chain is a prompt's prefix fingerprints at its first and last ChainEnds
// segment boundaries, for telling how much of one prompt another shares
// without keeping either (an engine's per-slot cache reuses the common
// prefix of the prompt it holds and the next one: histo's slot cache). Two
// prompts share their first d segments when their cumulative hashes at
// boundary d agree. It holds only values.
type Chain struct {
	// Head[i] is boundary i+1, for i < min(ChainEnds, Depth); Tail[i] is
	// boundary Depth−ChainEnds+1+i, for those ≥ 1: Tail[ChainEnds−1] is
	// the whole prompt.
	Head, Tail [ChainEnds]Mark
	Depth      int // the prompt's segments
}

// chainOf is the Chain of segs.
func chainOf(segs []segment) Chain {
	c := Chain{Depth: len(segs)}
	for i := range min(ChainEnds, len(segs)) {
		c.Head[i] = Mark{segs[i].cum, segs[i].total}
	}
	for i := range ChainEnds {
		if d := len(segs) - ChainEnds + 1 + i; d >= 1 {
			c.Tail[i] = Mark{segs[d-1].cum, segs[d-1].total}
		}
	}
	return c
}

// At returns boundary d (1 ≤ d ≤ Depth) when the chain keeps it.
func (c *Chain) At(d int) (Mark, bool) {
	switch {
	case d < 1 || d > c.Depth:
		return Mark{}, false
	case d <= ChainEnds:
		return c.Head[d-1], true
	case d > c.Depth-ChainEnds:
		return c.Tail[d-(c.Depth-ChainEnds+1)], true
	}
	return Mark{}, false
}

// Common is the segments and canonical bytes prompts a and b share at the
// start, as far as their chains tell: exact when they part within their
// first ChainEnds segments, or when the shorter one ends (or they part)
// within the last ChainEnds boundaries of both (a conversation's next turn
// extends its previous prompt by a few messages); otherwise a lower bound,
// the deepest boundary both chains keep and agree on. Zero for an empty
// chain.
func Common(a, b *Chain) (depth int, bytes int64) {
	if a.Depth > b.Depth {
		a, b = b, a
	}
	// a's boundaries, deepest first: its tail, then its head below it.
	for i := ChainEnds - 1; i >= 0; i-- {
		d := a.Depth - ChainEnds + 1 + i
		if d <= ChainEnds {
			break
		}
		if m, ok := b.At(d); ok && m.Hash == a.Tail[i].Hash {
			return d, m.Bytes
		}
	}
	for d := min(ChainEnds, a.Depth); d >= 1; d-- {
		if m, ok := b.At(d); ok && m.Hash == a.Head[d-1].Hash {
			return d, m.Bytes
		}
	}
	return 0, 0
}
