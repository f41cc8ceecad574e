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
	if c := r.capacity(target); c != nil {
		for _, w := range c.Waves {
			if !w.streamTally.ok() {
				return false
			}
		}
	}
	return true
}

// Goals the run is judged against. MaxKiBPerStream and MinHeld are the
// capacity goals; every other goal is "at or below nginx in the same run".
const (
	MaxKiBPerStream = 20
	MinHeld         = 10000
)

// versus compares anvilproxy with nginx measure by measure, from the same
// run: each stream level's added latency, TTFB and CPU, the non-stream
// throughput and CPU, and the capacity run's memory and streams held. A
// measure either proxy did not run is left out.
func versus(r *Report) []Versus {
	var out []Versus
	add := func(v Versus) { out = append(out, v) }
	for _, lv := range r.Streams {
		a, n := r.result(lv.Streams, AnvilProxy), r.result(lv.Streams, Nginx)
		if a == nil || n == nil || a.AddedEvent == nil || n.AddedEvent == nil {
			continue
		}
		name := fmt.Sprintf("%d streams × %d events", lv.Streams, lv.Events)
		add(lowerPair(name+", added p50 / p99", a.AddedEvent.P50, a.AddedEvent.P99, n.AddedEvent.P50, n.AddedEvent.P99, "µs"))
		add(lowerPair(name+", added TTFB p50 / p99", a.AddedTTFB.P50, a.AddedTTFB.P99, n.AddedTTFB.P50, n.AddedTTFB.P99, "µs"))
		add(lower(fmt.Sprintf("%d streams, proxy CPU per 1,000 events", lv.Streams), a.CPUPer1000, n.CPUPer1000, "ms"))
	}
	if a, n := r.small(AnvilProxy), r.small(Nginx); a != nil && n != nil {
		v := Versus{Measure: fmt.Sprintf("non-stream, %d keep-alive clients, requests/s", r.Small.Clients),
			AnvilProxy: rpsText(a), Nginx: rpsText(n), Ratio: ratio(float64(a.RPS), float64(n.RPS))}
		v.Met = verdict(a.RPS.known() && n.RPS.known() && a.RPS >= n.RPS)
		add(v)
		add(lower("CPU per non-stream request", a.CPUPerRequest, n.CPUPerRequest, "µs"))
	}
	if a, n := r.capacity(AnvilProxy), r.capacity(Nginx); a != nil && n != nil {
		v := lower(fmt.Sprintf("RSS per held stream, %d slow streams (worst wave)", r.Capacity.Streams), a.worstKiB(), n.worstKiB(), "KiB")
		v.AnvilProxy, v.Nginx = wavesText(a), wavesText(n)
		add(v)
	}
	return out
}

// Versus is one measure of anvilproxy beside nginx's in the same run.
// Ratio is anvilproxy's over nginx's; Met says whether anvilproxy is at or
// below nginx (at or above, for requests/s), null when unknown.
type Versus struct {
	Measure    string `json:"measure"`
	AnvilProxy string `json:"anvilproxy"`
	Nginx      string `json:"nginx"`
	Ratio      Num    `json:"ratio"`
	Met        *bool  `json:"met"`
}

var yes, no = true, false

func verdict(ok bool) *bool {
	if ok {
		return &yes
	}
	return &no
}

func lower(measure string, a, n Num, unit string) Versus {
	v := Versus{Measure: measure, AnvilProxy: unitText(a, unit), Nginx: unitText(n, unit), Ratio: ratio(float64(a), float64(n))}
	if a.known() && n.known() {
		v.Met = verdict(a <= n)
	}
	return v
}

// lowerPair judges two quantiles at once: both must be at or below.
func lowerPair(measure string, a50, a99, n50, n99 Num, unit string) Versus {
	v := Versus{Measure: measure,
		AnvilProxy: signed(a50) + " / " + signed(a99) + " " + unit,
		Nginx:      signed(n50) + " / " + signed(n99) + " " + unit,
		Ratio:      ratio(float64(a50), float64(n50))}
	if a50.known() && a99.known() && n50.known() && n99.known() {
		v.Met = verdict(a50 <= n50 && a99 <= n99)
	}
	return v
}

func unitText(v Num, unit string) string {
	if !v.known() {
		return "-"
	}
	return fmt.Sprintf("%s %s", plain(v), unit)
}

func rpsText(s *SmallTargetResult) string {
	t := fixed(s.RPS, 0)
	if s.RoundsRPS != nil {
		t += " (" + rpsSpread(s.RoundsRPS) + ")"
	}
	return t
}

func wavesText(c *CapacityTarget) string {
	var parts []string
	for _, w := range c.Waves {
		parts = append(parts, fixed(w.RSSPerStreamKiB, 1))
	}
	return strings.Join(parts, " / ") + " KiB"
}

// checks judges the run against its goals: every versus measure, then the
// capacity goals and the one that does not depend on the machine (no event
// lost); a goal the run did not measure is listed with Met null.
func checks(r *Report) []Check {
	var out []Check
	for _, v := range r.Versus {
		goal := v.Measure + ": at or below nginx's"
		if strings.Contains(v.Measure, "requests/s") {
			goal = v.Measure + ": at or above nginx's"
		}
		out = append(out, Check{Goal: goal, Measured: fmt.Sprintf("%s vs nginx %s (%s×)", v.AnvilProxy, v.Nginx, fixed(v.Ratio, 2)), Met: v.Met})
	}
	if len(r.Versus) == 0 {
		out = append(out, Check{Goal: "every measure at or below nginx's", Measured: "not measured (nginx did not run: scripts/install-comparison-proxies.sh)"})
	}
	out = append(out, memoryCheck(r), heldCheck(r))
	out = append(out, Check{Goal: "0 allocations per event", Measured: "not measured by the bench: go test -run TestRelayAllocsPerEvent ./proxy/"})
	return append(out, intactCheck(r))
}

func memoryCheck(r *Report) Check {
	c := Check{Goal: fmt.Sprintf("≤ %d KiB RSS per held stream, every wave", MaxKiBPerStream), Measured: "not measured (bench --capacity N)"}
	a := r.capacity(AnvilProxy)
	if a == nil || len(a.Waves) == 0 {
		return c
	}
	worst := a.worstKiB()
	c.Measured = fmt.Sprintf("%s at %d streams (by wave)", wavesText(a), r.Capacity.Streams)
	if worst.known() && worst > MaxKiBPerStream {
		c.Measured += fmt.Sprintf(", over by %.1f KiB", float64(worst)-MaxKiBPerStream)
	}
	c.Met = verdict(worst.known() && worst <= MaxKiBPerStream)
	return c
}

func heldCheck(r *Report) Check {
	c := Check{Goal: fmt.Sprintf("%d concurrent streams held, none lost", MinHeld), Measured: "not measured (bench --capacity 10000)"}
	a := r.capacity(AnvilProxy)
	if a == nil || len(a.Waves) == 0 {
		return c
	}
	var t streamTally
	for _, w := range a.Waves {
		t.add(w.streamTally)
	}
	c.Measured = fmt.Sprintf("%d held at once; %d lost, %d reordered, %d corrupt, %d failed", a.peakOpen(), t.Lost, t.Reordered, t.Corrupt, t.Failed)
	if r.Capacity.Asked > r.Capacity.Streams {
		c.Measured += fmt.Sprintf("; %d asked, the open-file limit allowed %d", r.Capacity.Asked, r.Capacity.Streams)
	}
	c.Met = verdict(a.peakOpen() >= MinHeld && t.ok())
	if a.peakOpen() < MinHeld && r.Capacity.Asked < MinHeld {
		c.Met = nil // not asked for
	}
	return c
}

func intactCheck(r *Report) Check {
	c := Check{Goal: "0 events lost or reordered through anvilproxy", Measured: "not measured"}
	var t streamTally
	seen := false
	for _, lv := range r.Streams {
		if a := r.result(lv.Streams, AnvilProxy); a != nil {
			t.add(a.streamTally)
			seen = true
		}
	}
	if a := r.capacity(AnvilProxy); a != nil {
		for _, w := range a.Waves {
			t.add(w.streamTally)
			seen = true
		}
	}
	if seen {
		c.Measured = fmt.Sprintf("%d events in %d streams: %d lost, %d reordered, %d corrupt, %d failed", t.Events, t.Streams, t.Lost, t.Reordered, t.Corrupt, t.Failed)
		c.Met = verdict(t.ok())
	}
	return c
}
