package snapshot

import (
	"math"
	"slices"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/anvilproxy/anvilproxy/histo"

	"github.com/anvilproxy/anvilproxy/histo/dist"
)

// percentiles are the v1 schema's, in percent.
var percentiles = [...]int64{25, 50, 75, 90, 95, 99}

// z95 is the normal quantile of a two-sided 95% interval.
const z95 = 1.96

// unknownStats is the summary of an empty sample.
func unknownStats() Stats {
	nan := Num(math.NaN())
	return Stats{CI95High: nan, CI95Low: nan, Max: nan, Mean: nan, Min: nan,
		P25: nan, P50: nan, P75: nan, P90: nan, P95: nan, P99: nan, Stddev: nan}
}

// exactStats summarizes values. values is sorted in place.
func exactStats(values []float64) Stats {
	s := unknownStats()
	n := len(values)
	s.Samples = int64(n)
	if n == 0 {
		return s
	}
	slices.Sort(values)
	var sum float64
	for _, v := range values {
		sum += v
	}
	mean := sum / float64(n)
	s.Mean, s.Min, s.Max = Num(mean), Num(values[0]), Num(values[n-1])
	ps := s.percentiles()
	for i, p := range percentiles {
		*ps[i] = Num(dist.NearestRank(values, p))
	}
	if n > 1 {
		var ss float64
		for _, v := range values {
			ss += (v - mean) * (v - mean)
		}
		s.setSpread(mean, math.Sqrt(ss/float64(n-1)))
	}
	return s
}

// setSpread sets the sample standard deviation sd and the normal
// approximation of the 95% confidence interval of the mean from it.
func (s *Stats) setSpread(mean, sd float64) {
	half := z95 * sd / math.Sqrt(float64(s.Samples))
	s.Stddev, s.CI95Low, s.CI95High = Num(sd), Num(mean-half), Num(mean+half)
}

func (s *Stats) percentiles() [len(percentiles)]*Num {
	return [...]*Num{&s.P25, &s.P50, &s.P75, &s.P90, &s.P95, &s.P99}
}

// hdrStats summarizes an HDR histogram of metric m in the v1 unit. The
// percentiles are nearest-rank, and like the library's ValueAtPercentile
// they report the highest value equivalent to the bucket (within 0.1%); the
// mean and standard deviation use each bucket's middle.
func hdrStats(h *hdrhistogram.Histogram, m histo.Metric) Stats {
	s := unknownStats()
	n := h.TotalCount()
	s.Samples = n
	if n == 0 {
		return s
	}
	scale := m.Float(1)
	mean := h.Mean() * scale
	s.Mean, s.Min, s.Max = Num(mean), Num(m.Float(h.Min())), Num(m.Float(h.Max()))
	ps := s.percentiles()
	for i, p := range percentiles {
		// ValueAtPercentile takes rank int(q/100·n + 0.5); asking for rank
		// r − 0.25 gets exactly the nearest rank r.
		q := 100 * (float64(dist.Rank(p, n)) - 0.25) / float64(n)
		*ps[i] = Num(m.Float(h.ValueAtPercentile(q)))
	}
	if n > 1 {
		// StdDev is the population's; the v1 schema's is the sample's.
		s.setSpread(mean, h.StdDev()*scale*math.Sqrt(float64(n)/float64(n-1)))
	}
	return s
}
