package histo

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

func TestParseSLO(t *testing.T) {
	tests := []struct {
		in      string
		want    SLO
		wantErr string
	}{
		{in: "ttft=2s", want: SLO{"ttft", 2 * time.Second}},
		{in: " TPOT = 50ms", want: SLO{"tpot", 50 * time.Millisecond}},
		{in: "queue=500ms", want: SLO{"queue", 500 * time.Millisecond}},
		{in: "ttft", wantErr: "want metric=duration"},
		{in: "ttft=soon", wantErr: "invalid duration"},
		{in: "ttft=0s", wantErr: "positive"},
		{in: "itl=1s", wantErr: "one of"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSLO(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestNewRejectsBadSLOs(t *testing.T) {
	_, err := New(Config{SLOs: []SLO{{"ttft", time.Second}, {"ttft", 2 * time.Second}}}, nil)
	require.ErrorContains(t, err, "twice")
	_, err = New(Config{SLOs: []SLO{{"bogus", time.Second}}}, nil)
	require.ErrorContains(t, err, "one of")
}

// TestMaxSLOsIsTheSLORows: the tally holds one SLO per row of the phase
// table marked slo, and New takes one of each at once.
func TestMaxSLOsIsTheSLORows(t *testing.T) {
	require.Len(t, SLONames(), maxSLOs)
	var slos []SLO
	for _, name := range SLONames() {
		s, err := ParseSLO(name + "=1s")
		require.NoError(t, err)
		slos = append(slos, s)
	}
	_, err := New(Config{SLOs: slos}, prometheus.NewRegistry())
	require.NoError(t, err)
}

func TestGoodput(t *testing.T) {
	r, reg, _ := newTest(t, Config{SLOs: []SLO{{"ttft", 2 * time.Second}, {"tpot", 20 * time.Millisecond}}})

	// TTFT 1.3 s, TPOT 10 ms: good.
	good := chat()
	// TTFT 3 s: misses ttft (within 1.5×), meets tpot.
	slow := chat()
	slow.FirstContent, slow.LastToken, slow.End = at(3000), at(3990), at(4000)
	// TPOT (4000−300)/200 = 18.5 ms: meets both. No content: TTFT unknown does not count against it.
	noContent := chat()
	noContent.FirstContent, noContent.ContentEvents = time.Time{}, 0
	noContent.End = at(4000)
	// Failed: never good, whatever its latencies.
	failed := chat()
	failed.ErrSide, failed.ErrKind = proxy.SideClient, proxy.ErrClientGone
	for _, tr := range []proxy.Trace{good, slow, noContent, failed} {
		r.Record(&tr)
	}

	win, cum := r.Goodput()
	require.Equal(t, win, cum)
	require.Equal(t, int64(4), win.Requests)
	require.Equal(t, int64(1), win.Failed)
	require.Equal(t, int64(2), win.Good)
	require.Equal(t, Float(0.5), win.Ratio)
	require.Equal(t, int64(2), win.Curves[0].Met) // ttft
	require.Equal(t, int64(3), win.Curves[1].Met) // tpot

	curve := r.goodputCurve()[0]
	require.Equal(t, "ttft", curve.Metric)
	shares := map[float64]Float{}
	for _, p := range curve.Points {
		shares[p.Multiple] = p.Share
		require.Equal(t, Span(time.Duration(p.Multiple*float64(2*time.Second))), p.Budget)
	}
	// Budgets 0.5 s .. 8 s against TTFTs 1.3 s, 3 s, unknown, failed.
	require.Equal(t, map[float64]Float{
		0.25: 0.25, 0.5: 0.25, 0.75: 0.5, 1: 0.5, 1.5: 0.75, 2: 0.75, 3: 0.75, 4: 0.75,
	}, shares)

	require.Equal(t, []bool{true, false, true, false}, goodFlags(r.Recent(4)))

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP anvilproxy_goodput_ratio Share of inference requests over the current and previous window that did not fail and met the SLO (slo="all": every SLO).
# TYPE anvilproxy_goodput_ratio gauge
anvilproxy_goodput_ratio{slo="all"} 0.5
anvilproxy_goodput_ratio{slo="tpot"} 0.75
anvilproxy_goodput_ratio{slo="ttft"} 0.5
`), "anvilproxy_goodput_ratio"))

	// The gauge rolls over the current and previous window; the cumulative
	// figure keeps everything.
	w := r.Rotate()
	require.Equal(t, int64(4), w.Goodput.Requests)
	r.Record(&slow)
	r.Record(&slow)
	require.InDelta(t, 2.0/6, r.rollingRatio(-1), 1e-12)
	r.Rotate()
	r.Rotate()
	require.True(t, math.IsNaN(r.rollingRatio(-1)), "no requests in the last two windows")
	win, cum = r.Goodput()
	require.Zero(t, win.Requests)
	require.Equal(t, int64(6), cum.Requests)
	require.Equal(t, int64(2), cum.Good)
}

func goodFlags(rqs []Request) []bool {
	out := make([]bool, len(rqs))
	for i := range rqs {
		out[len(rqs)-1-i] = rqs[i].Good // newest first → oldest first
	}
	return out
}

func TestGoodputWithoutSLOs(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	ok, bad := chat(), chat()
	bad.Status = 429
	r.Record(&ok)
	r.Record(&bad)
	win, _ := r.Goodput()
	require.Equal(t, Float(0.5), win.Ratio)
	require.Empty(t, win.Curves)
}

// TestSLOWords: --slo takes a phase-table row's word, name or key, stores
// the word, and refuses rows that are not SLO metrics, naming those that
// are, from the table.
func TestSLOWords(t *testing.T) {
	for _, in := range []string{"ttfo=2s", "TTFO=2s", "time_to_first_output=2s", "time_to_first_output_ms=2s"} {
		s, err := ParseSLO(in)
		require.NoError(t, err, in)
		require.Equal(t, SLO{Metric: "ttfo", Threshold: 2 * time.Second}, s, in)
	}
	_, err := ParseSLO("prefill=1s")
	require.ErrorContains(t, err, "one of ttfo, ttft, queue, tpot, e2e")
	_, err = New(Config{SLOs: []SLO{{"ttfo", time.Second}, {"time_to_first_output", 2 * time.Second}}}, nil)
	require.ErrorContains(t, err, "configured twice", "one row, two spellings")
}
