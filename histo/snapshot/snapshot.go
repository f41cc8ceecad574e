// Package snapshot builds, writes, reads and merges anvil-serving.benchmark/v1
// documents: the proxy's measurement windows in the file format of the
// benchmark client of the first deployment (docs/design.md "Snapshots"), so that tools
// that read the benchmark's files read the proxy's, and the proxy's files
// from several windows or replicas merge exactly.
package snapshot

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/anvilproxy/anvilproxy/histo"
)

// nan is the unknown Num.
var nan = Num(math.NaN())

// Schema is the value of a v1 document's "schema" key.
const Schema = "anvil-serving.benchmark/v1"

// Protocol is the "measurement_protocol" of the documents the proxy writes.
const Protocol = "anvilproxy-passive-v1"

// Document is an anvil-serving.benchmark/v1 document. Fields are in the
// order of their JSON keys, which is alphabetical as in the benchmark's
// files. The json.RawMessage fields describe the benchmark client's own
// controls (its context plan, sampling, canaries …): the proxy observes
// passively and writes them as null (see passiveNulls); a document read from
// the benchmark keeps them, and a merge keeps a value that every input
// agrees on.
type Document struct {
	Anvilproxy               *Extension        `json:"anvilproxy,omitempty"`
	BaseURL                  json.RawMessage   `json:"base_url"`
	ClockDomainID            json.RawMessage   `json:"clock_domain_id"`
	Completed                int64             `json:"completed"`
	Concurrency              json.RawMessage   `json:"concurrency"`
	ConfigurationFingerprint json.RawMessage   `json:"configuration_fingerprint"`
	ContextDistribution      json.RawMessage   `json:"context_distribution"`
	ContextSeed              json.RawMessage   `json:"context_seed"`
	ContextTokens            json.RawMessage   `json:"context_tokens"`
	ControlledOutputPolicy   json.RawMessage   `json:"controlled_output_policy"`
	Engine                   json.RawMessage   `json:"engine"`
	Failed                   int64             `json:"failed"`
	Failures                 []json.RawMessage `json:"failures"` // Failure for the proxy's; kept as read otherwise
	FinishedAt               string            `json:"finished_at"`
	FinishedAtUnixNs         int64             `json:"finished_at_unix_ns"`
	GPU                      json.RawMessage   `json:"gpu"`
	Manifest                 json.RawMessage   `json:"manifest"`
	MaxContextTokens         json.RawMessage   `json:"max_context_tokens"`
	MaxTokens                json.RawMessage   `json:"max_tokens"`
	MeasurementProtocol      string            `json:"measurement_protocol"`
	MetricPopulation         Population        `json:"metric_population"`
	Metrics                  map[string]any    `json:"metrics"`
	Model                    *string           `json:"model"` // null only when no request named a model
	PerformanceEligible      bool              `json:"performance_eligible"`
	PromptCacheMode          json.RawMessage   `json:"prompt_cache_mode"`
	RequestCanaries          json.RawMessage   `json:"request_canaries"`
	RequestTimings           []Timing          `json:"request_timings"`
	Requests                 int64             `json:"requests"`
	ResponseWords            json.RawMessage   `json:"response_words"`
	ResponsesReceived        int64             `json:"responses_received"`
	RunID                    string            `json:"run_id"`
	Sampling                 json.RawMessage   `json:"sampling"`
	Schema                   string            `json:"schema"`
	ServeFlags               json.RawMessage   `json:"serve_flags"`
	SharedPrefixTokens       json.RawMessage   `json:"shared_prefix_tokens"`
	SourceRecipe             json.RawMessage   `json:"source_recipe"`
	StartedAt                string            `json:"started_at"`
	StartedAtUnixNs          int64             `json:"started_at_unix_ns"`
	Tier                     json.RawMessage   `json:"tier"`
	TimestampPrecision       string            `json:"timestamp_precision"`
	TimingMethodology        json.RawMessage   `json:"timing_methodology"`
	WallClockMs              Num               `json:"wall_clock_ms"`
}

// Timing is one successful request of a v1 document's "request_timings":
// the benchmark's per-request keys, then the proxy's (addedTimingKeys).
// Unknown values are null (Num NaN, histo.Count −1, nil), never 0.
type Timing struct {
	CacheInferredTokens      histo.Count     `json:"cache_inferred_tokens"` // the proxy's inference; never mixed into cached_tokens
	CachedTokens             histo.Count     `json:"cached_tokens"`
	ConnectMs                Num             `json:"connect_ms"`
	ContentChunks            histo.Count     `json:"content_chunks"`
	ControlledOutput         json.RawMessage `json:"controlled_output"`
	DecodeTokS               Num             `json:"decode_tok_s"`
	E2EMs                    Num             `json:"e2e_ms"`
	EffectivePrefillTokS     Num             `json:"effective_prefill_tok_s"`
	EngineCachedTokens       histo.Count     `json:"engine_cached_tokens"` // the engine's own figures (histo.EngineFigures), beside the proxy's
	EngineDecodeMs           Num             `json:"engine_decode_ms"`
	EngineInferenceMs        Num             `json:"engine_inference_ms"`
	EngineLoadMs             Num             `json:"engine_load_ms"`
	EnginePrefillMs          Num             `json:"engine_prefill_ms"`
	EnginePromptEvalTokens   histo.Count     `json:"engine_prompt_eval_tokens"`
	EngineQueueMs            Num             `json:"engine_queue_ms"`
	EngineRunningAtAdmit     histo.Count     `json:"engine_running_at_admit"`
	EngineTotalMs            Num             `json:"engine_total_ms"`
	EngineWaitingAtAdmit     histo.Count     `json:"engine_waiting_at_admit"`
	GenerationMs             Num             `json:"generation_ms"`
	MeanInterTokenLatencyMs  Num             `json:"mean_inter_token_latency_ms"`
	MeanTimePerOutputTokenMs Num             `json:"mean_time_per_output_token_ms"`
	Model                    *string         `json:"model"`
	OutputTokenSource        *string         `json:"output_token_source"`
	OutputTokens             histo.Count     `json:"output_tokens"`
	PlannedContextTokens     json.RawMessage `json:"planned_context_tokens"`
	PrefillMs                Num             `json:"prefill_ms"`
	PrefixReuse              Num             `json:"prefix_reuse"`
	PromptTokens             histo.Count     `json:"prompt_tokens"`
	ProxyQueueMs             Num             `json:"proxy_queue_ms"`
	QueueMs                  Num             `json:"queue_ms"`
	QueueSource              *string         `json:"queue_source"`
	ReasoningChunks          histo.Count     `json:"reasoning_chunks"`
	ReasoningMs              Num             `json:"reasoning_ms"`
	ReasoningTokens          histo.Count     `json:"reasoning_tokens"`
	RequestCanary            json.RawMessage `json:"request_canary"`
	RequestIndex             int64           `json:"request_index"`
	RetryAttempt             histo.Count     `json:"retry_attempt"`
	Route                    *string         `json:"route"`
	StartedAtUnixNs          histo.Count     `json:"started_at_unix_ns"`
	Status                   histo.Count     `json:"status"`
	TimeToFirstOutputMs      Num             `json:"time_to_first_output_ms"`
	TpotMs                   Num             `json:"tpot_ms"`
	TtftMs                   Num             `json:"ttft_ms"`
	VisibleContentTruncated  json.RawMessage `json:"visible_content_truncated"`
	VisibleGenerationMs      Num             `json:"visible_generation_ms"`
}

// addedTimingKeys are the keys a request_timings entry has beyond the
// benchmark's: the nine v1 metric names (docs/design.md "Snapshots"), then the phases and counts
// behind the extension's distributions and a timestamp to order merged
// requests by.
var addedTimingKeys = [...]string{
	"queue_ms", "prefill_ms", "queue_source", "cached_tokens", "prefix_reuse", "retry_attempt", "status", "model", "route",
	"connect_ms", "proxy_queue_ms", "reasoning_ms", "reasoning_tokens", "started_at_unix_ns", "cache_inferred_tokens",
	"engine_queue_ms", "engine_prefill_ms", "engine_decode_ms", "engine_cached_tokens", "engine_waiting_at_admit",
	"engine_total_ms", "engine_load_ms", "engine_inference_ms", "engine_prompt_eval_tokens", "engine_running_at_admit",
}

// unknownTiming is a Timing with every value unknown: what a key absent
// from a file decodes to.
func unknownTiming() Timing {
	return Timing{
		CacheInferredTokens: -1, CachedTokens: -1, ConnectMs: nan, ContentChunks: -1, DecodeTokS: nan, E2EMs: nan,
		EffectivePrefillTokS: nan, EngineCachedTokens: -1, EngineDecodeMs: nan, EngineLoadMs: nan, EnginePrefillMs: nan, EngineQueueMs: nan, EngineTotalMs: nan,
		EngineInferenceMs: nan, EnginePromptEvalTokens: -1, EngineRunningAtAdmit: -1, EngineWaitingAtAdmit: -1, GenerationMs: nan, MeanInterTokenLatencyMs: nan, MeanTimePerOutputTokenMs: nan,
		OutputTokens: -1, PrefillMs: nan, PrefixReuse: nan, PromptTokens: -1, ProxyQueueMs: nan, QueueMs: nan,
		ReasoningChunks: -1, ReasoningMs: nan, ReasoningTokens: -1, RetryAttempt: -1, StartedAtUnixNs: -1,
		Status: -1, TimeToFirstOutputMs: nan, TpotMs: nan, TtftMs: nan, VisibleGenerationMs: nan,
	}
}

// UnmarshalJSON reads a request_timings entry; keys it lacks (the proxy's
// additions, in a benchmark file) are unknown rather than 0.
func (t *Timing) UnmarshalJSON(b []byte) error {
	type plain Timing
	p := plain(unknownTiming())
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*t = Timing(p)
	return nil
}

// Failure is one failed request of a v1 document's "failures": sanitized
// metadata and the timings known when it failed, never any content. The
// benchmark's failure_policy asks for exactly this ("failed … responses
// retain sanitized timing and metadata but are excluded from performance
// distributions").
type Failure struct {
	CacheInferredTokens histo.Count `json:"cache_inferred_tokens"`
	CachedTokens        histo.Count `json:"cached_tokens"`
	E2EMs               Num         `json:"e2e_ms"`
	ErrorKind           *string     `json:"error_kind"` // proxy.ErrKind; null for an HTTP error status alone
	ErrorSide           *string     `json:"error_side"` // "client", "upstream" or "proxy"
	Model               *string     `json:"model"`
	OutputTokens        histo.Count `json:"output_tokens"`
	PrefillMs           Num         `json:"prefill_ms"`
	PromptTokens        histo.Count `json:"prompt_tokens"`
	QueueMs             Num         `json:"queue_ms"`
	QueueSource         *string     `json:"queue_source"`
	RequestIndex        int64       `json:"request_index"`
	RetryAttempt        histo.Count `json:"retry_attempt"`
	Route               *string     `json:"route"`
	StartedAtUnixNs     histo.Count `json:"started_at_unix_ns"`
	Status              histo.Count `json:"status"` // null when no status was sent
	TimeToFirstOutputMs Num         `json:"time_to_first_output_ms"`
	Truncated           bool        `json:"truncated"` // the upstream stream ended without its end marker
	TtftMs              Num         `json:"ttft_ms"`
}

// Population is a v1 document's "metric_population": which requests the
// distributions describe.
type Population struct {
	AggregateThroughputEligible  bool              `json:"aggregate_throughput_eligible"`
	AttemptedRequests            int64             `json:"attempted_requests"`
	ExcludedRequests             int64             `json:"excluded_requests"`
	FailurePolicy                string            `json:"failure_policy"`
	P99Interpretation            string            `json:"p99_interpretation"`
	P99InterpretationByMetric    map[string]string `json:"p99_interpretation_by_metric"`
	P99MinimumRecommendedSamples int64             `json:"p99_minimum_recommended_samples"`
	P99SamplesByMetric           map[string]int64  `json:"p99_samples_by_metric"`
	PerformanceEligibleRequests  int64             `json:"performance_eligible_requests"`
	SuccessfulRequests           int64             `json:"successful_requests"`
}

// Num is a float64 that may be unknown (NaN). It marshals to JSON as null
// or as a number with a decimal point (519.0, not 519), as the benchmark's
// Python writer does, so that readers that tell floats from integers see the
// reference's types.
type Num float64

// Known reports whether n is a number.
func (n Num) Known() bool { return !math.IsNaN(float64(n)) && !math.IsInf(float64(n), 0) }

// MarshalJSON writes the number or null.
func (n Num) MarshalJSON() ([]byte, error) {
	if !n.Known() {
		return []byte("null"), nil
	}
	return appendNum(nil, float64(n)), nil
}

// UnmarshalJSON reads a number or null (NaN).
func (n *Num) UnmarshalJSON(b []byte) error {
	var f histo.Float
	if err := f.UnmarshalJSON(b); err != nil {
		return err
	}
	*n = Num(f)
	return nil
}

// appendNum formats f as encoding/json does (exponent only below 1e-6 or
// from 1e21) and adds ".0" to an integral value.
func appendNum(b []byte, f float64) []byte {
	start := len(b)
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		b = strconv.AppendFloat(b, f, 'e', -1, 64)
	} else {
		b = strconv.AppendFloat(b, f, 'f', -1, 64)
	}
	for _, c := range b[start:] {
		if c == '.' || c == 'e' {
			return b
		}
	}
	return append(b, ".0"...)
}

// str returns a pointer to s, or nil (JSON null) for "".
func str(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
