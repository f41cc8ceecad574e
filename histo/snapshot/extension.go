package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/histo/selfcheck"
)

// Extension is a v1 document's "anvilproxy" object: what the proxy measures
// beyond the benchmark's keys, and the HDR histograms that make windows and
// replicas merge exactly. Fields are in the order of their JSON keys.
type Extension struct {
	// Cache is histo.CacheSection: the prompt tokens served from the
	// engine's prefix cache as the engine reported them and as the proxy
	// inferred them from prefill times, side by side, never mixed; null in
	// merges of files that have none.
	Cache json.RawMessage `json:"cache"`
	// Clamped counts, per metric, the values recorded at the end of the HDR
	// range because they fell outside it.
	Clamped map[string]int64 `json:"clamped"`
	// Concurrency is histo.ConcurrencySection: the requests by the
	// engine's load when admitted, each level's queue and service, the
	// queue knee and a reading of where the traffic sits.
	Concurrency json.RawMessage `json:"concurrency"`
	// Conversations is histo.ConversationsSection: each conversation's
	// time in the engine against the agent's own between turns.
	Conversations json.RawMessage `json:"conversations"`
	// Distributions are the phases the benchmark has no metrics key for:
	// queue_ms, prefill_ms, reasoning_ms and connect_ms over successful
	// requests (exact or HDR as PercentileSource says), and the per-event
	// inter_event_ms and proxy_overhead_ms (always from the HDR histograms).
	Distributions map[string]Stats `json:"distributions"`
	// DroppedRecords counts requests beyond the window's record cap: they
	// are in the histograms, counts and goodput but not in request_timings
	// or failures.
	DroppedRecords int64 `json:"dropped_records"`
	// Engine is histo.EngineSection: the engine's own /metrics as last
	// scraped (its running and waiting counts, KV cache) and the agreement
	// of its token and prefill totals with the proxy's (docs/engines.md);
	// null without a scraper and in files that have none.
	Engine json.RawMessage `json:"engine"`
	// EngineSlots is histo.SlotsSection: the engine's slot count behind
	// queue_source "occupancy" when the latest window ended, the
	// --engine-slots hint and whether the evidence contradicted it; null
	// in merges of files that have none.
	EngineSlots json.RawMessage `json:"engine_slots"`
	// Goodput is against the SLOs configured with --slo, with the
	// goodput-vs-budget curve of each.
	Goodput histo.Goodput `json:"goodput"`
	// Histograms holds every latency, rate and token histogram in the
	// HdrHistogram V2 compressed encoding, base64, keyed by histo.Metric name.
	Histograms map[string]Histogram `json:"histograms"`
	// MaxInflightObserved is the most requests the proxy had in flight
	// upstream at once, as seen at admission (the benchmark's "concurrency"
	// is a setting the proxy does not have).
	MaxInflightObserved histo.Count `json:"max_inflight_observed"`
	// MeasurementQuality is selfcheck.Section: whether the host let the
	// proxy take its stamps on time ("good" or "noisy", with reasons).
	MeasurementQuality json.RawMessage `json:"measurement_quality"`
	// Models counts requests (failed included) per model label.
	Models map[string]int64 `json:"models"`
	// Notes are caveats a reader must know, in words.
	Notes []string `json:"notes"`
	// PercentileSource is "exact" when the statistics come from every
	// request's record, "hdr" when records were dropped and they come from
	// the HDR histograms (values within 0.1%).
	PercentileSource string `json:"percentile_source"`
	// PrefixCacheHitSamples is the number of requests behind
	// metrics.prefix_cache_hit_avg, so that the average merges exactly.
	PrefixCacheHitSamples int64 `json:"prefix_cache_hit_samples"`
	// PrefillRateModel is the learned prefill rate behind queue_source
	// "model" when the window ended.
	PrefillRateModel PrefillModel `json:"prefill_rate_model"`
	// Prefix is histo.PrefixSection (docs/design.md "Prefix drift"); null in merges of
	// files that have none (the benchmark client's).
	Prefix json.RawMessage `json:"prefix"`
	// PromptLedger is histo.LedgerSection: the prompts' bytes by part
	// (system, tools, history, last turn) and how they grow with turns.
	PromptLedger json.RawMessage `json:"prompt_ledger"`
	// QueueSplit is the queue/prefill split by source (docs/design.md "Queue vs prefill"):
	// requests per source, failed and dropped included, and the queue and
	// prefill distributions of the successful requests with a record.
	QueueSplit map[string]SourceSplit `json:"queue_split"`
	// Retry is histo.RetrySection (docs/design.md "Retries"); null in merges of
	// files that have none (the benchmark client's).
	Retry json.RawMessage `json:"retry"`
	// The measurement window (or, merged, the span of the windows).
	WindowEnd         string `json:"window_end"` // RFC 3339, nanoseconds, UTC
	WindowEndUnixNs   int64  `json:"window_end_unix_ns"`
	WindowStart       string `json:"window_start"`
	WindowStartUnixNs int64  `json:"window_start_unix_ns"`
	// Windows is the number of windows merged into the document: 1 for a
	// file the proxy wrote.
	Windows int64 `json:"windows"`
}

// Histogram is one HDR histogram of Extension.Histograms.
type Histogram struct {
	HDR  string `json:"hdr"`  // V2 compressed encoding, base64
	Unit string `json:"unit"` // histo.Unit: "us", "mtok/s" or "tokens"
}

// SourceSplit is the queue/prefill split of the requests of one
// histo.QueueSource.
type SourceSplit struct {
	PrefillMs Stats `json:"prefill_ms"`
	QueueMs   Stats `json:"queue_ms"`
	Requests  int64 `json:"requests"`
}

// PrefillModel is the state of the proxy's prefill-rate model.
type PrefillModel struct {
	Ready      bool `json:"ready"`        // enough samples for queue_source "model"
	Samples    int  `json:"samples"`      // samples the median rests on
	TokensPerS Num  `json:"tokens_per_s"` // uncached prompt tokens per second; null until Ready
}

// Stats is a distribution's summary, in the v1 statistics: mean, sample
// standard deviation, normal-approximation 95% confidence interval of the
// mean, min, nearest-rank percentiles and max. A statistic that the sample
// does not define (none without samples; stddev and the interval with fewer
// than two) is null.
type Stats struct {
	CI95High Num   `json:"ci95_high"`
	CI95Low  Num   `json:"ci95_low"`
	Max      Num   `json:"max"`
	Mean     Num   `json:"mean"`
	Min      Num   `json:"min"`
	P25      Num   `json:"p25"`
	P50      Num   `json:"p50"`
	P75      Num   `json:"p75"`
	P90      Num   `json:"p90"`
	P95      Num   `json:"p95"`
	P99      Num   `json:"p99"`
	Samples  int64 `json:"samples"`
	Stddev   Num   `json:"stddev"`
}

// extension is the anvilproxy object.
func (pop *population) extension(doc *Document) (*Extension, error) {
	ext := &Extension{
		Clamped:             make(map[string]int64, histo.NumMetrics),
		Distributions:       make(map[string]Stats, len(phases)),
		Histograms:          make(map[string]Histogram, histo.NumMetrics),
		Models:              pop.models(),
		MaxInflightObserved: -1,
		PercentileSource:    "exact",
		PrefillRateModel:    PrefillModel{TokensPerS: nan},
		QueueSplit:          pop.queueSplit(),
		WindowStart:         time.Unix(0, doc.StartedAtUnixNs).UTC().Format(time.RFC3339Nano),
		WindowStartUnixNs:   doc.StartedAtUnixNs,
		WindowEnd:           time.Unix(0, doc.FinishedAtUnixNs).UTC().Format(time.RFC3339Nano),
		WindowEndUnixNs:     doc.FinishedAtUnixNs,
		Notes:               []string{},
	}
	if !pop.exact {
		ext.PercentileSource = "hdr"
	}
	_, ext.PrefixCacheHitSamples = pop.cacheHits()
	for _, ph := range phases {
		ext.Distributions[ph.key] = pop.stats(ph.metric, func(t *Timing) Num { return metricValue(t, ph.metric) })
	}
	for m, h := range pop.hist {
		ext.Histograms[histo.Metric(m).String()] = Histogram{HDR: dist.Encode(h), Unit: histo.Metric(m).Unit().String()}
		ext.Clamped[histo.Metric(m).String()] = 0
	}
	var latest int64
	for _, p := range pop.parts {
		dist.AddCounts(ext.Clamped, p.clamped)
		ext.DroppedRecords += p.dropped
		ext.MaxInflightObserved = max(ext.MaxInflightObserved, p.maxInflight)
		ext.Windows += p.windows
		if p.prefill != nil && p.end >= latest {
			ext.PrefillRateModel, latest = *p.prefill, p.end
		}
	}
	ext.Goodput = pop.goodput(ext)
	if err := pop.sections(ext); err != nil {
		return nil, err
	}
	ext.Notes = dedupe(append(ext.Notes, pop.notes(ext)...))
	return ext, nil
}

// sections merges the inputs' sections into ext; a section none of them
// has stays null.
func (pop *population) sections(ext *Extension) error {
	n := len(pop.parts)
	retries, prefixes := make([]*histo.RetrySection, n), make([]*histo.PrefixSection, n)
	convs, ledgers := make([]*histo.ConversationsSection, n), make([]*histo.LedgerSection, n)
	levels, quality := make([]*histo.ConcurrencySection, n), make([]*selfcheck.Section, n)
	for i, p := range pop.parts {
		retries[i], prefixes[i] = p.retry, p.prefix
		convs[i], ledgers[i], levels[i], quality[i] = p.conversations, p.ledger, p.concurrency, p.quality
	}
	q := selfcheck.Merge(quality...)
	if q != nil && q.Verdict == selfcheck.VerdictNoisy {
		ext.Notes = append(ext.Notes, "the host was noisy in at least one window (measurement_quality): the proxy's stamps may include its scheduling delays")
	}
	var errs [8]error
	caches := make([]*histo.CacheSection, n)
	var slots *histo.SlotsSection
	var eng *histo.EngineSection
	var latest, latestEngine int64
	for i, p := range pop.parts {
		caches[i] = p.cache
		if p.slots != nil && (slots == nil || p.end >= latest) {
			slots, latest = p.slots, p.end
		}
		if p.engine != nil && (eng == nil || p.end >= latestEngine) {
			eng, latestEngine = p.engine, p.end
		}
	}
	ext.Notes = append(ext.Notes, sharedNotes(eng)...)
	var engErr error
	ext.Engine, engErr = rawSection(eng)
	cache := histo.MergeCache(caches...)
	ext.Notes = append(ext.Notes, cacheNotes(cache)...)
	if slots != nil && (slots.State == histo.SlotsHintLow || slots.State == histo.SlotsHintHigh) {
		ext.Notes = append(ext.Notes, "the --engine-slots hint disagreed with what the proxy observed (engine_slots.state): the occupancy queue/prefill split used the observed slot count")
	}
	ext.Cache, errs[6] = rawSection(cache)
	ext.EngineSlots, errs[7] = rawSection(slots)
	ext.Retry, errs[0] = rawSection(histo.MergeRetry(retries...))
	ext.Prefix, errs[1] = rawSection(histo.MergePrefix(prefixes...))
	ext.Conversations, errs[2] = rawSection(histo.MergeConversations(convs...))
	ext.PromptLedger, errs[3] = rawSection(histo.MergeLedger(ledgers...))
	ext.Concurrency, errs[4] = rawSection(histo.MergeConcurrency(levels...))
	ext.MeasurementQuality, errs[5] = rawSection(q)
	return errors.Join(append(errs[:], engErr)...)
}

// cacheNotes says what a reader of the cache figures must know.
func cacheNotes(c *histo.CacheSection) []string {
	if c == nil || c.Requests == 0 {
		return nil
	}
	var out []string
	if c.EngineReported.Requests == 0 {
		out = append(out, "the engine reported no cached prompt tokens: cache.engine_reported has no data (not 0%); cache.inferred is the proxy's estimate from prefill times")
	}
	return out
}

// queueSplit is requests per queue source and, over the successful
// requests with a record, their queue and prefill distributions.
func (pop *population) queueSplit() map[string]SourceSplit {
	requests := make(map[string]int64)
	for _, s := range histo.QueueSources() {
		requests[string(s)] = 0
	}
	for _, p := range pop.parts {
		for s, n := range p.queueSources {
			requests[s] += n
		}
	}
	out := make(map[string]SourceSplit, len(requests))
	for s, n := range requests {
		var mine []Timing
		for _, t := range pop.timings {
			if sourceOf(&t) == s {
				mine = append(mine, t)
			}
		}
		out[s] = SourceSplit{
			Requests:  n,
			QueueMs:   exactStats(values(mine, func(t *Timing) Num { return t.QueueMs })),
			PrefillMs: exactStats(values(mine, func(t *Timing) Num { return t.PrefillMs })),
		}
	}
	return out
}

// sourceOf is t's queue source; a file without one has "none".
func sourceOf(t *Timing) string {
	if t.QueueSource == nil {
		return string(histo.SourceNone)
	}
	return *t.QueueSource
}

// goodput sums the inputs' goodput when they were judged against the same
// SLOs; otherwise (or when an input carries none, as a benchmark file)
// goodput is the share of requests that did not fail, without curves.
func (pop *population) goodput(ext *Extension) histo.Goodput {
	var g histo.Goodput
	same := true
	for i, p := range pop.parts {
		if p.goodput == nil || (i > 0 && !sameSLOs(p.goodput.Curves, pop.parts[0].goodput.Curves)) {
			same = false
			break
		}
	}
	if same {
		g.Curves = cloneCurves(pop.parts[0].goodput.Curves)
		for _, p := range pop.parts {
			g.Requests += p.goodput.Requests
			g.Failed += p.goodput.Failed
			g.Good += p.goodput.Good
			for c, pc := range p.goodput.Curves {
				g.Curves[c].Met += pc.Met
				for k := range pc.Points {
					g.Curves[c].Points[k].Met += pc.Points[k].Met
				}
			}
		}
	} else {
		for _, p := range pop.parts {
			g.Requests += p.requests
			g.Failed += p.failed
		}
		g.Good = g.Requests - g.Failed
		g.Curves = []histo.Curve{}
		ext.Notes = append(ext.Notes, "goodput is the share of requests that did not fail: not every input carries goodput against the same SLOs")
	}
	g.Ratio = ratio(g.Good, g.Requests)
	for c := range g.Curves {
		g.Curves[c].Ratio = ratio(g.Curves[c].Met, g.Requests)
		for k := range g.Curves[c].Points {
			g.Curves[c].Points[k].Share = ratio(g.Curves[c].Points[k].Met, g.Requests)
		}
	}
	return g
}

// ratio is n/d, unknown without requests.
func ratio(n, d int64) histo.Float {
	if d == 0 {
		return histo.Float(nan)
	}
	return histo.Float(float64(n) / float64(d))
}

// sameSLOs reports whether two goodput curve sets judge the same SLOs.
func sameSLOs(a, b []histo.Curve) bool {
	return slices.EqualFunc(a, b, func(x, y histo.Curve) bool {
		return x.Metric == y.Metric && x.Threshold == y.Threshold && len(x.Points) == len(y.Points)
	})
}

// cloneCurves copies cs with every count zeroed.
func cloneCurves(cs []histo.Curve) []histo.Curve {
	out := slices.Clone(cs)
	for i := range out {
		out[i].Met = 0
		out[i].Points = slices.Clone(out[i].Points)
		for k := range out[i].Points {
			out[i].Points[k].Met = 0
		}
	}
	if out == nil {
		out = []histo.Curve{}
	}
	return out
}

// notes are the caveats of the merged document: its own and its inputs'.
// They carry no numbers, so that a merge of merges states each once.
func (pop *population) notes(ext *Extension) []string {
	var out []string
	if ext.DroppedRecords > 0 {
		out = append(out, "request records were dropped at the window record cap (dropped_records): the distributions come from the HDR histograms (within 0.1%); request_timings, failures, token totals and the per-source queue split cover the kept records only")
	}
	for _, p := range pop.parts {
		if p.rebuilt {
			out = append(out, "an input carried no HDR histograms (a benchmark file): its histograms were rebuilt from its request_timings, and inter_event_ms and proxy_overhead_ms do not cover it")
		}
		out = append(out, p.notes...)
	}
	return out
}

// dedupe removes repeated strings, keeping the first of each.
func dedupe(s []string) []string {
	seen := make(map[string]bool, len(s))
	return slices.DeleteFunc(s, func(n string) bool {
		dup := seen[n]
		seen[n] = true
		return dup
	})
}

// rawSection encodes an optional section; nil stays null.
func rawSection[T any](v *T) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("snapshot: encoding a section: %w", err)
	}
	return b, nil
}

// sharedNotes says what the engine section's Shared verdict means for the
// split: nothing when no one else shares the engine.
func sharedNotes(eng *histo.EngineSection) []string {
	if eng == nil {
		return nil
	}
	switch eng.Shared {
	case histo.SharedYes:
		return []string{fmt.Sprintf("the engine's /metrics counted %.2f× the prompt tokens this proxy relayed (engine.prompt_tokens_ratio): other front doors share the engine, which the occupancy split cannot see; the split took the cold prefill's account of the wait (queue_source engine_load)", float64(eng.PromptRatio))}
	case histo.SharedUnknown:
		return []string{fmt.Sprintf("the engine's /metrics counted %.2f× the prompt tokens this proxy relayed, but %.0f%% of its requests have prompt tokens it does not know (engine.unaccounted_share: failed, or streamed without usage; --inject-usage asks for it), so whether other front doors share the engine cannot be told: the split assumed they do not", float64(eng.PromptRatio), 100*float64(eng.UnaccountedShare))}
	}
	return nil
}
