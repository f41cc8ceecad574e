//go:build unix

package selfcheck

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// TestSelfCheckCost measures the probe's CPU cost: the process's CPU time
// (getrusage) over 10 s with the probe running at its default period,
// against 10 s without. It takes 20 s, so it runs only with
// ANVILPROXY_PROBE_COST=1:
//
//	ANVILPROXY_PROBE_COST=1 go test -run TestSelfCheckCost -v ./histo/selfcheck/
//
// The target is under 0.1% of one core.
func TestSelfCheckCost(t *testing.T) {
	if os.Getenv("ANVILPROXY_PROBE_COST") == "" {
		t.Skip("set ANVILPROXY_PROBE_COST=1 to measure the probe's cost (20 s)")
	}
	const span = 10 * time.Second
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	measure := func(run func()) time.Duration {
		before, start := cpu(), time.Now()
		run()
		return time.Duration(float64(cpu()-before) * float64(span) / float64(time.Since(start)))
	}
	idle := measure(func() { time.Sleep(span) })
	s, _ := New(Config{Period: DefaultProbePeriod, PressureDir: DefaultPressureDir})
	probe := measure(func() {
		s.Start()
		time.Sleep(span)
		s.Stop()
	})
	share := float64(probe-idle) / float64(span)
	t.Logf("CPU over %v: idle %v, with the probe %v: the probe costs %v, %.4f%% of one core",
		span, idle, probe, probe-idle, 100*share)
	if share > 0.001 {
		t.Errorf("the probe costs %.4f%% of one core, above 0.1%%", 100*share)
	}
}
