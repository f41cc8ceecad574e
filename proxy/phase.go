package proxy

import "time"

// The phases of docs/design.md "Stamps and phases", derived from a Trace's stamps. Each returns
// ok=false when a stamp it needs is missing, so that callers report null,
// never 0, for a phase that did not happen.

// The words of the phases the log line carries (logTrace), which
// histo's phase table uses too: one place for each name.
const (
	NameTTFO = "ttfo"
	NameTTFT = "ttft"
	NameE2E  = "e2e"
)

func span(from, to time.Time) (time.Duration, bool) {
	if from.IsZero() || to.IsZero() {
		return 0, false
	}
	return to.Sub(from), true
}

// ProxyQueue is t_admit − t_recv: the wait in the proxy's own limiter.
func (t *Trace) ProxyQueue() (time.Duration, bool) { return span(t.Recv, t.Admit) }

// TTFO is time to first output (reasoning, content or tool call): t_first_output − t_recv.
func (t *Trace) TTFO() (time.Duration, bool) { return span(t.Recv, t.FirstOutput) }

// TTFT is time to first content token: t_first_content − t_recv. It includes reasoning time.
func (t *Trace) TTFT() (time.Duration, bool) { return span(t.Recv, t.FirstContent) }

// Reasoning is t_first_content − t_first_output when reasoning came first, else 0.
func (t *Trace) Reasoning() (time.Duration, bool) {
	if t.FirstOutput.IsZero() {
		return 0, false
	}
	if t.FirstContent.IsZero() {
		if t.ReasoningEvents > 0 {
			return span(t.FirstOutput, t.LastToken) // reasoning only, no content yet
		}
		return 0, false
	}
	return t.FirstContent.Sub(t.FirstOutput), true
}

// Generation is t_end − t_first_output ("generation_ms" in the v1 schema).
func (t *Trace) Generation() (time.Duration, bool) { return span(t.FirstOutput, t.End) }

// E2E is t_end − t_recv.
func (t *Trace) E2E() (time.Duration, bool) { return span(t.Recv, t.End) }

// Tail is t_client_done − t_end: the time the proxy and the client took to
// take the last bytes after the upstream finished.
func (t *Trace) Tail() (time.Duration, bool) { return span(t.End, t.ClientDone) }

// OutputTokens returns the completion tokens and where the number came
// from: "usage" when the engine reported it, "chunks" when it is the count
// of output events (a lower bound for engines that send several tokens per
// event), "" when neither is known.
func (t *Trace) OutputTokens() (int64, string) {
	if t.UsageSeen && t.CompletionTokens >= 0 {
		return t.CompletionTokens, "usage"
	}
	if n := t.ReasoningEvents + t.ContentEvents + t.ToolEvents; n > 0 {
		return int64(n), "chunks"
	}
	return 0, ""
}

// TPOT is generation / (completion_tokens − 1).
func (t *Trace) TPOT() (time.Duration, bool) {
	g, ok := t.Generation()
	n, _ := t.OutputTokens()
	if !ok || n < 2 {
		return 0, false
	}
	return g / time.Duration(n-1), true
}

// DecodeTokensPerSec is (completion_tokens − 1) / generation.
func (t *Trace) DecodeTokensPerSec() (float64, bool) {
	g, ok := t.Generation()
	n, _ := t.OutputTokens()
	if !ok || n < 2 || g <= 0 {
		return 0, false
	}
	return float64(n-1) / g.Seconds(), true
}

// EffectivePrefillTokensPerSec is prompt_tokens / TTFO (queueing included, as in the v1 schema).
func (t *Trace) EffectivePrefillTokensPerSec() (float64, bool) {
	d, ok := t.TTFO()
	if !ok || d <= 0 || t.PromptTokens <= 0 {
		return 0, false
	}
	return float64(t.PromptTokens) / d.Seconds(), true
}

// Failed reports whether the request did not end as a complete success.
func (t *Trace) Failed() bool {
	return t.ErrKind != ErrNone || t.Status >= 400 || t.Status == 0 || t.Truncated
}
