package sim

import (
	"container/list"
	"encoding/binary"
	"hash/maphash"
)

// prefixCache models a block prefix cache such as vLLM's automatic prefix
// caching: the prompt is cut into fixed-size blocks, each identified by a
// hash chained over all blocks before it, so a block matches only if the
// whole prefix up to it matches. An edit early in the prompt therefore
// misses from the edit on, while an append-only conversation keeps hitting.
//
// A prefixCache is not safe for concurrent use, except hashes, which reads
// only immutable fields; Server.mu guards the rest.
type prefixCache struct {
	seed        maphash.Seed
	blockTokens int
	blockBytes  int
	capacity    int

	lru   *list.List // of uint64 block hashes, most recently used first
	index map[uint64]*list.Element
}

func newPrefixCache(blockTokens, bytesPerToken, capacity int) *prefixCache {
	return &prefixCache{
		seed:        maphash.MakeSeed(),
		blockTokens: blockTokens,
		blockBytes:  blockTokens * bytesPerToken,
		capacity:    capacity,
		lru:         list.New(),
		index:       make(map[uint64]*list.Element),
	}
}

// hashes returns the chained hashes of the prompt's full blocks; a trailing
// partial block is never cached, as in vLLM.
func (c *prefixCache) hashes(prompt string) []uint64 {
	n := len(prompt) / c.blockBytes
	if n == 0 {
		return nil
	}
	hs := make([]uint64, n)
	var h maphash.Hash
	h.SetSeed(c.seed)
	var prev [8]byte
	for i := range hs {
		h.Reset()
		h.Write(prev[:])
		h.WriteString(prompt[i*c.blockBytes : (i+1)*c.blockBytes])
		hs[i] = h.Sum64()
		binary.LittleEndian.PutUint64(prev[:], hs[i])
	}
	return hs
}

// match returns the cached tokens for a prompt of promptTokens tokens with
// block hashes hs: the tokens of the longest run of leading blocks present,
// always leaving at least one token to compute (the last token's logits are
// needed to sample, which is why vLLM never reports a full hit). Matched
// blocks become most recently used.
func (c *prefixCache) match(hs []uint64, promptTokens int) int {
	n := 0
	for n < len(hs) && c.index[hs[n]] != nil {
		n++
	}
	cached := leaveOne(n, c.blockTokens, promptTokens)
	c.touch(hs[:cached/c.blockTokens])
	return cached
}

// insert adds blocks after a prefill, evicting the least recently used.
func (c *prefixCache) insert(hs []uint64) {
	c.touch(hs)
	for c.lru.Len() > c.capacity {
		delete(c.index, c.lru.Remove(c.lru.Back()).(uint64))
	}
}

// touch makes hs most recently used, in reverse so that a prompt's first
// block ends up most recent: the tail of a prefix is evicted before its head
// (vLLM frees a request's blocks in reverse order for the same reason), so
// eviction shortens a cached prefix instead of breaking its chain at the root.
func (c *prefixCache) touch(hs []uint64) {
	for i := len(hs) - 1; i >= 0; i-- {
		if e := c.index[hs[i]]; e != nil {
			c.lru.MoveToFront(e)
			continue
		}
		c.index[hs[i]] = c.lru.PushFront(hs[i])
	}
}
