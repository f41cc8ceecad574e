package snapshot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/selfcheck"
)

// part is one input of assemble: a window the proxy measured, or a document
// read from a file. Build and Merge both go through assemble, so a document
// merged from one file states what the file stated.
type part struct {
	doc         *Document // the keys passed through (passiveNulls); null in a window's
	start, end  int64     // Unix ns
	wallMs      float64
	runID       string
	protocol    string
	methodology json.RawMessage

	timings  []Timing          // successful requests
	failures []json.RawMessage // failed requests
	requests int64             // attempted, records dropped or not
	failed   int64
	// responses counts the requests whose upstream answered with headers.
	responses int64

	// Totals over the successful requests: the benchmark's metrics counters.
	contentChunks, reasoningChunks, outputTokens, promptTokens int64
	promptSamples                                              int64
	sources                                                    map[string]int64 // output token sources
	cacheHitSum                                                float64          // Σ cached/prompt
	cacheHitN                                                  int64
	// hitExact: the timings hold every request behind cacheHitN, so the
	// merged average is recomputed from them rather than from the sums
	// (which would differ in the last bit).
	hitExact bool

	hist     [histo.NumMetrics]*hdrhistogram.Histogram // nil: none
	rebuilt  bool                                      // hist was rebuilt from timings
	complete bool                                      // timings hold every successful request
	goodput  *histo.Goodput                            // nil: unknown
	retry    *histo.RetrySection                       // nil: unknown (a benchmark file)
	prefix   *histo.PrefixSection                      // nil: unknown (a benchmark file)
	// The sections of agent-side time, prompt composition, engine load
	// and measurement quality; nil: unknown.
	conversations *histo.ConversationsSection
	ledger        *histo.LedgerSection
	concurrency   *histo.ConcurrencySection
	quality       *selfcheck.Section
	cache         *histo.CacheSection  // nil: unknown (a benchmark file, an older proxy)
	slots         *histo.SlotsSection  // nil: unknown
	engine        *histo.EngineSection // nil: no scraper, or a file without one

	queueSources map[string]int64
	clamped      map[string]int64
	dropped      int64
	models       map[string]int64
	prefill      *PrefillModel // nil: unknown
	maxInflight  histo.Count
	windows      int64
	notes        []string // the input's own caveats
}

// countTimings sets p's totals from its timings.
func (p *part) countTimings() {
	p.sources = make(map[string]int64)
	p.contentChunks, p.reasoningChunks, p.outputTokens, p.promptTokens = 0, 0, 0, 0
	p.promptSamples, p.cacheHitSum, p.cacheHitN = 0, 0, 0
	for i := range p.timings {
		t := &p.timings[i]
		p.contentChunks += max(0, int64(t.ContentChunks))
		p.reasoningChunks += max(0, int64(t.ReasoningChunks))
		if t.OutputTokens >= 0 {
			p.outputTokens += int64(t.OutputTokens)
			if t.OutputTokenSource != nil {
				p.sources[*t.OutputTokenSource]++
			}
		}
		if t.PromptTokens >= 0 {
			p.promptTokens += int64(t.PromptTokens)
			p.promptSamples++
			if t.PromptTokens > 0 && t.CachedTokens >= 0 {
				p.cacheHitSum += float64(t.CachedTokens) / float64(t.PromptTokens)
				p.cacheHitN++
			}
		}
	}
}

// population is the merged inputs.
type population struct {
	parts    []*part
	timings  []Timing
	failures []json.RawMessage
	hist     [histo.NumMetrics]*hdrhistogram.Histogram
	exact    bool
}

// stats summarizes metric m (read with value) over the population: exactly
// from the timings when they hold every successful request, else from the
// merged histogram. Per-event metrics have no timings.
func (pop *population) stats(m histo.Metric, value func(*Timing) Num) Stats {
	if !pop.exact || m >= histo.MetricInterEvent {
		return hdrStats(pop.hist[m], m)
	}
	return exactStats(values(pop.timings, value))
}

// values are the known values of ts read with value.
func values(ts []Timing, value func(*Timing) Num) []float64 {
	out := make([]float64, 0, len(ts))
	for i := range ts {
		if v := value(&ts[i]); v.Known() {
			out = append(out, float64(v))
		}
	}
	return out
}

// assemble merges parts into one document.
func assemble(parts []*part) (*Document, error) {
	sort.SliceStable(parts, func(i, j int) bool { return parts[i].start < parts[j].start })
	pop := &population{parts: parts, exact: true}
	var offset int64
	for _, p := range parts {
		pop.exact = pop.exact && p.complete
		if len(parts) == 1 {
			pop.timings, pop.failures = p.timings, p.failures
			break
		}
		for _, t := range p.timings {
			t.RequestIndex += offset
			pop.timings = append(pop.timings, t)
		}
		for _, f := range p.failures {
			pop.failures = append(pop.failures, reindex(f, offset))
		}
		offset += max(p.requests, int64(len(p.timings)+len(p.failures)))
	}
	if pop.timings == nil {
		pop.timings = []Timing{}
	}
	if pop.failures == nil {
		pop.failures = []json.RawMessage{}
	}
	for m := range pop.hist {
		if h := parts[0].hist[m]; len(parts) == 1 && h != nil {
			pop.hist[m] = h // only read
			continue
		}
		pop.hist[m] = histo.NewHistogram(histo.Metric(m))
		for _, p := range parts {
			if h := p.hist[m]; h != nil {
				pop.hist[m].Merge(h)
			}
		}
	}

	doc := pop.header()
	doc.Metrics = pop.metrics(doc)
	doc.MetricPopulation = pop.metricPopulation(doc)
	ext, err := pop.extension(doc)
	if err != nil {
		return nil, err
	}
	doc.Anvilproxy = ext
	return doc, nil
}

// reindex adds offset to a failure's request_index, keeping every other key
// of it as it was.
func reindex(f json.RawMessage, offset int64) json.RawMessage {
	var obj map[string]json.RawMessage
	var i int64
	if offset == 0 || json.Unmarshal(f, &obj) != nil || json.Unmarshal(obj["request_index"], &i) != nil {
		return f
	}
	obj["request_index"] = json.RawMessage(fmt.Sprint(i + offset))
	b, err := json.Marshal(obj)
	if err != nil {
		return f
	}
	return b
}

// header fills the document's top-level keys apart from metrics,
// metric_population and anvilproxy.
func (pop *population) header() *Document {
	parts := pop.parts
	doc := &Document{
		Schema:             Schema,
		TimestampPrecision: "nanosecond-unix-fields; ISO labels are second precision",
		RequestTimings:     pop.timings,
		Failures:           pop.failures,
		WallClockMs:        Num(parts[0].wallMs),
		RunID:              parts[0].runID,
	}
	start, end := parts[0].start, parts[0].end
	for _, p := range parts {
		doc.Requests += p.requests
		doc.Failed += p.failed
		doc.ResponsesReceived += p.responses
		start, end = min(start, p.start), max(end, p.end)
	}
	doc.Completed = doc.Requests - doc.Failed
	doc.StartedAtUnixNs, doc.FinishedAtUnixNs = start, end
	doc.StartedAt, doc.FinishedAt = isoSecond(start), isoSecond(end)
	if len(parts) > 1 {
		doc.WallClockMs = Num(float64(pop.covered()) / float64(time.Millisecond))
		doc.RunID = "anvilproxy-merged-" + time.Unix(0, start).UTC().Format("20060102T150405.000Z")
	}
	doc.Model = pop.model()
	doc.PerformanceEligible = doc.Completed > 0
	doc.MeasurementProtocol, doc.TimingMethodology = pop.protocol()
	pop.passThrough(doc)
	return doc
}

// covered is the time the inputs' windows cover, in nanoseconds: the span
// of consecutive windows or of replicas' overlapping ones, without the gaps
// between separate runs, so that throughput is over measured time.
func (pop *population) covered() int64 {
	var total, end int64 // parts are sorted by start
	for i, p := range pop.parts {
		if i == 0 || p.start > end {
			total += max(0, p.end-p.start)
			end = p.end
		} else if p.end > end {
			total += p.end - end
			end = p.end
		}
	}
	return total
}

func isoSecond(ns int64) string { return time.Unix(0, ns).UTC().Format("2006-01-02T15:04:05Z") }

// model is the most common model, ties to the first by name.
func (pop *population) model() *string {
	counts := pop.models()
	var best string
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		if best == "" || counts[name] > counts[best] {
			best = name
		}
	}
	return str(best)
}

func (pop *population) models() map[string]int64 {
	out := make(map[string]int64)
	for _, p := range pop.parts {
		for name, n := range p.models {
			out[name] += n
		}
	}
	return out
}

// protocol is the inputs' measurement protocol and methodology: theirs when
// they agree, else the protocols joined with "+" and each methodology by
// protocol.
func (pop *population) protocol() (string, json.RawMessage) {
	byProtocol := make(map[string]json.RawMessage)
	for _, p := range pop.parts {
		if _, ok := byProtocol[p.protocol]; !ok {
			byProtocol[p.protocol] = p.methodology
		}
	}
	if len(byProtocol) == 1 {
		return pop.parts[0].protocol, pop.parts[0].methodology
	}
	names := slices.Sorted(maps.Keys(byProtocol))
	b, err := json.Marshal(byProtocol)
	if err != nil {
		b = nil
	}
	return strings.Join(names, "+"), b
}

// passThrough sets the benchmark-only keys to the value every input has,
// else null.
func (pop *population) passThrough(doc *Document) {
	fields := func(d *Document) []*json.RawMessage {
		return []*json.RawMessage{&d.BaseURL, &d.ClockDomainID, &d.Concurrency, &d.ConfigurationFingerprint,
			&d.ContextDistribution, &d.ContextSeed, &d.ContextTokens, &d.ControlledOutputPolicy, &d.Engine,
			&d.GPU, &d.Manifest, &d.MaxContextTokens, &d.MaxTokens, &d.PromptCacheMode, &d.RequestCanaries,
			&d.ResponseWords, &d.Sampling, &d.ServeFlags, &d.SharedPrefixTokens, &d.SourceRecipe, &d.Tier}
	}
	out := fields(doc)
	for i := range out {
		v := *fields(pop.parts[0].doc)[i]
		for _, p := range pop.parts[1:] {
			if !sameJSON(v, *fields(p.doc)[i]) {
				v = nil
				break
			}
		}
		*out[i] = v
	}
}

func sameJSON(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return false
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}
