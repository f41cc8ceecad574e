package bench

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latencies are recorded in nanoseconds, from 1 ns to 2 minutes, with 3
// significant digits: a value is read back within 0.1%.
const (
	histMin     = 1
	histMax     = int64(2 * time.Minute)
	histSigFigs = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histSigFigs) }

// record adds v to h, clamped into the histogram's range; a negative
// latency (impossible on one monotonic clock) counts as 1 ns.
func record(h *hdrhistogram.Histogram, v int64) {
	_ = h.RecordValue(min(max(v, histMin), histMax))
}

// Quantiles are a latency distribution's summary, in microseconds.
type Quantiles struct {
	N    int64 `json:"n"`
	P50  Num   `json:"p50_us"`
	P99  Num   `json:"p99_us"`
	P999 Num   `json:"p99_9_us"`
	Max  Num   `json:"max_us"`
}

// quantiles summarizes h; an empty h gives NaNs, which print as "-".
func quantiles(h *hdrhistogram.Histogram) Quantiles {
	if h.TotalCount() == 0 {
		nan := Num(math.NaN())
		return Quantiles{P50: nan, P99: nan, P999: nan, Max: nan}
	}
	us := func(ns int64) Num { return Num(float64(ns) / 1e3) }
	return Quantiles{
		N:    h.TotalCount(),
		P50:  us(h.ValueAtQuantile(50)),
		P99:  us(h.ValueAtQuantile(99)),
		P999: us(h.ValueAtQuantile(99.9)),
		Max:  us(h.Max()),
	}
}

// Added is what a target adds to a latency, quantile by quantile: its
// quantile minus the direct run's, both from the same interleaved rounds.
// A difference of quantiles is not a quantile of differences; it is what
// GetBusbar and BerriAI's gateway benches report, and what a client sees.
type Added struct {
	P50  Num `json:"p50_us"`
	P99  Num `json:"p99_us"`
	P999 Num `json:"p99_9_us"`
}

func added(target, direct Quantiles) *Added {
	return &Added{P50: target.P50 - direct.P50, P99: target.P99 - direct.P99, P999: target.P999 - direct.P999}
}

// Spread is the range of a per-round figure over the rounds, with its
// median: how much of a difference is noise.
type Spread struct {
	Median Num `json:"median"`
	Min    Num `json:"min"`
	Max    Num `json:"max"`
}

func spread(v []float64) *Spread {
	var vs []float64
	for _, x := range v {
		if !math.IsNaN(x) {
			vs = append(vs, x)
		}
	}
	if len(vs) == 0 {
		return nil
	}
	slices.Sort(vs)
	m := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		m = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return &Spread{Median: Num(m), Min: Num(vs[0]), Max: Num(vs[len(vs)-1])}
}

// cellStats gathers one cell (one target, one round) from many workers.
// It is safe for concurrent use.
type cellStats struct {
	mu    sync.Mutex
	ttfb  *hdrhistogram.Histogram
	event *hdrhistogram.Histogram
	tally streamTally
	errs  []string // the first few distinct stream errors
}

func newCellStats() *cellStats { return &cellStats{ttfb: newHist(), event: newHist()} }

func (c *cellStats) reset() {
	c.ttfb.Reset()
	c.event.Reset()
	c.tally = streamTally{}
	c.errs = c.errs[:0]
}

// addStream takes one stream's results; its latencies only if timed.
func (c *cellStats) addStream(t streamTally, ttfb time.Duration, lat []int64, err error, timed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tally.add(t)
	if timed && ttfb > 0 {
		record(c.ttfb, int64(ttfb))
	}
	for _, v := range lat {
		if !timed {
			break
		}
		record(c.event, v)
	}
	if err != nil {
		c.noteErr(err)
	}
}

func (c *cellStats) noteErr(err error) {
	msg := err.Error()
	if len(c.errs) < 4 && !slices.Contains(c.errs, msg) {
		c.errs = append(c.errs, msg)
	}
}

// Num is a figure of the report. NaN means unknown: it is null in JSON
// and "-" in the table.
type Num float64

var unknown = Num(math.NaN())

func (n Num) known() bool { return !math.IsNaN(float64(n)) && !math.IsInf(float64(n), 0) }

// MarshalJSON writes n rounded to 2 decimals, or null.
func (n Num) MarshalJSON() ([]byte, error) {
	if !n.known() {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, math.Round(float64(n)*100)/100, 'f', -1, 64), nil
}

// perMille is v per 1,000 of n, or unknown when n is 0.
func perMille(v float64, n int64) Num {
	if n == 0 {
		return unknown
	}
	return Num(v * 1000 / float64(n))
}

// ratio is a/b, or unknown when b is 0.
func ratio(a, b float64) Num {
	if b == 0 {
		return unknown
	}
	return Num(a / b)
}
