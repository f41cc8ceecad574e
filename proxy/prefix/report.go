package prefix

import "time"

// count updates the counters and the drift ring for res. Called with the
// lock held.
func (t *Tracker) count(res *Result, at time.Time) {
	s := &t.stats
	s.Tracked++
	s.PromptBytes += uint64(res.PromptBytes)
	res.ReusableBytes = min(res.ReusableBytes, res.PromptBytes)
	s.ReusableBytes += uint64(res.ReusableBytes)
	res.ReusableTokensEst = res.ReusableBytes / int64(t.cfg.BytesPerToken)
	res.Reuse = -1
	if res.PromptBytes > 0 {
		res.Reuse = float64(res.ReusableBytes) / float64(res.PromptBytes)
	}
	if res.Masked {
		s.MaskedDrifts++
	}
	if !res.Drift.Happened {
		return
	}
	s.Drifts[res.Drift.Segment][res.Drift.Class]++
	t.ring[t.ringNext] = DriftEvent{At: at, ConversationID: res.ConversationID, Turn: res.Turn, Drift: res.Drift}
	t.ringNext = (t.ringNext + 1) % ringSize
	t.ringLen = min(t.ringLen+1, ringSize)
}

// Cache compares the reuse Observe expected with the engine's: call it once
// the response's usage is known, with the prompt tokens and the cached
// (prefix-hit) tokens the engine reported. Call it only when the engine
// reported a cached count at all: vLLM sends one only with
// --enable-prompt-tokens-details and SGLang with --enable-cache-report, and
// an absent count is not zero. It sets r.ExpectedCachedTokens and
// r.MissDespiteReuse: the prefix was stable, yet the engine cached less
// than half of the expected tokens, short by at least 256 (eviction, or a
// shared prefix shorter than the engine's block). Drifts are counted
// apart, by Observe; a Masked request is never a miss despite reuse, since
// its raw prompt did change. Cache is safe for concurrent use, but r must
// not be shared.
func (t *Tracker) Cache(r *Result, promptTokens, cachedTokens int64) {
	if r == nil || !r.Tracked || r.CacheChecked || r.Reuse < 0 || promptTokens <= 0 || cachedTokens < 0 {
		return
	}
	expected := int64(r.Reuse*float64(promptTokens) + 0.5)
	r.CacheChecked = true
	r.ExpectedCachedTokens = expected
	r.MissDespiteReuse = !r.Masked && expected-cachedTokens >= missMinTokens && 2*cachedTokens < expected
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats.CacheChecked++
	t.stats.ExpectedCachedTokens += expected
	t.stats.EngineCachedTokens += cachedTokens
	if r.MissDespiteReuse {
		t.stats.MissDespiteReuse++
	}
}

// RecentDrifts returns up to n of the most recent drift events, newest
// first (all kept ones, at most 256, if n <= 0). The slice is the caller's.
func (t *Tracker) RecentDrifts(n int) []DriftEvent {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n <= 0 || n > t.ringLen {
		n = t.ringLen
	}
	out := make([]DriftEvent, n)
	for i := range out {
		out[i] = t.ring[(t.ringNext-1-i+ringSize)%ringSize]
	}
	return out
}

// Stats returns the counters and the index gauges.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats
	s.IndexBytes = t.ix.bytes()
	s.IndexCapBytes = t.ix.cap
	s.IndexNodes = len(t.ix.nodes)
	s.Fingerprints = len(t.ix.fps)
	s.Evictions = t.ix.evictions
	return s
}
