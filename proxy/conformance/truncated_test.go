package conformance

import "testing"

// ollama's repeat guard: it ends a generation after one token repeats more
// than 30 times, closing the stream with no finish_reason, no usage and no
// [DONE], status 200 (llm/server.go in ollama v0.17.4).
const repeatLimit = 30

// TestUnterminatedStreamForwardedAndFlagged: greedy decoding of the tiny
// model ("temperature":0 in the body; ollama's /v1 layer forces 1.0 when the
// request has none) repeats one word until ollama cuts the stream. The
// proxy forwards the cut stream byte for byte and flags it truncated.
func TestUnterminatedStreamForwardedAndFlagged(t *testing.T) {
	st := newStack(t)
	for i, rt := range routes[:2] { // chat and completions end with [DONE]; a missing one is the cut
		t.Run(rt.name, func(t *testing.T) {
			body := rt.body(greedyModel, `"temperature":0,`)
			direct := do(t, st.engine, rt.path, body, "", 0)
			proxied := do(t, st.proxyURL, rt.path, body, "", 0)
			sameBody(t, direct, proxied)
			o := proxied.observe(t, rt.path)
			if o.done || o.usage != nil || o.finish != "" || o.contentEvents <= repeatLimit {
				t.Fatalf("want a cut stream: done %v, usage %v, finish %q, %d content events", o.done, o.usage, o.finish, o.contentEvents)
			}
			rec := st.waitRecords(t, i+1)[i]
			if !rec.Truncated || rec.Status != 200 || rec.ContentChunks != o.contentEvents {
				t.Errorf("record: truncated %v, status %d, %d content chunks (client %d)", rec.Truncated, rec.Status, rec.ContentChunks, o.contentEvents)
			}
			checkSpan(t, "e2e", rec.E2E, o.end.Sub(proxied.sent))
			// No usage came (completions' per-chunk zeros are no count), so
			// the output count is the chunks relayed.
			if int(rec.OutputTokens) != o.contentEvents || rec.OutputTokenSource != "chunks" {
				t.Errorf("record: output_tokens %d (source %q), want the %d chunks", rec.OutputTokens, rec.OutputTokenSource, o.contentEvents)
			}
		})
	}
}
