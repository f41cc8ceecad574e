package histo

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBatchLockNotFromOneSharedPrefill: on an engine without a batch lock
// whose concurrent prefills share it (llama.cpp, vLLM), a request that
// arrived with another and whose first output came its own prefill after
// that one's end looks like one that waited for it. On a fresh proxy
// (no lock votes yet) that one vote must not move its queue: the other
// prefill was slowed to twice its cost, so it did not run alone, and the
// request was prefilling beside it, not waiting.
func TestBatchLockNotFromOneSharedPrefill(t *testing.T) {
	for _, hint := range []int{0} {
		r, _, _ := newTest(t, Config{EngineSlots: hint})
		for i := range 8 { // 2,000 tokens in 100 ms, alone
			tr := served(float64(i*10000), float64(i*10000+100), float64(i*10000+150), 0)
			tr.CachedTokens = 0
			r.Record(&tr)
		}
		x := served(100000, 100200, 100300, 0) // slowed to 200 ms by e beside it
		x.CachedTokens, x.ID = 0, 100
		e := served(100001, 100499, 100600, 1) // 6,000 tokens: 300 ms alone
		e.PromptTokens, e.CachedTokens, e.ID = 6000, 0, 101
		r.FirstOutput(&x)
		r.Record(&x)
		r.Record(&e)
		rq := r.Recent(1)[0]
		require.Less(t, rq.Queue.Millis(), 25.0, "hint %d: queue %.1f ms (%s) from one vote", hint, rq.Queue.Millis(), rq.QueueSource)
	}
}
