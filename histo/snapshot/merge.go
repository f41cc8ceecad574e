package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/selfcheck"
)

// Merge combines v1 documents (the proxy's windows or replicas, benchmark
// files, or earlier merges) into one over all their requests. The
// statistics are exact: recomputed from the union of request_timings when
// every input lists every successful request, else from the merged HDR
// histograms (an input without histograms contributes histograms rebuilt
// from its request_timings). Counts and token totals are summed. Merge does
// not modify docs.
func Merge(docs ...*Document) (*Document, error) {
	if len(docs) == 0 {
		return nil, errors.New("snapshot: nothing to merge")
	}
	parts := make([]*part, len(docs))
	for i, d := range docs {
		p, err := docPart(d)
		if err != nil {
			return nil, err
		}
		parts[i] = p
	}
	return assemble(parts)
}

// docPart is a document read from a file as one input of assemble.
func docPart(d *Document) (*part, error) {
	p := &part{
		doc:   d,
		start: d.StartedAtUnixNs, end: d.FinishedAtUnixNs,
		wallMs:      float64(d.WallClockMs),
		runID:       d.RunID,
		protocol:    d.MeasurementProtocol,
		methodology: d.TimingMethodology,
		timings:     d.RequestTimings,
		failures:    d.Failures,
		requests:    d.Requests,
		failed:      d.Failed,
		responses:   d.ResponsesReceived,
		maxInflight: -1,
		windows:     1,
		models:      make(map[string]int64),
	}
	if !d.WallClockMs.Known() {
		p.wallMs = float64(p.end-p.start) / 1e6
	}
	p.countTimings()
	p.counters(d.Metrics)
	ext := d.Anvilproxy
	if ext == nil {
		return p.fromBenchmark(d), nil
	}
	for m := range histo.NumMetrics {
		h, err := decodeHist(ext.Histograms, m)
		if err != nil {
			return nil, err
		}
		p.hist[m] = h
	}
	p.complete = ext.DroppedRecords == 0
	p.goodput = &ext.Goodput
	if err := p.sections(ext); err != nil {
		return nil, err
	}
	p.queueSources = make(map[string]int64, len(ext.QueueSplit))
	for s, split := range ext.QueueSplit {
		p.queueSources[s] = split.Requests
	}
	p.clamped = ext.Clamped
	p.dropped = ext.DroppedRecords
	p.models = ext.Models
	pm := ext.PrefillRateModel
	p.prefill = &pm
	p.maxInflight = ext.MaxInflightObserved
	p.windows = max(1, ext.Windows)
	p.notes = ext.Notes
	p.hitExact = p.complete && p.cacheHitN == ext.PrefixCacheHitSamples
	if avg, ok := number(d.Metrics["prefix_cache_hit_avg"]); ok && !p.hitExact {
		p.cacheHitN = ext.PrefixCacheHitSamples
		p.cacheHitSum = avg * float64(p.cacheHitN)
	}
	return p, nil
}

// sections reads the extension's sections; a missing or null one stays
// nil.
func (p *part) sections(ext *Extension) error {
	var errs [8]error
	p.cache, errs[6] = section[histo.CacheSection](ext.Cache, "cache")
	p.slots, errs[7] = section[histo.SlotsSection](ext.EngineSlots, "engine_slots")
	var engErr error
	p.engine, engErr = section[histo.EngineSection](ext.Engine, "engine")
	p.prefix, errs[0] = section[histo.PrefixSection](ext.Prefix, "prefix")
	p.retry, errs[1] = section[histo.RetrySection](ext.Retry, "retry")
	p.conversations, errs[2] = section[histo.ConversationsSection](ext.Conversations, "conversations")
	p.ledger, errs[3] = section[histo.LedgerSection](ext.PromptLedger, "prompt_ledger")
	p.concurrency, errs[4] = section[histo.ConcurrencySection](ext.Concurrency, "concurrency")
	p.quality, errs[5] = section[selfcheck.Section](ext.MeasurementQuality, "measurement_quality")
	return errors.Join(append(errs[:], engErr)...)
}

func section[T any](raw json.RawMessage, key string) (*T, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("anvilproxy.%s: %w", key, err)
	}
	return v, nil
}

// fromBenchmark fills what a file without the anvilproxy extension lacks:
// histograms rebuilt from its request_timings, the queue source of every
// request ("none": it has no split), and its model.
func (p *part) fromBenchmark(d *Document) *part {
	p.rebuilt = true
	p.complete = int64(len(d.RequestTimings)) >= d.Completed
	for m := range histo.NumMetrics {
		p.hist[m] = histo.NewHistogram(m)
	}
	p.queueSources = make(map[string]int64)
	for i := range p.timings {
		t := &p.timings[i]
		p.queueSources[sourceOf(t)]++
		for m := range histo.MetricInterEvent {
			if v := metricValue(t, m); v.Known() {
				recordValue(p.hist[m], m, float64(v))
			}
		}
	}
	if d.Model != nil {
		p.models[*d.Model] = d.Requests
	}
	// The benchmark states the requests behind its cache-hit average as
	// prompt_token_samples.
	if avg, ok := number(d.Metrics["prefix_cache_hit_avg"]); ok && p.cacheHitN == 0 {
		n, _ := number(d.Metrics["prompt_token_samples"])
		p.cacheHitN = int64(n)
		p.cacheHitSum = avg * n
	}
	return p
}

// counters takes the file's token and chunk totals over the totals of its
// request_timings, since they also cover requests whose records were
// dropped; the timings' totals stand in for a total the file lacks.
func (p *part) counters(metrics map[string]any) {
	for key, dst := range map[string]*int64{
		"content_chunks": &p.contentChunks, "reasoning_chunks": &p.reasoningChunks,
		"output_tokens": &p.outputTokens, "prompt_tokens": &p.promptTokens, "prompt_token_samples": &p.promptSamples,
	} {
		if v, ok := number(metrics[key]); ok {
			*dst = int64(v)
		}
	}
	if m, ok := metrics["output_token_sources"].(map[string]any); ok {
		p.sources = make(map[string]int64, len(m))
		for s, v := range m {
			if n, ok := number(v); ok {
				p.sources[s] = int64(n)
			}
		}
	}
}

// number reads a JSON number decoded into an any.
func number(v any) (float64, bool) {
	f, ok := v.(float64)
	return f, ok && !math.IsNaN(f)
}

// recordValue adds v (in the v1 unit) to h, a histogram of m, clamped to its
// range.
func recordValue(h *hdrhistogram.Histogram, m histo.Metric, v float64) {
	if m.Unit() != histo.Tokens {
		v *= 1000 // ms → µs, tokens/s → mtok/s
	}
	x := int64(math.Round(v))
	x = min(max(x, 0), h.HighestTrackableValue())
	_ = h.RecordValue(x) // in range
}

// decodeHist decodes histogram m of a document's extension. A metric the
// file lacks (written by an older proxy) is empty.
func decodeHist(hs map[string]Histogram, m histo.Metric) (*hdrhistogram.Histogram, error) {
	enc, ok := hs[m.String()]
	if !ok {
		return histo.NewHistogram(m), nil
	}
	if enc.Unit != m.Unit().String() {
		return nil, fmt.Errorf("histogram %s: unit %q, want %q", m, enc.Unit, m.Unit())
	}
	h, err := hdrhistogram.Decode([]byte(enc.HDR))
	if err != nil {
		return nil, fmt.Errorf("histogram %s: %w", m, err)
	}
	// The geometry the proxy writes is used as decoded; another (a future
	// version's) is merged into it.
	out := histo.NewHistogram(m)
	if h.LowestTrackableValue() == out.LowestTrackableValue() && h.HighestTrackableValue() == out.HighestTrackableValue() &&
		h.SignificantFigures() == out.SignificantFigures() {
		return h, nil
	}
	if dropped := out.Merge(h); dropped > 0 {
		return nil, fmt.Errorf("histogram %s: %d values outside the range", m, dropped)
	}
	return out, nil
}
