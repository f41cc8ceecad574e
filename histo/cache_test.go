package histo

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCacheTally: the engine's figure and the inferred one are counted
// over their own requests, and a side without requests has no ratio.
func TestCacheTally(t *testing.T) {
	var c cacheTally
	c.add(&Request{PromptTokens: 1000, CachedTokens: 800, CacheInferredTokens: -1})
	c.add(&Request{PromptTokens: 2000, CachedTokens: -1, CacheInferredTokens: 1500})
	c.add(&Request{PromptTokens: -1, CachedTokens: -1, CacheInferredTokens: -1})
	s := c.section()
	require.Equal(t, int64(3), s.Requests)
	require.Equal(t, CacheSide{Requests: 1, PromptTokens: 1000, CachedTokens: 800, Ratio: 0.8}, s.EngineReported)
	require.Equal(t, CacheSide{Requests: 1, PromptTokens: 2000, CachedTokens: 1500, Ratio: 0.75}, s.Inferred)

	var empty cacheTally
	empty.add(&Request{PromptTokens: 10, CachedTokens: -1, CacheInferredTokens: -1})
	require.True(t, math.IsNaN(float64(empty.section().EngineReported.Ratio)))

	m := MergeCache(s, nil, empty.section())
	require.Equal(t, int64(4), m.Requests)
	require.Equal(t, int64(3000), m.EngineReported.PromptTokens+m.Inferred.PromptTokens)
	require.InDelta(t, 0.8, float64(m.EngineReported.Ratio), 1e-12)
	require.Nil(t, MergeCache(nil, nil))
}

// TestCacheCounters: the reported denominator counts prompt tokens of
// requests whose engine reported a cached count, 0 included; nothing
// reported adds nothing.
func TestCacheCounters(t *testing.T) {
	r, reg, _ := newTest(t, Config{})
	tr := chat() // 10,000 prompt tokens, 2,000 reported cached
	r.Record(&tr)
	tr.CachedTokens = -1 // an engine that reports nothing
	r.Record(&tr)
	require.Equal(t, 10000.0, counterValue(t, reg, "anvilproxy_cache_reported_prompt_tokens_total", nil))
	require.Equal(t, 2000.0, counterValue(t, reg, "anvilproxy_cached_prompt_tokens_total", nil))
	require.Equal(t, 0.0, counterValue(t, reg, "anvilproxy_cache_inferred_prompt_tokens_total", nil), "no cold rate yet")
}
