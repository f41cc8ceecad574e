package histo

import (
	"math"

	"github.com/anvilproxy/anvilproxy/histo/dist"
)

// CacheSection is a window's prefix-cache figures, the engine's word and
// the proxy's inference side by side and never mixed (docs/queue-split.md):
// an engine that reports nothing has no reported ratio (null), not 0%.
type CacheSection struct {
	EngineReported CacheSide `json:"engine_reported"`
	Inferred       CacheSide `json:"inferred"`
	// Requests is every inference request of the window (dropped records
	// included), so that the requests with neither figure are visible.
	Requests int64 `json:"requests"`
}

// CacheSide is one source of cache figures over the requests that have
// one: their prompt tokens, the cached share of them, and the ratio (null
// without requests).
type CacheSide struct {
	Requests     int64 `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	Ratio        Float `json:"ratio"`
}

// cacheTally accumulates a window's CacheSection; guarded by Recorder.mu.
type cacheTally struct {
	reported, inferred cacheSideTally
	requests           int64
}

type cacheSideTally struct{ requests, prompt, cached int64 }

func (t *cacheTally) add(rq *Request) {
	t.requests++
	prompt := max(int64(rq.PromptTokens), 0)
	if rq.CachedTokens >= 0 && rq.PromptTokens >= 0 {
		t.reported.requests++
		t.reported.prompt += prompt
		t.reported.cached += int64(rq.CachedTokens)
	}
	if rq.CacheInferredTokens >= 0 {
		t.inferred.requests++
		t.inferred.prompt += prompt
		t.inferred.cached += int64(rq.CacheInferredTokens)
	}
}

// clone copies the tally: it holds values only.
func (t *cacheTally) clone() cacheTally { return *t }

func (t *cacheTally) section() *CacheSection {
	return &CacheSection{EngineReported: t.reported.side(), Inferred: t.inferred.side(), Requests: t.requests}
}

func (s cacheSideTally) side() CacheSide {
	c := CacheSide{Requests: s.requests, PromptTokens: s.prompt, CachedTokens: s.cached, Ratio: Float(math.NaN())}
	if s.prompt > 0 {
		c.Ratio = Float(float64(s.cached) / float64(s.prompt))
	}
	return c
}

// MergeCache sums cache sections; nil ones (files that have none) are
// skipped, and nil is returned when none has one.
func MergeCache(sections ...*CacheSection) *CacheSection {
	in := dist.Present(sections)
	if len(in) == 0 {
		return nil
	}
	var t cacheTally
	for _, s := range in {
		t.requests += s.Requests
		t.reported.requests += s.EngineReported.Requests
		t.reported.prompt += s.EngineReported.PromptTokens
		t.reported.cached += s.EngineReported.CachedTokens
		t.inferred.requests += s.Inferred.Requests
		t.inferred.prompt += s.Inferred.PromptTokens
		t.inferred.cached += s.Inferred.CachedTokens
	}
	return t.section()
}
