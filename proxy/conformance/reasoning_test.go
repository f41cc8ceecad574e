package conformance

import (
	"testing"
)

// TestReasoningIsFirstOutput: with the thinking model every token arrives
// as reasoning (chat delta.reasoning, Responses
// reasoning_summary_text.delta, Messages thinking_delta). The proxy counts
// the first of them as first output, within 5 ms of the client, and has no
// TTFT since no content came.
func TestReasoningIsFirstOutput(t *testing.T) {
	st := newStack(t)
	n := 0
	for _, rt := range routes {
		if rt.name == "completions" { // a raw prompt: no chat template, no thinking
			continue
		}
		t.Run(rt.name, func(t *testing.T) {
			r := do(t, st.proxyURL, rt.path, rt.body(thinkingModel, ""), "", 0)
			if r.status != 200 || r.readErr != nil {
				t.Fatalf("status %d, read error %v", r.status, r.readErr)
			}
			n++
			o := r.observe(t, rt.path)
			if o.reasoningEvents == 0 || o.contentEvents != 0 || !o.done {
				t.Fatalf("want a reasoning-only answer: %d reasoning events, %d content events, done %v", o.reasoningEvents, o.contentEvents, o.done)
			}
			rec := st.waitRecords(t, n)[n-1]
			checkSpan(t, "ttfo", rec.TTFO, o.firstOutput.Sub(r.sent))
			checkSpan(t, "e2e", rec.E2E, o.end.Sub(r.sent))
			if rec.TTFT.Known() {
				t.Errorf("ttft %.3f ms for an answer with no content", rec.TTFT.Millis())
			}
			if rec.ReasoningChunks != o.reasoningEvents || rec.ContentChunks != 0 {
				t.Errorf("record: %d reasoning and %d content chunks; the client saw %d reasoning", rec.ReasoningChunks, rec.ContentChunks, o.reasoningEvents)
			}
			if !rec.Reasoning.Known() {
				t.Error("record has no reasoning span")
			}
		})
	}
}
