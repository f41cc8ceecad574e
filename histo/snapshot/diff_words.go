package snapshot

import (
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/anvilproxy/anvilproxy/histo"
)

// The gate's words: the verdict that reads the shape of a change (which
// phases moved together), the table, and the --fail-on bounds.

// minMove is the smallest relative change the verdict calls a move: a
// change beyond the noise but under 5% is real and not worth a sentence.
const minMove = 0.05

// movement is how a row moved: +1 up, −1 down, 0 not beyond the noise.
func movement(r *DiffRow) (dir int, p *DiffPoint) {
	for _, stat := range []string{StatP90, StatP50, StatP99, StatValue} {
		for i := range r.Points {
			pt := &r.Points[i]
			if pt.Stat != stat || !pt.Moved() {
				continue
			}
			if rel := float64(pt.Relative); pt.Relative.Known() && math.Abs(rel) < minMove {
				continue
			}
			if pt.Change > 0 {
				return 1, pt
			}
			return -1, pt
		}
	}
	return 0, nil
}

// verdict names what moved and what the shape suggests, in the order of
// the rules: queue without prefill is waiting; prefill with the cache and
// drift is the prompt prefix; decode is the engine or its batch;
// amplification is retries.
func verdict(rows []DiffRow) (moved []string, text string) {
	dir := map[string]int{}
	var worst *DiffPoint
	worstName := ""
	for i := range rows {
		d, pt := movement(&rows[i])
		dir[rows[i].Name] = d
		if d == 0 {
			continue
		}
		word := "up"
		if d < 0 {
			word = "down"
		}
		moved = append(moved, rows[i].Name+"."+pt.Stat+" "+word)
		if worst == nil || math.Abs(float64(pt.Relative)) > math.Abs(float64(worst.Relative)) || !worst.Relative.Known() {
			worst, worstName = pt, rows[i].Name
		}
	}
	if worst == nil {
		return moved, "no phase moved beyond the noise"
	}
	var why []string
	queue, prefill := dir[rowName(histo.MetricQueue)], dir[rowName(histo.MetricPrefill)]
	cache, drift := dir[rowCacheHit], dir[rowDrift]
	switch {
	case queue > 0 && prefill <= 0:
		why = append(why, "queue up with prefill flat: waiting, not work (more requests than the engine's slots: load, fewer slots or a lower --max-inflight)")
	case queue < 0 && prefill >= 0:
		why = append(why, "queue down with prefill flat: less waiting for a slot")
	}
	switch {
	case prefill > 0 && cache < 0 && drift > 0:
		why = append(why, "prefill up with cache hit down and drift up: the prompt prefix changed, so the engine recomputes it (a timestamp or reordered tools early in the prompt?)")
	case prefill > 0 && cache < 0:
		why = append(why, "prefill up with cache hit down: the engine's prefix cache serves less (evictions, or prompts that share less)")
	case prefill > 0:
		why = append(why, "prefill up with the cache steady: more prompt work per request (longer prompts) or a slower prefill")
	}
	if dir[rowName(histo.MetricTPOT)] > 0 || dir[rowName(histo.MetricDecodeRate)] < 0 {
		why = append(why, "decode slower: the engine or its batch (more sequences decoding at once, another model, build or GPU)")
	}
	if dir[rowAmplification] > 0 {
		why = append(why, "retry amplification up: clients re-send more (their timeouts, or errors they retry)")
	}
	if len(why) == 0 {
		why = append(why, "no phase behind it moved: look at the output lengths and the other rows")
	}
	word := "up"
	if worst.Change < 0 {
		word = "down"
	}
	head := fmt.Sprintf("%s.%s %s %s", worstName, worst.Stat, word, relText(worst.Relative))
	return moved, head + "; " + strings.Join(why, "; ")
}

func relText(r Num) string {
	if !r.Known() {
		return "(from 0)"
	}
	return fmt.Sprintf("%+.0f%%", 100*float64(r))
}

// WriteDiff prints d as the gate's table: one line per row and statistic
// (baseline, current, change, relative change, samples and a note), then
// the verdict.
func WriteDiff(w io.Writer, d *Diff) error {
	var b strings.Builder
	side := func(name string, s DiffSide) {
		src := "exact"
		if !s.Exact {
			src = "HDR"
		}
		fmt.Fprintf(&b, "%-9s %s (%d completed) in %s, %s to %s; percentiles %s\n", name,
			Plural(s.Requests, "request"), s.Completed, Plural(s.Windows, "window"), s.Start, s.End, src)
	}
	side("baseline", d.Baseline)
	side("current", d.Current)
	b.WriteByte('\n')
	rows := [][]string{{"metric", "stat", "n base/cur", "baseline", "current", "change", "rel", "note"}}
	for _, r := range d.Rows {
		for _, p := range r.Points {
			rows = append(rows, []string{r.Name, p.Stat, fmt.Sprintf("%d/%d", p.BaseN, p.CurN),
				valueText(p.Base, r.Unit), valueText(p.Cur, r.Unit), changeText(p.Change, r.Unit), relOnly(p.Relative), noteText(p)})
		}
	}
	writeDiffTable(&b, rows)
	fmt.Fprintf(&b, "\nnotes: n<N: fewer samples than the statistic needs (p99: p99_minimum_recommended_samples, %d);\n"+
		"noise: the change is inside the 95%% noise (%s)\n", d.MinSamples, d.Noise)
	fmt.Fprintf(&b, "verdict: %s\n", d.Verdict)
	_, err := io.WriteString(w, wrapLines(b.String(), ReportWidth))
	return err
}

func writeDiffTable(b *strings.Builder, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(c))
		}
	}
	for _, r := range rows {
		var line strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-len(c))
			switch {
			case i == 0:
				line.WriteString(c + pad)
			case i == 1 || i == len(r)-1:
				line.WriteString("  " + c + pad)
			default:
				line.WriteString("  " + pad + c)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
}

func valueText(v Num, unit string) string {
	switch {
	case !v.Known():
		return "-"
	case unit == "ratio":
		return percent(v)
	case unit == "x":
		return fmt.Sprintf("%.3fx", float64(v))
	}
	return num(v) + " " + unit
}

func changeText(v Num, unit string) string {
	switch {
	case !v.Known():
		return "-"
	case unit == "ratio":
		return fmt.Sprintf("%+.1fpp", 100*float64(v))
	case unit == "x":
		return fmt.Sprintf("%+.3fx", float64(v))
	}
	s := num(v)
	if v >= 0 {
		s = "+" + s
	}
	return s + " " + unit
}

func relOnly(r Num) string {
	if !r.Known() {
		return "-"
	}
	if math.Abs(float64(r)) >= 0.1 {
		return fmt.Sprintf("%+.0f%%", 100*float64(r))
	}
	return fmt.Sprintf("%+.1f%%", 100*float64(r))
}

func noteText(p DiffPoint) string {
	var notes []string
	if p.FewSamples {
		notes = append(notes, fmt.Sprintf("n<%d", p.NeedN))
	}
	if p.Noise && p.Change.Known() {
		notes = append(notes, "noise")
	}
	return strings.Join(notes, ", ")
}

// Bound is one --fail-on expression: metric.stat OP value, on the change
// from baseline to current, relative (%), in percentage points (pp) or
// absolute in the row's unit (ms, s, tok/s, x).
type Bound struct {
	Expr     string  `json:"expr"`
	Metric   string  `json:"metric"`
	Stat     string  `json:"stat"`
	Op       string  `json:"op"`
	Value    float64 `json:"value"`    // in Unit: a fraction for %, ms for time
	Relative bool    `json:"relative"` // Value is a fraction of the baseline
}

var boundRe = regexp.MustCompile(`^([a-z_0-9]+)(?:\.(p50|p90|p99|value))?\s*(>=|<=|>|<)\s*([+-]?[0-9]+(?:\.[0-9]+)?)\s*(%|pp|ms|s|us|tok/s|x)?$`)

// figureAliases are the other names a bound may use for a figure; a
// phase's row also answers to its names in histo's table (diffRowNamed).
var figureAliases = map[string]string{
	"retry_amplification": rowAmplification, "cache": rowCacheHit, "drift_rate": rowDrift,
}

// diffRowNamed is the row a bound names: a row's name, a figure's alias,
// or any name of a compared phase in histo's table (its name, word, key
// or label: "time_to_first_output", "decode_tok_s", "decode"), and "tok_s"
// for the decode rate, the gate's older word for it.
func diffRowNamed(name string) *diffRow {
	if a, ok := figureAliases[name]; ok {
		name = a
	}
	m, ok := histo.MetricByName(name)
	if name == "tok_s" {
		m, ok = histo.MetricDecodeRate, true
	}
	for i := range diffRows {
		r := &diffRows[i]
		if r.name == name || r.metric != histo.NumMetrics && (ok && r.metric == m || name == r.metric.Phase().Label) {
			return r
		}
	}
	return nil
}

// ParseBound parses a --fail-on expression such as "ttft.p99>+25%",
// "e2e.p50>+200ms", "cache_hit.p50<-10%" or "amplification>+0.2".
func ParseBound(expr string) (Bound, error) {
	m := boundRe.FindStringSubmatch(strings.TrimSpace(expr))
	if m == nil {
		return Bound{}, fmt.Errorf("--fail-on %q: want METRIC.STAT OP CHANGE, e.g. ttft.p99>+25%% or e2e.p50>+200ms (STAT p50, p90 or p99; OP >, >=, < or <=; CHANGE with %%, ms, s, pp or the row's unit)", expr)
	}
	b := Bound{Expr: expr, Metric: m[1], Stat: m[2], Op: m[3]}
	row := diffRowNamed(b.Metric)
	if row == nil {
		return Bound{}, fmt.Errorf("--fail-on %q: no metric %q; the metrics are %s", expr, m[1], strings.Join(DiffRowNames, ", "))
	}
	b.Metric = row.name
	unit := row.unit
	single := row.value != nil
	switch {
	case single && b.Stat != "" && b.Stat != StatValue:
		return Bound{}, fmt.Errorf("--fail-on %q: %s is one figure, without p50/p90/p99 (write %s>…)", expr, b.Metric, b.Metric)
	case single:
		b.Stat = StatValue
	case b.Stat == "" || b.Stat == StatValue:
		return Bound{}, fmt.Errorf("--fail-on %q: say which percentile, e.g. %s.p99", expr, b.Metric)
	}
	v, err := strconv.ParseFloat(m[4], 64)
	if err != nil {
		return Bound{}, fmt.Errorf("--fail-on %q: %w", expr, err)
	}
	switch suffix := m[5]; {
	case suffix == "%":
		b.Value, b.Relative = v/100, true
	case suffix == "pp" && unit == "ratio":
		b.Value = v / 100
	case (suffix == "ms" || suffix == "s" || suffix == "us") && unit == "ms":
		b.Value = v * map[string]float64{"ms": 1, "s": 1000, "us": 0.001}[suffix]
	case suffix == unit || suffix == "" && unit == "x":
		b.Value = v
	default:
		return Bound{}, fmt.Errorf("--fail-on %q: a change of %s is in %%, or %s", expr, b.Metric, unitWords[unit])
	}
	return b, nil
}

var unitWords = map[string]string{"ms": "ms, s or us", "tok/s": "tok/s", "ratio": "pp (percentage points)", "x": "a plain number (attempts per request)"}

// Unit is the unit of the bound's row: ms, tok/s, ratio or x.
func (b Bound) Unit() string {
	if r := diffRowNamed(b.Metric); r != nil {
		return r.unit
	}
	return ""
}

// BoundResult is a bound checked against a diff.
type BoundResult struct {
	Bound
	Holds      bool   `json:"holds"`      // the change is beyond the bound
	Sufficient bool   `json:"sufficient"` // both sides have the samples the statistic needs
	Fails      bool   `json:"fails"`      // Holds && Sufficient: the gate fails
	Change     Num    `json:"change"`     // what was compared, in the bound's terms
	Why        string `json:"why"`
}

// Check evaluates b against d.
func (d *Diff) Check(b Bound) BoundResult {
	r := BoundResult{Bound: b, Change: nan}
	p := d.Point(b.Metric, b.Stat)
	if p == nil || !p.Change.Known() {
		r.Why = "no value on one side"
		return r
	}
	r.Change = p.Change
	if b.Relative {
		r.Change = p.Relative
	}
	if !r.Change.Known() {
		r.Why = "the baseline is 0: no relative change"
		return r
	}
	c := float64(r.Change)
	switch b.Op {
	case ">":
		r.Holds = c > b.Value
	case ">=":
		r.Holds = c >= b.Value
	case "<":
		r.Holds = c < b.Value
	case "<=":
		r.Holds = c <= b.Value
	}
	r.Sufficient = !p.FewSamples
	r.Fails = r.Holds && r.Sufficient
	switch {
	case r.Fails:
		r.Why = "holds"
	case r.Holds:
		r.Why = fmt.Sprintf("holds, but on too few samples (%d and %d; %s needs %d): not failed", p.BaseN, p.CurN, b.Stat, p.NeedN)
	default:
		r.Why = "does not hold"
	}
	if p.Noise && r.Holds {
		r.Why += "; the change is inside the noise"
	}
	return r
}
