package snapshot

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/dist"
)

// The regression gate (anvilproxy diff): two merged documents, a baseline
// and a current one, compared phase by phase at p50, p90 and p99, with
// each change judged against its noise.
//
// Noise. Each percentile gets a standard error on each side, and a change
// is inside the noise when |current − baseline| <= 1.96·√(se_b² + se_c²)
// (a two-sided 95% test of the difference), or within the HDR histograms'
// resolution (0.1%). The standard error comes from
//   - a bootstrap of the per-request timings, when the side lists every
//     request (percentile_source "exact") and has at most bootstrapMax of
//     them: bootstrapRounds resamples with replacement, the percentile of
//     each, their standard deviation (deterministic: a fixed seed);
//   - otherwise the HDR counts: the nearest-rank percentile's distribution-
//     free 95% interval, the values at ranks n·q ∓ 1.96·√(n·q·(1−q)), whose
//     half-width over 1.96 is the standard error.
// Single figures (retry amplification, drift rate) use the counting error
// of their counts: √retries / logical requests, √(p(1−p)/tracked).
//
// Too few samples. The schema's p99_minimum_recommended_samples (N) is what
// a p99 needs, N/100 requests beyond it; a percentile p needs as many beyond
// it, N/100 / (1 − p/100) samples (p90: N/10, p50: N/50).

// Stat names of DiffPoint.
const (
	StatP50   = "p50"
	StatP90   = "p90"
	StatP99   = "p99"
	StatValue = "value" // a figure with no distribution (amplification, drift)
)

// bootstrapRounds and bootstrapMax bound the bootstrap: 200 resamples give
// a standard error to within about 5%; beyond bootstrapMax requests a side
// uses the HDR counts, which are then as good and far cheaper.
const (
	bootstrapRounds = 200
	bootstrapMax    = 20000
)

// Diff is the comparison of two documents, in the order the gate prints it.
type Diff struct {
	Baseline   DiffSide  `json:"baseline"`
	Current    DiffSide  `json:"current"`
	Rows       []DiffRow `json:"rows"`
	Verdict    string    `json:"verdict"`
	Moved      []string  `json:"moved"` // "queue.p90 up", beyond the noise
	MinSamples int64     `json:"p99_minimum_recommended_samples"`
	Noise      string    `json:"noise_method"`
}

// DiffSide describes one side's document.
type DiffSide struct {
	Requests  int64  `json:"requests"`
	Completed int64  `json:"completed"`
	Windows   int64  `json:"windows"`
	Start     string `json:"started_at"`
	End       string `json:"finished_at"`
	Exact     bool   `json:"exact"` // percentiles from every request's record
}

// DiffRow is one phase or figure.
type DiffRow struct {
	Name   string      `json:"name"` // one of DiffRowNames: a phase's word, or cache_hit, amplification, drift
	Unit   string      `json:"unit"` // ms, tok/s, ratio, x
	Better string      `json:"better"`
	Points []DiffPoint `json:"points"`
}

// DiffPoint is one statistic of a row on both sides.
type DiffPoint struct {
	Stat       string `json:"stat"`
	BaseN      int64  `json:"baseline_samples"`
	CurN       int64  `json:"current_samples"`
	Base       Num    `json:"baseline"`
	Cur        Num    `json:"current"`
	Change     Num    `json:"change"`   // current − baseline, in Unit
	Relative   Num    `json:"relative"` // change / baseline; null when baseline is 0 or unknown
	Threshold  Num    `json:"noise"`    // the change the noise allows, 1.96·√(se_b² + se_c²)
	Noise      bool   `json:"inside_noise"`
	FewSamples bool   `json:"few_samples"`
	NeedN      int64  `json:"samples_needed"`
}

// Moved reports whether the point changed beyond the noise on enough
// samples.
func (p DiffPoint) Moved() bool {
	return p.Change.Known() && !p.Noise && !p.FewSamples && p.Change != 0
}

// diffRow is a row of the gate, in the gate's order: a phase of histo's
// table, read from its distribution, or a figure that is no phase. A
// phase row's name, unit and direction come from the phase table (the
// phase's word, Phase.ShortName; a time is better lower, a rate higher:
// unitOf, betterOf), so that no phase name is written here.
type diffRow struct {
	name, unit, better string
	metric             histo.Metric           // a phase's row; NumMetrics for a figure
	sample             func(*Document) sample // a figure's distribution, or nil
	value              func(*Document) figure // a figure's one number, or nil
}

// diffPhases are the phases the gate compares, in its order.
var diffPhases = [...]histo.Metric{histo.MetricQueue, histo.MetricPrefill, histo.MetricTTFO, histo.MetricTTFT, histo.MetricTPOT, histo.MetricE2E, histo.MetricDecodeRate}

// The rows that are no phase.
const (
	rowCacheHit      = "cache_hit"
	rowAmplification = "amplification"
	rowDrift         = "drift"
)

// diffRows are the gate's rows: diffPhases, then the figures. Read-only
// after package init.
var diffRows = func() []diffRow {
	var rows []diffRow
	for _, m := range diffPhases {
		rows = append(rows, diffRow{name: rowName(m), unit: unitOf(m), better: betterOf(m), metric: m})
	}
	return append(rows,
		diffRow{name: rowCacheHit, unit: "ratio", better: "higher", metric: histo.NumMetrics, sample: cacheSample},
		diffRow{name: rowAmplification, unit: "x", better: "lower", metric: histo.NumMetrics, value: amplification},
		diffRow{name: rowDrift, unit: "ratio", better: "lower", metric: histo.NumMetrics, value: driftRate},
	)
}()

// rowName is the name of phase m's row: its word in the phase table.
func rowName(m histo.Metric) string { return m.Phase().ShortName() }

// DiffRowNames are the rows Compare produces, in order.
var DiffRowNames = func() []string {
	names := make([]string, len(diffRows))
	for i, r := range diffRows {
		names[i] = r.name
	}
	return names
}()

var diffStats = [...]struct {
	name string
	p    int64
}{{StatP50, 50}, {StatP90, 90}, {StatP99, 99}}

// defaultMinSamples is p99_minimum_recommended_samples when neither
// document states it.
const defaultMinSamples = 100

// Compare compares current against baseline, both documents from Merge
// (or Build). It does not modify them.
func Compare(baseline, current *Document) (*Diff, error) {
	if baseline.Anvilproxy == nil || current.Anvilproxy == nil {
		return nil, fmt.Errorf("snapshot: compare merged documents (they carry the anvilproxy object)")
	}
	d := &Diff{
		Baseline:   sideOf(baseline),
		Current:    sideOf(current),
		MinSamples: max(baseline.MetricPopulation.P99MinimumRecommendedSamples, current.MetricPopulation.P99MinimumRecommendedSamples),
		Noise:      "bootstrap of the per-request timings where every request is listed, else the HDR rank interval",
	}
	if d.MinSamples <= 0 {
		d.MinSamples = defaultMinSamples
	}
	for i := range diffRows {
		row, err := d.compareRow(&diffRows[i], baseline, current)
		if err != nil {
			return nil, err
		}
		d.Rows = append(d.Rows, row)
	}
	d.Moved, d.Verdict = verdict(d.Rows)
	return d, nil
}

// compareRow is row r of the diff of current against baseline.
func (d *Diff) compareRow(r *diffRow, baseline, current *Document) (DiffRow, error) {
	switch {
	case r.value != nil:
		return d.valueRow(r.name, r.unit, r.better, r.value(baseline), r.value(current)), nil
	case r.sample != nil:
		return d.percentileRow(r.name, r.unit, r.better, r.sample(baseline), r.sample(current)), nil
	}
	b, err := sampleOf(baseline, r.metric)
	if err != nil {
		return DiffRow{}, err
	}
	c, err := sampleOf(current, r.metric)
	if err != nil {
		return DiffRow{}, err
	}
	return d.percentileRow(r.name, r.unit, r.better, b, c), nil
}

func sideOf(doc *Document) DiffSide {
	return DiffSide{Requests: doc.Requests, Completed: doc.Completed, Windows: doc.Anvilproxy.Windows,
		Start: doc.StartedAt, End: doc.FinishedAt, Exact: doc.Anvilproxy.PercentileSource != "hdr"}
}

func unitOf(m histo.Metric) string {
	if m.Unit() == histo.Microseconds {
		return "ms"
	}
	return "tok/s"
}

// betterOf is the direction of phase m's improvement: a time is better
// lower, a rate higher.
func betterOf(m histo.Metric) string {
	if m.Unit() == histo.Microseconds {
		return "lower"
	}
	return "higher"
}

// sample is one side's distribution of a row: its sorted values when every
// request is listed, else its HDR histogram.
type sample struct {
	values []float64 // sorted, v1 unit; nil with hist
	hist   *hdrhistogram.Histogram
	metric histo.Metric
}

func (s sample) n() int64 {
	if s.hist != nil {
		return s.hist.TotalCount()
	}
	return int64(len(s.values))
}

// sampleOf reads metric m of doc: from request_timings when the document's
// percentiles are exact, else from its histogram.
func sampleOf(doc *Document, m histo.Metric) (sample, error) {
	if doc.Anvilproxy.PercentileSource != "hdr" {
		var v []float64
		for i := range doc.RequestTimings {
			if x := metricValue(&doc.RequestTimings[i], m); x.Known() {
				v = append(v, float64(x))
			}
		}
		slices.Sort(v)
		return sample{values: v, metric: m}, nil
	}
	h, err := decodeHist(doc.Anvilproxy.Histograms, m)
	if err != nil {
		return sample{}, err
	}
	return sample{hist: h, metric: m}, nil
}

// cacheSample is the per-request cache hit ratio, cached / prompt tokens,
// of the requests whose engine reported it.
func cacheSample(doc *Document) sample {
	var v []float64
	for _, t := range doc.RequestTimings {
		if t.PromptTokens > 0 && t.CachedTokens >= 0 {
			v = append(v, float64(t.CachedTokens)/float64(t.PromptTokens))
		}
	}
	slices.Sort(v)
	return sample{values: v}
}

// percentile is the nearest-rank percentile p of s and its standard error.
func (s sample) percentile(p int64) (v, se float64) {
	n := s.n()
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	if s.hist == nil {
		v = dist.NearestRank(s.values, p)
		if n <= bootstrapMax {
			return v, bootstrapSE(s.values, p)
		}
		return v, rankSE(n, p, func(r int64) float64 { return s.values[r-1] })
	}
	at := func(r int64) float64 {
		q := 100 * (float64(r) - 0.25) / float64(n) // see hdrStats
		return s.metric.Float(s.hist.ValueAtPercentile(q))
	}
	return at(dist.Rank(p, n)), rankSE(n, p, at)
}

// rankSE is the standard error of the p-th percentile of n sorted values,
// value(rank) reading them, from the distribution-free 95% interval of the
// nearest rank.
func rankSE(n, p int64, value func(rank int64) float64) float64 {
	q := float64(p) / 100
	half := 1.96 * math.Sqrt(float64(n)*q*(1-q))
	lo := max(1, int64(math.Floor(float64(n)*q-half)))
	hi := min(n, int64(math.Ceil(float64(n)*q+half)))
	return (value(hi) - value(lo)) / (2 * 1.96)
}

// bootstrapSE is the bootstrap standard error of the p-th percentile of
// sorted: each resample is drawn as counts per index, so its percentile is
// read by walking the counts, without sorting.
func bootstrapSE(sorted []float64, p int64) float64 {
	n := len(sorted)
	if n < 2 {
		return math.NaN()
	}
	rng := rand.New(rand.NewPCG(0x616e76696c, uint64(n)*131+uint64(p))) //nolint:gosec // a reproducible resampling, not a secret
	counts := make([]int32, n)
	rank := dist.Rank(p, int64(n))
	var sum, sumSq float64
	for range bootstrapRounds {
		clear(counts)
		for range n {
			counts[rng.IntN(n)]++
		}
		var seen int64
		x := sorted[n-1]
		for i, c := range counts {
			seen += int64(c)
			if seen >= rank {
				x = sorted[i]
				break
			}
		}
		sum += x
		sumSq += x * x
	}
	mean := sum / bootstrapRounds
	return math.Sqrt(max(0, sumSq/bootstrapRounds-mean*mean) * bootstrapRounds / (bootstrapRounds - 1))
}

// needed is how many samples percentile p needs: as many beyond it as the
// schema's minimum gives a p99.
func needed(min99, p int64) int64 {
	return (min99 + (100 - p) - 1) / (100 - p) // ⌈min99/100 / (1 − p/100)⌉
}

func (d *Diff) percentileRow(name, unit, better string, b, c sample) DiffRow {
	row := DiffRow{Name: name, Unit: unit, Better: better}
	for _, st := range diffStats {
		bv, bse := b.percentile(st.p)
		cv, cse := c.percentile(st.p)
		pt := point(st.name, b.n(), c.n(), bv, cv, bse, cse)
		pt.NeedN = needed(d.MinSamples, st.p)
		pt.FewSamples = b.n() < pt.NeedN || c.n() < pt.NeedN
		row.Points = append(row.Points, pt)
	}
	return row
}

// figure is a single value with its standard error and the count it rests on.
type figure struct {
	v, se float64
	n     int64
}

func (d *Diff) valueRow(name, unit, better string, b, c figure) DiffRow {
	pt := point(StatValue, b.n, c.n, b.v, c.v, b.se, c.se)
	pt.NeedN = d.MinSamples
	pt.FewSamples = b.n < pt.NeedN || c.n < pt.NeedN
	return DiffRow{Name: name, Unit: unit, Better: better, Points: []DiffPoint{pt}}
}

// hdrResolution is the relative precision of the HDR histograms: a change
// below it is no change.
const hdrResolution = 0.001

func point(stat string, bn, cn int64, bv, cv, bse, cse float64) DiffPoint {
	pt := DiffPoint{Stat: stat, BaseN: bn, CurN: cn, Base: Num(bv), Cur: Num(cv), Change: nan, Relative: nan, Threshold: nan}
	if !pt.Base.Known() || !pt.Cur.Known() {
		pt.Noise = true
		return pt
	}
	pt.Change = Num(cv - bv)
	if bv != 0 {
		pt.Relative = Num((cv - bv) / math.Abs(bv))
	}
	allowed := hdrResolution * max(math.Abs(bv), math.Abs(cv))
	if s := math.Sqrt(sq(bse) + sq(cse)); !math.IsNaN(s) {
		allowed = max(allowed, 1.96*s)
	}
	pt.Threshold = Num(allowed)
	pt.Noise = math.Abs(cv-bv) <= allowed
	return pt
}

func sq(x float64) float64 { return x * x }

// amplification is attempts per logical request, with the counting error
// of its retries.
func amplification(doc *Document) figure {
	rs, err := section[histo.RetrySection](doc.Anvilproxy.Retry, "retry")
	if err != nil || rs == nil || rs.LogicalRequests == 0 {
		return figure{v: math.NaN(), se: math.NaN()}
	}
	l := float64(rs.LogicalRequests)
	extra := max(0, float64(rs.Attempts)-l)
	return figure{v: float64(rs.Attempts) / l, se: math.Sqrt(max(extra, 1)) / l, n: rs.LogicalRequests}
}

// driftRate is the share of tracked requests whose prompt prefix drifted.
func driftRate(doc *Document) figure {
	ps, err := section[histo.PrefixSection](doc.Anvilproxy.Prefix, "prefix")
	if err != nil || ps == nil || ps.Tracked == 0 {
		return figure{v: math.NaN(), se: math.NaN()}
	}
	n := float64(ps.Tracked)
	p := float64(ps.Drifts) / n
	return figure{v: p, se: math.Sqrt(max(p*(1-p), 1/n) / n), n: ps.Tracked}
}

// Row returns the row named name, or nil.
func (d *Diff) Row(name string) *DiffRow {
	for i := range d.Rows {
		if d.Rows[i].Name == name {
			return &d.Rows[i]
		}
	}
	return nil
}

// Point returns the point of row name at stat, or nil.
func (d *Diff) Point(name, stat string) *DiffPoint {
	r := d.Row(name)
	if r == nil {
		return nil
	}
	for i := range r.Points {
		if r.Points[i].Stat == stat {
			return &r.Points[i]
		}
	}
	return nil
}
