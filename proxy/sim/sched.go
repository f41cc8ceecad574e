package sim

import (
	"context"
	"time"
)

// slot is one of the engine's Config.Slots sequences. Server.mu guards it.
type slot struct {
	busy bool
	// resident is the block hashes of the prompt the slot's KV cache holds
	// (CacheSlot): the prompt it served last, or the part of it that was
	// prefilled before an abandoned prefill stopped.
	resident []uint64
	lastUsed uint64 // grant sequence number of its latest holder, for LRU ties
	kv       int    // KV tokens its holder reserved
}

// ticket is a request's place in admission: it waits in the FIFO queue
// until dispatch grants it a slot.
type ticket struct {
	hashes []uint64      // the prompt's block hashes, for the slot choice
	kv     int           // KV-cache tokens it reserves while it holds a slot
	ready  chan struct{} // closed when granted
	// Guarded by Server.mu:
	granted bool
	locked  bool          // it took the prefill lock with its slot (LockPrefill)
	group   *prefillGroup // the requests granted with it (SharedPrefill)
	slot    int           // valid once granted
}

// prefillGroup is the requests granted their slots in one dispatch pass
// under LockPrefill with SharedPrefill: their prefills start together and
// share the engine. Server.mu guards members and works; once done is
// closed works is read without it.
type prefillGroup struct {
	members int
	works   []time.Duration // each member's prefill alone, as they register
	done    chan struct{}   // closed when every member registered
}

// add registers one member's prefill alone (0 for a member that left
// before its prefill). The caller holds Server.mu.
func (g *prefillGroup) add(w time.Duration) {
	g.works = append(g.works, w)
	if len(g.works) == g.members {
		close(g.done)
	}
}

// shared is how long a member whose prefill alone takes w takes beside
// the others: Σ min(w_j, w) (every member gets an equal share of the
// engine until it ends). Call it once done is closed.
func (g *prefillGroup) shared(w time.Duration) time.Duration {
	var d time.Duration
	for _, x := range g.works {
		d += min(x, w)
	}
	return d
}

// enqueue puts a request with prompt block hashes in the queue and grants
// it a slot at once when one is free; false means the queue is full and the
// request must be answered 429.
func (s *Server) enqueue(hashes []uint64, kv int) (*ticket, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) >= s.cfg.MaxQueue {
		return nil, false
	}
	t := &ticket{hashes: hashes, kv: kv, ready: make(chan struct{})}
	s.queue = append(s.queue, t)
	s.dispatch()
	return t, true
}

// dispatch grants free slots to the head of the queue, in FIFO order, while
// both last. The caller holds s.mu.
func (s *Server) dispatch() {
	if s.cfg.BatchLock == LockPrefill && s.prefilling > 0 {
		return // the engine's lock is held by a prefill: no slot can be taken
	}
	var group *prefillGroup
	for len(s.queue) > 0 {
		t := s.queue[0]
		k := s.pickSlot(t.hashes)
		if k < 0 || (s.cfg.KVCacheTokens > 0 && s.kvUsed+t.kv > s.cfg.KVCacheTokens) {
			return // first come first served: nobody passes the head
		}
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.grants++
		s.slots[k].busy = true
		s.slots[k].lastUsed = s.grants
		s.slots[k].kv = t.kv
		s.kvUsed += t.kv
		s.active++
		t.granted, t.slot = true, k
		if s.cfg.BatchLock == LockPrefill {
			// Every request granted in this pass starts its prefill now,
			// together; the next waits until they all end.
			s.prefilling++
			t.locked = true
			if s.cfg.SharedPrefill {
				if group == nil {
					group = &prefillGroup{done: make(chan struct{})}
				}
				group.members++
				t.group = group
			}
		}
		close(t.ready)
	}
}

// pickSlot returns a free slot for a prompt with block hashes hs, or -1.
// With CacheSlot it is the one whose resident prompt shares the longest
// prefix with hs, the least recently used among equals (as llama.cpp's
// get_available_slot falls back to the LRU slot), or for EngineOllama the
// lowest-numbered among equals (ollama's findLongestCacheSlot keeps the
// first slot of the longest match, so a slot sharing only a system
// prompt beats an empty one); otherwise the first free one. The caller
// holds s.mu.
func (s *Server) pickSlot(hs []uint64) int {
	best, bestLen := -1, -2
	lru := s.cfg.Engine != EngineOllama
	for k := range s.slots {
		sl := &s.slots[k]
		if sl.busy {
			continue
		}
		if s.cfg.Cache != CacheSlot {
			return k
		}
		n := commonPrefix(sl.resident, hs)
		if !lru && len(sl.resident) == 0 {
			n = -1 // ollama: a used slot shares the template's first tokens at least
		}
		if n > bestLen || (lru && n == bestLen && sl.lastUsed < s.slots[best].lastUsed) {
			best, bestLen = k, n
		}
	}
	return best
}

// commonPrefix is the number of leading block hashes a and b share.
func commonPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// wait blocks until t holds a slot. If ctx ends first, t leaves the queue
// (or gives back a slot granted in the meantime) and wait returns the
// context's error.
func (s *Server) wait(ctx context.Context, t *ticket) error {
	select {
	case <-t.ready: // granted at enqueue: no wait, whatever ctx says
		return nil
	default:
	}
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if t.granted {
		if t.locked {
			t.locked = false
			s.prefilling-- // it leaves before its prefill began
		}
		if t.group != nil {
			t.group.add(0)
		}
		s.mu.Unlock()
		s.release(t.slot)
		return ctx.Err()
	}
	for i, q := range s.queue {
		if q == t {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			break
		}
	}
	s.dispatch() // the head may have left
	s.mu.Unlock()
	return ctx.Err()
}

// release frees slot k and hands free slots to the queue.
func (s *Server) release(k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots[k].busy = false
	s.kvUsed -= s.slots[k].kv
	s.active--
	s.dispatch()
}

// reuse returns how many of a prompt's promptTokens tokens, with block
// hashes hs, the cache serves on slot k, marking them used. The caller
// holds s.mu.
func (s *Server) reuse(k int, hs []uint64, promptTokens int) int {
	if s.cfg.Cache != CacheSlot {
		return s.cache.match(hs, promptTokens)
	}
	return leaveOne(commonPrefix(s.slots[k].resident, hs), s.cfg.CacheBlockTokens, promptTokens)
}

// leaveOne is the tokens of n matched blocks of blockTokens each, keeping
// at least one of promptTokens to compute: the last token's logits are
// needed to sample, which is why no engine reports a full hit.
func leaveOne(n, blockTokens, promptTokens int) int {
	for n > 0 && n*blockTokens >= promptTokens {
		n--
	}
	return n * blockTokens
}

// kvCapacity is the KV cache in tokens: Config.KVCacheTokens, or the
// prefix cache's blocks.
func (s *Server) kvCapacity() int {
	if s.cfg.KVCacheTokens > 0 {
		return s.cfg.KVCacheTokens
	}
	return s.cfg.CacheBlocks * s.cfg.CacheBlockTokens
}

// keep records that slot k now holds the prompt blocks hs (CacheSlot), or
// adds them to the shared cache. The caller holds s.mu.
func (s *Server) keep(k int, hs []uint64) {
	if s.cfg.Cache != CacheSlot {
		s.cache.insert(hs)
		return
	}
	s.slots[k].resident = hs
}
