package sim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// burst sends one chat request per id, in order (each is in the engine
// before the next is sent), and waits for all of them to end.
func (v *virtualSim) burst(t *testing.T, body func(id string) map[string]any, ids []string, headers ...string) {
	t.Helper()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := v.post(t, context.Background(), "/v1/chat/completions", body(id),
				append([]string{"X-Request-Id", id}, headers...)...)
			io.Copy(io.Discard, resp.Body)
		}()
		synctest.Wait()
	}
	wg.Wait()
}

func truthOf(t *testing.T, s *Server, id string) Truth {
	t.Helper()
	tr, ok := s.Truth(id)
	require.True(t, ok, "no truth for %s", id)
	return tr
}

// TestSlotsFIFO runs a burst of five against two slots: two run at once,
// the others wait in arrival order, each taking the slot the first
// finisher lets go at the instant it is let go, and never more than two
// hold a slot at one time.
func TestSlotsFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Slots = 2
		v := startVirtual(t, cfg)
		ids := []string{"r0", "r1", "r2", "r3", "r4"}
		v.burst(t, func(string) map[string]any { return chatBody(true, false) }, ids,
			"X-Sim-Prefill", "100ms", "X-Sim-Event-Gap", "5ms")

		trs := make([]Truth, len(ids))
		for i, id := range ids {
			trs[i] = truthOf(t, v.s, id)
		}
		require.Zero(t, trs[0].Queue)
		require.Zero(t, trs[1].Queue)
		require.ElementsMatch(t, []int{0, 1}, []int{trs[0].Slot, trs[1].Slot})
		for i := 2; i < len(trs); i++ {
			require.Positive(t, trs[i].Queue, ids[i])
			require.False(t, trs[i].Admitted.Before(trs[i-1].Admitted), "%s: FIFO", ids[i])
			handedOver := false
			for _, prev := range trs[:i] {
				if prev.Released.Equal(trs[i].Admitted) && prev.Slot == trs[i].Slot {
					handedOver = true
				}
			}
			require.True(t, handedOver, "%s gets the slot at the instant one is let go", ids[i])
		}
		for _, at := range trs {
			holding := 0
			for _, o := range trs {
				if !o.Admitted.After(at.Admitted) && o.Released.After(at.Admitted) {
					holding++
				}
			}
			require.LessOrEqual(t, holding, 2, "at most Slots hold a slot")
		}
	})
}

// convBody is a chat request whose prompt is a conversation's history: the
// keyed system prompt, then turns user messages.
func convBody(key string, turns int) map[string]any {
	msgs := []any{map[string]any{"role": "system", "content": key + " " + strings.Repeat("be careful. ", 120)}}
	for i := range turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("turn %d %s", i, strings.Repeat("z", 300))})
	}
	return map[string]any{"messages": msgs, "max_tokens": 4}
}

// TestLongestPrefixSlot: with per-slot caches (llama.cpp, ollama) a turn
// takes the free slot holding its conversation and reuses its prefix; the
// same turn finds nothing cached when that slot is busy, where a shared
// block cache (vLLM) would serve it.
func TestLongestPrefixSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineLlamaCpp
		cfg.Slots = 3
		cfg.Abandon = AbandonStop // the holder's hour of prefill ends when it leaves
		cfg.SwitchCost = -1       // no RAM prompt cache: only the slots hold prompts
		v := startVirtual(t, cfg)
		send := func(id string, body map[string]any, headers ...string) {
			resp := v.post(t, context.Background(), "/v1/chat/completions", body, append([]string{"X-Request-Id", id}, headers...)...)
			_, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
		}
		// Three conversations fill the three slots, least recently used first.
		for _, key := range []string{"a", "b", "c"} {
			send(key+"1", convBody(key, 1))
		}
		require.Equal(t, 0, truthOf(t, v.s, "a1").Slot)
		require.Equal(t, 1, truthOf(t, v.s, "b1").Slot)
		require.Equal(t, 2, truthOf(t, v.s, "c1").Slot)

		// Their second turns go back to their own slots, in any order.
		for _, key := range []string{"c", "a", "b"} {
			send(key+"2", convBody(key, 2))
			first, second := truthOf(t, v.s, key+"1"), truthOf(t, v.s, key+"2")
			require.Equal(t, first.Slot, second.Slot, key)
			require.Equal(t, (first.PromptTokens-1)/16*16, second.CachedTokens, "%s: the whole first turn is reused", key)
		}

		// a's slot is busy: a's third turn gets another slot and no reuse.
		holder, stop := context.WithCancel(context.Background())
		held := convBody("a", 2)
		held["stream"] = true
		v.post(t, holder, "/v1/chat/completions", held, "X-Sim-Prefill", "1h")
		synctest.Wait()
		send("a3", convBody("a", 3))
		a3 := truthOf(t, v.s, "a3")
		require.NotEqual(t, truthOf(t, v.s, "a2").Slot, a3.Slot)
		require.Zero(t, a3.CachedTokens, "another conversation's slot shares no prefix")
		stop()
	})
}

// TestSharedCacheAnySlot is the contrast: vLLM's shared blocks serve a
// conversation's prefix on whichever slot it gets.
func TestSharedCacheAnySlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Slots = 2
		v := startVirtual(t, cfg)
		resp := v.post(t, context.Background(), "/v1/chat/completions", convBody("a", 1), "X-Request-Id", "a1")
		io.Copy(io.Discard, resp.Body)
		holder, stop := context.WithCancel(context.Background())
		defer stop()
		held := convBody("b", 1)
		held["stream"] = true
		v.post(t, holder, "/v1/chat/completions", held, "X-Sim-Prefill", "1h")
		synctest.Wait()
		resp = v.post(t, context.Background(), "/v1/chat/completions", convBody("a", 2), "X-Request-Id", "a2")
		io.Copy(io.Discard, resp.Body)
		a1, a2 := truthOf(t, v.s, "a1"), truthOf(t, v.s, "a2")
		require.NotEqual(t, a1.Slot, a2.Slot)
		require.Equal(t, (a1.PromptTokens-1)/16*16, a2.CachedTokens)
	})
}

// finishEvent returns the index of the chunk carrying a finish reason and
// the index of the last chunk carrying content.
func finishEvent(t *testing.T, evs []sseEvent) (finish, lastContent int) {
	t.Helper()
	finish, lastContent = -1, -1
	for i, ev := range evs {
		if ev.data == "[DONE]" {
			continue
		}
		c := decode[testChunk](t, ev.data)
		if len(c.Choices) == 0 {
			continue
		}
		if c.Choices[0].FinishReason != nil {
			finish = i
		}
		if c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
			lastContent = i
		}
	}
	return finish, lastContent
}

// TestReleaseAtStreamEnd: llama.cpp and ollama send the finish reason in
// a chunk of its own one decode step after the last token of an answer that
// stopped by itself, and let the slot go then, so the next request waits
// that step longer; vLLM's last token carries the finish and frees the slot.
func TestReleaseAtStreamEnd(t *testing.T) {
	const gap = 10 * time.Millisecond
	for _, tc := range []struct {
		engine  Engine
		limit   int           // max_tokens; 0: none, the answer stops by itself
		step    time.Duration // last token to release
		ownLast bool          // the finish reason comes in a chunk of its own
	}{
		{EngineVLLM, 0, 0, false},
		{EngineLlamaCpp, 0, gap, true},
		{EngineOllama, 0, gap, true},
		{EngineOllama, 10, 0, true}, // cut by its limit: no end-of-sequence step
	} {
		t.Run(fmt.Sprintf("%v/limit%d", tc.engine, tc.limit), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.Engine = tc.engine
				cfg.Slots = 1
				v := startVirtual(t, cfg)
				body := chatBody(true, true)
				if tc.limit > 0 {
					body["max_tokens"] = tc.limit
				}
				resp := v.post(t, context.Background(), "/v1/chat/completions", body,
					"X-Request-Id", "first", "X-Sim-Event-Gap", gap.String())
				next := make(chan struct{})
				go func() {
					defer close(next)
					r := v.post(t, context.Background(), "/v1/chat/completions", chatBody(false, false), "X-Request-Id", "next")
					io.Copy(io.Discard, r.Body)
				}()
				evs, err := readAll(resp.Body)
				require.NoError(t, err)
				<-next

				finish, lastContent := finishEvent(t, evs)
				require.Equal(t, tc.ownLast, finish == lastContent+1, "finish in its own chunk")
				first := truthOf(t, v.s, "first")
				require.Equal(t, evs[lastContent].at, first.LastToken)
				require.Equal(t, tc.step, first.Released.Sub(first.LastToken))
				require.Equal(t, evs[finish].at, first.Released, "the slot is let go as the finish goes out")
				require.Equal(t, first.Released, first.Finished)
				require.Equal(t, first.Released, truthOf(t, v.s, "next").Admitted)
			})
		})
	}
}

// TestReleaseAtStreamEndNonStream: a whole answer is written at the end
// step too, and the slot let go after it.
func TestReleaseAtStreamEndNonStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineOllama
		v := startVirtual(t, cfg)
		resp := v.post(t, context.Background(), "/v1/chat/completions", chatBody(false, false),
			"X-Request-Id", "whole", "X-Sim-Event-Gap", "10ms")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Contains(t, string(body), `"finish_reason":"stop"`)
		tr := truthOf(t, v.s, "whole")
		require.Equal(t, 10*time.Millisecond, tr.Released.Sub(tr.LastToken))
	})
}

// TestHeadModes: behind a request holding the one slot, a stream's head
// leaves on admission (vLLM), when the slot starts its prompt (llama.cpp)
// or with its first output (ollama), and the truth records when.
func TestHeadModes(t *testing.T) {
	for _, tc := range []struct {
		engine Engine
		at     func(Truth) time.Time
	}{
		{EngineVLLM, func(tr Truth) time.Time { return tr.Arrived }},
		{EngineLlamaCpp, func(tr Truth) time.Time { return tr.Admitted }},
		{EngineOllama, func(tr Truth) time.Time { return tr.FirstToken }},
	} {
		t.Run(tc.engine.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.Engine = tc.engine
				cfg.Slots = 1
				v := startVirtual(t, cfg)
				go func() {
					r := v.post(t, context.Background(), "/v1/chat/completions", chatBody(false, false, "max_tokens", 1), "X-Sim-Prefill", "100ms")
					io.Copy(io.Discard, r.Body)
				}()
				synctest.Wait()
				resp := v.post(t, context.Background(), "/v1/chat/completions", chatBody(true, false),
					"X-Request-Id", "s", "X-Sim-Prefill", "30ms")
				head := time.Now()
				_, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				tr := truthOf(t, v.s, "s")
				require.Equal(t, 100*time.Millisecond, tr.Queue)
				require.Equal(t, head, tr.Head, "the truth is when the client got the head")
				require.Equal(t, tc.at(tr), tr.Head)
			})
		})
	}
}

// TestLlamaCppTimings: llama.cpp's final chunk, and its whole response,
// carry the timings object; usage's cached_tokens is its cache_n, which the
// second turn of a conversation on the same slot has.
func TestLlamaCppTimings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineLlamaCpp
		cfg.TokensPerEvent = 1
		v := startVirtual(t, cfg)
		stream := func(id string, body map[string]any) testChunk {
			body["stream"], body["max_tokens"] = true, 64
			resp := v.post(t, context.Background(), "/v1/chat/completions", body, "X-Request-Id", id, "X-Sim-Event-Gap", "2ms")
			evs, err := readAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, "[DONE]", evs[len(evs)-1].data)
			last := decode[testChunk](t, evs[len(evs)-2].data)
			require.NotNil(t, last.Choices[0].FinishReason, "the final chunk carries the finish")
			return last
		}
		stream("t1", convBody("a", 1))
		last := stream("t2", convBody("a", 2))
		tr := truthOf(t, v.s, "t2")
		require.Positive(t, tr.CachedTokens)
		tm := last.Timings
		require.Equal(t, float64(tr.CachedTokens), tm["cache_n"])
		require.Equal(t, float64(tr.PromptTokens-tr.CachedTokens), tm["prompt_n"])
		require.Equal(t, float64(tr.Prefill.Microseconds())/1e3, tm["prompt_ms"])
		require.Equal(t, 64.0, tm["predicted_n"])
		require.Equal(t, 126.0, tm["predicted_ms"], "63 gaps of 2 ms")
		require.Equal(t, 2.0, tm["predicted_per_token_ms"].(float64)*64/63)

		// With include_usage the usage chunk carries both.
		body := convBody("a", 3)
		body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true}
		resp := v.post(t, context.Background(), "/v1/chat/completions", body, "X-Request-Id", "t3")
		evs, err := readAll(resp.Body)
		require.NoError(t, err)
		u := decode[testChunk](t, evs[len(evs)-2].data)
		require.Equal(t, float64(u.Usage.PromptTokensDetails.CachedTokens), u.Timings["cache_n"])
		require.Equal(t, truthOf(t, v.s, "t3").CachedTokens, u.Usage.PromptTokensDetails.CachedTokens)

		whole := decodeBody[testChunk](t, v.post(t, context.Background(), "/v1/chat/completions", convBody("a", 4)))
		require.Equal(t, float64(whole.Usage.PromptTokensDetails.CachedTokens), whole.Timings["cache_n"])
		require.Positive(t, whole.Usage.PromptTokensDetails.CachedTokens)
	})
}

// TestTGIHeaders: a whole response behind a busy slot reports TGI's
// queue and inference times, in milliseconds, equal to the truth.
func TestTGIHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Slots = 1
		cfg.TGIHeaders = true
		cfg.TokensPerEvent = 1
		v := startVirtual(t, cfg)
		go func() {
			r := v.post(t, context.Background(), "/v1/chat/completions", chatBody(false, false, "max_tokens", 1), "X-Sim-Prefill", "70ms")
			io.Copy(io.Discard, r.Body)
		}()
		synctest.Wait()
		resp := v.post(t, context.Background(), "/v1/chat/completions", chatBody(false, false, "max_tokens", 10),
			"X-Request-Id", "w", "X-Sim-Prefill", "40ms", "X-Sim-Event-Gap", "1ms")
		io.Copy(io.Discard, resp.Body)
		tr := truthOf(t, v.s, "w")
		require.Equal(t, fmt.Sprint(tr.Queue.Milliseconds()), resp.Header.Get("x-queue-time"))
		require.Equal(t, "70", resp.Header.Get("x-queue-time"))
		require.Equal(t, "49", resp.Header.Get("x-inference-time"), "40 ms prefill, 9 gaps of 1 ms")
		require.Equal(t, "4", resp.Header.Get("x-time-per-token"))
		require.Equal(t, "10", resp.Header.Get("x-generated-tokens"))
		require.Equal(t, fmt.Sprint(tr.PromptTokens), resp.Header.Get("x-prompt-tokens"))

		stream := v.post(t, context.Background(), "/v1/chat/completions", chatBody(true, false))
		require.Empty(t, stream.Header.Get("x-queue-time"), "TGI reports them on whole responses only")
	})
}

// TestKVBudget is continuous batching: sixteen slots, but a 1,000-token KV
// cache. Two 364-token requests run; the third waits with free slots until
// one ends, and a small fourth behind it waits too (first come first
// served); one that could never fit is answered 400.
func TestKVBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Slots = 16
		cfg.KVCacheTokens = 1000
		v := startVirtual(t, cfg)
		big := func(key string) map[string]any { return longPrompt(key, 300, true) } // +64 completion
		var wg sync.WaitGroup
		for i, id := range []string{"b0", "b1", "b2", "small"} {
			body := big(id)
			if id == "small" {
				body = longPrompt(id, 30, true)
			}
			delete(body, "max_tokens") // the natural 64 tokens
			headers := []string{"X-Request-Id", id, "X-Sim-Event-Gap", "10ms"}
			if i < 2 {
				headers = append(headers, "X-Sim-Prefill", fmt.Sprintf("%dms", 100*(i+1)))
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := mustRequest(t, context.Background(), "http://sim/v1/chat/completions", body, headers...)
				if resp, err := v.client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			synctest.Wait()
		}
		st := v.s.Stats()
		require.Equal(t, 2, st.Active)
		require.Equal(t, 2, st.Queued, "the third waits with 14 slots free, the small one behind it")
		require.Equal(t, 728, st.KVTokens)
		wg.Wait()

		b0, b2, small := truthOf(t, v.s, "b0"), truthOf(t, v.s, "b2"), truthOf(t, v.s, "small")
		require.Equal(t, b0.Released, b2.Admitted, "admitted when b0's tokens are freed")
		require.Equal(t, b2.Admitted, small.Admitted, "the small one right after it, both fitting then")

		huge := longPrompt("huge", 990, false)
		delete(huge, "max_tokens")
		resp := v.post(t, context.Background(), "/v1/chat/completions", huge)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
}
