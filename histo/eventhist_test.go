package histo

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo/dist"
)

// TestEventHistogramMatchesClientGolang feeds the same durations to a
// per-event metric and to the histogram client_golang makes from the same
// options, and requires the same exposition: classic buckets, count, sum,
// and native schema, zero bucket and spans, including the lowering of the
// schema once more than 160 native buckets are populated.
func TestEventHistogramMatchesClientGolang(t *testing.T) {
	for _, tc := range []struct {
		name   string
		m      Metric
		n      int
		lo, hi time.Duration // log-uniform
		schema int32         // the exposition's
	}{
		{"residency", MetricOverhead, 20_000, 300 * time.Nanosecond, 20 * time.Millisecond, 3},
		{"gaps", MetricInterEvent, 20_000, 50 * time.Microsecond, 30 * time.Second, 3},
		{"every scale", MetricInterEvent, 50_000, time.Nanosecond, 1000 * time.Hour, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ours, theirs := testEventPair(tc.m), clientGolangHistogram(tc.m)
			rng := rand.New(rand.NewPCG(1, uint64(tc.n)))
			lo, hi := math.Log(float64(tc.lo)), math.Log(float64(tc.hi))
			for i := range tc.n {
				d := time.Duration(math.Exp(lo + rng.Float64()*(hi-lo)))
				if i%97 == 0 {
					d = 0 // events of one read are 0 apart
				}
				ours.observe(d)
				theirs.Observe(d.Seconds())
			}
			got, want := collect(t, ours), collect(t, theirs)
			require.Equal(t, tc.schema, got.GetSchema())
			require.InEpsilon(t, want.GetSampleSum(), got.GetSampleSum(), 1e-9)
			got.SampleSum, want.SampleSum = nil, nil
			got.CreatedTimestamp, want.CreatedTimestamp = nil, nil
			require.Equal(t, want.String(), got.String())
		})
	}
}

// TestEventHistogramEmpty: before any event, the exposition is a native
// histogram with no observations, as client_golang's is.
func TestEventHistogramEmpty(t *testing.T) {
	ours, theirs := testEventPair(MetricOverhead), clientGolangHistogram(MetricOverhead)
	got, want := collect(t, ours), collect(t, theirs)
	got.CreatedTimestamp, want.CreatedTimestamp = nil, nil
	require.Equal(t, want.String(), got.String())
}

// TestNativeBounds: the bounds copied from client_golang are 2^(i/8 - 1).
func TestNativeBounds(t *testing.T) {
	for i, b := range nativeBounds {
		require.InEpsilon(t, math.Exp2(float64(i)/8-1), b, 1e-15, "bound %d", i)
	}
	require.Equal(t, -239, minNativeKey) // 1 ns = 2^-29.9
}

func testEventPair(m Metric) *eventPair {
	return newEventPair(m, prometheus.NewCounter(prometheus.CounterOpts{Name: "c"}), time.Now())
}

// clientGolangHistogram is the histogram client_golang makes for m's row.
func clientGolangHistogram(m Metric) prometheus.Histogram {
	row := &phases[m]
	return prometheus.NewHistogram(dist.PromHistogram(row.prom, row.help, row.buckets))
}

func collect(t *testing.T, c prometheus.Collector) *dto.Histogram {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	require.NoError(t, (<-ch).Write(&m))
	return m.GetHistogram()
}

// TestObserveEventAllocs: a per-event observation allocates nothing.
func TestObserveEventAllocs(t *testing.T) {
	e := testEventPair(MetricOverhead)
	d := time.Duration(0)
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		d += 777 * time.Nanosecond
		e.observe(d)
	}))
}
