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
// event intact, in the stream test and the capacity runs (a target that
// did not run is intact). Unlike the timings, this does not depend on the
// machine, so a smoke test may fail on it.
func (r *Report) Intact(target string) bool {
	for _, lv := range r.Streams {
		for _, s := range lv.Results {
			if s.Target == target && !s.streamTally.ok() {
				return false
			}
		}
	}
	for _, c := range r.capacity(target) {
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

// versus compares each anvilproxy target (serve's default, the goroutine
// relay) with nginx measure by measure, from the same run: each stream
// level's added latency, TTFB and CPU, the non-stream throughput and CPU,
// and each capacity run's memory. The floor's figure and the ratio to it
// stand beside, for the fallback (within 10% of the floor): the
// floor relay's, and for the non-stream rows floor-http's if it ran. A
// measure anvilproxy or nginx did not run is left out.
func versus(r *Report) []Versus {
	var out []Versus
	add := func(target string, v Versus, floor Num) {
		v.Target = target
		v.Floor, v.VsFloor = "-", unknown
		if floor.known() {
			v.Floor = plain(floor)
			v.VsFloor = v.vsFloor(floor)
		}
		out = append(out, v)
	}
	for _, lv := range r.Streams {
		n, f := r.result(lv.Streams, Nginx), r.result(lv.Streams, Floor)
		if n == nil || n.AddedEvent == nil {
			continue
		}
		name := fmt.Sprintf("%d streams × %d events", lv.Streams, lv.Events)
		for _, at := range anvilTargets {
			a := r.result(lv.Streams, at)
			if a == nil || a.AddedEvent == nil {
				continue
			}
			fe, ft, fc := unknown, unknown, unknown
			if f != nil && f.AddedEvent != nil {
				fe, ft, fc = f.AddedEvent.P50, f.AddedTTFB.P50, f.CPUPer1000
			}
			add(at, lowerPair(name+", added p50 / p99", a.AddedEvent.P50, a.AddedEvent.P99, n.AddedEvent.P50, n.AddedEvent.P99, "µs"), fe)
			add(at, lowerPair(name+", added TTFB p50 / p99", a.AddedTTFB.P50, a.AddedTTFB.P99, n.AddedTTFB.P50, n.AddedTTFB.P99, "µs"), ft)
			add(at, lower(fmt.Sprintf("%d streams, proxy CPU per 1,000 events", lv.Streams), a.CPUPer1000, n.CPUPer1000, "ms"), fc)
		}
	}
	if n := r.small(Nginx); n != nil {
		// The non-stream rows' floor is fasthttp's, when it ran: the floor
		// relay parses no HTTP at all.
		f := r.small(HTTPFloor)
		if f == nil {
			f = r.small(Floor)
		}
		for _, at := range anvilTargets {
			a := r.small(at)
			if a == nil {
				continue
			}
			fr, fc := unknown, unknown
			if f != nil {
				fr, fc = f.RPS, f.CPUPerRequest
			}
			v := Versus{Measure: fmt.Sprintf("non-stream, %d keep-alive clients, requests/s", r.Small.Clients),
				AnvilProxy: rpsText(a), Nginx: rpsText(n), Ratio: ratio(float64(a.RPS), float64(n.RPS)), value: a.RPS, higher: true}
			v.Met = verdict(a.RPS.known() && n.RPS.known() && a.RPS >= n.RPS)
			add(at, v, fr)
			add(at, lower("CPU per non-stream request", a.CPUPerRequest, n.CPUPerRequest, "µs"), fc)
		}
	}
	for _, c := range r.Capacity {
		n := c.target(Nginx)
		if n == nil {
			continue
		}
		for _, at := range anvilTargets {
			a := c.target(at)
			if a == nil {
				continue
			}
			v := lower(fmt.Sprintf("RSS per held stream, %d slow streams (worst wave)", c.Streams), a.worstKiB(), n.worstKiB(), "KiB")
			v.AnvilProxy, v.Nginx = wavesText(a), wavesText(n)
			add(at, v, unknown)
		}
	}
	return out
}

// Versus is one measure of an anvilproxy target beside nginx's in the
// same run. Ratio is anvilproxy's over nginx's; Met says whether
// anvilproxy is at or below nginx (at or above, for requests/s), null
// when unknown. Floor is the floor's figure in the same run (its added
// p50 for a latency pair) and VsFloor anvilproxy's over it: the issue's
// fallback asks for at most 1.1 (requests/s: at least 0.9). The floor is
// the floor relay's (bytes only) for stream rows and floor-http's (a
// fasthttp proxy measuring nothing) for non-stream rows when it ran: the
// floor relay parses no HTTP, so no HTTP proxy could come near it there.
type Versus struct {
	Measure    string `json:"measure"`
	Target     string `json:"target"`
	AnvilProxy string `json:"anvilproxy"`
	Nginx      string `json:"nginx"`
	Ratio      Num    `json:"ratio"`
	Met        *bool  `json:"met"`
	Floor      string `json:"floor"`
	VsFloor    Num    `json:"ratio_to_floor"`

	value  Num  // anvilproxy's figure the ratios are of
	higher bool // more is better (requests/s)
}

// vsFloor is the ratio of anvilproxy's figure to the floor's, for an
// added latency the ratio of the added p50s.
func (v *Versus) vsFloor(floor Num) Num {
	return ratio(float64(v.value), float64(floor))
}

var yes, no = true, false

func verdict(ok bool) *bool {
	if ok {
		return &yes
	}
	return &no
}

func lower(measure string, a, n Num, unit string) Versus {
	v := Versus{Measure: measure, AnvilProxy: unitText(a, unit), Nginx: unitText(n, unit), Ratio: ratio(float64(a), float64(n)), value: a}
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
		Ratio:      ratio(float64(a50), float64(n50)), value: a50}
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
// lost), for each anvilproxy target that ran; a goal the run did not
// measure is listed with Met null.
func checks(r *Report) []Check {
	var out []Check
	for _, v := range r.Versus {
		goal := v.Measure + ": at or below nginx's"
		if strings.Contains(v.Measure, "requests/s") {
			goal = v.Measure + ": at or above nginx's"
		}
		out = append(out, Check{Goal: targetGoal(v.Target, goal), Measured: fmt.Sprintf("%s vs nginx %s (%s×)", v.AnvilProxy, v.Nginx, fixed(v.Ratio, 2)), Met: v.Met})
	}
	if len(r.Versus) == 0 {
		out = append(out, Check{Goal: "every measure at or below nginx's", Measured: "not measured (nginx did not run: scripts/install-comparison-proxies.sh)"})
	}
	for _, at := range anvilTargets {
		if !r.ran(at) {
			continue
		}
		out = append(out, memoryChecks(r, at)...)
		out = append(out, heldCheck(r, at))
	}
	out = append(out, Check{Goal: "0 allocations per event", Measured: "not measured by the bench: go test -run 'AllocsPerEvent' ./proxy/"})
	for _, at := range anvilTargets {
		if r.ran(at) {
			out = append(out, intactCheck(r, at))
		}
	}
	return out
}

// targetGoal names the target in a goal, but for the default anvilproxy.
func targetGoal(target, goal string) string {
	if target == "" || target == AnvilProxy {
		return goal
	}
	return target + ": " + goal
}

// ran reports whether target has any result in the run.
func (r *Report) ran(target string) bool {
	for _, lv := range r.Streams {
		if find(lv.Results, func(s *StreamResult) bool { return s.Target == target }) != nil {
			return true
		}
	}
	return r.small(target) != nil || len(r.capacity(target)) > 0
}

// memoryChecks judges target's memory per held stream in each capacity
// run, or says it was not measured.
func memoryChecks(r *Report, target string) []Check {
	goal := targetGoal(target, fmt.Sprintf("≤ %d KiB RSS per held stream, every wave", MaxKiBPerStream))
	var out []Check
	for _, c := range r.Capacity {
		a := c.target(target)
		if a == nil || len(a.Waves) == 0 {
			continue
		}
		worst := a.worstKiB()
		m := fmt.Sprintf("%s at %d streams (by wave)", wavesText(a), c.Streams)
		if worst.known() && worst > MaxKiBPerStream {
			m += fmt.Sprintf(", over by %.1f KiB", float64(worst)-MaxKiBPerStream)
		}
		if h := heapText(a); h != "" {
			m += "; heap in use " + h
		}
		out = append(out, Check{Goal: goal, Measured: m, Met: verdict(worst.known() && worst <= MaxKiBPerStream)})
	}
	if len(out) == 0 {
		out = append(out, Check{Goal: goal, Measured: "not measured (bench --capacity N)"})
	}
	return out
}

// heapText is a target's heap in use per stream by wave, "" when unknown.
func heapText(c *CapacityTarget) string {
	var parts []string
	for _, w := range c.Waves {
		if !w.HeapPerStreamKiB.known() {
			return ""
		}
		parts = append(parts, fixed(w.HeapPerStreamKiB, 1))
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, " / ") + " KiB"
}

// heldCheck judges the largest capacity run target held.
func heldCheck(r *Report, target string) Check {
	c := Check{Goal: targetGoal(target, fmt.Sprintf("%d concurrent streams held, none lost", MinHeld)), Measured: "not measured (bench --capacity 10000)"}
	var a *CapacityTarget
	var run *CapacityResult
	for _, cr := range r.Capacity {
		if t := cr.target(target); t != nil && (run == nil || cr.Streams > run.Streams) {
			a, run = t, cr
		}
	}
	if a == nil || len(a.Waves) == 0 {
		return c
	}
	var t streamTally
	for _, w := range a.Waves {
		t.add(w.streamTally)
	}
	c.Measured = fmt.Sprintf("%d held at once; %d lost, %d reordered, %d corrupt, %d failed", a.peakOpen(), t.Lost, t.Reordered, t.Corrupt, t.Failed)
	if run.Asked > run.Streams {
		c.Measured += fmt.Sprintf("; %d asked, the open-file limit allowed %d", run.Asked, run.Streams)
	}
	c.Met = verdict(a.peakOpen() >= MinHeld && t.ok())
	if a.peakOpen() < MinHeld && run.Asked < MinHeld {
		c.Met = nil // not asked for
	}
	return c
}

func intactCheck(r *Report, target string) Check {
	c := Check{Goal: "0 events lost or reordered through " + target, Measured: "not measured"}
	var t streamTally
	seen := false
	for _, lv := range r.Streams {
		if a := r.result(lv.Streams, target); a != nil {
			t.add(a.streamTally)
			seen = true
		}
	}
	for _, a := range r.capacity(target) {
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
