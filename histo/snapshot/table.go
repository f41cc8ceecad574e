package snapshot

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
)

// WriteTable prints doc, from Build or Merge, as the phase table of "anvilproxy report": where
// the time goes (p50/p90/p99 of each phase), decode and prefill rates, the
// prefix-cache hit rate and goodput, in aligned columns with units in the
// headers; then, when the document has them, the agent/engine split of
// conversations, the prompt ledger, the queue knee and the measurement
// quality.
func WriteTable(w io.Writer, doc *Document) error {
	ext := doc.Anvilproxy
	if ext == nil {
		return fmt.Errorf("snapshot: the document has no anvilproxy object; merge it first")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d completed, %s%s; %s\n",
		Plural(doc.Requests, "request"), doc.Completed, failedText(doc), retriesText(ext), spanText(doc, ext))
	model := "-"
	if doc.Model != nil {
		model = *doc.Model
		if len(ext.Models) > 1 {
			model += fmt.Sprintf(" (and %d more)", len(ext.Models)-1)
		}
	}
	fmt.Fprintf(&b, "model %s; protocol %s; percentiles %s\n\n", model, doc.MeasurementProtocol, percentileSource(ext))

	lat := [][]string{{"phase", "n", "p50 ms", "p90 ms", "p99 ms", "mean ms"}}
	add := func(rows *[][]string, name string, s Stats) {
		*rows = append(*rows, []string{name, fmt.Sprint(s.Samples), num(s.P50), num(s.P90), num(s.P99), num(s.Mean)})
	}
	for _, m := range tableLatencies {
		add(&lat, m.Phase().LabelText(), phaseStats(doc, ext, m))
	}
	rates := [][]string{{"rate", "n", "p50 tok/s", "p90 tok/s", "p99 tok/s", "mean tok/s"}}
	for _, m := range tableRates {
		add(&rates, m.Phase().LabelText(), phaseStats(doc, ext, m))
	}
	writeTables(&b, lat, rates)

	writeCache(&b, doc, ext)
	if slots, err := section[histo.SlotsSection](ext.EngineSlots, "engine_slots"); err == nil && slots != nil {
		hint := "none"
		if slots.Hint >= 0 {
			hint = fmt.Sprint(slots.Hint)
		}
		kv := "" // why fewer than the slots ran at once
		if slots.KVBound > 0 {
			kv = fmt.Sprintf("; KV cache held %s", Plural(slots.KVBound, "wait"))
		}
		fmt.Fprintf(&b, "engine      %s for the occupancy split (%s; --engine-slots %s%s)\n", Plural(int64(slots.Effective), "slot"), slots.State, hint, kv)
	}
	thr := metricNum(doc.Metrics["throughput_tok_s"])
	fmt.Fprintf(&b, "throughput  %s tok/s output\n", num(thr))
	g := ext.Goodput
	slos := "no SLOs: the share of requests that did not fail"
	if len(g.Curves) > 0 {
		slos = "within every SLO"
	}
	fmt.Fprintf(&b, "goodput     %s (%d of %s; %s)\n", percent(Num(g.Ratio)), g.Good, Plural(g.Requests, "request"), slos)
	for _, c := range g.Curves {
		points := make([]string, len(c.Points))
		for i, p := range c.Points {
			points[i] = fmt.Sprintf("%gx %s", p.Multiple, percent(Num(p.Share)))
		}
		fmt.Fprintf(&b, "  %s <= %s: %s; at budget %s\n", c.Metric, time.Duration(c.Threshold), percent(Num(c.Ratio)), strings.Join(points, ", "))
	}
	if err := writeBeyond(&b, ext); err != nil {
		return err
	}
	for _, n := range ext.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, wrapLines(b.String(), ReportWidth))
	return err
}

// ReportWidth is the widest line of the report: a terminal of 100 columns
// shows it unwrapped.
const ReportWidth = 100

// wrapLines breaks every line of text wider than width (in runes) at a
// clause (after "; " or ", "), else at a space, and indents what follows
// under the line's text: past its label (the first run of two or more
// spaces, as in "cache hit   …") or its own indentation, plus two.
func wrapLines(text string, width int) string {
	lines := strings.SplitAfter(text, "\n")
	var b strings.Builder
	for _, l := range lines {
		nl := strings.HasSuffix(l, "\n")
		l = strings.TrimSuffix(l, "\n")
		indent := strings.Repeat(" ", hangingIndent(l))
		for len([]rune(l)) > width {
			cut := breakAt(l, width)
			if cut <= len(indent) {
				break // one word longer than the line: leave it
			}
			b.WriteString(strings.TrimRight(l[:cut], " ") + "\n")
			l = indent + strings.TrimLeft(l[cut:], " ")
		}
		b.WriteString(l)
		if nl {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// hangingIndent is where a wrapped line's continuation starts.
func hangingIndent(l string) int {
	lead := len(l) - len(strings.TrimLeft(l, " "))
	if i := strings.Index(l[lead:], "  "); i > 0 && i < 24 {
		j := lead + i
		for j < len(l) && l[j] == ' ' {
			j++
		}
		return j
	}
	return lead + 2
}

// breakAt is the byte offset to break l at so that the first part is at
// most width runes: after the last "; " or ", " in the last fifth of
// the line, else after the last space.
func breakAt(l string, width int) int {
	limit := len(l)
	if r := []rune(l); len(r) > width {
		limit = len(string(r[:width]))
	}
	head := l[:limit]
	for _, sep := range []string{"; ", ", "} {
		if i := strings.LastIndex(head, sep); i > limit*4/5 {
			return i + len(sep)
		}
	}
	if i := strings.LastIndex(head, " "); i > 0 {
		return i + 1
	}
	return 0 // no space: the caller leaves the line whole
}

func percentileSource(ext *Extension) string {
	if ext.PercentileSource == "hdr" {
		return "from HDR histograms (within 0.1%)"
	}
	return "exact (nearest rank)"
}

// metricStats reads a distribution back from the metrics object.
// The phase-table rows the report's two tables show, in order.
var (
	tableLatencies = [...]histo.Metric{histo.MetricQueue, histo.MetricPrefill, histo.MetricTTFO, histo.MetricTTFT, histo.MetricTPOT, histo.MetricE2E}
	tableRates     = [...]histo.Metric{histo.MetricDecodeRate, histo.MetricPrefillRate}
)

// phaseStats are m's statistics as the document holds them: in the v1
// metrics object or in the extension's distributions (histo.Phase.V1).
func phaseStats(doc *Document, ext *Extension, m histo.Metric) Stats {
	ph := m.Phase()
	if !ph.V1 {
		return ext.Distributions[ph.Name+"_ms"]
	}
	return metricStats(doc, ph.Name, ph.Unit == histo.Microseconds)
}

func metricStats(doc *Document, stem string, ms bool) Stats {
	unit := ""
	if ms {
		unit = "_ms"
	}
	get := func(stat string) Num { return metricNum(doc.Metrics[stem+"_"+stat+unit]) }
	s := Stats{P50: get("p50"), P90: get("p90"), P99: get("p99"), Mean: get("mean")}
	if n := metricNum(doc.Metrics[stem+"_samples"]); n.Known() {
		s.Samples = int64(n)
	}
	return s
}

// metricNum reads a metrics value as Build and Merge set it or as JSON
// decodes it.
func metricNum(v any) Num {
	switch v := v.(type) {
	case Num:
		return v
	case int64:
		return Num(v)
	case float64:
		return Num(v)
	}
	return nan
}

// num formats a value with about four significant digits, "-" when unknown.
func num(v Num) string {
	f := float64(v)
	switch {
	case !v.Known():
		return "-"
	case f >= 100 || f <= -100:
		return fmt.Sprintf("%.1f", f)
	case f >= 1 || f <= -1:
		return fmt.Sprintf("%.2f", f)
	}
	return fmt.Sprintf("%.3f", f)
}

func percent(v Num) string {
	if !v.Known() {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(v))
}

// writeTables writes tables one after the other, each followed by a blank
// line, in shared columns two spaces apart: the first left aligned, the
// others (numbers) right aligned.
func writeTables(b *strings.Builder, tables ...[][]string) {
	var width []int
	for _, rows := range tables {
		for _, r := range rows {
			for i, c := range r {
				if i == len(width) {
					width = append(width, 0)
				}
				width[i] = max(width[i], len(c))
			}
		}
	}
	for _, rows := range tables {
		for _, r := range rows {
			for i, c := range r {
				pad := strings.Repeat(" ", width[i]-len(c))
				if i == 0 {
					b.WriteString(c + pad)
				} else {
					b.WriteString("  " + pad + c)
				}
			}
			b.WriteByte('\n')
		}
		b.WriteByte('\n')
	}
}

// writeCache prints the engine's cache figure and the proxy's inferred
// one side by side; a figure the engine never reported is "not reported",
// not 0%.
func writeCache(b *strings.Builder, doc *Document, ext *Extension) {
	reported := cacheHitText(doc, ext)
	if ext.PrefixCacheHitSamples == 0 {
		reported = "not reported"
	}
	cache, err := section[histo.CacheSection](ext.Cache, "cache")
	if err != nil || cache == nil {
		fmt.Fprintf(b, "cache hit   engine-reported %s\n", reported)
		return
	}
	inferred := "-"
	if cache.Inferred.Requests > 0 {
		inferred = fmt.Sprintf("%s of %s (%s)", percent(Num(cache.Inferred.Ratio)), Plural(cache.Inferred.PromptTokens, "prompt token"), Plural(cache.Inferred.Requests, "request"))
	}
	fmt.Fprintf(b, "cache hit   engine-reported %s; inferred from prefill time %s\n", reported, inferred)
}
