package histo

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/anvilproxy/anvilproxy/histo/engine"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// EngineFigures are a request's figures as the engine reported them, in
// its body, its response head or its /metrics (docs/engines.md says which
// engine reports which); null where it reported nothing. They sit beside
// the proxy's own in /requests and in a snapshot's request_timings, so
// that a reader can hold one against the other.
type EngineFigures struct {
	Queue        Span  `json:"engine_queue_ms"`           // vLLM metrics.queue_time_ms, TGI x-queue-time
	Prefill      Span  `json:"engine_prefill_ms"`         // llama.cpp timings.prompt_ms, vLLM ttft − queue, ollama prompt_eval_duration
	Decode       Span  `json:"engine_decode_ms"`          // llama.cpp timings.predicted_ms, ollama eval_duration
	Inference    Span  `json:"engine_inference_ms"`       // TGI x-inference-time: prefill and decode
	Total        Span  `json:"engine_total_ms"`           // ollama total_duration: the engine's handler start to the end
	Load         Span  `json:"engine_load_ms"`            // ollama load_duration: getting a loaded model, within Total
	CachedTokens Count `json:"engine_cached_tokens"`      // llama.cpp timings.cache_n
	PromptEval   Count `json:"engine_prompt_eval_tokens"` // llama.cpp timings.prompt_n: the prompt tokens computed
	// RunningAtAdmit and WaitingAtAdmit are the engine's own counts from
	// its /metrics as last scraped before the request arrived (vLLM
	// num_requests_running/waiting, llama.cpp requests_processing/deferred);
	// they include traffic that did not pass this proxy.
	RunningAtAdmit Count `json:"engine_running_at_admit"`
	WaitingAtAdmit Count `json:"engine_waiting_at_admit"`
}

func engineSpan(d time.Duration) Span { return spanOf(d, d >= 0) }

// engineFiguresOf reads the Trace's engine-reported values; the /metrics
// counts are filled by Record, which has the engine's load.
func engineFiguresOf(tr *proxy.Trace) EngineFigures {
	return EngineFigures{
		Queue:          engineSpan(tr.ServerQueue),
		Prefill:        engineSpan(tr.ServerPrefill),
		Decode:         engineSpan(tr.ServerDecode),
		Inference:      engineSpan(tr.ServerInference),
		Total:          engineSpan(tr.ServerTotal),
		Load:           engineSpan(tr.ServerLoad),
		CachedTokens:   Count(tr.ServerCachedTokens),
		PromptEval:     Count(tr.ServerPromptEval),
		RunningAtAdmit: -1,
		WaitingAtAdmit: -1,
	}
}

// setLoad puts the engine's load at the request's arrival into f.
func (f *EngineFigures) setLoad(l engineLoad) {
	if l.ok {
		f.RunningAtAdmit, f.WaitingAtAdmit = Count(l.running), Count(l.waiting)
	}
}

// proxyTotals are the proxy's own cumulative counts of successful
// inference requests, and of the requests it recorded and those of them
// whose prompt tokens the engine counted but it does not know, for the
// agreement check against the engine's /metrics (engine.Scraper.Agreement). Atomic: Record adds, the scraper
// reads from its goroutine.
type proxyTotals struct {
	prompt, output        atomic.Int64
	prefillNs             atomic.Int64
	requests, unaccounted atomic.Int64
}

// add counts rq; sent says it reached the engine (it was written
// upstream): only such a request can be among the engine's counts and
// missing from the proxy's (unaccounted).
func (t *proxyTotals) add(rq *Request, sent bool) {
	t.requests.Add(1)
	if sent && (rq.Failed || !rq.UsageSeen || rq.PromptTokens < 0) {
		t.unaccounted.Add(1)
	}
	if rq.Failed {
		return
	}
	if rq.UsageSeen && rq.PromptTokens >= 0 {
		t.prompt.Add(int64(rq.PromptTokens))
	}
	if rq.OutputTokens >= 0 {
		t.output.Add(int64(rq.OutputTokens))
	}
	if rq.Prefill.Known() {
		t.prefillNs.Add(int64(rq.Prefill))
	}
}

// EngineTotals returns the proxy's totals since start: prompt tokens from
// usage, output tokens, and the split's prefill seconds, over successful
// inference requests. It is the engine scraper's Totals hook. Safe for
// concurrent use.
func (r *Recorder) EngineTotals() engine.Totals {
	return engine.Totals{
		PromptTokens: float64(r.totals.prompt.Load()),
		OutputTokens: float64(r.totals.output.Load()),
		PrefillSecs:  time.Duration(r.totals.prefillNs.Load()).Seconds(),
		Requests:     float64(r.totals.requests.Load()),
		Unaccounted:  float64(r.totals.unaccounted.Load()),
	}
}

// EngineSection is what the engine's /metrics said when a window ended:
// the scraper's state, the engine's last counts and the agreement of its
// totals with the proxy's (docs/engines.md). Unknown values are null.
type EngineSection struct {
	State        string `json:"state"` // starting, ok, absent, failing
	Kind         string `json:"kind"`  // vllm, llamacpp, sglang, tgi, unknown
	Running      Float  `json:"running"`
	Waiting      Float  `json:"waiting"`
	KVCacheUsage Float  `json:"kv_cache_usage"`
	// The agreement over the scraper's kept samples: engine and proxy
	// totals, and engine ÷ proxy.
	AgreementSeconds Float `json:"agreement_seconds"`
	EnginePrompt     Float `json:"engine_prompt_tokens"`
	ProxyPrompt      Float `json:"proxy_prompt_tokens"`
	PromptRatio      Float `json:"prompt_tokens_ratio"`
	EngineOutput     Float `json:"engine_output_tokens"`
	ProxyOutput      Float `json:"proxy_output_tokens"`
	OutputRatio      Float `json:"output_tokens_ratio"`
	EnginePrefill    Float `json:"engine_prefill_seconds"`
	ProxyPrefill     Float `json:"proxy_prefill_seconds"`
	PrefillRatio     Float `json:"prefill_seconds_ratio"`
	// UnaccountedShare is the share of the proxy's requests over the
	// same interval whose prompt tokens it does not know (failed, or
	// streamed without usage); Shared whether others share the engine as
	// the split reads it (sharesEngine): "yes", "no", or "unknown" when
	// the prompt ratio is above SharedPromptRatio but UnaccountedShare is
	// too large to tell.
	UnaccountedShare Float  `json:"unaccounted_share"`
	Shared           string `json:"shared"`
}

// engineReporter is what engineSection needs of the EngineLoad: the
// scraper of histo/engine has it; another EngineLoad yields no section.
type engineReporter interface {
	Status() (engine.State, int64, error)
	Last() (engine.Sample, bool)
	Agreement() (engine.Agreement, bool)
}

// reporter is the EngineLoad as an engineReporter: false without a
// scraper, or with an EngineLoad that is not one. Safe for concurrent use.
func (r *Recorder) reporter() (engineReporter, bool) {
	b := r.load.Load()
	if b == nil {
		return nil, false
	}
	rep, ok := b.EngineLoad.(engineReporter)
	return rep, ok
}

// engineSection reads the engine's /metrics as last scraped; nil when no
// scraper is set. Safe for concurrent use.
func (r *Recorder) engineSection() *EngineSection {
	rep, ok := r.reporter()
	if !ok {
		return nil
	}
	nan := Float(math.NaN())
	st, _, _ := rep.Status()
	s := &EngineSection{State: st.String(), Kind: engine.KindUnknown.String(), Running: nan, Waiting: nan, KVCacheUsage: nan,
		AgreementSeconds: nan, EnginePrompt: nan, ProxyPrompt: nan, PromptRatio: nan, EngineOutput: nan, ProxyOutput: nan,
		OutputRatio: nan, EnginePrefill: nan, ProxyPrefill: nan, PrefillRatio: nan, UnaccountedShare: nan, Shared: SharedNo}
	if smp, ok := rep.Last(); ok {
		s.Kind = smp.Read.Kind.String()
		s.Running, s.Waiting, s.KVCacheUsage = Float(smp.Read.Running), Float(smp.Read.Waiting), Float(smp.Read.KVCacheUsage)
	}
	if g, ok := rep.Agreement(); ok {
		s.AgreementSeconds = Float(g.Seconds)
		s.EnginePrompt, s.ProxyPrompt, s.PromptRatio = Float(g.EnginePrompt), Float(g.ProxyPrompt), Float(g.PromptRatio)
		s.EngineOutput, s.ProxyOutput, s.OutputRatio = Float(g.EngineOutput), Float(g.ProxyOutput), Float(g.OutputRatio)
		s.EnginePrefill, s.ProxyPrefill, s.PrefillRatio = Float(g.EnginePrefill), Float(g.ProxyPrefill), Float(g.PrefillRatio)
		s.UnaccountedShare, s.Shared = Float(g.UnaccountedShare), sharesEngine(g)
	}
	return s
}
