package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestQuantiles(t *testing.T) {
	h := newHist()
	for v := int64(1); v <= 1000; v++ {
		record(h, v*1000) // 1..1000 µs
	}
	record(h, -5)               // clamped to 1 ns
	record(h, int64(time.Hour)) // clamped to the top
	q := quantiles(h)
	require.Equal(t, int64(1002), q.N)
	require.InDelta(t, 500, float64(q.P50), 1)
	require.InDelta(t, 991, float64(q.P99), 1.5)
	require.InDelta(t, 1000, float64(q.P999), 1.5)
	require.InDelta(t, float64(histMax)/1e3, float64(q.Max), float64(histMax)/1e3*0.001)

	empty := quantiles(newHist())
	require.False(t, empty.P50.known())
	require.Zero(t, empty.N)
}

func TestAdded(t *testing.T) {
	direct := Quantiles{P50: 30, P99: 200, P999: 900}
	proxy := Quantiles{P50: 45.5, P99: 180, P999: 1000}
	require.Equal(t, &Added{P50: 15.5, P99: -20, P999: 100}, added(proxy, direct))
	require.False(t, added(quantiles(newHist()), direct).P50.known())
}

func TestSpread(t *testing.T) {
	require.Equal(t, &Spread{Median: 2, Min: 1, Max: 9}, spread([]float64{9, 1, 2}))
	require.Equal(t, &Spread{Median: 2.5, Min: 1, Max: 9}, spread([]float64{9, 1, 2, 3, math.NaN()}))
	require.Nil(t, spread(nil))
	require.Nil(t, spread([]float64{math.NaN()}))
}

func TestNumJSON(t *testing.T) {
	b, err := json.Marshal(struct {
		A, B, C Num
	}{1.23456, unknown, Num(math.Inf(1))})
	require.NoError(t, err)
	require.JSONEq(t, `{"A":1.23,"B":null,"C":null}`, string(b))
	require.Equal(t, unknown.known(), false)
	require.True(t, perMille(1, 0) != perMille(1, 0), "NaN")
	require.Equal(t, Num(2), perMille(4, 2000))
	require.Equal(t, Num(0.5), ratio(1, 2))
	require.False(t, ratio(1, 0).known())
}

func TestCellStats(t *testing.T) {
	c := newCellStats()
	c.addStream(streamTally{Streams: 1, Events: 2}, 50*time.Microsecond, []int64{10_000, 20_000}, nil, true)
	c.addStream(streamTally{Streams: 1, Events: 1}, 50*time.Microsecond, []int64{10_000}, nil, false) // ramp-up: counted, not timed
	c.addStream(streamTally{Streams: 1, Failed: 1, Lost: 2}, 0, nil, errStatus, true)
	c.addStream(streamTally{Streams: 1, Failed: 1, Lost: 2}, 0, nil, errStatus, true)
	require.Equal(t, streamTally{Streams: 4, Events: 3, Failed: 2, Lost: 4}, c.tally)
	require.Equal(t, int64(1), c.ttfb.TotalCount(), "failed streams have no TTFB")
	require.Equal(t, int64(2), c.event.TotalCount())
	require.Equal(t, []string{errStatus.Error()}, c.errs, "errors kept once each")
	c.reset()
	require.Zero(t, c.event.TotalCount())
	require.Empty(t, c.errs)
}

// report returns a report as a full run on a machine with every proxy
// would, with anvilproxy's figures from a and nginx's fixed.
func report(a StreamResult, anvilRPS float64, anvilKiB Num) *Report {
	lv := LevelResult{Streams: 256, Events: 60, Results: []StreamResult{
		{Target: Direct, streamTally: streamTally{Streams: 256, Events: 15360}},
		a,
		{Target: Nginx, AddedTTFB: &Added{P50: 100, P99: 300}, AddedEvent: &Added{P50: 40, P99: 200}, CPUPer1000: 9},
		{Target: Caddy, AddedTTFB: &Added{P50: 300}, AddedEvent: &Added{}, CPUPer1000: 12},
	}}
	r := &Report{
		Streams: []LevelResult{lv},
		Small: &SmallResult{Clients: 64, Results: []SmallTargetResult{
			{Target: Direct, RPS: 100000}, {Target: AnvilProxy, RPS: Num(anvilRPS), CPUPerRequest: 20}, {Target: Nginx, RPS: 50000, CPUPerRequest: 22},
		}},
		Capacity: []*CapacityResult{{Asked: 10000, Streams: 10000, Targets: []CapacityTarget{
			{Target: AnvilProxy, Waves: []CapacityWave{{PeakOpen: 10000, RSSPerStreamKiB: anvilKiB, HeapPerStreamKiB: 7}, {PeakOpen: 10000, RSSPerStreamKiB: anvilKiB - 1, HeapPerStreamKiB: 7}}},
			{Target: Nginx, Waves: []CapacityWave{{PeakOpen: 10000, RSSPerStreamKiB: 5, HeapPerStreamKiB: unknown}, {PeakOpen: 10000, RSSPerStreamKiB: 5, HeapPerStreamKiB: unknown}}},
		}}},
	}
	r.Versus = versus(r)
	return r
}

func TestChecks(t *testing.T) {
	good := StreamResult{Target: AnvilProxy, streamTally: streamTally{Streams: 256, Events: 15360},
		AddedEvent: &Added{P50: 12, P99: 50}, AddedTTFB: &Added{P50: 80, P99: 200}, CPUPer1000: 4}
	r := report(good, 60000, 4)
	require.Len(t, r.Versus, 6, "3 per level, 2 non-stream, 1 memory")
	met := map[string]*bool{}
	for _, c := range checks(r) {
		met[c.Goal] = c.Met
	}
	for goal, m := range met {
		if strings.Contains(goal, "allocations") {
			require.Nil(t, m, goal)
			continue
		}
		require.NotNil(t, m, goal)
		require.True(t, *m, goal)
	}

	require.True(t, report(good, 1, 4).Intact(AnvilProxy))
	r.Targets = []TargetInfo{{Name: AnvilProxy}, {Name: Caddy, Skipped: "not installed"}}
	require.Empty(t, r.Skipped(AnvilProxy))
	require.Equal(t, "not installed", r.Skipped(Caddy))

	bad := good
	bad.AddedEvent = &Added{P50: 20, P99: 201} // p50 below nginx's, p99 above: missed
	bad.AddedTTFB = &Added{P50: 200, P99: 200}
	bad.CPUPer1000 = 9.5
	bad.Lost = 1
	require.False(t, report(bad, 1, 4).Intact(AnvilProxy))
	require.True(t, report(bad, 1, 4).Intact(Nginx))
	for _, c := range checks(report(bad, 40000, 21)) {
		if c.Met == nil || strings.Contains(c.Goal, "CPU per non-stream request") || strings.Contains(c.Goal, "held") { // fixed by report
			continue
		}
		require.False(t, *c.Met, c.Goal)
	}
	for _, c := range checks(report(bad, 40000, 21)) {
		if strings.HasPrefix(c.Goal, "≤ 20 KiB") {
			require.Equal(t, "21.0 / 20.0 KiB at 10000 streams (by wave), over by 1.0 KiB; heap in use 7.0 / 7.0 KiB", c.Measured)
		}
		if strings.Contains(c.Goal, "requests/s") {
			require.Contains(t, c.Goal, "at or above")
			require.Equal(t, "40000 vs nginx 50000 (0.80×)", c.Measured)
		}
	}
}

func TestWriteTable(t *testing.T) {
	r := report(StreamResult{Target: AnvilProxy, AddedEvent: &Added{P50: 12, P99: 50, P999: unknown}, AddedTTFB: &Added{P50: 80, P99: 90},
		RoundsAddedEventP50: &Spread{Min: 10, Max: 14}, CPUPer1000: 4}, 60000, 18)
	r.Targets = []TargetInfo{{Name: Direct}, {Name: AnvilProxy, Version: "this build"}, {Name: HAProxy, Skipped: "not installed"}}
	r.Config.Order = []string{Direct, AnvilProxy}
	r.Checks = checks(r)
	var out bytes.Buffer
	require.NoError(t, r.WriteTable(&out))
	s := out.String()
	for _, want := range []string{"haproxy    skipped: not installed", "anvilproxy", "+12.0", "+10.0..+14.0", "4.00 ms",
		"256 streams × 60 events, added p50 / p99", "+12.0 / +50.0 µs", "RSS per held stream", "18.0 / 17.0 KiB",
		"[met   ] ≤ 20 KiB", "[n/a   ] 0 allocations"} {
		require.Contains(t, s, want)
	}
	var js bytes.Buffer
	require.NoError(t, r.WriteJSON(&js))
	require.True(t, json.Valid(js.Bytes()))
}

// TestVersusLoopAndFloor: the goroutine-relay target gets its own rows
// beside the default's (the loop), each with the floor's figure and the
// ratio to it, and its own goals.
func TestVersusLoopAndFloor(t *testing.T) {
	r := &Report{Streams: []LevelResult{{Streams: 16, Events: 200, Results: []StreamResult{
		{Target: Direct},
		{Target: AnvilProxy, AddedEvent: &Added{P50: 20, P99: 60}, AddedTTFB: &Added{P50: 80, P99: 200}, CPUPer1000: 11},
		{Target: AnvilGoroutine, AddedEvent: &Added{P50: 30, P99: 90}, AddedTTFB: &Added{P50: 80, P99: 200}, CPUPer1000: 22},
		{Target: Floor, AddedEvent: &Added{P50: 10, P99: 40}, AddedTTFB: &Added{P50: 40, P99: 100}, CPUPer1000: 10},
		{Target: Nginx, AddedEvent: &Added{P50: 10, P99: 50}, AddedTTFB: &Added{P50: 50, P99: 100}, CPUPer1000: 12},
	}}}}
	r.Versus = versus(r)
	require.Len(t, r.Versus, 6, "3 rows per anvilproxy target")
	cpu := map[string]Versus{}
	for _, v := range r.Versus {
		if strings.Contains(v.Measure, "CPU") {
			cpu[v.Target] = v
		}
	}
	require.Equal(t, "10.0", cpu[AnvilProxy].Floor)
	require.InDelta(t, 1.1, float64(cpu[AnvilProxy].VsFloor), 1e-9)
	require.True(t, *cpu[AnvilProxy].Met)
	require.InDelta(t, 2.2, float64(cpu[AnvilGoroutine].VsFloor), 1e-9)
	require.False(t, *cpu[AnvilGoroutine].Met)
	goals := map[string]bool{}
	for _, c := range checks(r) {
		goals[c.Goal] = true
	}
	require.True(t, goals["anvilproxy-goroutine: 16 streams, proxy CPU per 1,000 events: at or below nginx's"])
	require.True(t, goals["16 streams, proxy CPU per 1,000 events: at or below nginx's"])
	require.True(t, goals["0 events lost or reordered through anvilproxy-goroutine"])
	var out bytes.Buffer
	require.NoError(t, r.WriteTable(&out))
	require.Contains(t, out.String(), "1.10×")
}

// TestVersusNonStreamFloor: the non-stream rows' floor is floor-http's
// when it ran (the floor relay parses no HTTP), the floor relay's when not.
func TestVersusNonStreamFloor(t *testing.T) {
	small := func(withHTTP bool) *Report {
		res := []SmallTargetResult{{Target: AnvilProxy, RPS: 30000, CPUPerRequest: 30}, {Target: Nginx, RPS: 40000, CPUPerRequest: 15},
			{Target: Floor, RPS: 60000, CPUPerRequest: 10}}
		if withHTTP {
			res = append(res, SmallTargetResult{Target: HTTPFloor, RPS: 45000, CPUPerRequest: 15})
		}
		r := &Report{Small: &SmallResult{Clients: 64, Results: res}}
		r.Versus = versus(r)
		return r
	}
	cpuFloor := func(r *Report) Num {
		for _, v := range r.Versus {
			if v.Measure == "CPU per non-stream request" {
				return v.VsFloor
			}
		}
		t.Fatal("no CPU per non-stream request row")
		return 0
	}
	require.InDelta(t, 2.0, float64(cpuFloor(small(true))), 1e-9)
	require.InDelta(t, 3.0, float64(cpuFloor(small(false))), 1e-9)
}
