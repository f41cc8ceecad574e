package histo

import (
	"math"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// phases is the one table of the measured phases and per-request values:
// one row per HDR histogram, indexed by Metric. Each row carries its
// definition over the Trace and the split (of); Record evaluates every row
// once into a phaseValues array, and everything that records or reports a
// phase indexes that array or this table: the HDR name and unit (hdr.go),
// the clamp label, the Prometheus histogram's name, help, buckets and
// labels (metrics.go, labeled.go), the HDR histograms (recordHDR), the SLO
// metrics (goodput.go), the /requests record (Request.slot), and, through
// Metric.Phase, the v1 snapshot's stems, extension distributions and
// request_timings keys (histo/snapshot), the live table and `diff`
// (ShortName). Adding a phase is a Metric constant, a Request field (its
// case in Request.slot) and one row here (docs/design.md "How to add a
// phase").
//
// The table is read-only and safe for concurrent use.
var phases = [NumMetrics]phaseRow{
	MetricTTFO: {Phase: Phase{Name: "time_to_first_output", Short: "ttfo", Unit: Microseconds, Key: "time_to_first_output_ms", V1: true},
		prom: "anvilproxy_time_to_first_output_seconds", help: "Time from request received to the first reasoning, content or tool-call delta. Successful inference requests only.",
		buckets: phaseBuckets, of: traceSpan((*proxy.Trace).TTFO), slo: true,
		labels: byRouteModel},
	MetricTTFT: {Phase: Phase{Name: "ttft", Unit: Microseconds, Key: "ttft_ms", V1: true},
		prom: "anvilproxy_time_to_first_token_seconds", help: "Time from request received to the first content or tool-call delta; includes reasoning. Successful inference requests only.",
		buckets: phaseBuckets, of: traceSpan((*proxy.Trace).TTFT), slo: true,
		labels: byRouteModel},
	MetricQueue: {Phase: Phase{Name: "queue", Unit: Microseconds, Key: "queue_ms"},
		prom: "anvilproxy_queue_seconds", help: "Wait before prefill began (limiter wait plus engine queue), by where the split came from. Successful inference requests only.",
		buckets: phaseBuckets, of: func(_ *proxy.Trace, sp Split) float64 { return spanValue(sp.Queue, sp.OK) }, slo: true,
		labels: bySource},
	MetricPrefill: {Phase: Phase{Name: "prefill", Unit: Microseconds, Key: "prefill_ms"},
		prom: "anvilproxy_prefill_seconds", help: "Prefill time: time to first output minus queue and connect. Successful inference requests only.",
		buckets: phaseBuckets, of: func(_ *proxy.Trace, sp Split) float64 { return spanValue(sp.Prefill, sp.OK) },
		labels: byRouteModel},
	MetricReasoning: {Phase: Phase{Name: "reasoning", Unit: Microseconds, Key: "reasoning_ms"},
		prom: "anvilproxy_reasoning_seconds", help: "Time from the first output to the first content when reasoning came first, else 0. Successful inference requests only.",
		buckets: phaseBuckets, of: traceSpan((*proxy.Trace).Reasoning),
		labels: byRouteModel},
	MetricGeneration: {Phase: Phase{Name: "generation", Unit: Microseconds, Key: "generation_ms", V1: true},
		prom: "anvilproxy_generation_seconds", help: "Time from the first output to the end of the upstream stream. Successful inference requests only.",
		buckets: phaseBuckets, of: traceSpan((*proxy.Trace).Generation),
		labels: byRouteModel},
	MetricTPOT: {Phase: Phase{Name: "tpot", Unit: Microseconds, Key: "tpot_ms", V1: true, Aliases: []Alias{
		// The benchmark's legacy names for the same values; each reads its
		// own request_timings key, so a file's duplicates are summarized as
		// written. The first's statistics keys carry no _ms suffix.
		{Stem: "mean_inter_token_latency_ms", Key: "mean_inter_token_latency_ms"},
		{Stem: "mean_time_per_output_token", Key: "mean_time_per_output_token_ms", Ms: true},
	}},
		prom: "anvilproxy_time_per_output_token_seconds", help: "Generation time divided by output tokens after the first. Successful inference requests only.",
		buckets: tpotBuckets, of: traceSpan((*proxy.Trace).TPOT), slo: true,
		labels: byRouteModel},
	MetricE2E: {Phase: Phase{Name: "e2e", Unit: Microseconds, Key: "e2e_ms", V1: true},
		prom: "anvilproxy_request_duration_seconds", help: "Time from request received to the end of the upstream response. Successful inference requests only.",
		buckets: phaseBuckets, of: traceSpan((*proxy.Trace).E2E), slo: true,
		labels: byRouteModel},
	MetricConnect: {Phase: Phase{Name: "connect", Unit: Microseconds, Key: "connect_ms"},
		prom: "anvilproxy_upstream_connect_seconds", help: "Time acquiring an upstream connection; cold=true when one was dialled. Successful inference requests only.",
		buckets: gapBuckets, of: func(tr *proxy.Trace, _ Split) float64 { return float64(tr.Connect) },
		labels: byCold},
	MetricDecodeRate: {Phase: Phase{Name: "decode_tok_s", Unit: MilliTokensPerSecond, Key: "decode_tok_s", V1: true},
		prom: "anvilproxy_decode_tokens_per_second", help: "Output tokens after the first divided by generation time, per request. Successful inference requests only.",
		buckets: decodeBuckets, of: traceRate((*proxy.Trace).DecodeTokensPerSec),
		labels: byRouteModel},
	MetricPrefillRate: {Phase: Phase{Name: "effective_prefill_tok_s", Unit: MilliTokensPerSecond, Key: "effective_prefill_tok_s", V1: true},
		prom: "anvilproxy_prefill_tokens_per_second", help: "Effective prefill rate: prompt tokens divided by time to first output (queueing included), per request. Successful inference requests only.",
		buckets: prefillBuckets, of: traceRate((*proxy.Trace).EffectivePrefillTokensPerSec),
		labels: byRouteModel},
	// The token counts have an HDR histogram each but no Prometheus
	// histogram: their totals are counters (metrics.tokens).
	MetricPromptTokens:     {Phase: Phase{Name: "prompt_tokens", Unit: Tokens, Key: "prompt_tokens", V1: true}, of: func(tr *proxy.Trace, _ Split) float64 { return countValue(tr.PromptTokens) }},
	MetricCompletionTokens: {Phase: Phase{Name: "completion_tokens", Unit: Tokens, Key: "output_tokens", V1: true}, of: outputTokens},
	// The per-event metrics are recorded by ObserveGap and ObserveRelay, not
	// from a Request: they have no Key and no definition.
	MetricInterEvent: {Phase: Phase{Name: "inter_event", Unit: Microseconds},
		prom: "anvilproxy_inter_event_seconds", help: "Gap between consecutive output events of a stream, every gap.",
		buckets: gapBuckets, labels: perEvent},
	MetricOverhead: {Phase: Phase{Name: "proxy_overhead", Unit: Microseconds},
		prom: "anvilproxy_proxy_overhead_seconds", help: "Proxy residency per relayed upstream read: read returned to client write and flush returned.",
		buckets: overheadBuckets, labels: perEvent},
}

// Phase is what the snapshot side needs of a row of the phase table.
type Phase struct {
	// Name is the HDR histogram's name (Metric.String, the
	// anvilproxy_histo_clamped_total label, the snapshot's histograms key)
	// and the v1 stem of its statistics.
	Name string
	// Short is the phase's word where it differs from Name: the SLO flag
	// and label, the live table, `diff` (ShortName). Both are accepted on
	// input (MetricByName).
	Short string
	Unit  Unit // of the HDR values
	// Key is the per-request JSON name, the same in /requests (Request)
	// and in the v1 request_timings; "" for the per-event metrics.
	Key string
	// V1 puts the distribution in the v1 metrics object (stem_p50_ms …);
	// the others are in the anvilproxy extension's distributions, keyed
	// Name+"_ms".
	V1 bool
	// Aliases are further v1 metrics stems over the same values.
	Aliases []Alias
}

// ShortName is p's word: Short, or Name when it has none.
func (p Phase) ShortName() string {
	if p.Short != "" {
		return p.Short
	}
	return p.Name
}

// Alias is a further v1 stem of a phase, read from its own
// request_timings key. Ms adds the _ms suffix to its statistics' keys.
type Alias struct {
	Stem, Key string
	Ms        bool
}

// labelKind is how a phase's Prometheus histogram is labeled.
type labelKind uint8

const (
	noProm       labelKind = iota // no Prometheus histogram
	byRouteModel                  // route, model
	bySource                      // source (QueueSource), route, model
	byCold                        // cold ("false", "true"), route, model
	perEvent                      // unlabeled, observed per event
)

// phaseRow is one row of the phase table.
type phaseRow struct {
	Phase
	// of is the phase's definition: its raw value for a finished request,
	// NaN when unknown. Raw is the value in the row's Unit family:
	// nanoseconds for Microseconds rows (exact: an int64 duration below
	// 2^53 ns, 104 days), tokens/s for rates, tokens for counts. It takes
	// the split by value so that Record's split stays on the stack (the
	// pointer arguments of an indirect call escape). nil for the per-event
	// metrics.
	of         func(tr *proxy.Trace, sp Split) float64
	slo        bool   // may be an SLO's metric (goodput.go)
	prom, help string // the Prometheus histogram's; "" for none
	buckets    []float64
	labels     labelKind
}

// The definitions' adapters from the Trace's (value, ok) methods
// (proxy/phase.go) to raw values.
func traceSpan(f func(*proxy.Trace) (time.Duration, bool)) func(*proxy.Trace, Split) float64 {
	return func(tr *proxy.Trace, _ Split) float64 { return spanValue(f(tr)) }
}

func traceRate(f func(*proxy.Trace) (float64, bool)) func(*proxy.Trace, Split) float64 {
	return func(tr *proxy.Trace, _ Split) float64 { return rateValue(f(tr)) }
}

func spanValue(d time.Duration, ok bool) float64 {
	if !ok {
		return math.NaN()
	}
	return float64(d)
}

func rateValue(v float64, ok bool) float64 {
	if !ok {
		return math.NaN()
	}
	return v
}

func countValue(n int64) float64 {
	if n < 0 {
		return math.NaN()
	}
	return float64(n)
}

// outputTokens is the completion tokens, by usage or else by chunks
// (proxy.Trace.OutputTokens); NaN when neither is known.
func outputTokens(tr *proxy.Trace, _ Split) float64 {
	n, src := tr.OutputTokens()
	if src == "" {
		return math.NaN()
	}
	return float64(n)
}

// phaseValues are one request's raw values of the per-request metrics
// (phaseRow.of), indexed by Metric.
type phaseValues [numRequestMetrics]float64

// evalPhases evaluates every per-request row once. It does not allocate.
func evalPhases(tr *proxy.Trace, sp Split) (v phaseValues) {
	for m := range v {
		v[m] = phases[m].of(tr, sp)
	}
	return v
}

// Phase returns m's row of the phase table. The Aliases slice is shared
// and must not be modified.
func (m Metric) Phase() Phase {
	if m < NumMetrics {
		return phases[m].Phase
	}
	return Phase{Name: "unknown"}
}

// MetricByName returns the metric whose Short, Name or Key is name: the
// one lookup of a phase given as a word (--slo, `diff`).
func MetricByName(name string) (Metric, bool) {
	for m := range NumMetrics {
		if p := &phases[m]; name != "" && (name == p.Short || name == p.Name || name == p.Key) {
			return m, true
		}
	}
	return NumMetrics, false
}

// hdrValue converts a raw value of m to its HDR unit, and reports whether
// it is known.
func (m Metric) hdrValue(raw float64) (int64, bool) {
	if raw != raw {
		return 0, false
	}
	switch phases[m].Unit {
	case Microseconds:
		return micros(time.Duration(raw)), true
	case MilliTokensPerSecond:
		return millis(raw), true
	}
	return int64(raw), true
}

// promValue converts a raw value of m to the Prometheus unit (seconds,
// tokens/s), and reports whether it is known.
func (m Metric) promValue(raw float64) (float64, bool) {
	if raw != raw {
		return 0, false
	}
	if phases[m].Unit == Microseconds {
		return time.Duration(raw).Seconds(), true
	}
	return raw, true
}

// Value returns rq's value of m in the v1 unit (milliseconds, tokens/s,
// tokens), NaN when unknown or per event.
func (m Metric) Value(rq *Request) float64 {
	if m >= numRequestMetrics {
		return math.NaN()
	}
	raw := rq.phase(m)
	if phases[m].Unit == Microseconds {
		return raw / float64(time.Millisecond)
	}
	return raw
}
