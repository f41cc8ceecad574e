package histo

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// Classic buckets, chosen per metric so that the range a user looks at has
// a 1–2.5–5 progression; the native buckets alongside (factor 1.1, ~4.5%
// error) carry the fine detail for servers that ingest them.
var (
	phaseBuckets    = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 25, 50, 100, 250, 600}
	tpotBuckets     = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	gapBuckets      = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	overheadBuckets = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, .001, .0025, .005, .01, .025, .05, .1}
	decodeBuckets   = []float64{1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}
	prefillBuckets  = []float64{10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1e6}
)

// codeLabels are the status code label values, computed once so that Record
// does not format a number per request. Status codes are three digits, so
// the label has at most 500 values; anything else is "other". 0 means no
// status was sent (the client went away first), as in Envoy's access log.
var codeLabels = func() (a [600]string) {
	for i := range a {
		a[i] = "other"
		if i >= 100 {
			a[i] = strconv.Itoa(i)
		}
	}
	a[0] = "0"
	return a
}()

func codeLabel(status int) string {
	if status < 0 || status >= len(codeLabels) {
		return "other"
	}
	return codeLabels[status]
}

// metrics are the Prometheus collectors but the per-event histograms,
// which are their eventPairs' (eventhist.go). Children on the hot paths
// are resolved once (client_golang counter.go: WithLabelValues hashes the
// labels on every call): the per-request ones once per route and model
// (labeled).
type metrics struct {
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	counted  requestCounters // requests' children, by route, model and status

	phase [NumMetrics]*prometheus.HistogramVec // the phase table's labeled per-request rows

	promptTokens, completionTokens, cachedTokens, reasoningTokens prometheus.Counter
	cacheReported, cacheInferred, cacheInferable                  prometheus.Counter
	outputSource                                                  map[string]prometheus.Counter
	clamped                                                       [NumMetrics]prometheus.Counter
	dropped                                                       prometheus.Counter

	sets labeledSets

	all []prometheus.Collector // everything above, for registration
}

func newMetrics() *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "anvilproxy_requests_total",
			Help: "Requests finished, by route, model and status code sent to the client (0: none sent).",
		}, []string{"route", "model", "code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "anvilproxy_errors_total",
			Help: "Requests that ended in an error, by the side it came from and its kind (truncated: a stream that ended without its end marker, status 200 notwithstanding).",
		}, []string{"side", "kind"}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_prompt_tokens_total", Help: "Prompt tokens of finished inference requests."}),
		completionTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_completion_tokens_total", Help: "Output tokens of finished inference requests (usage, else output events)."}),
		cachedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_cached_prompt_tokens_total", Help: "Prompt tokens the engine reported as served from its prefix cache."}),
		cacheReported: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_cache_reported_prompt_tokens_total",
			Help: "Prompt tokens of the requests whose engine reported cached tokens (0 included): the denominator of the reported cache-hit ratio."}),
		cacheInferred: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_cache_inferred_prompt_tokens_total",
			Help: "Prompt tokens inferred as served from the engine's prefix cache, from each request's prefill time against the learned cold prefill rate."}),
		cacheInferable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_cache_inferable_prompt_tokens_total",
			Help: "Prompt tokens of the requests whose cached tokens could be inferred: the denominator of the inferred cache-hit ratio."}),
		reasoningTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_reasoning_tokens_total", Help: "Reasoning tokens the engine reported."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_histo_records_dropped_total",
			Help: "Requests counted in a window's histograms but beyond its per-request record cap."}),
	}
	for _, e := range proxy.ErrorLabels {
		m.errors.WithLabelValues(e.Side.String(), e.Kind.String()) // exported at 0 from start
	}
	src := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "anvilproxy_output_tokens_source_total",
		Help: "Finished inference requests by where their output token count came from.",
	}, []string{"source"})
	m.outputSource = map[string]prometheus.Counter{"usage": src.WithLabelValues("usage"), "chunks": src.WithLabelValues("chunks")}
	clamped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "anvilproxy_histo_clamped_total",
		Help: "Values outside an HDR histogram's range, recorded at the nearest end of the range.",
	}, []string{"metric"})
	for i := range m.clamped {
		m.clamped[i] = clamped.WithLabelValues(Metric(i).String())
	}
	m.sets.m = m
	m.all = []prometheus.Collector{
		m.requests, m.errors, m.promptTokens, m.completionTokens, m.cachedTokens, m.reasoningTokens, m.dropped,
		m.cacheReported, m.cacheInferred, m.cacheInferable, src, clamped,
	}
	m.all = append(m.all, m.phaseHistograms()...)
	return m
}

// phaseHistograms creates the Prometheus histograms of the phase table's
// rows and returns them for registration.
func (m *metrics) phaseHistograms() []prometheus.Collector {
	var out []prometheus.Collector
	for i := range phases {
		row := &phases[i]
		opts := dist.PromHistogram(row.prom, row.help, row.buckets)
		switch row.labels {
		case noProm, perEvent: // the per-event ones are their eventPairs'
			continue
		case byRouteModel:
			m.phase[i] = prometheus.NewHistogramVec(opts, []string{"route", "model"})
		case bySource:
			m.phase[i] = prometheus.NewHistogramVec(opts, []string{"source", "route", "model"})
		case byCold:
			m.phase[i] = prometheus.NewHistogramVec(opts, []string{"cold", "route", "model"})
		}
		out = append(out, m.phase[i])
	}
	return out
}

// count updates the counters that every finished request feeds, whatever
// its route and outcome.
func (m *metrics) count(tr *proxy.Trace) {
	m.requestCounter(tr.Route, tr.Model, tr.Status).Inc()
	if tr.ErrKind != proxy.ErrNone {
		m.errors.WithLabelValues(tr.ErrSide.String(), tr.ErrKind.String()).Inc()
	}
}

// tokens counts an inference request's tokens, failed or not: the engine
// did the work either way.
func (m *metrics) tokens(rq *Request) {
	add := func(c prometheus.Counter, n Count) {
		if n > 0 {
			c.Add(float64(n))
		}
	}
	add(m.promptTokens, rq.PromptTokens)
	add(m.completionTokens, rq.OutputTokens)
	add(m.cachedTokens, rq.CachedTokens)
	add(m.reasoningTokens, rq.ReasoningTokens)
	if rq.CachedTokens >= 0 {
		add(m.cacheReported, rq.PromptTokens)
	}
	if rq.CacheInferredTokens >= 0 {
		add(m.cacheInferred, rq.CacheInferredTokens)
		add(m.cacheInferable, rq.PromptTokens)
	}
	if c, ok := m.outputSource[rq.OutputTokenSource]; ok {
		c.Inc()
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
