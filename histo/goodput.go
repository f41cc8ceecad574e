package histo

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// SLO is a latency objective: a request meets it when its Metric is at most
// Threshold.
type SLO struct {
	// Metric is the word of a phase-table row that may be an SLO's
	// (SLONames: ttfo, ttft, queue, tpot, e2e); ParseSLO also accepts the
	// row's Name or Key and stores the word.
	Metric    string
	Threshold time.Duration // > 0
}

// ParseSLO parses the flag form "metric=duration", for example "ttft=2s".
func ParseSLO(s string) (SLO, error) {
	name, val, ok := strings.Cut(s, "=")
	if !ok {
		return SLO{}, fmt.Errorf("histo: slo %q: want metric=duration, e.g. ttft=2s", s)
	}
	d, err := time.ParseDuration(strings.TrimSpace(val))
	if err != nil {
		return SLO{}, fmt.Errorf("histo: slo %q: %w", s, err)
	}
	slo := SLO{Metric: strings.ToLower(strings.TrimSpace(name)), Threshold: d}
	if m, ok := slo.metric(); ok {
		slo.Metric = m.Phase().ShortName()
	}
	return slo, slo.validate()
}

func (s SLO) validate() error {
	if _, ok := s.metric(); !ok {
		return fmt.Errorf("histo: slo %q: metric must be one of %s", s.Metric, strings.Join(SLONames(), ", "))
	}
	if s.Threshold <= 0 {
		return fmt.Errorf("histo: slo %q: threshold must be positive", s.Metric)
	}
	return nil
}

// metric is the phase-table row the SLO judges, if it may be an SLO's.
func (s SLO) metric() (Metric, bool) {
	m, ok := MetricByName(s.Metric)
	return m, ok && phases[m].slo
}

// SLONames are the words of the phase-table rows that may be an SLO's
// metric, in table order: ttfo, ttft, queue, tpot, e2e.
func SLONames() []string {
	var out []string
	for m := range numRequestMetrics {
		if phases[m].slo {
			out = append(out, m.Phase().ShortName())
		}
	}
	return out
}

// String returns the flag form, "ttft=2s".
func (s SLO) String() string { return s.Metric + "=" + s.Threshold.String() }

// curveMultiples are the budgets, as multiples of each SLO's threshold, at
// which the goodput-vs-budget curve is evaluated.
var curveMultiples = [...]float64{0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4}

// maxSLOs bounds Config.SLOs: one per metric (New rejects duplicates), so
// it is the number of rows of the phase table marked slo. It is written
// out, not counted, because it sizes the tally's arrays, which keep Record
// from allocating, and a constant cannot count a table's rows;
// TestMaxSLOsIsTheSLORows fails when a row's slo mark changes without it.
const maxSLOs = 5

// tally counts goodput in fixed arrays so that Record does not allocate.
// It is guarded by Recorder.mu.
type tally struct {
	requests, failed, good int64
	met                    [maxSLOs]int64
	within                 [maxSLOs][len(curveMultiples)]int64
}

// add judges one finished inference request and reports whether it was
// good: not failed and within every SLO. A metric the request does not
// have (no content for TTFT, one token for TPOT, queue with SourceNone)
// does not count against it: it cannot be judged, and a successful request
// is not made bad by what the proxy failed to see.
func (t *tally) add(failed bool, v *phaseValues, slos []SLO, ms *[maxSLOs]Metric) bool {
	t.requests++
	if failed {
		t.failed++
		return false
	}
	good := true
	for i, s := range slos {
		x := v[ms[i]] // ns, NaN when unknown: all SLO metrics are spans
		if x != x || x <= float64(s.Threshold) {
			t.met[i]++
		} else {
			good = false
		}
		for j, k := range curveMultiples {
			if x != x || x <= k*float64(s.Threshold) {
				t.within[i][j]++
			}
		}
	}
	if good {
		t.good++
	}
	return good
}

func (t *tally) merge(o *tally) {
	t.requests += o.requests
	t.failed += o.failed
	t.good += o.good
	for i := range t.met {
		t.met[i] += o.met[i]
		for j := range t.within[i] {
			t.within[i][j] += o.within[i][j]
		}
	}
}

// Goodput is the share of finished inference requests that did not fail and
// met the configured SLOs, with the counts behind it so that windows merge.
type Goodput struct {
	Requests int64   `json:"requests"` // finished inference requests
	Failed   int64   `json:"failed"`   // proxy.Trace.Failed
	Good     int64   `json:"good"`     // not failed and within every SLO
	Ratio    Float   `json:"ratio"`    // Good / Requests; unknown without requests
	Curves   []Curve `json:"slos"`     // one per configured SLO, in Config order
}

// Curve is one SLO's goodput-vs-budget curve: the share of requests that did
// not fail and were within the threshold scaled by each of curveMultiples.
// The point at multiple 1 is the SLO itself.
type Curve struct {
	Metric    string       `json:"metric"`
	Threshold Span         `json:"threshold_ms"`
	Met       int64        `json:"met"` // within Threshold
	Ratio     Float        `json:"ratio"`
	Points    []CurvePoint `json:"curve"`
}

// CurvePoint is the curve at one budget.
type CurvePoint struct {
	Multiple float64 `json:"multiple"`
	Budget   Span    `json:"budget_ms"`
	Met      int64   `json:"met"`
	Share    Float   `json:"share"`
}

func ratio(n, d int64) Float {
	if d == 0 {
		return Float(math.NaN())
	}
	return Float(float64(n) / float64(d))
}

// goodput builds the exported form of t for slos.
func (t *tally) goodput(slos []SLO) Goodput {
	g := Goodput{Requests: t.requests, Failed: t.failed, Good: t.good, Ratio: ratio(t.good, t.requests)}
	g.Curves = make([]Curve, len(slos))
	for i, s := range slos {
		c := Curve{Metric: s.Metric, Threshold: Span(s.Threshold), Met: t.met[i], Ratio: ratio(t.met[i], t.requests)}
		c.Points = make([]CurvePoint, len(curveMultiples))
		for j, k := range curveMultiples {
			c.Points[j] = CurvePoint{
				Multiple: k,
				Budget:   Span(time.Duration(k * float64(s.Threshold))),
				Met:      t.within[i][j],
				Share:    ratio(t.within[i][j], t.requests),
			}
		}
		g.Curves[i] = c
	}
	return g
}

// Goodput returns goodput in the current window and since New. Safe for
// concurrent use.
func (r *Recorder) Goodput() (window, cumulative Goodput) {
	r.mu.Lock()
	w, c := r.cur.tally, r.total
	r.mu.Unlock()
	c.merge(&w)
	return w.goodput(r.cfg.SLOs), c.goodput(r.cfg.SLOs)
}

// goodputCurve returns the goodput-vs-budget curve of every configured SLO
// over the current window. Safe for concurrent use.
func (r *Recorder) goodputCurve() []Curve {
	w, _ := r.Goodput()
	return w.Curves
}

// rollingRatio is the goodput gauge: the share over the current and the
// previous window, so that the gauge does not restart from a handful of
// requests at each rotation. i < 0 means all SLOs.
func (r *Recorder) rollingRatio(i int) float64 {
	r.mu.Lock()
	t := r.prev
	t.merge(&r.cur.tally)
	r.mu.Unlock()
	if i < 0 {
		return float64(ratio(t.good, t.requests))
	}
	return float64(ratio(t.met[i], t.requests))
}
