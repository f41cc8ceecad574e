package snapshot

import (
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
)

// windows records requests 0..n−1 into one Recorder, rotating after each of
// cuts, and returns the windows' documents as read back from files. The
// windows share out two minutes by their requests.
func windows(t *testing.T, cfg histo.Config, n, failEvery int, cuts ...int) []*Document {
	t.Helper()
	r, clk := newRecorder(t, cfg)
	var docs []*Document
	from := 0
	for _, to := range append(cuts, n) {
		record(r, from, to, failEvery)
		clk.t = t0.Add(2 * time.Minute * time.Duration(to) / time.Duration(n))
		docs = append(docs, roundTrip(t, build(t, r.Rotate())))
		from = to
	}
	return docs
}

// requireSameMeasurements checks that two documents describe the same
// requests with the same statistics.
func requireSameMeasurements(t *testing.T, want, got *Document) {
	t.Helper()
	w, g := generic(t, want), generic(t, got)
	require.Equal(t, w["metrics"], g["metrics"])
	require.Equal(t, w["metric_population"], g["metric_population"])
	require.Equal(t, w["request_timings"], g["request_timings"])
	require.Equal(t, w["failures"], g["failures"])
	for _, k := range []string{"requests", "completed", "failed", "responses_received", "started_at_unix_ns", "finished_at_unix_ns", "wall_clock_ms", "model"} {
		require.Equal(t, w[k], g[k], k)
	}
	we, ge := w["anvilproxy"].(map[string]any), g["anvilproxy"].(map[string]any)
	for _, k := range []string{"distributions", "queue_split", "goodput", "clamped", "dropped_records", "models", "percentile_source", "prefix_cache_hit_samples"} {
		require.Equal(t, we[k], ge[k], "anvilproxy.%s", k)
	}
	for name, h := range want.Anvilproxy.Histograms {
		a, err := hdrhistogram.Decode([]byte(h.HDR))
		require.NoError(t, err)
		b, err := hdrhistogram.Decode([]byte(got.Anvilproxy.Histograms[name].HDR))
		require.NoError(t, err)
		require.True(t, a.Equals(b), name)
	}
}

// TestMergeWindowsEqualsOneWindow: two consecutive windows merged give
// exactly what one window over both gives: the statistics are recomputed
// from the union of the requests, indices continue, counts and goodput add.
func TestMergeWindowsEqualsOneWindow(t *testing.T) {
	parts := windows(t, histo.Config{}, 40, 7, 17)
	whole := windows(t, histo.Config{}, 40, 7)[0]
	require.Equal(t, "exact", whole.Anvilproxy.PercentileSource)
	merged, err := Merge(parts[1], parts[0]) // in any order
	require.NoError(t, err)
	requireSameMeasurements(t, whole, roundTrip(t, merged))
	require.Equal(t, int64(2), merged.Anvilproxy.Windows)
	require.Equal(t, "anvilproxy-merged-20261129T230500.123Z", merged.RunID)

	// Merging is associative: a merged file merges again.
	thirds := windows(t, histo.Config{}, 40, 7, 10, 25)
	first, err := Merge(thirds[0], thirds[1])
	require.NoError(t, err)
	again, err := Merge(roundTrip(t, first), thirds[2])
	require.NoError(t, err)
	requireSameMeasurements(t, whole, roundTrip(t, again))
}

// TestMergeHDRWindows: when windows dropped records, their histograms merge
// exactly: the same percentiles as one window over both, within HDR
// precision of the exact ones.
func TestMergeHDRWindows(t *testing.T) {
	cfg := histo.Config{MaxWindowRequests: 8}
	parts := windows(t, cfg, 60, 0, 30)
	whole := windows(t, cfg, 60, 0)[0]
	exact := windows(t, histo.Config{}, 60, 0)[0]
	merged, err := Merge(parts...)
	require.NoError(t, err)
	require.Equal(t, "hdr", merged.Anvilproxy.PercentileSource)
	require.Equal(t, int64(44), merged.Anvilproxy.DroppedRecords)
	m := roundTrip(t, merged).Metrics
	for _, s := range stems {
		for _, p := range []string{"p25", "p50", "p90", "p99"} {
			key := s.name + "_" + p
			if s.ms {
				key += "_ms"
			}
			require.Equal(t, metricNum(whole.Metrics[key]), metricNum(m[key]), key)
			require.InEpsilon(t, float64(metricNum(exact.Metrics[key])), float64(metricNum(m[key])), 1e-3, key)
		}
	}
}

// TestMergeBenchmarkWithProxy: the benchmark's file and the proxy's merge;
// the benchmark's histograms are rebuilt from its requests.
func TestMergeBenchmarkWithProxy(t *testing.T) {
	ref, err := Decode(readReference(t))
	require.NoError(t, err)
	proxyDoc := windows(t, histo.Config{}, 24, 6)[0]
	merged, err := Merge(ref, proxyDoc)
	require.NoError(t, err)
	require.Equal(t, int64(30), merged.Requests)
	require.Equal(t, int64(26), merged.Completed)
	require.Equal(t, int64(26), merged.Metrics["ttft_samples"])
	require.Equal(t, "anvilproxy-passive-v1+capacity-v4-reasoning", merged.MeasurementProtocol)
	require.InDelta(t, 42385.4611+120000, float64(merged.WallClockMs), 1e-6, "measured time, not the months between the runs")
	require.Equal(t, "exact", merged.Anvilproxy.PercentileSource)
	require.Nil(t, merged.BaseURL, "the inputs disagree")
	require.Empty(t, merged.Anvilproxy.Goodput.Curves, "the benchmark has no SLOs")
	require.Equal(t, int64(26), merged.Anvilproxy.Goodput.Good)
	require.Len(t, merged.Anvilproxy.Notes, 2)
	h, err := hdrhistogram.Decode([]byte(merged.Anvilproxy.Histograms["ttft"].HDR))
	require.NoError(t, err)
	require.Equal(t, int64(26), h.TotalCount())
	require.Equal(t, "qwen", *merged.Model, "24 requests against 6")
	require.Equal(t, map[string]int64{"qwen": 24, "qwen38-swift15-ninfer-dflash2-c4-262k": 6}, merged.Anvilproxy.Models)
	// Indices stay unique: the benchmark's requests come first (it ran first).
	seen := map[int64]bool{}
	for _, rt := range merged.RequestTimings {
		require.False(t, seen[rt.RequestIndex], rt.RequestIndex)
		seen[rt.RequestIndex] = true
	}
	// Two copies of the benchmark's file keep what they agree on.
	twice, err := Merge(ref, ref)
	require.NoError(t, err)
	require.JSONEq(t, `"[operator identity redacted]"`, string(twice.BaseURL))
	require.Equal(t, ref.MeasurementProtocol, twice.MeasurementProtocol)
	require.Equal(t, int64(12), twice.Metrics["request_canary_passed"])
	require.InEpsilon(t, ref.Metrics["prefix_cache_hit_avg"], float64(twice.Metrics["prefix_cache_hit_avg"].(Num)), 1e-15)
}

func TestMergeNothing(t *testing.T) {
	_, err := Merge()
	require.Error(t, err)
}
