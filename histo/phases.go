package histo

import (
	"math"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// phases is the one table of the measured phases and per-request values:
// one row per HDR histogram, indexed by Metric. Each per-request row's
// definition over the Trace and the split is its line of evalPhases, beside
// the table; Record evaluates every row once into a phaseValues array, and everything that records or reports a
// phase indexes that array or this table: the HDR name and unit (hdr.go),
// the clamp label, the Prometheus histogram's name, help, buckets and
// labels (metrics.go, labeled.go), the HDR histograms (recordHDR), the SLO
// metrics (goodput.go), the /requests record (Request.slot), and, through
// Metric.Phase, the v1 snapshot's stems, extension distributions and
// request_timings keys (histo/snapshot), the live table and `diff`
// (ShortName, LabelText). Adding a phase is a Metric constant, one row
// here with its line in evalPhases, and a Request field with its case in
// Request.slot (docs/design.md "How to add a phase").
//
// The table is read-only and safe for concurrent use.
var phases = [NumMetrics]phaseRow{
	MetricTTFO: {Phase: Phase{Name: "time_to_first_output", Short: proxy.NameTTFO, Label: "time to first output", Unit: Microseconds, Key: "time_to_first_output_ms", V1: true},
		prom: "anvilproxy_time_to_first_output_seconds", help: "Time from request received to the first reasoning, content or tool-call delta. Successful inference requests only.",
		buckets: phaseBuckets, slo: true,
		labels: byRouteModel},
	MetricTTFT: {Phase: Phase{Name: proxy.NameTTFT, Unit: Microseconds, Key: "ttft_ms", V1: true},
		prom: "anvilproxy_time_to_first_token_seconds", help: "Time from request received to the first content or tool-call delta; includes reasoning. Successful inference requests only.",
		buckets: phaseBuckets, slo: true,
		labels: byRouteModel},
	MetricQueue: {Phase: Phase{Name: "queue", Unit: Microseconds, Key: "queue_ms"},
		prom: "anvilproxy_queue_seconds", help: "Wait before prefill began (limiter wait plus engine queue), by where the split came from. Successful inference requests only.",
		buckets: phaseBuckets, slo: true,
		labels: bySource},
	MetricPrefill: {Phase: Phase{Name: "prefill", Unit: Microseconds, Key: "prefill_ms"},
		prom: "anvilproxy_prefill_seconds", help: "Prefill time: time to first output minus queue and connect. Successful inference requests only.",
		buckets: phaseBuckets,
		labels:  byRouteModel},
	MetricReasoning: {Phase: Phase{Name: "reasoning", Unit: Microseconds, Key: "reasoning_ms"},
		prom: "anvilproxy_reasoning_seconds", help: "Time from the first output to the first content when reasoning came first, else 0. Successful inference requests only.",
		buckets: phaseBuckets,
		labels:  byRouteModel},
	MetricGeneration: {Phase: Phase{Name: "generation", Unit: Microseconds, Key: "generation_ms", V1: true},
		prom: "anvilproxy_generation_seconds", help: "Time from the first output to the end of the upstream stream. Successful inference requests only.",
		buckets: phaseBuckets,
		labels:  byRouteModel},
	MetricTPOT: {Phase: Phase{Name: "tpot", Unit: Microseconds, Key: "tpot_ms", V1: true, Aliases: []Alias{
		// The benchmark's legacy names for the same values; each reads its
		// own request_timings key, so a file's duplicates are summarized as
		// written. The first's statistics keys carry no _ms suffix.
		{Stem: "mean_inter_token_latency_ms", Key: "mean_inter_token_latency_ms"},
		{Stem: "mean_time_per_output_token", Key: "mean_time_per_output_token_ms", Ms: true},
	}},
		prom: "anvilproxy_time_per_output_token_seconds", help: "Generation time divided by output tokens after the first. Successful inference requests only.",
		buckets: tpotBuckets, slo: true,
		labels: byRouteModel},
	MetricE2E: {Phase: Phase{Name: proxy.NameE2E, Unit: Microseconds, Key: "e2e_ms", V1: true},
		prom: "anvilproxy_request_duration_seconds", help: "Time from request received to the end of the upstream response. Successful inference requests only.",
		buckets: phaseBuckets, slo: true,
		labels: byRouteModel},
	MetricConnect: {Phase: Phase{Name: "connect", Unit: Microseconds, Key: "connect_ms"},
		prom: "anvilproxy_upstream_connect_seconds", help: "Time acquiring an upstream connection; cold=true when one was dialled. Successful inference requests only.",
		buckets: gapBuckets,
		labels:  byCold},
	MetricDecodeRate: {Phase: Phase{Name: "decode_tok_s", Short: "tokens_s", Label: "decode", Unit: MilliTokensPerSecond, Key: "decode_tok_s", V1: true},
		prom: "anvilproxy_decode_tokens_per_second", help: "Output tokens after the first divided by generation time, per request. Successful inference requests only.",
		buckets: decodeBuckets,
		labels:  byRouteModel},
	MetricPrefillRate: {Phase: Phase{Name: "effective_prefill_tok_s", Label: "effective prefill", Unit: MilliTokensPerSecond, Key: "effective_prefill_tok_s", V1: true},
		prom: "anvilproxy_prefill_tokens_per_second", help: "Effective prefill rate: prompt tokens divided by time to first output (queueing included), per request. Successful inference requests only.",
		buckets: prefillBuckets,
		labels:  byRouteModel},
	// The token counts have an HDR histogram each but no Prometheus
	// histogram: their totals are counters (metrics.tokens).
	MetricPromptTokens:     {Phase: Phase{Name: "prompt_tokens", Unit: Tokens, Key: "prompt_tokens", V1: true}},
	MetricCompletionTokens: {Phase: Phase{Name: "completion_tokens", Unit: Tokens, Key: "output_tokens", V1: true}},
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
	// Label is the phase in words where a table shows it (`report`),
	// when they are not ShortName's (LabelText).
	Label string
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

// LabelText is p in a table's words: Label, or ShortName when it has none.
func (p Phase) LabelText() string {
	if p.Label != "" {
		return p.Label
	}
	return p.ShortName()
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
	slo        bool   // may be an SLO's metric (goodput.go)
	prom, help string // the Prometheus histogram's; "" for none
	buckets    []float64
	labels     labelKind
}

// evalPhases is the definition of every per-request metric over the Trace
// (proxy/phase.go) and the split, evaluated once: its raw value for a
// finished request, NaN when unknown. Raw is the value in the row's Unit
// family: nanoseconds for Microseconds rows (exact: an int64 duration below
// 2^53 ns, 104 days), tokens/s for rates, tokens for counts. It does not
// allocate.
//
// One line per row, beside the table, not a func-valued column of it: the
// arguments of an indirect call escape, and a func column made every
// caller's Trace escape to the heap, 760 bytes per Record when the caller
// kept it on the stack (TestRecordAllocs). Straight lines, not a loop over
// a switch: the compiler inlines the Trace's methods here, which a call per
// row did not, 100-200 ns a request (BENCHMARKS.md "Phase table"). A row
// without its line stays NaN (TestPhaseDefinitions).
func evalPhases(tr *proxy.Trace, sp *split) (v phaseValues) {
	for m := range v {
		v[m] = math.NaN()
	}
	v[MetricTTFO] = spanValue(tr.TTFO())
	v[MetricTTFT] = spanValue(tr.TTFT())
	v[MetricQueue] = spanValue(sp.Queue, sp.OK)
	v[MetricPrefill] = spanValue(sp.Prefill, sp.OK)
	v[MetricReasoning] = spanValue(tr.Reasoning())
	v[MetricGeneration] = spanValue(tr.Generation())
	v[MetricTPOT] = spanValue(tr.TPOT())
	v[MetricE2E] = spanValue(tr.E2E())
	v[MetricConnect] = float64(tr.Connect)
	v[MetricDecodeRate] = rateValue(tr.DecodeTokensPerSec())
	v[MetricPrefillRate] = rateValue(tr.EffectivePrefillTokensPerSec())
	if tr.PromptTokens >= 0 {
		v[MetricPromptTokens] = float64(tr.PromptTokens)
	}
	if n, src := tr.OutputTokens(); src != "" {
		v[MetricCompletionTokens] = float64(n)
	}
	return v
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

// phaseValues are one request's raw values of the per-request metrics
// (evalPhases), indexed by Metric.
type phaseValues [numRequestMetrics]float64

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
	switch rowUnits[m] {
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
	if rowUnits[m] == Microseconds {
		return time.Duration(raw).Seconds(), true
	}
	return raw, true
}

// rowUnits are the table's units, compact for Record's conversions (the
// rows are large: reading Unit from them cost a cache line each).
var rowUnits = func() (u [NumMetrics]Unit) {
	for m := range u {
		u[m] = phases[m].Unit
	}
	return u
}()

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
