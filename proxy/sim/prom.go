package sim

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MetricsForm is the shape of GET /metrics: the engine's own metric names,
// which a proxy that scrapes the engine reads.
type MetricsForm int

const (
	// MetricsAuto is the Engine's choice.
	MetricsAuto MetricsForm = iota
	// MetricsVLLM serves vLLM v1's names (vllm/v1/metrics/loggers.py,
	// PrometheusStatLogger), labelled model_name and engine as vLLM labels
	// them, beside the sim's own sim_* counters.
	MetricsVLLM
	// MetricsLlamaCpp serves llama-server's --metrics names (ggml-org/
	// llama.cpp tools/server, server_task_result_metrics::to_metrics),
	// unlabelled, beside the sim's own sim_* counters.
	MetricsLlamaCpp
	// MetricsNone answers /metrics 404, as ollama has none.
	MetricsNone
)

var metricsNames = enumText[MetricsForm]{"auto", "vllm", "llamacpp", "none"}

// String returns "auto", "vllm", "llamacpp" or "none".
func (m MetricsForm) String() string { return metricsNames.text(m) }

// MarshalText implements encoding.TextMarshaler.
func (m MetricsForm) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (flag.TextVar).
func (m *MetricsForm) UnmarshalText(b []byte) error {
	return metricsNames.parse("metrics form", b, m)
}

// engineCounters are the engine-side totals the /metrics forms need beyond
// Stats. Server.mu guards them.
type engineCounters struct {
	prefilled       int64   // prompt tokens of requests whose prefill finished, cached included (vllm:prompt_tokens)
	uncached        int64   // the part of prefilled that was computed (llamacpp:prompt_tokens_total)
	cachedPrefilled int64   // the part of prefilled served by the cache (llamacpp:prompt_tokens_cached_total)
	promptSeconds   float64 // prefill time of those requests
	predicted       int64   // tokens of requests that ended, at their end (llamacpp:tokens_predicted_total)
	predictSeconds  float64 // their decode time
	finished        map[string]int64

	// Since the last scrape, for llama.cpp's throughput gauges, which
	// average over the window between two reads of /metrics.
	windowPrompt, windowPredicted               int64
	windowPromptSeconds, windowPredictedSeconds float64
}

// vLLM's request-latency buckets (loggers.py request_latency_buckets) and
// time-to-first-token buckets.
var (
	vllmLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	vllmTTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
)

// vllmHistograms are the per-request histograms of MetricsVLLM, observed
// when a request ends; safe for concurrent use.
type vllmHistograms struct {
	queue, prefill, decode, inference, e2e, ttft prometheus.Histogram
}

func (h *vllmHistograms) observe(tr Truth) {
	if h == nil || tr.FirstToken.IsZero() {
		return
	}
	h.queue.Observe(tr.Queue.Seconds())
	h.prefill.Observe(tr.FirstToken.Sub(tr.Admitted).Seconds())
	h.decode.Observe(tr.LastToken.Sub(tr.FirstToken).Seconds())
	h.inference.Observe(tr.LastToken.Sub(tr.Admitted).Seconds())
	h.e2e.Observe(tr.Finished.Sub(tr.Arrived).Seconds())
	h.ttft.Observe(tr.FirstToken.Sub(tr.Arrived).Seconds())
}

// newMetricsHandler builds the registry of s's /metrics form, or a 404
// handler for MetricsNone. Every value is read from s under its lock at
// scrape time, except the histograms, which record() observes.
func (s *Server) newMetricsHandler() http.Handler {
	if s.cfg.Metrics == MetricsNone {
		return http.HandlerFunc(serveNotFound)
	}
	reg := prometheus.NewRegistry()
	s.registerSimMetrics(reg)
	switch s.cfg.Metrics {
	case MetricsVLLM:
		s.registerVLLM(reg)
	case MetricsLlamaCpp:
		s.registerLlamaCpp(reg)
	}
	// Uncompressed whatever the client accepts, as llama-server answers: a
	// proxy in front forwards the bytes it counts. (vLLM's
	// prometheus_client app may gzip; a scraper's HTTP client undoes that.)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{DisableCompression: true})
}

type metricFunc struct {
	name, help string
	gauge      bool
	v          func() float64
}

func register(reg *prometheus.Registry, labels prometheus.Labels, ms []metricFunc) {
	for _, m := range ms {
		opts := prometheus.Opts{Name: m.name, Help: m.help, ConstLabels: labels}
		if m.gauge {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts), m.v))
		} else {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts(opts), m.v))
		}
	}
}

// read returns a function reading f of the stats and counters under s.mu.
func (s *Server) read(f func(st *Stats, c *engineCounters) float64) func() float64 {
	return func() float64 {
		st := s.Stats()
		s.mu.Lock()
		defer s.mu.Unlock()
		return f(&st, &s.counters)
	}
}

func (s *Server) registerSimMetrics(reg *prometheus.Registry) {
	stat := func(f func(*Stats) int64) func() float64 {
		return s.read(func(st *Stats, _ *engineCounters) float64 { return float64(f(st)) })
	}
	register(reg, nil, []metricFunc{
		{"sim_requests_total", "Generation requests received.", false, stat(func(st *Stats) int64 { return st.Requests })},
		{"sim_requests_completed_total", "Generation requests answered in full.", false, stat(func(st *Stats) int64 { return st.Completed })},
		{"sim_requests_aborted_total", "Generation requests whose client went away first.", false, stat(func(st *Stats) int64 { return st.Aborted })},
		{"sim_requests_rejected_total", "Generation requests answered 429.", false, stat(func(st *Stats) int64 { return st.Rejected429 })},
		{"sim_requests_failed_total", "Generation requests answered another error or cut mid-stream.", false, stat(func(st *Stats) int64 { return st.Failed })},
		{"sim_requests_truncated_total", "Streams ended cleanly without their final events.", false, stat(func(st *Stats) int64 { return st.Truncated })},
		{"sim_prompt_tokens_total", "Prompt tokens of requests that reached prefill.", false, stat(func(st *Stats) int64 { return st.PromptTokens })},
		{"sim_prompt_tokens_cached_total", "Prompt tokens served by the prefix cache.", false, stat(func(st *Stats) int64 { return st.CachedTokens })},
		{"sim_generation_tokens_total", "Completion tokens generated.", false, stat(func(st *Stats) int64 { return st.CompletionTokens })},
		{"sim_requests_running", "Requests holding a slot.", true, stat(func(st *Stats) int64 { return int64(st.Active) })},
		{"sim_requests_waiting", "Requests waiting for a slot.", true, stat(func(st *Stats) int64 { return int64(st.Queued) })},
	})
}

// registerVLLM registers vLLM v1's scheduler gauges, token and prefix-cache
// counters and per-request histograms under their real names (counters
// get prometheus_client's _total suffix).
func (s *Server) registerVLLM(reg *prometheus.Registry) {
	labels := prometheus.Labels{"model_name": s.cfg.Model, "engine": "0"}
	kvUsage := s.read(func(st *Stats, _ *engineCounters) float64 {
		return float64(st.KVTokens) / float64(s.kvCapacity())
	})
	register(reg, labels, []metricFunc{
		{"vllm:num_requests_running", "Number of requests in model execution batches.", true,
			s.read(func(st *Stats, _ *engineCounters) float64 { return float64(st.Active) })},
		{"vllm:num_requests_waiting", "Number of requests waiting to be processed.", true,
			s.read(func(st *Stats, _ *engineCounters) float64 { return float64(st.Queued) })},
		{"vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", true, kvUsage},
		{"vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.", true, kvUsage},
		{"vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", false,
			s.read(func(st *Stats, _ *engineCounters) float64 { return float64(st.PromptTokens) })},
		{"vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", false,
			s.read(func(st *Stats, _ *engineCounters) float64 { return float64(st.CachedTokens) })},
		{"vllm:prompt_tokens_total", "Number of prefill tokens processed.", false,
			s.read(func(_ *Stats, c *engineCounters) float64 { return float64(c.prefilled) })},
		{"vllm:generation_tokens_total", "Number of generation tokens processed.", false,
			s.read(func(st *Stats, _ *engineCounters) float64 { return float64(st.CompletionTokens) })},
	})
	// The cache's configuration as an info gauge whose labels carry it
	// (vLLM's CacheConfig metrics_info): the KV cache's size in tokens.
	if kv := s.kvCapacity(); kv > 0 {
		block := s.cfg.CacheBlockTokens
		info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
			ConstLabels: prometheus.Labels{"engine": "0", "block_size": strconv.Itoa(block), "num_gpu_blocks": strconv.Itoa(kv / block),
				"kv_cache_size_tokens": strconv.Itoa(kv), "enable_prefix_caching": "True"}})
		info.Set(1)
		reg.MustRegister(info)
	}
	for _, reason := range []string{"stop", "length", "abort"} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
			ConstLabels: prometheus.Labels{"model_name": s.cfg.Model, "engine": "0", "finished_reason": reason},
		}, s.read(func(_ *Stats, c *engineCounters) float64 { return float64(c.finished[reason]) })))
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
		reg.MustRegister(h)
		return h
	}
	s.hists = &vllmHistograms{
		queue:     hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", vllmLatencyBuckets),
		prefill:   hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", vllmLatencyBuckets),
		decode:    hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", vllmLatencyBuckets),
		inference: hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", vllmLatencyBuckets),
		e2e:       hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", vllmLatencyBuckets),
		ttft:      hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", vllmTTFTBuckets),
	}
}

// registerLlamaCpp registers llama-server's counters and gauges. Prompt
// figures count when a prefill finishes, predicted ones when a request
// ends, as llama.cpp's on_prompt_eval and on_prediction do.
func (s *Server) registerLlamaCpp(reg *prometheus.Registry) {
	counter := func(f func(c *engineCounters) float64) func() float64 {
		return s.read(func(_ *Stats, c *engineCounters) float64 { return f(c) })
	}
	register(reg, nil, []metricFunc{
		{"llamacpp:prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", false,
			counter(func(c *engineCounters) float64 { return float64(c.uncached) })},
		{"llamacpp:prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", false,
			counter(func(c *engineCounters) float64 { return float64(c.cachedPrefilled) })},
		{"llamacpp:prompt_seconds_total", "Total time spent processing prompts", false,
			counter(func(c *engineCounters) float64 { return c.promptSeconds })},
		{"llamacpp:tokens_predicted_total", "Number of generation tokens processed", false,
			counter(func(c *engineCounters) float64 { return float64(c.predicted) })},
		{"llamacpp:tokens_predicted_seconds_total", "Total time spent generating tokens", false,
			counter(func(c *engineCounters) float64 { return c.predictSeconds })},
		{"llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s", true,
			counter(func(c *engineCounters) float64 {
				v := perSecond(c.windowPrompt, c.windowPromptSeconds)
				c.windowPrompt, c.windowPromptSeconds = 0, 0
				return v
			})},
		{"llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s", true,
			counter(func(c *engineCounters) float64 {
				v := perSecond(c.windowPredicted, c.windowPredictedSeconds)
				c.windowPredicted, c.windowPredictedSeconds = 0, 0
				return v
			})},
		{"llamacpp:requests_processing", "Number of requests processing", true,
			s.read(func(st *Stats, _ *engineCounters) float64 { return float64(st.Active) })},
		{"llamacpp:requests_deferred", "Number of requests deferred", true,
			s.read(func(st *Stats, _ *engineCounters) float64 { return float64(st.Queued) })},
	})
}

func perSecond(n int64, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return float64(n) / seconds
}

// countPrefill adds a finished prefill to the engine counters. The caller
// holds s.mu.
func (c *engineCounters) countPrefill(res *result) {
	c.prefilled += int64(res.promptTokens)
	c.uncached += int64(res.promptTokens - res.cachedTokens)
	c.cachedPrefilled += int64(res.cachedTokens)
	c.promptSeconds += res.prefill.Seconds()
	c.windowPrompt += int64(res.promptTokens - res.cachedTokens)
	c.windowPromptSeconds += res.prefill.Seconds()
}

// countEnd adds an ended request to the engine counters; reason is vLLM's
// finished_reason. The caller holds s.mu.
func (c *engineCounters) countEnd(res *result, reason string) {
	if c.finished == nil {
		c.finished = make(map[string]int64)
	}
	c.finished[reason]++
	c.predicted += int64(res.completionTokens)
	c.predictSeconds += res.decode.Seconds()
	c.windowPredicted += int64(res.completionTokens)
	c.windowPredictedSeconds += res.decode.Seconds()
}
