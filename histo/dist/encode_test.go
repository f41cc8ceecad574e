package dist

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/stretchr/testify/require"
)

// encodeCases are histograms of every shape the project encodes (histo's
// per-metric ones, Ms, Share), empty, with one value, with counts that
// take the ZigZag long's ninth byte, and merged.
func encodeCases(t testing.TB) map[string]*hdrhistogram.Histogram {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(h *hdrhistogram.Histogram, n int, hi int64) *hdrhistogram.Histogram {
		for range n {
			require.NoError(t, h.RecordValue(rng.Int64N(hi)))
		}
		return h
	}
	perMetric := func() *hdrhistogram.Histogram { return hdrhistogram.New(1, 3_600_000_000, 3) }
	cases := map[string]*hdrhistogram.Histogram{
		"empty":            Ms.New(),
		"empty per-metric": perMetric(),
		"zero":             random(Share.New(), 1, 1),
		"ms":               random(Ms.New(), 5000, 3_600_000_000),
		"ms low":           random(Ms.New(), 300, 20_000),
		"share":            random(Share.New(), 2000, 1001),
		"per-metric":       random(perMetric(), 20000, 60_000_000),
	}
	huge := Ms.New()
	require.NoError(t, huge.RecordValues(1234, 1<<60))
	require.NoError(t, huge.RecordValues(99, 1<<40))
	require.NoError(t, huge.RecordValues(3_000_000_000, 1<<20))
	cases["huge counts"] = huge
	merged := random(Ms.New(), 100, 1000)
	merged.Merge(random(Ms.New(), 100, 90_000_000))
	cases["merged"] = merged
	return cases
}

// TestEncodeMatchesLibrary holds Encode to hdrhistogram-go's own encoder,
// byte for byte, and to its decoder.
func TestEncodeMatchesLibrary(t *testing.T) {
	for name, h := range encodeCases(t) {
		t.Run(name, func(t *testing.T) {
			want, err := h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
			require.NoError(t, err)
			got := Encode(h)
			require.Equal(t, string(want), got)
			back, err := hdrhistogram.Decode([]byte(got))
			require.NoError(t, err)
			require.True(t, h.Equals(back), "decoded histogram differs")
			require.Equal(t, got, Encode(h), "a reused encoder wrote other bytes")
		})
	}
}

// TestEncodeConcurrent encodes from several goroutines at once (run under
// -race by the README's test command): each takes its own pooled encoder.
func TestEncodeConcurrent(t *testing.T) {
	cases := encodeCases(t)
	want := map[string]string{}
	for name, h := range cases {
		want[name] = Encode(h)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				for name, h := range cases {
					if got := Encode(h); got != want[name] {
						t.Errorf("%s: concurrent encoding differs", name)
					}
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkEncode against BenchmarkEncodeLibrary: one Ms histogram with
// 5,000 values, as a snapshot section's distribution.
func BenchmarkEncode(b *testing.B) {
	h := encodeCases(b)["ms"]
	b.ReportAllocs()
	for b.Loop() {
		Encode(h)
	}
}

func BenchmarkEncodeLibrary(b *testing.B) {
	h := encodeCases(b)["ms"]
	b.ReportAllocs()
	for b.Loop() {
		_, _ = h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
	}
}
