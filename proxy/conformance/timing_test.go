package conformance

import (
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
)

// stampTolerance is how far the proxy's TTFO, TTFT and e2e may be from the
// client's: the client stamps after the proxy, on the far side of one
// loopback hop and one relay, so its values are larger by the proxy's
// residency plus scheduling noise on a shared 2-core machine.
const stampTolerance = 5 * time.Millisecond

// TestTimingsMatchClient: on every route, the proxy's per-request TTFO,
// TTFT and e2e (read back from /requests) are within 5 ms of the client's
// own stamps, and its token counts are the engine's usage.
func TestTimingsMatchClient(t *testing.T) {
	st := newStack(t)
	// The routes' short prompts are mostly served from ollama's prompt
	// cache after the first run; a fresh 1,000-character prompt makes a
	// TTFO of a few hundred milliseconds of real prefill.
	cold := route{"chat-cold", "/v1/chat/completions", func(string, string) string { return chatBody(freshPrompt(1000)) }}
	for i, rt := range append([]route{cold}, routes...) {
		t.Run(rt.name, func(t *testing.T) {
			r := do(t, st.proxyURL, rt.path, rt.body(plainModel, ""), "", 0)
			if r.status != 200 || r.readErr != nil {
				t.Fatalf("status %d, read error %v", r.status, r.readErr)
			}
			o := r.observe(t, rt.path)
			if !o.done || o.usage == nil || o.contentEvents == 0 || !finishedNormally(o.finish) {
				t.Fatalf("the engine's answer did not end normally: done %v, usage %v, %d content events, finish %q", o.done, o.usage, o.contentEvents, o.finish)
			}
			rec := st.waitRecords(t, i+1)[i]
			if rec.Route != routeLabel[rt.path] {
				t.Errorf("record route %q", rec.Route)
			}
			if rec.Truncated || rec.Failed || rec.Status != 200 || !rec.Stream {
				t.Errorf("record: truncated %v failed %v status %d stream %v", rec.Truncated, rec.Failed, rec.Status, rec.Stream)
			}
			checkSpan(t, "ttfo", rec.TTFO, o.firstOutput.Sub(r.sent))
			checkSpan(t, "ttft", rec.TTFT, o.firstContent.Sub(r.sent))
			checkSpan(t, "e2e", rec.E2E, o.end.Sub(r.sent))
			checkTokens(t, rec, o)
		})
	}
}

// routeLabel is the proxy's name for each route (its metrics label).
var routeLabel = map[string]string{
	"/v1/chat/completions": "chat",
	"/v1/completions":      "completions",
	"/v1/responses":        "responses",
	"/v1/messages":         "messages",
}

// finishedNormally: chat and completions say "stop", Responses
// "completed", Messages "end_turn".
func finishedNormally(f string) bool { return f == "stop" || f == "completed" || f == "end_turn" }

// checkSpan holds one proxy span to the client's.
func checkSpan(t *testing.T, name string, proxy histo.Span, client time.Duration) {
	t.Helper()
	if !proxy.Known() {
		t.Errorf("%s: the proxy has none; the client measured %v", name, client)
		return
	}
	d := client - time.Duration(proxy)
	t.Logf("%s: proxy %.3f ms, client %.3f ms, delta %+.3f ms", name, proxy.Millis(), ms(client), ms(d))
	if d < -stampTolerance || d > stampTolerance {
		t.Errorf("%s: proxy %.3f ms vs client %.3f ms: off by %.3f ms (tolerance %v)", name, proxy.Millis(), ms(client), ms(d), stampTolerance)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// checkTokens: the record's token counts are the usage the client read.
func checkTokens(t *testing.T, rec record, o observed) {
	t.Helper()
	if !rec.UsageSeen || rec.OutputTokenSource != "usage" {
		t.Errorf("record: usage_seen %v, output_token_source %q", rec.UsageSeen, rec.OutputTokenSource)
	}
	if int64(rec.PromptTokens) != o.usage.prompt || int64(rec.OutputTokens) != o.usage.output {
		t.Errorf("record tokens prompt %d output %d, usage chunk prompt %d output %d", rec.PromptTokens, rec.OutputTokens, o.usage.prompt, o.usage.output)
	}
	if got := rec.ContentChunks + rec.ReasoningChunks; got != o.contentEvents+o.reasoningEvents {
		t.Errorf("record output chunks %d, client counted %d", got, o.contentEvents+o.reasoningEvents)
	}
}
