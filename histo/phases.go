package histo

import (
	"fmt"
	"math"
	"reflect"
	"time"
	"unsafe"
)

// phases is the one table of the measured phases and per-request values:
// one row per HDR histogram, indexed by Metric. Every place that names a
// phase reads it from here: the HDR name and unit (hdr.go), the clamp
// label, the Prometheus histogram's name, help, buckets and labels
// (metrics.go, labeled.go), what Record feeds the histograms (recordHDR),
// and, through Metric.Phase, the v1 snapshot's stems, extension
// distributions and request_timings keys (histo/snapshot). Adding a phase
// is a Metric constant, a Request field and one row here: the row's Key
// is the field's JSON name, and init finds the field by it.
//
// The table is read-only after package init and safe for concurrent use.
var phases = [NumMetrics]phaseRow{
	MetricTTFO: {Phase: Phase{Name: "time_to_first_output", Unit: Microseconds, Key: "time_to_first_output_ms", V1: true},
		prom: "anvilproxy_time_to_first_output_seconds", help: "Time from request received to the first reasoning, content or tool-call delta. Successful inference requests only.",
		buckets: phaseBuckets, labels: byRouteModel},
	MetricTTFT: {Phase: Phase{Name: "ttft", Unit: Microseconds, Key: "ttft_ms", V1: true},
		prom: "anvilproxy_time_to_first_token_seconds", help: "Time from request received to the first content or tool-call delta; includes reasoning. Successful inference requests only.",
		buckets: phaseBuckets, labels: byRouteModel},
	MetricQueue: {Phase: Phase{Name: "queue", Unit: Microseconds, Key: "queue_ms"},
		prom: "anvilproxy_queue_seconds", help: "Wait before prefill began (limiter wait plus engine queue), by where the split came from. Successful inference requests only.",
		buckets: phaseBuckets, labels: bySource},
	MetricPrefill: {Phase: Phase{Name: "prefill", Unit: Microseconds, Key: "prefill_ms"},
		prom: "anvilproxy_prefill_seconds", help: "Prefill time: time to first output minus queue and connect. Successful inference requests only.",
		buckets: phaseBuckets, labels: byRouteModel},
	MetricReasoning: {Phase: Phase{Name: "reasoning", Unit: Microseconds, Key: "reasoning_ms"},
		prom: "anvilproxy_reasoning_seconds", help: "Time from the first output to the first content when reasoning came first, else 0. Successful inference requests only.",
		buckets: phaseBuckets, labels: byRouteModel},
	MetricGeneration: {Phase: Phase{Name: "generation", Unit: Microseconds, Key: "generation_ms", V1: true},
		prom: "anvilproxy_generation_seconds", help: "Time from the first output to the end of the upstream stream. Successful inference requests only.",
		buckets: phaseBuckets, labels: byRouteModel},
	MetricTPOT: {Phase: Phase{Name: "tpot", Unit: Microseconds, Key: "tpot_ms", V1: true, Aliases: []Alias{
		// The benchmark's legacy names for the same values; each reads its
		// own request_timings key, so a file's duplicates are summarized as
		// written. The first's statistics keys carry no _ms suffix.
		{Stem: "mean_inter_token_latency_ms", Key: "mean_inter_token_latency_ms"},
		{Stem: "mean_time_per_output_token", Key: "mean_time_per_output_token_ms", Ms: true},
	}},
		prom: "anvilproxy_time_per_output_token_seconds", help: "Generation time divided by output tokens after the first. Successful inference requests only.",
		buckets: tpotBuckets, labels: byRouteModel},
	MetricE2E: {Phase: Phase{Name: "e2e", Unit: Microseconds, Key: "e2e_ms", V1: true},
		prom: "anvilproxy_request_duration_seconds", help: "Time from request received to the end of the upstream response. Successful inference requests only.",
		buckets: phaseBuckets, labels: byRouteModel},
	MetricConnect: {Phase: Phase{Name: "connect", Unit: Microseconds, Key: "connect_ms"},
		prom: "anvilproxy_upstream_connect_seconds", help: "Time acquiring an upstream connection; cold=true when one was dialled. Successful inference requests only.",
		buckets: gapBuckets, labels: byCold},
	MetricDecodeRate: {Phase: Phase{Name: "decode_tok_s", Unit: MilliTokensPerSecond, Key: "decode_tok_s", V1: true},
		prom: "anvilproxy_decode_tokens_per_second", help: "Output tokens after the first divided by generation time, per request. Successful inference requests only.",
		buckets: decodeBuckets, labels: byRouteModel},
	MetricPrefillRate: {Phase: Phase{Name: "effective_prefill_tok_s", Unit: MilliTokensPerSecond, Key: "effective_prefill_tok_s", V1: true},
		prom: "anvilproxy_prefill_tokens_per_second", help: "Effective prefill rate: prompt tokens divided by time to first output (queueing included), per request. Successful inference requests only.",
		buckets: prefillBuckets, labels: byRouteModel},
	// The token counts have an HDR histogram each but no Prometheus
	// histogram: their totals are counters (metrics.tokens).
	MetricPromptTokens:     {Phase: Phase{Name: "prompt_tokens", Unit: Tokens, Key: "prompt_tokens", V1: true}},
	MetricCompletionTokens: {Phase: Phase{Name: "completion_tokens", Unit: Tokens, Key: "output_tokens", V1: true}},
	// The per-event metrics are recorded by ObserveGap and ObserveRelay, not
	// from a Request: they have no Key and no accessor.
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
	Unit Unit // of the HDR values
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
	prom, help string // the Prometheus histogram's; "" for none
	buckets    []float64
	labels     labelKind
	field      requestField // the Request field named by Key, set at init
}

// requestField is where a row's value lives in a Request: its offset and
// its type. It is found from the row's Key (the field's JSON name) once,
// at init, so that the Key is the one name of the field. A func-valued
// accessor per row would do the same without unsafe, but the compiler
// cannot see through it and moves Record's Request to the heap: one
// allocation per request (TestRecordAllocs).
type requestField struct {
	off  uintptr
	kind fieldKind
}

// fieldKind is the type of a Request field behind a phase.
type fieldKind uint8

const (
	noField    fieldKind = iota // per-event metrics
	spanField                   // Span
	rateField                   // Float
	countField                  // Count
)

func init() {
	kinds := map[reflect.Type]fieldKind{
		reflect.TypeFor[Span](): spanField, reflect.TypeFor[Float](): rateField, reflect.TypeFor[Count](): countField,
	}
	t := reflect.TypeFor[Request]()
	for i := range phases {
		row := &phases[i]
		if row.Key == "" {
			continue
		}
		for j := range t.NumField() {
			if f := t.Field(j); f.Tag.Get("json") == row.Key {
				row.field = requestField{f.Offset, kinds[f.Type]}
			}
		}
		if row.field.kind == noField {
			panic(fmt.Sprintf("BUG: phase %q: Request has no Span, Float or Count field %q", row.Name, row.Key))
		}
	}
}

// The field readers. init checked the field's type against kind, so each
// pointer is to a field of that type inside *rq.
func (f requestField) span(rq *Request) Span {
	return *(*Span)(unsafe.Add(unsafe.Pointer(rq), f.off))
}
func (f requestField) rate(rq *Request) Float {
	return *(*Float)(unsafe.Add(unsafe.Pointer(rq), f.off))
}
func (f requestField) count(rq *Request) Count {
	return *(*Count)(unsafe.Add(unsafe.Pointer(rq), f.off))
}

// Phase returns m's row of the phase table. The Aliases slice is shared
// and must not be modified.
func (m Metric) Phase() Phase {
	if m < NumMetrics {
		return phases[m].Phase
	}
	return Phase{Name: "unknown"}
}

// hdrValue is rq's value in the row's HDR unit, and whether it is known.
// It does not allocate.
func (p *phaseRow) hdrValue(rq *Request) (int64, bool) {
	switch p.field.kind {
	case spanField:
		s := p.field.span(rq)
		return micros(time.Duration(s)), s.Known()
	case rateField:
		f := p.field.rate(rq)
		if !f.Known() {
			return 0, false
		}
		return millis(float64(f)), true
	case countField:
		c := p.field.count(rq)
		return int64(c), c >= 0
	}
	return 0, false
}

// promValue is rq's value in the Prometheus unit (seconds, tokens/s), and
// whether it is known.
func (p *phaseRow) promValue(rq *Request) (float64, bool) {
	switch p.field.kind {
	case spanField:
		s := p.field.span(rq)
		return time.Duration(s).Seconds(), s.Known()
	case rateField:
		f := p.field.rate(rq)
		return float64(f), f.Known()
	}
	return 0, false
}

// Value returns rq's value of m in the v1 unit (milliseconds, tokens/s,
// tokens), NaN when unknown or per event.
func (m Metric) Value(rq *Request) float64 {
	if m >= NumMetrics {
		return math.NaN()
	}
	p := &phases[m]
	switch p.field.kind {
	case spanField:
		return p.field.span(rq).Millis()
	case rateField:
		return float64(p.field.rate(rq))
	case countField:
		if c := p.field.count(rq); c >= 0 {
			return float64(c)
		}
	}
	return math.NaN()
}
