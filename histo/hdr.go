package histo

import (
	"math"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names one of the HDR histograms the Recorder keeps, per window and
// cumulatively. The per-request metrics come first; MetricInterEvent and
// MetricOverhead are recorded per event.
type Metric uint8

// The HDR histograms. Latencies are in microseconds, rates in
// milli-tokens per second, counts in tokens (see Unit).
const (
	MetricTTFO             Metric = iota // time to first output
	MetricTTFT                           // time to first content token
	MetricQueue                          // Split.Queue, whatever its source
	MetricPrefill                        // Split.Prefill
	MetricReasoning                      // first output → first content
	MetricGeneration                     // first output → end
	MetricTPOT                           // generation / (output tokens − 1)
	MetricE2E                            // recv → end
	MetricConnect                        // acquiring the upstream connection
	MetricDecodeRate                     // (output tokens − 1) / generation
	MetricPrefillRate                    // effective prefill: prompt tokens / TTFO
	MetricPromptTokens                   // prompt tokens per request
	MetricCompletionTokens               // output tokens per request (usage, else chunks)
	MetricInterEvent                     // gap between consecutive output events
	MetricOverhead                       // upstream read → client write+flush
	NumMetrics
)

// numRequestMetrics is the number of metrics recorded once per request,
// under Recorder.mu; the rest are recorded per event under their own locks.
const numRequestMetrics = MetricInterEvent

// Unit is the unit of the integers an HDR histogram holds.
type Unit uint8

// Units. Rates are stored in thousandths so that three significant digits
// survive for rates below 1,000 tokens/s (decode rates are ~100–300).
const (
	Microseconds Unit = iota
	MilliTokensPerSecond
	Tokens
)

// String returns the unit's short name: "us", "mtok/s" or "tokens".
func (u Unit) String() string {
	switch u {
	case Microseconds:
		return "us"
	case MilliTokensPerSecond:
		return "mtok/s"
	}
	return "tokens"
}

// unitMax is the highest value each unit tracks; larger values are clamped
// to it and counted. An hour of latency, ten million tokens/s, and 2^24
// tokens are far beyond anything an engine on one GPU produces.
var unitMax = [...]int64{
	Microseconds:         int64(time.Hour / time.Microsecond),
	MilliTokensPerSecond: 10_000_000_000,
	Tokens:               1 << 24,
}

// sigFigs: 3 significant digits bound the quantile error to 0.1% at about
// 190 KB per dense histogram (docs/design.md "Performance design").
const sigFigs = 3

// String returns the metric's name: the v1 schema's stem where it has one
// ("ttft", "e2e", "decode_tok_s", …).
func (m Metric) String() string {
	if m < NumMetrics {
		return phases[m].Name
	}
	return "unknown"
}

// Unit returns the unit of the metric's HDR values.
func (m Metric) Unit() Unit {
	if m < NumMetrics {
		return phases[m].Unit
	}
	return Microseconds
}

// Float converts an HDR value of the metric to the v1 schema's unit:
// milliseconds for latencies, tokens/s for rates, tokens for counts.
func (m Metric) Float(v int64) float64 {
	if m.Unit() == Tokens {
		return float64(v)
	}
	return float64(v) / 1000
}

// NewHistogram returns an empty HDR histogram with the range and precision
// the Recorder uses for m, for merging windows (docs/design.md "Snapshots", merging).
func NewHistogram(m Metric) *hdrhistogram.Histogram {
	return hdrhistogram.New(1, unitMax[m.Unit()], sigFigs)
}

// micros converts a duration to the HDR latency unit. Sub-microsecond
// values record as 0: the HDR's lowest bucket, not a clamp.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// millis converts a rate in tokens/s to the HDR rate unit.
func millis(rate float64) int64 {
	v := math.Round(rate * 1000)
	if v > math.MaxInt64/2 {
		return math.MaxInt64 / 2 // clamped again by pair.record
	}
	return int64(v)
}

// pair is one metric's current-window and cumulative histograms. A value
// is recorded in the window only; the window is added to the total when it
// is swapped out (fold), so that the hot paths pay one HDR record, not two.
// It is not safe for concurrent use: its owner serializes the window side
// (record, swap) under one lock and the total (fold, cumulative) under
// another, taken first when both are.
type pair struct {
	m       Metric
	window  *hdrhistogram.Histogram
	total   *hdrhistogram.Histogram // the windows swapped out
	clamped int64                   // values clamped in the current window
	ever    int64                   // values clamped in the windows swapped out
	counter prometheus.Counter      // anvilproxy_histo_clamped_total{metric=m}
}

func newPair(m Metric, counter prometheus.Counter) pair {
	return pair{m: m, window: NewHistogram(m), total: NewHistogram(m), counter: counter}
}

// record adds v to the window histogram. A value outside [0, max] is
// clamped to the nearest end and counted: hdrhistogram-go returns an error
// for it and dropping it silently would bias every quantile (docs/design.md
// "Rules the code keeps": never drop silently).
func (p *pair) record(v int64) {
	if hi := unitMax[p.m.Unit()]; v < 0 || v > hi {
		v = min(max(v, 0), hi)
		p.clamped++
		p.counter.Inc()
	}
	// It cannot fail: v is within the histogram's range.
	_ = p.window.RecordValue(v)
}

// fold adds a swapped-out window histogram and its clamps to the total.
func (p *pair) fold(window *hdrhistogram.Histogram, clamped int64) {
	p.total.Merge(window)
	p.ever += clamped
}

// cumulative returns a copy of the total with window, a copy of the window
// in progress, added; and the clamps of both.
func (p *pair) cumulative(window *hdrhistogram.Histogram, clamped int64) (*hdrhistogram.Histogram, int64) {
	total := p.total.Clone()
	total.Merge(window)
	return total, p.ever + clamped
}

// swap installs fresh as the window histogram and returns the finished one
// with its clamp count. fresh is allocated by the caller outside the lock.
func (p *pair) swap(fresh *hdrhistogram.Histogram) (*hdrhistogram.Histogram, int64) {
	old, clamped := p.window, p.clamped
	p.window, p.clamped = fresh, 0
	return old, clamped
}

// eventPair is a per-event metric: its HDR pair and its Prometheus
// histogram, under locks of their own: they are recorded far more often
// than the per-request ones and must not contend with Record. It is the
// Prometheus collector of its histogram. Safe for concurrent use.
type eventPair struct {
	mu      sync.Mutex // guards p's window and clamped, and prom
	totalMu sync.Mutex // guards p's total and ever; taken before mu
	p       pair
	prom    eventHistogram
	desc    *prometheus.Desc
	created time.Time // when prom began counting
}

func newEventPair(m Metric, clamped prometheus.Counter, now time.Time) *eventPair {
	row := &phases[m]
	return &eventPair{
		p:       newPair(m, clamped),
		prom:    newEventHistogram(row.buckets),
		desc:    prometheus.NewDesc(row.prom, row.help, nil, nil),
		created: now,
	}
}

func (e *eventPair) observe(d time.Duration) {
	e.mu.Lock()
	e.p.record(micros(d))
	e.prom.observe(d)
	e.mu.Unlock()
}

func (e *eventPair) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e *eventPair) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	h := e.prom.clone()
	e.mu.Unlock()
	m, err := h.metric(e.desc, e.created)
	if err != nil { // the counts are consistent by construction
		m = prometheus.NewInvalidMetric(e.desc, err)
	}
	ch <- m
}

// swap installs fresh as the window histogram and returns the finished
// one, folded into the total, with its clamp count. The events go on
// meanwhile; a cumulative read waits for the fold.
func (e *eventPair) swap(fresh *hdrhistogram.Histogram) (*hdrhistogram.Histogram, int64) {
	e.totalMu.Lock()
	defer e.totalMu.Unlock()
	e.mu.Lock()
	old, clamped := e.p.swap(fresh)
	e.mu.Unlock()
	e.p.fold(old, clamped)
	return old, clamped
}

// cloneWindow returns a copy of the window histogram and its clamp count.
func (e *eventPair) cloneWindow() (*hdrhistogram.Histogram, int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.p.window.Clone(), e.p.clamped
}

// cloneTotal returns the cumulative histogram, the window in progress
// included, and its clamp count.
func (e *eventPair) cloneTotal() (*hdrhistogram.Histogram, int64) {
	e.totalMu.Lock()
	defer e.totalMu.Unlock()
	window, clamped := e.cloneWindow()
	return e.p.cumulative(window, clamped)
}
