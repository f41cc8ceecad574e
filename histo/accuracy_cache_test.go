package histo_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// convTurn is one turn of a conversation as sent and recorded.
type convTurn struct {
	id     string
	tokens int // its natural length: its key in the records
}

// runConversations runs convs concurrent agent conversations of turns
// turns each against the engine: each turn resends the history and adds
// a tool result of ~400 tokens, as a coding agent does, and the next turn
// follows the answer at once. It returns the turns, by conversation.
func runConversations(t *testing.T, base string, convs, turns int) [][]convTurn {
	out := make([][]convTurn, convs)
	var wg sync.WaitGroup
	for c := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("conversation-%d", c)
			msgs := coldPrompt(key, 1200)
			for k := range turns {
				turn := convTurn{id: fmt.Sprintf("c%d-t%d", c, k), tokens: 5 + c*turns + k}
				sendNatural(t, base, burstReq{id: turn.id, body: msgsBody(msgs, 4096), maxTokens: turn.tokens})
				out[c] = append(out[c], turn)
				msgs = append(msgs,
					map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d of %s %s", k, key, strings.Repeat("a", 80))},
					map[string]string{"role": "user", "content": fmt.Sprintf("tool result %d %s", k, strings.Repeat("r", 1600))})
			}
		}()
	}
	wg.Wait()
	return out
}

// TestInferredCacheConversations: eight agent conversations at once
// against an engine that reports no cached tokens. The cost model learns
// from the turns themselves (the prefix reuse the proxy saw gives each
// turn's new tokens), so the inferred cache figure is there within the
// first turns (before, one sample in a whole run: never), and over each
// conversation it is within 20% of the engine's own reuse. A shared-block
// cache (vLLM) and per-slot caches with a slot per conversation (ollama,
// llama.cpp) are both served mostly from cache; the engine's truth says
// how much.
func TestInferredCacheConversations(t *testing.T) {
	skipInaccurate(t)
	const convs, turns = 8, 8
	for _, engine := range []sim.Engine{sim.EngineVLLM, sim.EngineOllama} {
		t.Run(engine.String(), func(t *testing.T) {
			s, err := sim.New(sim.Config{Engine: engine, Slots: convs, PrefillTokensPerSec: 20000, DecodeTokensPerSec: 400,
				TokensPerEvent: 1, ExactLength: true, UnreportedCache: true, Seed: 1})
			require.NoError(t, err)
			hs := httptest.NewServer(s)
			defer hs.Close()
			st := newStack(t, hs.URL, proxy.Config{}, histo.Config{})
			acc := &accStack{stack: st, sim: s}
			all := runConversations(t, st.base, convs, turns)
			firstReady := turns
			for c, conv := range all {
				var inferred, prompt, truthCached, truthPrompt int64
				for k, turn := range conv {
					rq := acc.record(t, turn.tokens)
					truth, ok := s.Truth(turn.id)
					require.True(t, ok, turn.id)
					if testing.Verbose() {
						t.Logf("%s: %s queue %v prefill %v (truth %v / %v) prompt %d inferred %d truth cached %d reuse %v", turn.id, rq.QueueSource, rq.Queue, rq.Prefill, truth.Queue, truth.Prefill, rq.PromptTokens, rq.CacheInferredTokens, truth.CachedTokens, rq.PrefixReuse)
					}
					if rq.CacheInferredTokens < 0 {
						continue
					}
					firstReady = min(firstReady, k)
					inferred += int64(rq.CacheInferredTokens)
					prompt += int64(rq.PromptTokens)
					truthCached += int64(truth.CachedTokens)
					truthPrompt += int64(truth.PromptTokens)
				}
				require.Positive(t, prompt, "conversation %d: no inferred figure at all", c)
				got, want := float64(inferred)/float64(prompt), float64(truthCached)/float64(truthPrompt)
				t.Logf("conversation %d: inferred %.1f%% cached, the engine %.1f%%", c, 100*got, 100*want)
				require.InDelta(t, want, got, 0.2*want, "conversation %d", c)
			}
			rate, n, ok := acc.rec.PrefillRate()
			t.Logf("first turn with an inferred figure: %d; cold rate %.0f tokens/s from %d samples", firstReady+1, rate, n)
			require.True(t, ok)
			require.LessOrEqual(t, firstReady, 2, "ready within the first turns")
			w := acc.rec.Current()
			require.NotNil(t, w.Cache)
			require.Positive(t, w.Cache.Inferred.Requests)
		})
	}
}
