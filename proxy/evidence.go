package proxy

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/anvilproxy/anvilproxy/sse"
)

// engineHeaders reads the per-request figures an engine puts in its
// response head: TGI's x-queue-time, x-inference-time (whole
// milliseconds), x-prompt-tokens and x-generated-tokens
// (huggingface/text-generation-inference router/src/server.rs, generate).
// TGI sets them only on a non-stream answer, whose head follows the whole
// generation. The token counts go into u as usage the engine reported; the
// body's own usage, read later, wins. x-time-per-token is
// x-inference-time / x-generated-tokens rounded to a millisecond, so it
// adds nothing and is not read. It reports whether any was present.
func engineHeaders(h *fasthttp.ResponseHeader, t *sse.Timing, u *sse.Usage) bool {
	t.QueueMs = headerNumber(h, "X-Queue-Time")
	t.InferenceMs = headerNumber(h, "X-Inference-Time")
	u.PromptTokens = int64(headerNumber(h, "X-Prompt-Tokens"))
	u.CompletionTokens = int64(headerNumber(h, "X-Generated-Tokens"))
	return t.QueueMs >= 0 || t.InferenceMs >= 0 || u.PromptTokens >= 0 || u.CompletionTokens >= 0
}

// headerNumber reads a non-negative decimal header value, or -1. It
// allocates nothing for a header that is absent, the common case.
func headerNumber(h *fasthttp.ResponseHeader, name string) float64 {
	v := h.Peek(name)
	if len(v) == 0 {
		return -1
	}
	n, err := strconv.ParseFloat(string(v), 64)
	if err != nil || n < 0 || n != n {
		return -1
	}
	return n
}

// readTiming copies the engine's own figures into the Trace, each -1 when
// the engine did not report it (docs/engines.md says which engine reports
// which). A cache hit the engine reported only in its timings fills
// CachedTokens when usage did not: cache_n (llama.cpp's native routes
// carry no usage object), else the prompt less prompt_n, the tokens it
// evaluated (llama-server before cache_n, mid-2025, reports only those;
// a prompt found whole in the slot's cache still evaluates its last
// token, so prompt_n is 1 there). Called once usage is read.
func readTiming(tr *Trace, t *sse.Timing) {
	tr.ServerQueue = msDuration(t.QueueMs)
	tr.ServerPrefill = msDuration(t.PrefillMs)
	tr.ServerDecode = msDuration(t.DecodeMs)
	tr.ServerInference = msDuration(t.InferenceMs)
	tr.ServerTotal = msDuration(t.TotalMs)
	tr.ServerLoad = msDuration(t.LoadMs)
	tr.ServerPromptEval = t.PromptEval
	tr.ServerCachedTokens = t.CachedTokens
	switch {
	case tr.CachedTokens >= 0:
	case t.CachedTokens >= 0:
		tr.CachedTokens = t.CachedTokens
	case t.PromptEval >= 0 && tr.PromptTokens >= t.PromptEval:
		tr.CachedTokens = tr.PromptTokens - t.PromptEval
	}
}

func msDuration(ms float64) time.Duration {
	if ms < 0 {
		return -1
	}
	return time.Duration(ms * float64(time.Millisecond))
}
