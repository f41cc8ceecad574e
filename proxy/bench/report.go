package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// Schema names the report's JSON format.
const Schema = "anvilproxy.bench/v3"

// Report is what one run measured. Latencies are in microseconds; every
// "added" figure is the target's minus the direct run's in the same
// rounds.
type Report struct {
	Schema   string            `json:"schema"`
	Command  string            `json:"command"`
	Started  time.Time         `json:"started"`
	Seconds  Num               `json:"duration_s"`
	Machine  Machine           `json:"machine"`
	LoadEnd  Num               `json:"load1_end"`
	Config   ReportConfig      `json:"config"`
	Targets  []TargetInfo      `json:"targets"`
	Streams  []LevelResult     `json:"streams"`
	Small    *SmallResult      `json:"non_stream,omitempty"`
	Capacity []*CapacityResult `json:"capacity,omitempty"` // one per --capacity N, in order
	Versus   []Versus          `json:"versus_nginx"`
	Checks   []Check           `json:"checks"`
	Notes    []string          `json:"notes,omitempty"`
}

// Machine is what the run ran on.
type Machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	Kernel   string `json:"kernel"`
	Go       string `json:"go"`
	Load1    Num    `json:"load1_start"`
}

// ReportConfig is the run's shape.
type ReportConfig struct {
	Rounds        int      `json:"rounds"`
	CellSeconds   Num      `json:"round_s"`
	EventBytes    int      `json:"event_bytes"`
	SmallWorkers  int      `json:"non_stream_clients"`
	ProxyLogLevel string   `json:"anvilproxy_log_level"`
	Order         []string `json:"round_order"`
}

// TargetInfo is one target, run or skipped.
type TargetInfo struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	Setup   string `json:"setup,omitempty"`
	Skipped string `json:"skipped,omitempty"`
}

// LevelResult is one stream concurrency, every target.
type LevelResult struct {
	Streams int            `json:"streams"`
	Events  int            `json:"events_per_stream"`
	GapUS   Num            `json:"gap_us"`
	Offered Num            `json:"offered_events_per_s"`
	Results []StreamResult `json:"targets"`
}

// StreamResult is one target at one stream concurrency, all rounds.
type StreamResult struct {
	Target string `json:"target"`
	streamTally
	EventsPerSec Num       `json:"events_per_s"`
	TTFB         Quantiles `json:"ttfb"`
	Event        Quantiles `json:"event_latency"`
	AddedTTFB    *Added    `json:"added_ttfb,omitempty"`
	AddedEvent   *Added    `json:"added_event_latency,omitempty"`
	// RoundsAddedEventP50 is the spread of each round's own added p50.
	RoundsAddedEventP50 *Spread `json:"rounds_added_event_p50_us,omitempty"`
	RoundsAddedTTFBP50  *Spread `json:"rounds_added_ttfb_p50_us,omitempty"`
	// CPUPer1000 is the proxy process's CPU time per 1,000 events, ms.
	CPUPer1000 Num `json:"cpu_ms_per_1000_events"`
	// Residency is the proxy's own measure of itself, for anvilproxy: upstream
	// read returned to client write and flush returned, per relayed read,
	// interpolated from its /metrics classic buckets (Max unknown).
	Residency *Quantiles `json:"proxy_residency,omitempty"`
	Errors    []string   `json:"errors,omitempty"`
}

// SmallResult is the non-stream throughput test.
type SmallResult struct {
	Clients int                 `json:"clients"`
	Results []SmallTargetResult `json:"targets"`
}

// SmallTargetResult is one target's throughput, all rounds.
type SmallTargetResult struct {
	Target    string    `json:"target"`
	Requests  int64     `json:"requests"`
	Failed    int64     `json:"failed"`
	RPS       Num       `json:"req_per_s"`
	VsDirect  Num       `json:"ratio_to_direct"`
	RoundsRPS *Spread   `json:"rounds_req_per_s,omitempty"`
	Latency   Quantiles `json:"latency"`
	// CPUPerRequest is the proxy process's CPU time per request, µs.
	CPUPerRequest Num      `json:"cpu_us_per_request"`
	Errors        []string `json:"errors,omitempty"`
}

// CapacityResult is the capacity run: the same slow streams held open
// through each target in turn.
type CapacityResult struct {
	Asked       int              `json:"asked"`
	Streams     int              `json:"streams"`
	PerStream   int              `json:"events_per_stream"`
	GapMS       Num              `json:"gap_ms"`
	RampSeconds Num              `json:"ramp_s"`
	Targets     []CapacityTarget `json:"targets"`
}

// CapacityTarget is one proxy's capacity run.
type CapacityTarget struct {
	Target      string         `json:"target"`
	RSSIdleMiB  Num            `json:"rss_idle_mib"`
	HeapIdleMiB Num            `json:"heap_inuse_idle_mib"` // anvilproxy's, from /metrics; unknown for others
	Waves       []CapacityWave `json:"waves"`
}

// worstKiB is the target's largest memory per stream over its waves.
func (c *CapacityTarget) worstKiB() Num {
	worst := unknown
	for _, w := range c.Waves {
		if w.RSSPerStreamKiB.known() && (!worst.known() || w.RSSPerStreamKiB > worst) {
			worst = w.RSSPerStreamKiB
		}
	}
	return worst
}

// peakOpen is the most streams the target held open at once.
func (c *CapacityTarget) peakOpen() int64 {
	var n int64
	for _, w := range c.Waves {
		n = max(n, w.PeakOpen)
	}
	return n
}

// CapacityWave is one opening of all the capacity run's streams.
type CapacityWave struct {
	PeakOpen int64 `json:"peak_open"`
	streamTally
	SampledOpen     int64 `json:"rss_sampled_open"` // streams open when RSSMostOpenMiB was read
	RSSMostOpenMiB  Num   `json:"rss_most_open_mib"`
	RSSPeakMiB      Num   `json:"rss_peak_mib"`
	RSSPerStreamKiB Num   `json:"rss_per_stream_kib"`
	// HeapPerStreamKiB is anvilproxy's heap in use with every stream open
	// minus idle, per stream (unknown for other targets, or when not every
	// stream was open at once).
	HeapPerStreamKiB Num       `json:"heap_inuse_per_stream_kib"`
	CPUPer1000       Num       `json:"cpu_ms_per_1000_events"`
	TTFB             Quantiles `json:"ttfb"`
	Event            Quantiles `json:"event_latency"`
	Errors           []string  `json:"errors,omitempty"`
}

// Check is one of the run's goals against what the run measured.
type Check struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	// Met is null when the run did not measure it.
	Met *bool `json:"met"`
}

func newReport(cfg *Config) *Report {
	return &Report{
		Schema:  Schema,
		Command: cfg.Command,
		Started: time.Now().UTC().Truncate(time.Second),
		Machine: machineFacts(),
		Config: ReportConfig{
			Rounds:        cfg.Rounds,
			CellSeconds:   Num(cfg.Cell.Seconds()),
			EventBytes:    cfg.EventBytes,
			SmallWorkers:  cfg.SmallWorkers,
			ProxyLogLevel: cfg.ProxyLogLevel,
		},
		Streams: []LevelResult{},
		Versus:  []Versus{},
		Checks:  []Check{},
	}
}

func (r *Report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func (r *Report) addTarget(t *target, skipped string) {
	r.Targets = append(r.Targets, TargetInfo{Name: t.name, Version: t.version, Setup: t.setup, Skipped: skipped})
	if skipped == "" {
		r.Config.Order = append(r.Config.Order, t.name)
	}
}

func (r *Report) addLevel(lv Level, ts []*target, acc []levelAcc) {
	res := LevelResult{Streams: lv.Streams, Events: lv.Events, GapUS: Num(lv.Gap.Microseconds()), Offered: Num(lv.offered())}
	var direct StreamResult
	for i, t := range ts {
		a := &acc[i]
		sr := StreamResult{
			Target:       t.name,
			streamTally:  a.tally,
			EventsPerSec: Num(float64(a.tally.Events) / a.elapsed.Seconds()),
			TTFB:         quantiles(a.ttfb),
			Event:        quantiles(a.event),
			CPUPer1000:   unknown,
			Residency:    a.residency,
			Errors:       a.errs,
		}
		if a.cpuKnown {
			sr.CPUPer1000 = perMille(float64(a.cpu)/1e6, a.tally.Events)
		}
		if t.name == Direct {
			direct = sr
		} else {
			sr.AddedTTFB = added(sr.TTFB, direct.TTFB)
			sr.AddedEvent = added(sr.Event, direct.Event)
			sr.RoundsAddedEventP50 = spread(a.roundP50)
			sr.RoundsAddedTTFBP50 = spread(a.roundTTFB)
		}
		res.Results = append(res.Results, sr)
	}
	r.Streams = append(r.Streams, res)
}

func (r *Report) addSmall(clients int, ts []*target, acc []smallAcc) {
	res := &SmallResult{Clients: clients}
	var directRPS float64
	for i, t := range ts {
		a := &acc[i]
		rps := float64(a.requests) / a.elapsed.Seconds()
		if t.name == Direct {
			directRPS = rps
		}
		sr := SmallTargetResult{
			Target:        t.name,
			Requests:      a.requests,
			Failed:        a.failed,
			RPS:           Num(rps),
			VsDirect:      ratio(rps, directRPS),
			RoundsRPS:     spread(a.roundRPS),
			Latency:       quantiles(a.lat),
			CPUPerRequest: unknown,
			Errors:        a.errs,
		}
		if a.cpuKnown && a.requests > 0 {
			sr.CPUPerRequest = Num(float64(a.cpu) / 1e3 / float64(a.requests))
		}
		res.Results = append(res.Results, sr)
	}
	r.Small = res
}

func (r *Report) newCapacity(asked int, lv Level, ramp time.Duration) *CapacityResult {
	c := &CapacityResult{
		Asked:       asked,
		Streams:     lv.Streams,
		PerStream:   lv.Events,
		GapMS:       Num(float64(lv.Gap) / 1e6),
		RampSeconds: Num(ramp.Seconds()),
	}
	r.Capacity = append(r.Capacity, c)
	return c
}

// target returns target's part of the capacity run c, or nil.
func (c *CapacityResult) target(target string) *CapacityTarget {
	return find(c.Targets, func(t *CapacityTarget) bool { return t.Target == target })
}

// capacity returns target's part of every capacity run that has one.
func (r *Report) capacity(target string) []*CapacityTarget {
	var out []*CapacityTarget
	for _, c := range r.Capacity {
		if t := c.target(target); t != nil {
			out = append(out, t)
		}
	}
	return out
}

func newCapacityWave(best rssSample, idle, peak, peakOpen int64, cpu time.Duration, st *cellStats) CapacityWave {
	w := CapacityWave{
		PeakOpen:        peakOpen,
		streamTally:     st.tally,
		SampledOpen:     best.open,
		RSSMostOpenMiB:  unknown,
		RSSPeakMiB:      Num(mib(peak)),
		RSSPerStreamKiB: unknown,
		CPUPer1000:      perMille(float64(cpu)/1e6, st.tally.Events),
		TTFB:            quantiles(st.ttfb),
		Event:           quantiles(st.event),
		Errors:          st.errs,
	}
	if best.open > 0 {
		w.RSSMostOpenMiB = Num(mib(best.rss))
		w.RSSPerStreamKiB = Num(float64(best.rss-idle) / 1024 / float64(best.open))
	}
	return w
}

// finish closes the report: duration, load, and the checks.
func (r *Report) finish() {
	r.Seconds = Num(time.Since(r.Started).Round(100 * time.Millisecond).Seconds())
	r.LoadEnd = Num(loadAvg())
	r.Versus = versus(r)
	r.Checks = checks(r)
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// result returns target's result at the level of n streams, or nil.
func (r *Report) result(n int, target string) *StreamResult {
	for i := range r.Streams {
		if r.Streams[i].Streams != n {
			continue
		}
		if res := find(r.Streams[i].Results, func(s *StreamResult) bool { return s.Target == target }); res != nil {
			return res
		}
	}
	return nil
}

func (r *Report) small(target string) *SmallTargetResult {
	if r.Small == nil {
		return nil
	}
	return find(r.Small.Results, func(s *SmallTargetResult) bool { return s.Target == target })
}

// find returns the first element of xs that match accepts, or nil.
func find[T any](xs []T, match func(*T) bool) *T {
	for i := range xs {
		if match(&xs[i]) {
			return &xs[i]
		}
	}
	return nil
}
