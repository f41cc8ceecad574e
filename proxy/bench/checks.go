package bench

import (
	"fmt"
	"strings"
)

// Skipped returns why target did not run, or "" when it ran or was not
// asked for.
func (r *Report) Skipped(target string) string {
	for _, t := range r.Targets {
		if t.Name == target {
			return t.Skipped
		}
	}
	return ""
}

// Intact reports whether every stream through target delivered every
// event intact, in the stream test and the capacity run (a target that did
// not run is intact). Unlike the timings, this does not depend on the
// machine, so a smoke test may fail on it.
func (r *Report) Intact(target string) bool {
	for _, lv := range r.Streams {
		for _, s := range lv.Results {
			if s.Target == target && !s.streamTally.ok() {
				return false
			}
		}
	}
	if r.Capacity != nil && target == AnvilProxy {
		for _, w := range r.Capacity.Waves {
			if !w.streamTally.ok() {
				return false
			}
		}
	}
	return true
}

// checks judges issue 7's targets; a target the run did not measure is
// listed with Met null.
func checks(r *Report) []Check {
	var out []Check
	yes, no := true, false
	verdict := func(ok bool) *bool {
		if ok {
			return &yes
		}
		return &no
	}
	limit := func(goal string, v Num, max float64, unit string) {
		c := Check{Goal: goal, Measured: "not measured"}
		if v.known() {
			c.Measured = fmt.Sprintf("%s %s", signed(v), unit)
			c.Met = verdict(float64(v) <= max)
			if !*c.Met {
				c.Measured += fmt.Sprintf(", over by %.1f %s", float64(v)-max, unit)
			}
		}
		out = append(out, c)
	}
	a64 := r.result(64, AnvilProxy)
	p50, p99 := unknown, unknown
	if a64 != nil {
		p50, p99 = a64.AddedEvent.P50, a64.AddedEvent.P99
	}
	limit("added per-event latency at 64 streams, p50 ≤ 15 µs", p50, 15, "µs")
	limit("added per-event latency at 64 streams, p99 ≤ 60 µs", p99, 60, "µs")
	out = append(out, ttfbCheck(r, verdict))

	out = append(out, cpuCheck(r, verdict))
	out = append(out, Check{Goal: "0 allocations per event", Measured: "not measured by the bench: go test -run '^$' -bench Relay -benchmem ./proxy/"})
	out = append(out, intactCheck(r, verdict))
	out = append(out, capacityCheck(r, verdict))

	c := Check{Goal: "non-stream throughput ≥ nginx's", Measured: "not measured"}
	if a, n := r.small(AnvilProxy), r.small(Nginx); a != nil && n != nil && n.RPS > 0 {
		c.Measured = fmt.Sprintf("%.0f req/s vs nginx %.0f (%.2f×)", float64(a.RPS), float64(n.RPS), float64(a.RPS/n.RPS))
		c.Met = verdict(a.RPS >= n.RPS)
	}
	return append(out, c)
}

// cpuCheck judges CPU per event at 64 streams and more. With one stream
// every event finds the proxy asleep, and the wake-up costs more than the
// relaying (nginx's figure grows the same way); it is listed, not judged.
func cpuCheck(r *Report, verdict func(bool) *bool) Check {
	c := Check{Goal: "proxy CPU ≤ 5 ms per 1,000 events, parsing and recording included (at 64 streams and more)", Measured: "not measured"}
	var parts []string
	met, judged := true, false
	for _, lv := range r.Streams {
		a := r.result(lv.Streams, AnvilProxy)
		if a == nil || !a.CPUPer1000.known() {
			continue
		}
		part := fmt.Sprintf("%.2f ms at %d", float64(a.CPUPer1000), lv.Streams)
		if n := r.result(lv.Streams, Nginx); n != nil && n.CPUPer1000.known() {
			part += fmt.Sprintf(" (nginx %.2f)", float64(n.CPUPer1000))
		}
		if lv.Streams >= 64 {
			judged = true
			met = met && a.CPUPer1000 <= 5
		} else {
			part += ", not judged"
		}
		parts = append(parts, part)
	}
	if len(parts) > 0 {
		c.Measured = strings.Join(parts, "; ")
	}
	if judged {
		c.Met = verdict(met)
	}
	return c
}

func ttfbCheck(r *Report, verdict func(bool) *bool) Check {
	c := Check{Goal: "added TTFB p50 below nginx's and Caddy's, at every level", Measured: "not measured"}
	met, measured := true, false
	text := ""
	for _, lv := range r.Streams {
		a := r.result(lv.Streams, AnvilProxy)
		if a == nil || !a.AddedTTFB.P50.known() {
			continue
		}
		part := fmt.Sprintf("%d: %s", lv.Streams, signed(a.AddedTTFB.P50))
		for _, other := range []string{Nginx, Caddy} {
			o := r.result(lv.Streams, other)
			if o == nil || !o.AddedTTFB.P50.known() {
				continue
			}
			measured = true
			part += fmt.Sprintf(" vs %s %s", other, signed(o.AddedTTFB.P50))
			if a.AddedTTFB.P50 >= o.AddedTTFB.P50 {
				met = false
			}
		}
		if text != "" {
			text += "; "
		}
		text += part
	}
	if measured {
		c.Measured = text + " µs"
		c.Met = verdict(met)
	}
	return c
}

func intactCheck(r *Report, verdict func(bool) *bool) Check {
	c := Check{Goal: "0 events lost or reordered through anvilproxy", Measured: "not measured"}
	var t streamTally
	seen := false
	for _, lv := range r.Streams {
		if a := r.result(lv.Streams, AnvilProxy); a != nil {
			t.add(a.streamTally)
			seen = true
		}
	}
	if seen {
		c.Measured = fmt.Sprintf("%d events in %d streams: %d lost, %d reordered, %d corrupt, %d failed", t.Events, t.Streams, t.Lost, t.Reordered, t.Corrupt, t.Failed)
		c.Met = verdict(t.ok())
	}
	return c
}

func capacityCheck(r *Report, verdict func(bool) *bool) Check {
	c := Check{Goal: "10,000 concurrent streams, ≤ 20 KiB RSS each, none lost", Measured: "not measured (bench --capacity 10000)"}
	cp := r.Capacity
	if cp == nil || len(cp.Waves) == 0 {
		return c
	}
	var t streamTally
	worst, peakOpen := Num(0), int64(0)
	var kib []string
	for _, w := range cp.Waves {
		t.add(w.streamTally)
		peakOpen = max(peakOpen, w.PeakOpen)
		if !w.RSSPerStreamKiB.known() || w.RSSPerStreamKiB > worst {
			worst = w.RSSPerStreamKiB
		}
		kib = append(kib, fixed(w.RSSPerStreamKiB, 1))
	}
	c.Measured = fmt.Sprintf("%d streams (peak %d open): %s KiB each (by wave); %d lost, %d reordered, %d corrupt, %d failed",
		cp.Streams, peakOpen, strings.Join(kib, ", "), t.Lost, t.Reordered, t.Corrupt, t.Failed)
	if cp.Asked > cp.Streams {
		c.Measured += fmt.Sprintf("; %d asked, the open-file limit allowed %d", cp.Asked, cp.Streams)
	}
	if worst.known() && worst > 20 {
		c.Measured += fmt.Sprintf(" (over by %.1f KiB)", float64(worst)-20)
	}
	c.Met = verdict(cp.Streams >= 10000 && peakOpen >= 10000 && worst.known() && worst <= 20 && t.ok())
	return c
}
