package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes the report as the text tables "anvilproxy bench"
// prints and BENCHMARKS.md quotes.
func (r *Report) WriteTable(w io.Writer) error {
	p := &printer{w: w}
	m := r.Machine
	p.f("anvilproxy bench: %d CPUs (%s), %s, %s; load %s at start, %s at end; %ss\n",
		m.CPUs, orUnknown(m.CPUModel), m.Kernel, m.Go, fixed(m.Load1, 2), fixed(r.LoadEnd, 2), fixed(r.Seconds, 0))
	if r.Command != "" {
		p.f("command: %s\n", r.Command)
	}
	for _, t := range r.Targets {
		if t.Skipped != "" {
			p.f("  %-10s skipped: %s\n", t.Name, t.Skipped)
		} else {
			p.f("  %-10s %s; %s\n", t.Name, t.Version, t.Setup)
		}
	}
	if len(r.Streams) > 0 {
		p.f("\nStreams. Rounds interleave %s; %d rounds of %vs each.\n", strings.Join(r.Config.Order, ", "), r.Config.Rounds, fixed(r.Config.CellSeconds, 1))
		p.f("direct: absolute latency; proxies: added = their quantile − direct's (µs). TTFB: request written → first response byte.\n")
		p.f("p50 rounds: each round's own added per-event p50, min..max. CPU: the proxy's processes, ms per 1,000 events.\n")
	}
	for _, lv := range r.Streams {
		p.f("\n%d stream(s) × %d events of %d B, %v apart (%.0f events/s offered)\n",
			lv.Streams, lv.Events, r.Config.EventBytes, time.Duration(lv.GapUS)*time.Microsecond, float64(lv.Offered))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\tevents\tlost\treord\tcorrupt\tfailed\tevent p50\tp99\tp99.9\tp50 rounds\tTTFB p50\tp99\tp99.9\tCPU/1k ev\t")
		for _, s := range lv.Results {
			ev, tt := rowQuantiles(s.Event, s.AddedEvent), rowQuantiles(s.TTFB, s.AddedTTFB)
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
				s.Target, s.Events, s.Lost, s.Reordered, s.Corrupt, s.Failed,
				ev[0], ev[1], ev[2], spreadText(s.RoundsAddedEventP50), tt[0], tt[1], tt[2], msText(s.CPUPer1000))
		}
		p.err(tw.Flush())
		for _, s := range lv.Results {
			if q := s.Residency; q != nil {
				p.f("  %s's own residency per relayed read (its /metrics buckets, interpolated): p50 %s, p99 %s, p99.9 %s µs over %d reads\n",
					s.Target, plain(q.P50), plain(q.P99), plain(q.P999), q.N)
			}
		}
		for _, s := range lv.Results {
			for _, e := range s.Errors {
				p.f("  %s error: %s\n", s.Target, e)
			}
		}
	}
	if s := r.Small; s != nil {
		p.f("\nNon-stream requests: %d closed-loop clients, POST with a %d-byte JSON answer; latency in µs.\n", s.Clients, len(smallResponse))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\trequests\treq/s\tvs direct\trounds req/s\tlatency p50\tp99\tp99.9\tCPU/request\tfailed\t")
		for _, t := range s.Results {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n",
				t.Target, t.Requests, fixed(t.RPS, 0), fixed(t.VsDirect, 2)+"×", rpsSpread(t.RoundsRPS),
				plain(t.Latency.P50), plain(t.Latency.P99), plain(t.Latency.P999), usText(t.CPUPerRequest), t.Failed)
		}
		p.err(tw.Flush())
		for _, t := range s.Results {
			for _, e := range t.Errors {
				p.f("  %s error: %s\n", t.Target, e)
			}
		}
	}
	for _, c := range r.Capacity {
		p.f("\nCapacity: %d streams held open at once through each proxy in turn (%d events %sms apart, opened over %ss).\n",
			c.Streams, c.PerStream, fixed(c.GapMS, 0), fixed(c.RampSeconds, 0))
		p.f("KiB/stream: (RSS with the most streams open − RSS idle) / streams open. Wave 1 runs on fresh memory, wave 2 on memory freed by wave 1.\n")
		p.f("heap KiB/stream: anvilproxy's go_memstats_heap_inuse_bytes with every stream open − idle, / streams (garbage not yet collected included).\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\twave\tpeak open\tevents\tlost\treord\tcorrupt\tfailed\tRSS idle\tRSS MiB\twith open\tKiB/stream\theap KiB/stream\tevent p50\tp99\tTTFB p50\tp99\tCPU/1k ev\t")
		for _, ct := range c.Targets {
			for i, v := range ct.Waves {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
					ct.Target, i+1, v.PeakOpen, v.Events, v.Lost, v.Reordered, v.Corrupt, v.Failed, fixed(ct.RSSIdleMiB, 1), fixed(v.RSSMostOpenMiB, 1), v.SampledOpen,
					fixed(v.RSSPerStreamKiB, 1), fixed(v.HeapPerStreamKiB, 1), plain(v.Event.P50), plain(v.Event.P99), plain(v.TTFB.P50), plain(v.TTFB.P99), msText(v.CPUPer1000))
			}
		}
		p.err(tw.Flush())
		for _, ct := range c.Targets {
			for _, v := range ct.Waves {
				for _, e := range v.Errors {
					p.f("  %s error: %s\n", ct.Target, e)
				}
			}
		}
	}
	if len(r.Versus) > 0 {
		p.f("\nanvilproxy beside nginx and the floor, this run. Goal: at or below nginx on every row (requests/s: at or above). Ratio: anvilproxy / nginx.\n")
		p.f("floor: the floor relay's figure (added p50 for a latency pair; for the non-stream rows floor-http's, if it ran); ÷floor: anvilproxy / floor, the issue's fallback is ≤ 1.10 (requests/s ≥ 0.90).\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "measure\ttarget\tanvilproxy\tnginx\tratio\tverdict\tfloor\t÷floor")
		for _, v := range r.Versus {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Measure, v.Target, v.AnvilProxy, v.Nginx, fixed(v.Ratio, 2)+"×", mark(v.Met), v.Floor, ratioText(v.VsFloor))
		}
		p.err(tw.Flush())
	}
	if len(r.Checks) > 0 {
		p.f("\nGoals:\n")
		for _, c := range r.Checks {
			if len(r.Versus) > 0 && strings.HasSuffix(c.Goal, " nginx's") {
				continue // in the table above
			}
			p.f("  [%s] %s: %s\n", mark(c.Met), c.Goal, c.Measured)
		}
	}
	for _, n := range r.Notes {
		p.f("note: %s\n", n)
	}
	return p.e
}

// mark is a verdict's column: met, MISSED, or n/a when not measured.
func mark(met *bool) string {
	switch {
	case met == nil:
		return "n/a   "
	case *met:
		return "met   "
	}
	return "MISSED"
}

// printer keeps the first write error.
type printer struct {
	w io.Writer
	e error
}

func (p *printer) f(format string, args ...any) {
	if p.e == nil {
		_, p.e = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) err(err error) {
	if p.e == nil {
		p.e = err
	}
}

// rowQuantiles is the absolute quantiles for direct, the added ones for a proxy.
func rowQuantiles(q Quantiles, a *Added) [3]string {
	if a == nil {
		return [3]string{plain(q.P50), plain(q.P99), plain(q.P999)}
	}
	return [3]string{signed(a.P50), signed(a.P99), signed(a.P999)}
}

func spreadText(s *Spread) string {
	if s == nil {
		return ""
	}
	return signed(s.Min) + ".." + signed(s.Max)
}

func rpsSpread(s *Spread) string {
	if s == nil {
		return ""
	}
	return fixed(s.Min, 0) + ".." + fixed(s.Max, 0)
}

func ratioText(v Num) string {
	if !v.known() {
		return "-"
	}
	return fixed(v, 2) + "×"
}

func msText(v Num) string {
	if !v.known() {
		return "-"
	}
	return fmt.Sprintf("%.2f ms", float64(v))
}

func usText(v Num) string {
	if !v.known() {
		return "-"
	}
	return fmt.Sprintf("%.1f µs", float64(v))
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown CPU"
	}
	return s
}

// signed formats an added figure with its sign.
func signed(v Num) string {
	if !v.known() {
		return "-"
	}
	f := float64(v)
	switch a := math.Abs(f); {
	case a >= 100:
		return fmt.Sprintf("%+.0f", f)
	default:
		return fmt.Sprintf("%+.1f", f)
	}
}

// plain formats an absolute figure.
func plain(v Num) string {
	if !v.known() {
		return "-"
	}
	if math.Abs(float64(v)) >= 100 {
		return fmt.Sprintf("%.0f", float64(v))
	}
	return fmt.Sprintf("%.1f", float64(v))
}

func fixed(v Num, decimals int) string {
	if !v.known() {
		return "-"
	}
	return fmt.Sprintf("%.*f", decimals, float64(v))
}
