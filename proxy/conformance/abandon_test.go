package conformance

import (
	"fmt"
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
)

// TestAbandonedPrefillCountedAsQueue: a client leaves during a long prefill
// on ollama's single slot; the runner prefills the whole prompt before it
// frees the slot (enginelog_test.go), so the next request waits, and that
// wait must be reported as its queue, within max(25 ms, 10%) of the truth
// (its slot line − its send), not as its prefill. Twice: leaving early and
// late in the prefill.
func TestAbandonedPrefillCountedAsQueue(t *testing.T) {
	url, logPath := engineWithSlots(t, 1)
	// The proxy starts in front of a running engine, as in the multi-slot
	// tests: the first request to a server that just started loads its
	// runner (310 ms for 320 tokens where a warm one takes ~70), and the
	// cost model, which refuses samples twice as fast as its reference as
	// cache hits, kept that one sample for all eight (docs/queue-split.md,
	// "The occupancy split").
	warmEngine(t, url)
	st := newStackOn(t, url, histo.Config{})
	// A session's worth of cold prompts first, of growing length (the
	// tiny model's prefill per token grows with the context): what the
	// proxy knows of the engine's prefill when the client leaves.
	for i := range 8 {
		if r := do(t, st.proxyURL, "/v1/chat/completions", chatBody(freshPrompt(300+100*i)), "", 0); r.status != 200 {
			t.Fatalf("cold request %d: status %d", i+1, r.status)
		}
	}
	done := 8
	var follows []*sample
	for k, leaveAfter := range []time.Duration{200 * time.Millisecond, 600 * time.Millisecond} {
		elog := markLog(t, logPath)
		// 2,000 fresh characters: ~1 s of prefill on an idle host.
		left := do(t, st.proxyURL, "/v1/chat/completions", chatBody(freshPrompt(2000)), "", leaveAfter)
		if left.cancelledAt().IsZero() || left.status != 0 {
			t.Fatalf("case %d: the client did not leave before the answer (status %d): the prompt was too short", k+1, left.status)
		}
		// The next request, as soon as the client is gone.
		next := &sample{label: fmt.Sprintf("case %d (left after %v): the next request", k+1, leaveAfter)}
		next.resp = do(t, st.proxyURL, "/v1/chat/completions", chatBody(freshPrompt(600)), "", 0)
		if next.resp.status != 200 {
			t.Fatalf("%s: status %d", next.label, next.resp.status)
		}
		next.obs = next.resp.observe(t, "/v1/chat/completions")
		if next.obs.usage == nil {
			t.Fatalf("%s: no usage", next.label)
		}
		next.prompt = int(next.obs.usage.prompt)
		lines := elog.waitSlots(t, 2)
		if len(lines) != 2 || lines[1].prompt != next.prompt {
			t.Fatalf("case %d: slot lines %+v, want the abandoned request's and then one with prompt=%d", k+1, lines, next.prompt)
		}
		abandoned := &sample{label: fmt.Sprintf("case %d: the abandoned request", k+1), resp: left, slot: lines[0]}
		next.slot = lines[1]
		recs := st.waitRecords(t, done+2)
		done += 2
		pairRecords(t, []*sample{abandoned, next}, recs[len(recs)-2:])
		if !abandoned.rec.Failed || abandoned.rec.ErrSide != "client" {
			t.Errorf("%s: record failed %v side %q, want a client-side failure", abandoned.label, abandoned.rec.Failed, abandoned.rec.ErrSide)
		}
		held := next.slot.at.Sub(left.cancelledAt())
		t.Logf("case %d: client left %.1f ms after its send; the engine freed the slot %.1f ms after it left (the abandoned prompt: %d tokens, prefill %.1f ms from its slot line)",
			k+1, ms(left.cancelledAt().Sub(left.sent)), ms(held), abandoned.slot.prompt, ms(next.slot.at.Sub(abandoned.slot.at)))
		if held < 100*time.Millisecond {
			t.Fatalf("case %d: the engine freed the slot only %.1f ms after the client left: the case did not test an abandoned prefill", k+1, ms(held))
		}
		logSample(t, next)
		logAbandoned(t, abandoned)
		follows = append(follows, next)
	}
	writeCapture(t, st, ollamaEngine, "abandoned-p1", 1, 0, follows)
	for _, s := range follows {
		tq := s.truthQueue()
		if !s.rec.Queue.Known() {
			barMissed(t, "%s: queue_ms null (source %q); truth %.1f ms", s.label, s.rec.QueueSource, ms(tq))
			continue
		}
		if d := time.Duration(s.rec.Queue) - tq; d.Abs() > queueTolerance(tq) {
			barMissed(t, "%s: queue_ms %.1f (source %q), prefill_ms %.1f; truth queue %.1f ms, prefill %.1f ms: off by %+.1f ms (tolerance %.1f ms)",
				s.label, s.rec.Queue.Millis(), s.rec.QueueSource, s.rec.Prefill.Millis(), ms(tq), ms(s.truthPrefill()), ms(d), ms(queueTolerance(tq)))
		}
	}
}

// logAbandoned logs what the proxy recorded of the abandoned request: what
// the split had to size the slot it held.
func logAbandoned(t *testing.T, s *sample) {
	t.Helper()
	r := s.rec
	t.Logf("%s: proxy error %q side %q, prompt tokens %d, request bytes %d, ttfo %v, e2e %v, inflight %d",
		s.label, r.ErrKind, r.ErrSide, r.PromptTokens, r.ReqBytes, r.TTFO, r.E2E, r.InflightAtAdmit)
}
