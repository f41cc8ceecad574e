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

// TestOneSlotFIFOTruth runs a burst against a one-slot engine: each request
// waits for the one before it, in arrival order, and the engine's truth says
// exactly that, while nothing of it reaches the client. It runs in a
// synctest bubble, so the prefills and the hand-overs are exact.
func TestOneSlotFIFOTruth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Slots = 1
		v := startVirtual(t, cfg)
		const prefill = 400 * time.Millisecond
		ids := []string{"first", "second", "third"}
		var wg sync.WaitGroup
		bodies := make([]string, len(ids))
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp := v.post(t, context.Background(), "/v1/chat/completions",
					chatBody(false, false, "max_tokens", 10), "X-Request-Id", id, "X-Sim-Prefill", prefill.String())
				b, err := io.ReadAll(resp.Body)
				if err == nil {
					bodies[i] = string(b) + fmt.Sprint(resp.Header)
				}
			}()
			// Arrival order is the order of the queue: this one is in before
			// the next is sent.
			synctest.Wait()
			st := v.s.Stats()
			require.Equal(t, i+1, st.Active+st.Queued)
		}
		wg.Wait()

		var prev Truth
		for i, id := range ids {
			tr, ok := v.s.Truth(id)
			require.True(t, ok, id)
			require.Equal(t, OutcomeCompleted, tr.Outcome)
			require.Equal(t, id, tr.ID)
			require.Equal(t, 10, tr.CompletionTokens)
			require.Equal(t, prefill, tr.Prefill)
			require.Equal(t, tr.Admitted.Sub(tr.Arrived), tr.Queue)
			if i == 0 {
				require.Zero(t, tr.Queue, "the first request finds the slot free")
			} else {
				require.Equal(t, prev.Finished, tr.Admitted, "%s: the slot is handed over at once", id)
				// It arrived while the one before it held or waited for the slot.
				require.Greater(t, tr.Queue, prefill/2)
			}
			prev = tr
		}
		for _, b := range bodies {
			require.NotEmpty(t, b)
			for _, leak := range []string{"queue", "prefill", "Admitted", "truth"} {
				require.NotContains(t, strings.ToLower(b), strings.ToLower(leak), "the truth never reaches the client")
			}
		}
		_, ok := v.s.Truth("never-sent")
		require.False(t, ok)
	})
}

// TestTruthWithoutRequestID keys a request sent without X-Request-Id by the
// id the sim generated, and records aborts with their partial work.
func TestTruthWithoutRequestID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := startVirtual(t, fast())
		resp := v.post(t, context.Background(), "/v1/chat/completions", chatBody(false, false, "max_tokens", 3))
		id := decodeBody[testChunk](t, resp).ID
		tr, ok := v.s.Truth(strings.TrimPrefix(id, "chatcmpl-"))
		require.True(t, ok, id)
		require.Equal(t, 3, tr.CompletionTokens)

		ctx, cancel := context.WithCancel(context.Background())
		v.post(t, ctx, "/v1/chat/completions", chatBody(true, false), "X-Request-Id", "left", "X-Sim-Prefill", "1h")
		synctest.Wait()
		require.Equal(t, 1, v.s.Stats().Active)
		cancel()
		synctest.Wait()
		tr, ok = v.s.Truth("left")
		require.True(t, ok, "the abort left no truth")
		require.Equal(t, OutcomeAborted, tr.Outcome)
		require.True(t, tr.FirstToken.IsZero(), "aborted in prefill")
		require.Zero(t, tr.Prefill)
		require.Zero(t, tr.CompletionTokens)
	})
}

func TestTruthsBounded(t *testing.T) {
	tr := newTruths()
	for i := range maxTruths + 10 {
		tr.put(Truth{ID: fmt.Sprint(i)})
	}
	require.Len(t, tr.byID, maxTruths)
	_, ok := tr.byID["9"]
	require.False(t, ok, "the oldest are forgotten first")
	_, ok = tr.byID["10"]
	require.True(t, ok)
	_, ok = tr.byID[fmt.Sprint(maxTruths+9)]
	require.True(t, ok)
}

// TestUnreportedCache: the engine reports no cached tokens on any protocol,
// yet a repeated prompt skips its prefill, as ollama's does.
func TestUnreportedCache(t *testing.T) {
	prompt := strings.Repeat("a long system prompt that agents resend ", 400) // 16,000 bytes: 4,000 tokens
	for _, tc := range []struct {
		path string
		body map[string]any
		// absent must not appear in the body; present must.
		absent, present []string
	}{
		{"/v1/chat/completions", map[string]any{"max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": prompt}}},
			[]string{"cached_tokens", "prompt_tokens_details"}, []string{`"prompt_tokens":4001`}},
		{"/v1/completions", map[string]any{"max_tokens": 2, "prompt": prompt},
			[]string{"cached_tokens", "prompt_tokens_details"}, []string{`"prompt_tokens":4000`}},
		{"/v1/responses", map[string]any{"max_output_tokens": 2, "input": prompt},
			nil, []string{`"input_tokens":4001`, `"input_tokens_details":{"cached_tokens":0}`}},
		{"/v1/messages", map[string]any{"max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": prompt}}},
			[]string{"cache_read_input_tokens", "cache_creation_input_tokens"}, []string{`"input_tokens":4001`}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			cfg := fast()
			cfg.UnreportedCache = true
			cfg.PrefillTokensPerSec = 10000 // 4,000 tokens: 400 ms cold
			synctest.Test(t, func(t *testing.T) {
				v := startVirtual(t, cfg)
				for i, id := range []string{"cold", "warm"} {
					for _, stream := range []bool{false, true} {
						body := maps(tc.body, "stream", stream)
						if stream {
							body["stream_options"] = map[string]any{"include_usage": true}
						}
						rid := fmt.Sprintf("%s-%v", id, stream)
						sent := time.Now()
						resp := v.post(t, context.Background(), tc.path, body, "X-Request-Id", rid)
						require.Equal(t, http.StatusOK, resp.StatusCode)
						b, err := io.ReadAll(resp.Body)
						require.NoError(t, err)
						took := time.Since(sent)
						for _, a := range tc.absent {
							require.NotContains(t, string(b), a)
						}
						for _, p := range tc.present {
							require.Contains(t, string(b), p)
						}
						tr, ok := v.s.Truth(rid)
						require.True(t, ok)
						t.Logf("%s: client %v, engine prefill %v, cached %d of %d (reported: none)", rid, took.Round(time.Millisecond), tr.Prefill.Round(time.Millisecond), tr.CachedTokens, tr.PromptTokens)
						if i == 0 && !stream {
							require.Zero(t, tr.CachedTokens)
							require.GreaterOrEqual(t, tr.Prefill, 400*time.Millisecond)
							require.GreaterOrEqual(t, took, 400*time.Millisecond)
							continue
						}
						// Every later request repeats the prompt: the cache served
						// all its full blocks and prefill took one engine step.
						require.Equal(t, (tr.PromptTokens-1)/16*16, tr.CachedTokens, rid)
						require.Less(t, tr.Prefill, 100*time.Millisecond, rid)
						require.Less(t, took, 300*time.Millisecond, rid)
					}
				}
				require.Positive(t, v.s.Stats().CachedTokens, "the engine's own counters keep the truth")
			})
		})
	}
}

// maps returns a copy of m with extra key/value pairs set.
func maps(m map[string]any, extra ...any) map[string]any {
	out := make(map[string]any, len(m)+len(extra)/2)
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(extra); i += 2 {
		out[extra[i].(string)] = extra[i+1]
	}
	return out
}

// TestReportCachedKnob hides the cached count of single requests on an
// engine that reports it.
func TestReportCachedKnob(t *testing.T) {
	s, ts := start(t, fast())
	body := chatBody(false, false, "max_tokens", 2, "messages",
		[]any{map[string]any{"role": "user", "content": strings.Repeat("resent prefix ", 100)}})
	post(t, context.Background(), ts.URL+"/v1/chat/completions", body) // warms the cache
	for _, tc := range []struct {
		header string
		want   bool
	}{{"false", false}, {"true", true}, {"", true}} {
		id := "report-" + tc.header
		resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", body, "X-Sim-Report-Cached", tc.header, "X-Request-Id", id)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, tc.want, strings.Contains(string(b), `"cached_tokens":336`), "%q: %s", tc.header, b)
		tr, _ := s.Truth(id)
		require.Equal(t, 336, tr.CachedTokens, "the cache served it either way")
	}
}

// TestTruthInvariants runs three conversations' turns and a client that
// leaves mid-prefill against two llama.cpp slots, all at once, and holds
// every record to the identities a test of the split relies on: the spans
// add up, a slot serves one request at a time, and a request that waited
// got its slot at the instant another let that slot go.
func TestTruthInvariants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineLlamaCpp
		cfg.Slots = 2
		cfg.PrefillTokensPerSec = 20000
		v := startVirtual(t, cfg)
		var wg sync.WaitGroup
		var ids []string
		for turn := 1; turn <= 3; turn++ {
			// A client that takes a slot, then leaves during its prefill.
			ctx, leave := context.WithCancel(context.Background())
			gone := fmt.Sprintf("gone%d", turn)
			ids = append(ids, gone)
			v.hold(t, ctx, longPrompt(gone, 3000, true), "X-Request-Id", gone)
			for _, key := range []string{"a", "b", "c"} {
				id := fmt.Sprintf("%s%d", key, turn)
				ids = append(ids, id)
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := convBody(key, turn)
					body["stream"] = true
					resp := v.post(t, context.Background(), "/v1/chat/completions", body, "X-Request-Id", id)
					io.Copy(io.Discard, resp.Body)
				}()
				synctest.Wait()
			}
			time.Sleep(5 * time.Millisecond)
			leave()
		}
		wg.Wait()
		synctest.Wait()
		time.Sleep(time.Second) // the abandoned prefills end
		synctest.Wait()

		trs := make([]Truth, len(ids))
		for i, id := range ids {
			tr := truthOf(t, v.s, id)
			trs[i] = tr
			if tr.Admitted.IsZero() { // left the queue
				require.Equal(t, OutcomeAborted, tr.Outcome, id)
				require.Equal(t, -1, tr.Slot, id)
				require.Equal(t, tr.Finished.Sub(tr.Arrived), tr.Queue, id)
				continue
			}
			require.False(t, tr.Admitted.Before(tr.Arrived), id)
			require.Equal(t, tr.Admitted.Sub(tr.Arrived), tr.Queue, id)
			require.Equal(t, tr.Admitted.Add(tr.PrePrefill), tr.PrefillStart, id)
			require.False(t, tr.Released.Before(tr.Admitted), id)
			require.Equal(t, tr.Released, tr.Finished, id)
			if tr.Outcome == OutcomeCompleted {
				require.Equal(t, tr.PrefillStart.Add(tr.Prefill), tr.FirstToken, id)
				require.False(t, tr.Released.Before(tr.LastToken), id)
				require.False(t, tr.Head.After(tr.FirstToken), id)
			} else {
				require.Equal(t, OutcomeAborted, tr.Outcome, id)
				require.Equal(t, tr.Left.Add(tr.Abandoned), tr.Released, id)
			}
		}
		abandoned := 0
		for i, tr := range trs {
			if tr.Abandoned > 0 {
				abandoned++
			}
			if tr.Admitted.IsZero() {
				continue
			}
			handedOver := tr.Queue == 0
			for j, o := range trs {
				if i == j || o.Slot != tr.Slot {
					continue
				}
				overlap := o.Admitted.Before(tr.Released) && tr.Admitted.Before(o.Released)
				require.False(t, overlap, "%s and %s share slot %d", ids[i], ids[j], tr.Slot)
				handedOver = handedOver || o.Released.Equal(tr.Admitted)
			}
			require.True(t, handedOver, "%s waited %v and got slot %d when it was let go", ids[i], tr.Queue, tr.Slot)
		}
		require.Positive(t, abandoned, "some prefill ran on for nobody")
	})
}
