package snapshot

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
)

// TestStatsMatchReference recomputes the benchmark's own metrics from its
// six request_timings: the reference file is the golden for every formula
// (sample stddev, 1.96·sd/√n interval, nearest-rank percentiles).
func TestStatsMatchReference(t *testing.T) {
	ref, err := Decode(readReference(t))
	require.NoError(t, err)
	var tpot []float64
	for _, rt := range ref.RequestTimings {
		tpot = append(tpot, float64(rt.TpotMs))
	}
	s := exactStats(tpot)
	// By hand: sorted 3.9992, 4.0938, 4.1710, 4.3110, 4.3621, 4.6175; rank
	// ceil(p/100·6) gives p25 → 2nd, p50 → 3rd, p75 → 5th, p90..p99 → 6th.
	require.Equal(t, int64(6), s.Samples)
	require.Equal(t, Num(3.999217374513913), s.Min)
	require.Equal(t, Num(4.093791208789222), s.P25)
	require.Equal(t, Num(4.1709643518498964), s.P50)
	require.Equal(t, Num(4.362078634361118), s.P75)
	require.Equal(t, Num(4.617549062493254), s.P90)
	require.Equal(t, Num(4.617549062493254), s.P95)
	require.Equal(t, Num(4.617549062493254), s.P99)
	require.Equal(t, Num(4.617549062493254), s.Max)
	require.InEpsilon(t, 4.259099867239761, float64(s.Mean), 1e-15)
	require.InEpsilon(t, 0.22109620494690177, float64(s.Stddev), 1e-14)
	require.InEpsilon(t, 4.082186057752424, float64(s.CI95Low), 1e-14)
	require.InEpsilon(t, 4.4360136767270975, float64(s.CI95High), 1e-14)

	// Every distribution key of the reference's metrics, recomputed.
	merged, err := Merge(ref)
	require.NoError(t, err)
	for k, want := range ref.Metrics {
		got := merged.Metrics[k]
		switch w := want.(type) {
		case float64:
			g := float64(metricNum(got))
			if w == math.Trunc(w) {
				require.Equal(t, w, g, k)
			} else {
				require.InEpsilon(t, w, g, 1e-14, k)
			}
		case map[string]any:
			require.Equal(t, map[string]int64{"usage": 6}, got, k)
		default:
			require.Equal(t, want, got, k)
		}
	}
	require.Len(t, merged.Metrics, len(ref.Metrics))
}

func TestExactStatsByHand(t *testing.T) {
	// 1..20: mean 10.5, sample variance 35, so sd √35 and the interval
	// 10.5 ± 1.96·√35/√20.
	var v []float64
	for i := 20; i >= 1; i-- {
		v = append(v, float64(i))
	}
	s := exactStats(v)
	sd := math.Sqrt(35)
	want := Stats{
		Samples: 20, Mean: 10.5, Stddev: Num(sd), Min: 1, Max: 20,
		CI95Low: Num(10.5 - 1.96*sd/math.Sqrt(20)), CI95High: Num(10.5 + 1.96*sd/math.Sqrt(20)),
		// Nearest rank ceil(p/100·20): 5, 10, 15, 18, 19 (not 20: 0.95·20
		// is 19.000000000000004 in floating point), 20.
		P25: 5, P50: 10, P75: 15, P90: 18, P95: 19, P99: 20,
	}
	require.Equal(t, want, s)

	one := exactStats([]float64{7})
	require.Equal(t, Num(7), one.P99)
	require.False(t, one.Stddev.Known(), "no sample stddev from one value")
	require.False(t, one.CI95Low.Known())
	require.False(t, exactStats(nil).Mean.Known())
}

// TestHDRStatsWithinPrecision: with records dropped, the statistics come
// from the HDR histograms and stay within their 0.1% of the exact ones.
func TestHDRStatsWithinPrecision(t *testing.T) {
	exact := build(t, window(t, histo.Config{}, 0, 300, 0))
	hdr := build(t, window(t, histo.Config{MaxWindowRequests: 100}, 0, 300, 0))
	require.Equal(t, "exact", exact.Anvilproxy.PercentileSource)
	require.Equal(t, "hdr", hdr.Anvilproxy.PercentileSource)
	require.Equal(t, int64(200), hdr.Anvilproxy.DroppedRecords)
	require.Len(t, hdr.RequestTimings, 100)
	require.NotEmpty(t, hdr.Anvilproxy.Notes)
	require.Equal(t, "hdr-nearest-rank", hdr.MetricPopulation.P99Interpretation)
	require.False(t, hdr.Metrics["throughput_tok_s"].(Num).Known(), "token totals miss the dropped records")
	for _, s := range stems {
		for _, stat := range []string{"min", "p25", "p50", "p75", "p90", "p95", "p99", "max", "mean"} {
			key := s.name + "_" + stat
			if s.ms {
				key += "_ms"
			}
			want, got := float64(exact.Metrics[key].(Num)), float64(hdr.Metrics[key].(Num))
			require.InEpsilon(t, want, got, 1e-3, key)
		}
		require.Equal(t, int64(300), hdr.Metrics[s.name+"_samples"], s.name)
	}
}
