package selfcheck

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo/dist"
)

// newProbe returns a probe (not started) reading PSI files from a
// directory the test writes: cpu, io, memory "some avg10" percentages.
func newProbe(t *testing.T, cfg Config, cpu, io, memory string) *Probe {
	t.Helper()
	dir := t.TempDir()
	for name, v := range map[string]string{"cpu": cpu, "io": io, "memory": memory} {
		if v == "" {
			continue
		}
		body := "some avg10=" + v + " avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	cfg.PressureDir = dir
	require.NoError(t, cfg.SetDefaults())
	s, _ := New(cfg)
	return s
}

func TestQualityVerdict(t *testing.T) {
	for _, c := range []struct {
		name       string
		late       []time.Duration
		cpu, mem   string
		verdict    string
		reasons    []string
		cpuPresure dist.Float
	}{
		{"quiet host", repeat(100, 200*time.Microsecond), "1.50", "0.00", VerdictGood, []string{}, 0.015},
		{"late ticks", append(repeat(95, time.Millisecond), repeat(5, 12*time.Millisecond)...), "1.50", "0.00", VerdictNoisy,
			[]string{"timer overshoot p99 12 ms > 5 ms"}, 0.015},
		{"cpu pressure", repeat(100, time.Millisecond), "35.00", "0.00", VerdictNoisy, []string{"cpu pressure 35% > 10%"}, 0.35},
		{"both, and memory", repeat(100, 20*time.Millisecond), "12.50", "40.00", VerdictNoisy,
			[]string{"timer overshoot p99 20.1 ms > 5 ms", "cpu pressure 12.5% > 10%", "memory pressure 40% > 10%"}, 0.125},
		{"no PSI", repeat(100, time.Millisecond), "", "", VerdictGood, []string{}, dist.NaN},
		{"probe not running", nil, "1.00", "0.00", VerdictUnknown, []string{"the self-check probe did not run in this window"}, 0.01},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newProbe(t, Config{}, c.cpu, "0.00", c.mem)
			for _, d := range c.late {
				s.observe(d)
			}
			s.readPressures()
			win := s.rotate()
			q := s.section(&win)
			require.Equal(t, c.verdict, q.Verdict)
			require.Equal(t, c.reasons, q.Reasons)
			if c.cpuPresure.Known() {
				require.InDelta(t, float64(c.cpuPresure), float64(q.Pressure.CPU), 1e-12)
			} else {
				require.False(t, q.Pressure.CPU.Known())
			}
			require.Equal(t, int64(len(c.late)), q.TimerOvershootMs.Count)
			require.Equal(t, dist.Float(250), q.ProbePeriodMs)
			require.Equal(t, Thresholds{OvershootP99Ms: 5, Pressure: 0.1}, q.Thresholds)
			again := s.rotate()
			require.Zero(t, s.section(&again).TimerOvershootMs.Count, "a window's samples are its own")
		})
	}
}

// handled is the number of ticks the probe handled in its window so far.
func (s *Probe) handled() int64 {
	c := s.current()
	return c.over.Count()
}

func repeat(n int, d time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// TestProbeUnderCPUHog: busy goroutines on every core (twice over) keep
// the probe's goroutine from running on time, and the window turns noisy.
// The hog is real (it is what the probe exists to see), so the test runs it
// until the probe has handled enough ticks to judge, however few a loaded
// machine lets through in a given time, rather than for a fixed time.
func TestProbeUnderCPUHog(t *testing.T) {
	s := newProbe(t, Config{Period: 5 * time.Millisecond}, "", "", "")
	s.Start()
	defer s.Stop()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			x := 0
			for !stop.Load() {
				for i := range 1000 {
					x += i
				}
			}
			_ = x
		})
	}
	// Go preempts a busy goroutine after 10 ms, so a tick waits up to that
	// long for a P: the p99 of 20 ticks is far above 5 ms.
	const ticks = 20
	for deadline := time.Now().Add(time.Minute); s.handled() < ticks; {
		if time.Now().After(deadline) {
			break // judged below with what it has
		}
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	s.Stop()
	win := s.rotate()
	q := s.section(&win)
	t.Logf("under the hog: %v; %d ticks, overshoot p50 %v p99 %v max %v ms", q.Reasons, q.TimerOvershootMs.Count,
		q.TimerOvershootMs.P50, q.TimerOvershootMs.P99, q.TimerOvershootMs.Max)
	require.GreaterOrEqual(t, q.TimerOvershootMs.Count, int64(ticks), "the probe handled too few ticks in a minute")
	require.Equal(t, VerdictNoisy, q.Verdict, "overshoot %+v", q.TimerOvershootMs)
	require.Contains(t, q.Reasons[0], "timer overshoot p99")
}

// TestProbeStartStop: in a bubble, where time is virtual and the probe's
// ticks are never late, a probe started for 10 periods handles exactly 10
// ticks, reads pressure once when it starts, and handles none once stopped.
func TestProbeStartStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newProbe(t, Config{Period: time.Millisecond}, "2.00", "", "")
		s.Stop() // not started: nothing
		s.Start()
		s.Start() // running: nothing
		// A failure must not leave the bubble blocked.
		t.Cleanup(s.Stop)
		time.Sleep(10 * time.Millisecond)
		synctest.Wait() // the probe has handled the tick due now
		s.Stop()
		s.Stop()
		win := s.rotate()
		require.Equal(t, int64(10), win.over.Count())
		require.Zero(t, float64(win.over.Dist(dist.Ms).Max), "virtual time: no tick is late")
		require.InDelta(t, 0.02, win.pressure[resourceCPU], 1e-12, "read when the probe starts")
		time.Sleep(5 * time.Millisecond)
		synctest.Wait()
		after := s.current()
		require.True(t, after.over.Empty(), "stopped: no more samples")
		s.Start() // again
		time.Sleep(3 * time.Millisecond)
		synctest.Wait()
		s.Stop()
		require.Equal(t, int64(3), s.handled(), "restarted: ticking again")
	})
}

func TestMergeQuality(t *testing.T) {
	good := newProbe(t, Config{}, "1.00", "", "")
	good.observe(time.Millisecond)
	good.readPressures()
	noisy := newProbe(t, Config{}, "30.00", "", "")
	noisy.observe(2 * time.Millisecond)
	noisy.readPressures()
	g, n := good.rotate(), noisy.rotate()
	a, b := good.section(&g), noisy.section(&n)
	m := Merge(a, nil, b)
	require.Equal(t, VerdictNoisy, m.Verdict)
	require.Equal(t, []string{"cpu pressure 30% > 10%"}, m.Reasons)
	require.Equal(t, int64(2), m.TimerOvershootMs.Count)
	require.InEpsilon(t, 2, float64(m.TimerOvershootMs.Max), 0.01)
	require.InDelta(t, 0.3, float64(m.Pressure.CPU), 1e-12)
	require.Equal(t, VerdictGood, Merge(a, a).Verdict)
	u := good.rotate()
	unknown := good.section(&u)
	require.Equal(t, VerdictGood, Merge(unknown, a).Verdict)
	require.Equal(t, VerdictUnknown, Merge(unknown, unknown).Verdict)
	require.Len(t, Merge(unknown, unknown).Reasons, 1)
}

func TestReadPressure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cpu")
	require.NoError(t, os.WriteFile(path, []byte("some avg10=7.25 avg60=3.72 avg300=8.25 total=644764634\n"), 0o644))
	v, err := readPressure(path)
	require.NoError(t, err)
	require.InDelta(t, 0.0725, v, 1e-12)
	require.NoError(t, os.WriteFile(path, []byte("garbage"), 0o644))
	_, err = readPressure(path)
	require.Error(t, err)
	_, err = readPressure(filepath.Join(dir, "missing"))
	require.Error(t, err)
}
