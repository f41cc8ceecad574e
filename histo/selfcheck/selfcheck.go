// Package selfcheck is the host-noise probe: the measurement-quality
// self-check that every histo window carries (Probe, Section, Merge). It
// reads no Trace; histo.Recorder owns one and judges each window with it.
package selfcheck

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/histo/dist"
)

// The measurement-quality self-check: every timing the proxy takes is only
// as good as the host lets its goroutines wake on time. A probe ticks at a
// fixed period and measures how late each tick is handled (the same delay
// that would stretch a stamp), and on Linux reads the kernel's pressure
// stall information (PSI, Documentation/accounting/psi.rst): the share of
// the last 10 s in which some task waited for a CPU, for I/O or for
// memory. Each window is judged good or noisy from them.

// Defaults of Config.
const (
	DefaultProbePeriod  = 250 * time.Millisecond
	DefaultMaxOvershoot = 5 * time.Millisecond
	DefaultMaxPressure  = 0.10
	DefaultPressureDir  = "/proc/pressure"
)

// Verdicts of a window's measurement quality.
const (
	VerdictGood    = "good"
	VerdictNoisy   = "noisy"
	VerdictUnknown = "unknown" // the probe did not run in the window
)

// Config configures the probe. The zero value is the default.
type Config struct {
	// Period is the probe's tick. 0 means 250 ms: 240 samples a minute,
	// at about 0.05% of one core where a wake-up costs 130 µs (a
	// Firecracker VM; see TestSelfCheckCost); 100 ms cost 0.14% there.
	Period time.Duration
	// MaxOvershoot is the p99 lateness of the probe's ticks above which a
	// window is noisy: stamps may then be late by as much. 0 means 5 ms.
	MaxOvershoot time.Duration
	// MaxPressure is the CPU or memory pressure (the peak "some avg10"
	// share) above which a window is noisy. I/O pressure is reported but
	// not judged: the proxy does no disk I/O on the request path. 0 means
	// 0.10.
	MaxPressure float64
	// PressureDir holds the PSI files cpu, io and memory. "" means
	// /proc/pressure; where they are missing, pressure is not reported.
	PressureDir string
}

// SetDefaults validates c and fills in the defaults of its zero fields.
func (c *Config) SetDefaults() error {
	if c.Period < 0 || c.MaxOvershoot < 0 || c.MaxPressure < 0 || c.MaxPressure > 1 {
		return errors.New("histo: SelfCheck.Period and MaxOvershoot must not be negative, MaxPressure must be within 0 and 1")
	}
	// cmp.Or: the first non-zero, so a zero field takes its default.
	c.Period = cmp.Or(c.Period, DefaultProbePeriod)
	c.MaxOvershoot = cmp.Or(c.MaxOvershoot, DefaultMaxOvershoot)
	c.MaxPressure = cmp.Or(c.MaxPressure, DefaultMaxPressure)
	c.PressureDir = cmp.Or(c.PressureDir, DefaultPressureDir)
	return nil
}

// resource is a PSI resource.
type resource uint8

const (
	resourceCPU resource = iota
	resourceIO
	resourceMemory
	numResources
)

var resourceNames = [numResources]string{"cpu", "io", "memory"}

// Probe is the self-check. Start and Stop it; histo.Recorder reads its
// figures with every window. Its methods are safe for concurrent use. At
// the default period it costs under 0.1% of one core (TestSelfCheckCost).
type Probe struct {
	cfg       Config
	overshoot prometheus.Histogram

	mu  sync.Mutex
	win qualityTally

	run        sync.Mutex // serializes Start and Stop
	stop, done chan struct{}
}

// qualityTally is what the probe saw in one window; guarded by
// Probe.mu.
type qualityTally struct {
	over     dist.Rec
	pressure [numResources]float64 // peak "some avg10" share; NaN: not read
}

func freshQuality() qualityTally {
	var t qualityTally
	for i := range t.pressure {
		t.pressure[i] = math.NaN()
	}
	return t
}

// New returns a stopped probe and its collectors, for the caller to
// register. cfg must have been through SetDefaults.
func New(cfg Config) (*Probe, []prometheus.Collector) {
	s := &Probe{cfg: cfg, win: freshQuality()}
	s.overshoot = prometheus.NewHistogram(dist.PromHistogram("anvilproxy_self_timer_overshoot_seconds",
		"How late the proxy's self-check probe handled its timer ticks: the delay the host adds to every stamp the proxy takes.",
		[]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}))
	out := []prometheus.Collector{s.overshoot}
	for r := range numResources {
		path := filepath.Join(cfg.PressureDir, resourceNames[r])
		// Registered everywhere, NaN where the host has no PSI (not Linux,
		// an old kernel, psi=0), so that the metric set does not depend on
		// the host.
		out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "anvilproxy_host_pressure_ratio",
			Help:        `Share of the last 10 s in which some task on the host waited for the resource (Linux PSI "some avg10"); NaN where the host does not report it.`,
			ConstLabels: prometheus.Labels{"resource": resourceNames[r]},
		}, func() float64 {
			v, err := readPressure(path)
			if err != nil {
				return math.NaN()
			}
			return v
		}))
	}
	return s, out
}

// Start starts the probe's goroutine; it runs until Stop. Starting a
// running probe does nothing.
func (s *Probe) Start() {
	s.run.Lock()
	defer s.run.Unlock()
	if s.stop != nil {
		return
	}
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.loop(s.stop, s.done)
}

// Stop stops the probe and waits for its goroutine to end. Stopping a
// stopped probe does nothing; it may be started again.
func (s *Probe) Stop() {
	s.run.Lock()
	defer s.run.Unlock()
	if s.stop == nil {
		return
	}
	close(s.stop)
	<-s.done
	s.stop, s.done = nil, nil
}

func (s *Probe) loop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(s.cfg.Period)
	defer tick.Stop()
	// PSI averages over 10 s: reading it every 2 s misses no peak.
	every := max(1, int(pressureEvery/s.cfg.Period))
	s.readPressures()
	for n := 1; ; n++ {
		select {
		case <-stop:
			return
		case at := <-tick.C:
			// at is the tick's scheduled time, however late the runtime
			// ran the timer (time.sendTime subtracts the delay), so this
			// is the whole lateness: timer and goroutine scheduling.
			s.observe(time.Since(at))
			if n%every == 0 {
				s.readPressures()
			}
		}
	}
}

func (s *Probe) observe(late time.Duration) {
	late = max(late, 0)
	s.overshoot.Observe(late.Seconds())
	s.mu.Lock()
	s.win.over.Record(dist.Ms, float64(late)/float64(time.Millisecond))
	s.mu.Unlock()
}

func (s *Probe) readPressures() {
	var v [numResources]float64
	for r := range numResources {
		var err error
		if v[r], err = readPressure(filepath.Join(s.cfg.PressureDir, resourceNames[r])); err != nil {
			v[r] = math.NaN()
		}
	}
	s.mu.Lock()
	for r, x := range v {
		if p := &s.win.pressure[r]; !math.IsNaN(x) && (math.IsNaN(*p) || x > *p) {
			*p = x
		}
	}
	s.mu.Unlock()
}

// pressureEvery is how often the probe reads PSI.
const pressureEvery = 2 * time.Second

var avg10 = []byte("some avg10=")

// readPressure reads the "some avg10" percentage of a PSI file as a share.
func readPressure(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	i := bytes.Index(b, avg10)
	if i < 0 {
		return 0, fmt.Errorf("histo: %s: no some avg10", path)
	}
	b = b[i+len(avg10):]
	if j := bytes.IndexAny(b, " \n"); j >= 0 {
		b = b[:j]
	}
	pct, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return 0, fmt.Errorf("histo: %s: %w", path, err)
	}
	return pct / 100, nil
}

// rotate returns the window's tally and starts a new one.
func (s *Probe) rotate() qualityTally {
	fresh := freshQuality()
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.win
	s.win = fresh
	return old
}

// Rotate ends the probe's window, starts a new one and returns the
// finished window's section.
func (s *Probe) Rotate() *Section {
	t := s.rotate()
	return s.section(&t)
}

// Current returns the section of the probe's window so far.
func (s *Probe) Current() *Section {
	t := s.current()
	return s.section(&t)
}

// current returns a copy of the window's tally.
func (s *Probe) current() qualityTally {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.win
	c.over = s.win.over.Clone()
	return c
}

// Section is a window's measurement quality: the snapshot's
// anvilproxy.measurement_quality object.
type Section struct {
	// Verdict is "good", "noisy" (Reasons say why) or "unknown" (the probe
	// did not run).
	Verdict string   `json:"verdict"`
	Reasons []string `json:"reasons"`
	// TimerOvershootMs is how late the probe's ticks were handled.
	TimerOvershootMs dist.Dist  `json:"timer_overshoot_ms"`
	ProbePeriodMs    dist.Float `json:"probe_period_ms"`
	Pressure         PSI        `json:"pressure"`
	Thresholds       Thresholds `json:"thresholds"`
}

// PSI holds the peak Linux pressure ("some avg10") of each resource over
// the window, as shares; null where the host does not report it.
type PSI struct {
	CPU    dist.Float `json:"cpu"`
	IO     dist.Float `json:"io"`
	Memory dist.Float `json:"memory"`
}

// Thresholds are the thresholds a verdict was judged against.
type Thresholds struct {
	OvershootP99Ms dist.Float `json:"timer_overshoot_p99_ms"`
	Pressure       dist.Float `json:"pressure"` // cpu and memory
}

// section judges the tally against the probe's thresholds.
func (s *Probe) section(t *qualityTally) *Section {
	q := &Section{
		TimerOvershootMs: t.over.Dist(dist.Ms),
		ProbePeriodMs:    dist.Millis(s.cfg.Period),
		Pressure:         PSI{CPU: dist.Float(t.pressure[resourceCPU]), IO: dist.Float(t.pressure[resourceIO]), Memory: dist.Float(t.pressure[resourceMemory])},
		Thresholds:       Thresholds{OvershootP99Ms: dist.Millis(s.cfg.MaxOvershoot), Pressure: dist.Float(s.cfg.MaxPressure)},
	}
	q.judge()
	return q
}

// judge sets the verdict and its reasons from the figures and thresholds.
func (q *Section) judge() {
	q.Reasons = []string{}
	if q.TimerOvershootMs.Count == 0 {
		q.Verdict = VerdictUnknown
		q.Reasons = append(q.Reasons, "the self-check probe did not run in this window")
		return
	}
	if p99, limit := q.TimerOvershootMs.P99, q.Thresholds.OvershootP99Ms; p99 > limit {
		q.Reasons = append(q.Reasons, fmt.Sprintf("timer overshoot p99 %s ms > %s ms", short(float64(p99)), short(float64(limit))))
	}
	for _, r := range []struct {
		name string
		v    dist.Float
	}{{"cpu", q.Pressure.CPU}, {"memory", q.Pressure.Memory}} {
		if r.v.Known() && r.v > q.Thresholds.Pressure {
			q.Reasons = append(q.Reasons, fmt.Sprintf("%s pressure %s%% > %s%%", r.name, short(100*float64(r.v)), short(100*float64(q.Thresholds.Pressure))))
		}
	}
	q.Verdict = VerdictGood
	if len(q.Reasons) > 0 {
		q.Verdict = VerdictNoisy
	}
}

// short formats v with up to three significant digits and no trailing
// zeros: "12", "0.25", "35".
func short(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }

// maxReasons bounds a merged section's reasons.
const maxReasons = 10

// Merge combines the measurement-quality sections of several
// windows (nil ones are skipped; nil when all are). The merged span is
// noisy when any window was, with their reasons; the overshoot
// distributions merge exactly and pressures keep their peak.
func Merge(sections ...*Section) *Section {
	return dist.MergeSections(sections, merge)
}

// merge combines two or more sections.
func merge(in []*Section) *Section {
	out := &Section{Verdict: VerdictUnknown, Reasons: []string{}, ProbePeriodMs: in[0].ProbePeriodMs, Thresholds: in[0].Thresholds,
		Pressure: PSI{CPU: dist.NaN, IO: dist.NaN, Memory: dist.NaN}}
	var overs []dist.Dist
	for _, s := range in {
		overs = append(overs, s.TimerOvershootMs)
		out.Pressure.CPU = dist.Max(out.Pressure.CPU, s.Pressure.CPU)
		out.Pressure.IO = dist.Max(out.Pressure.IO, s.Pressure.IO)
		out.Pressure.Memory = dist.Max(out.Pressure.Memory, s.Pressure.Memory)
		switch {
		case s.Verdict == VerdictNoisy:
			out.Verdict = VerdictNoisy
			for _, r := range s.Reasons {
				if !slices.Contains(out.Reasons, r) && len(out.Reasons) < maxReasons {
					out.Reasons = append(out.Reasons, r)
				}
			}
		case s.Verdict == VerdictGood && out.Verdict == VerdictUnknown:
			out.Verdict = VerdictGood
		}
	}
	if out.Verdict == VerdictUnknown {
		out.Reasons = append(out.Reasons, in[0].Reasons...)
	}
	out.TimerOvershootMs = dist.Merge(dist.Ms, overs...)
	return out
}
