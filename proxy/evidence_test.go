package proxy

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLlamaNativeStream: llama.cpp's native /completion stream (no choices,
// no usage object, no [DONE]) ends on its own "stop": true, so it is a
// complete request with TTFT, tokens and the engine's timings, not a
// truncated failure. The fixture is the shape llama-server writes.
func TestLlamaNativeStream(t *testing.T) {
	stream, err := os.ReadFile(filepath.Join("..", "sse", "testdata", "llamacpp_completion.sse"))
	require.NoError(t, err)
	for _, path := range []string{"/completion", "/completions"} {
		t.Run(path, func(t *testing.T) {
			up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				sseHeaders(w)
				_, _ = w.Write(stream)
			})
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up.URL}, log)
			resp, body := protoPost(t, base+path, `{"prompt":"What is LoRA:","n_predict":4,"stream":true}`)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, stream, body, "relayed unchanged")
			tr := log.next(t)
			require.Equal(t, RouteLlamaCompletion, tr.Route)
			require.False(t, tr.Truncated, "ended by stop:true")
			require.False(t, tr.Failed())
			require.Equal(t, 3, tr.ContentEvents)
			require.False(t, tr.FirstContent.IsZero())
			require.False(t, tr.End.IsZero())
			require.True(t, tr.UsageSeen)
			require.EqualValues(t, 68, tr.PromptTokens)
			require.EqualValues(t, 4, tr.CompletionTokens)
			require.EqualValues(t, 60, tr.CachedTokens, "timings.cache_n, the only cache figure of the native route")
			require.EqualValues(t, 60, tr.ServerCachedTokens)
			require.EqualValues(t, 8, tr.ServerPromptEval)
			require.Equal(t, time.Duration(43.237*float64(time.Millisecond)), tr.ServerPrefill)
			require.Equal(t, time.Duration(38.2*float64(time.Millisecond)), tr.ServerDecode)
			require.EqualValues(t, -1, tr.ServerQueue)
			require.EqualValues(t, -1, tr.ServerInference)
		})
	}
}

// TestLlamaPromptEvalGivesCached: llama-server of mid-2025 reports no
// cached tokens, neither in usage nor as timings.cache_n, but its
// timings.prompt_n counts the prompt tokens it evaluated: the rest came
// from the slot's cache. The fixture is such a server's answer to a
// prompt it had just seen (prompt_n 1 of 150: the last token is always
// evaluated).
func TestLlamaPromptEvalGivesCached(t *testing.T) {
	stream, err := os.ReadFile(filepath.Join("..", "sse", "testdata", "llamacpp_chat_prompt_n.sse"))
	require.NoError(t, err)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		_, _ = w.Write(stream)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	resp, body := protoPost(t, base+"/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, stream, body, "relayed unchanged")
	tr := log.next(t)
	require.False(t, tr.Failed())
	require.EqualValues(t, 150, tr.PromptTokens)
	require.EqualValues(t, 1, tr.ServerPromptEval)
	require.EqualValues(t, -1, tr.ServerCachedTokens, "no cache_n")
	require.EqualValues(t, 149, tr.CachedTokens, "the prompt less the tokens evaluated")
}

// TestLlamaNativeCutIsTruncated: without its "stop": true the native
// stream is still a truncated failure.
func TestLlamaNativeCutIsTruncated(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		_, _ = io.WriteString(w, "data: {\"content\":\"a\",\"stop\":false}\n\n")
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	resp, _ := protoPost(t, base+"/completion", `{"prompt":"x","stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	tr := log.next(t)
	require.True(t, tr.Truncated)
	require.Equal(t, ErrTruncated, tr.ErrKind)
}

// TestTGIHeaders: TGI's per-request headers on a non-stream answer
// become the engine's queue and inference time and its token counts; the
// headers still reach the client.
func TestTGIHeaders(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		// As router/src/server.rs writes them: whole milliseconds.
		for k, v := range map[string]string{
			"x-compute-type": "gpu+optimized", "x-total-time": "212", "x-validation-time": "1",
			"x-queue-time": "37", "x-inference-time": "174", "x-time-per-token": "21",
			"x-prompt-tokens": "12", "x-generated-tokens": "8",
		} {
			h[http.CanonicalHeaderKey(k)] = []string{v}
		}
		_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	resp, _ := protoPost(t, base+"/v1/chat/completions", `{"model":"m","messages":[]}`)
	require.Equal(t, "37", resp.Header.Get("X-Queue-Time"))
	tr := log.next(t)
	require.Equal(t, 37*time.Millisecond, tr.ServerQueue)
	require.Equal(t, 174*time.Millisecond, tr.ServerInference)
	require.EqualValues(t, -1, tr.ServerPrefill)
	require.True(t, tr.UsageSeen, "usage from x-prompt-tokens / x-generated-tokens")
	require.EqualValues(t, 12, tr.PromptTokens)
	require.EqualValues(t, 8, tr.CompletionTokens)

	// The body's own usage wins over the headers.
	up2 := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Prompt-Tokens", "99")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":1}}`)
	})
	base2, _ := startProxy(t, Config{Upstream: up2.URL}, log)
	protoPost(t, base2+"/v1/chat/completions", `{"model":"m","messages":[]}`)
	tr = log.next(t)
	require.EqualValues(t, 12, tr.PromptTokens)
	require.EqualValues(t, -1, tr.ServerQueue, "no header, not reported")
}
