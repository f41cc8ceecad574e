package sim

import (
	"context"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// longPrompt is a chat request of exactly tokens prompt tokens, keyed so
// that it shares no block with another key's.
func longPrompt(key string, tokens int, stream bool) map[string]any {
	text := key + " " + strings.Repeat("lorem ipsum ", tokens/3+1)
	// "user\n" + content + "\n" is the prompt text: 4 bytes per token.
	return map[string]any{"messages": []any{map[string]any{"role": "user", "content": text[:tokens*4-6]}},
		"max_tokens": 4, "stream": stream}
}

// TestAbandonedPrefill: a client leaves one second into a 5-second
// prefill. vLLM stops at once; llama.cpp finishes the 2,048-token batch it
// is on; ollama prefills the whole prompt. The slot stays busy meanwhile, so
// the client's retry waits for it in the queue, and then finds what was
// prefilled in the slot's cache.
func TestAbandonedPrefill(t *testing.T) {
	for _, tc := range []struct {
		engine    Engine
		abandoned time.Duration // after the client left
		cached    int           // of the retry
	}{
		{EngineVLLM, 0, 0},
		{EngineLlamaCpp, 2049*time.Millisecond - time.Second, 2048},
		{EngineOllama, 5001*time.Millisecond - time.Second, 0}, // ollama never reports its cache; the truth has it
	} {
		t.Run(tc.engine.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.Engine = tc.engine
				cfg.Slots = 1
				cfg.PrefillTokensPerSec = 1000
				cfg.ContextSlowdown = -1
				v := startVirtual(t, cfg)
				ctx, leave := context.WithCancel(context.Background())
				body := longPrompt("gone", 5000, true)
				go func() {
					req := mustRequest(t, ctx, "http://sim/v1/chat/completions", body, "X-Request-Id", "gone")
					if resp, err := v.client.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
				synctest.Wait()
				time.Sleep(time.Second)
				left := time.Now()
				leave()
				ev := <-v.s.Aborts()
				require.Equal(t, PhasePrefill, ev.Phase)
				require.Equal(t, left, ev.At, "noticed at once")

				retry := make(chan testChunk)
				go func() {
					body["stream"] = false
					resp := v.post(t, context.Background(), "/v1/chat/completions", body, "X-Request-Id", "retry")
					retry <- decodeBody[testChunk](t, resp)
				}()
				synctest.Wait()
				if tc.abandoned > 0 {
					st := v.s.Stats()
					require.Equal(t, 1, st.Active, "the slot prefills for nobody")
					require.Equal(t, 1, st.Queued)
				}
				got := <-retry

				gone, again := truthOf(t, v.s, "gone"), truthOf(t, v.s, "retry")
				require.Equal(t, OutcomeAborted, gone.Outcome)
				require.Equal(t, left, gone.Left)
				require.Equal(t, tc.abandoned, gone.Abandoned)
				require.Equal(t, left.Add(tc.abandoned), gone.Released)
				require.Equal(t, gone.Released, again.Admitted, "the retry's wait is queue")
				require.Equal(t, tc.abandoned, again.Queue)
				want := tc.cached
				if tc.engine == EngineOllama {
					want = (again.PromptTokens - 1) / 16 * 16
					require.Zero(t, got.Usage.PromptTokensDetails.CachedTokens)
				} else {
					require.Equal(t, want, got.Usage.PromptTokensDetails.CachedTokens)
				}
				require.Equal(t, want, again.CachedTokens, "what was prefilled stays in the slot")
			})
		})
	}
}

// TestPrePrefillSwitch: on one llama.cpp slot, a second conversation makes
// the slot save the first to the RAM prompt cache (15 ms); the first's next
// turn saves the second and restores the first (30 ms) before its prefill.
// That work is neither queue nor prefill: the timings' prompt_ms leave it
// out, and the truth keeps it apart. Without a RAM cache (ollama) the turn
// recomputes its whole prompt instead.
func TestPrePrefillSwitch(t *testing.T) {
	for _, tc := range []struct {
		engine   Engine
		switches time.Duration // of a2
		cached   bool          // a2 reuses a1
	}{
		{EngineLlamaCpp, 30 * time.Millisecond, true},
		{EngineOllama, 0, false},
	} {
		t.Run(tc.engine.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.Engine = tc.engine
				cfg.Slots = 1
				cfg.Timings = TimingLlamaCpp
				v := startVirtual(t, cfg)
				send := func(id string, body map[string]any) (time.Time, time.Time, testChunk) {
					body["stream"] = true
					sent := time.Now()
					resp := v.post(t, context.Background(), "/v1/chat/completions", body, "X-Request-Id", id)
					head := time.Now()
					evs, err := readAll(resp.Body)
					require.NoError(t, err)
					require.Equal(t, sent, truthOf(t, v.s, id).Arrived)
					return head, evs[0].at, decode[testChunk](t, evs[len(evs)-2].data)
				}
				send("a1", convBody("a", 1))
				send("b1", convBody("b", 1))
				head, first, last := send("a2", convBody("a", 2))
				a1, b1, a2 := truthOf(t, v.s, "a1"), truthOf(t, v.s, "b1"), truthOf(t, v.s, "a2")
				require.Zero(t, a1.PrePrefill, "an empty slot has nothing to save")
				require.Equal(t, tc.switches/2, b1.PrePrefill, "a1 is saved")
				require.Equal(t, tc.switches, a2.PrePrefill, "b1 is saved and a1 restored")
				require.Equal(t, a2.Admitted.Add(a2.PrePrefill), a2.PrefillStart)
				if tc.cached {
					require.Equal(t, (a1.PromptTokens-1)/16*16, a2.CachedTokens)
				} else {
					require.Zero(t, a2.CachedTokens)
				}
				require.Equal(t, float64(a2.Prefill.Microseconds())/1e3, last.Timings["prompt_ms"], "prompt_ms leaves the switch out")
				if tc.engine == EngineLlamaCpp {
					require.Equal(t, a2.Admitted, head, "the head leaves at slot start, before the switch")
				}
				require.Equal(t, a2.PrePrefill+a2.Prefill, first.Sub(a2.Admitted))
			})
		})
	}
}

// TestContextSlowdown: with a cost per new token that grows with the
// context, a turn on a long cached history takes far longer than its new
// tokens at the cold rate; the truth is the formula of prefillTime.
func TestContextSlowdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineLlamaCpp
		cfg.Slots = 1
		cfg.PrefillTokensPerSec = 10000
		cfg.ContextSlowdown = 0.5
		v := startVirtual(t, cfg)
		ask := func(id string, body map[string]any) Truth {
			resp := v.post(t, context.Background(), "/v1/chat/completions", body, "X-Request-Id", id)
			io.Copy(io.Discard, resp.Body)
			return truthOf(t, v.s, id)
		}
		formula := func(tr Truth) time.Duration {
			n, c := float64(tr.PromptTokens-tr.CachedTokens), float64(tr.CachedTokens)
			return prefillOverhead + time.Duration((n+0.5*(c*n+n*n/2)/1000)/10000*float64(time.Second))
		}
		cold := ask("cold", longPrompt("h", 2000, false))
		require.Zero(t, cold.CachedTokens)
		require.Equal(t, 301*time.Millisecond, cold.Prefill, "2,000 tokens: 200 ms, +50% for their own 1,000-token mean context")

		long := longPrompt("h", 2000, false)
		msgs := long["messages"].([]any)
		long["messages"] = append(msgs, map[string]any{"role": "user", "content": strings.Repeat("w", 1600)})
		warm := ask("warm", long)
		require.Positive(t, warm.CachedTokens)
		require.Equal(t, formula(warm), warm.Prefill)
		coldRate := prefillOverhead + perRate(warm.PromptTokens-warm.CachedTokens, 10000)
		require.Greater(t, float64(warm.Prefill), 1.9*float64(coldRate), "the new tokens attend to 2,000 cached ones")
	})
}
