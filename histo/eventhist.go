package histo

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/anvilproxy/anvilproxy/histo/dist"
)

// nativeSchema is the per-event histograms' native schema, as
// dist.PromHistogram configures the per-request ones: the largest whose
// bucket factor is at most 1.1. An exposition has at most
// dist.NativeMaxBuckets buckets.
const nativeSchema = 3

// nativeBounds are schema 3's bucket bounds within a power of two, as
// fractions of it (client_golang's nativeHistogramBounds[3], which is not
// exported: eventhist_test.go checks these against math.Exp2 and an
// exposition against client_golang's own histogram).
var nativeBounds = [1 << nativeSchema]float64{
	0.5, 0.5452538663326288, 0.5946035575013605, 0.6484197773255048,
	0.7071067811865475, 0.7711054127039704, 0.8408964152537144, 0.9170040432046711,
}

// nativeKey returns the schema-3 native bucket of v > 0, as client_golang's
// histogramCounts.observe keys it: bucket k holds (2^((k-1)/8), 2^(k/8)].
func nativeKey(v float64) int {
	frac, exp := math.Frexp(v)
	return sort.SearchFloat64s(nativeBounds[:], frac) + (exp-1)*len(nativeBounds)
}

// The keys a time.Duration in seconds can have: from one nanosecond to
// the longest duration.
var (
	minNativeKey = nativeKey(time.Nanosecond.Seconds())
	maxNativeKey = nativeKey(time.Duration(math.MaxInt64).Seconds())
)

// eventHistogram counts a per-event metric's Prometheus histogram: the
// classic and native buckets, count and sum that prometheus.NewHistogram
// with dist.PromHistogram's options would expose, kept in plain arrays.
// prometheus.NewHistogram pays atomic adds for every observation and a
// sync.Map lookup for its native bucket, 3-4% of the proxy's CPU at 16
// streams (BENCHMARKS.md "Session 22"); the per-event metrics are recorded
// under their eventPair's lock anyway, so neither is needed. The native
// counts are kept at schema 3 for every duration, and an exposition lowers
// the schema until at most 160 buckets are populated, where client_golang
// lowers it for good or resets the histogram. Not safe for concurrent use:
// the eventPair's lock guards it.
type eventHistogram struct {
	bounds  []float64 // the classic buckets' upper bounds, ascending
	classic []uint64  // observations per classic bucket, the last above every bound (+Inf)
	count   uint64
	sum     float64
	zero    uint64   // observations of 0: the native zero bucket
	native  []uint64 // observations per native bucket, by key - minNativeKey
}

func newEventHistogram(bounds []float64) eventHistogram {
	return eventHistogram{
		bounds:  bounds,
		classic: make([]uint64, len(bounds)+1),
		native:  make([]uint64, maxNativeKey-minNativeKey+1),
	}
}

// observe counts d. A monotonic clock makes no negative duration; one would
// count as 0.
func (h *eventHistogram) observe(d time.Duration) {
	v := max(d, 0).Seconds()
	h.count++
	h.sum += v
	h.classic[sort.SearchFloat64s(h.bounds, v)]++
	if v == 0 {
		h.zero++
		return
	}
	h.native[nativeKey(v)-minNativeKey]++
}

// clone returns a copy of h, for an exposition made outside the lock.
func (h *eventHistogram) clone() eventHistogram {
	c := *h
	c.classic = slices.Clone(h.classic)
	c.native = slices.Clone(h.native)
	return c
}

// metric returns h as the Prometheus metric desc describes, created being
// when its counting began.
func (h *eventHistogram) metric(desc *prometheus.Desc, created time.Time) (prometheus.Metric, error) {
	schema, buckets := h.nativeBuckets()
	native, err := prometheus.NewConstNativeHistogram(desc, h.count, h.sum, buckets, nil, h.zero,
		schema, prometheus.DefNativeHistogramZeroThreshold, created)
	if err != nil {
		return nil, err
	}
	return &eventMetric{Metric: native, h: h}, nil
}

// nativeBuckets returns the populated native buckets at the highest schema
// at which there are at most dist.NativeMaxBuckets of them.
func (h *eventHistogram) nativeBuckets() (int32, map[int]int64) {
	buckets := make(map[int]int64)
	for i, n := range h.native {
		if n > 0 {
			buckets[minNativeKey+i] = int64(n)
		}
	}
	schema := int32(nativeSchema)
	for len(buckets) > dist.NativeMaxBuckets && schema > -4 {
		// Bucket k of a schema is half of bucket ceil(k/2) of the next
		// lower one (client_golang's doubleBucketWidth).
		wider := make(map[int]int64, len(buckets)/2+1)
		for k, n := range buckets {
			if k > 0 {
				k++
			}
			wider[k/2] += n
		}
		buckets, schema = wider, schema-1
	}
	return schema, buckets
}

// eventMetric is an eventHistogram's exposition: client_golang's constant
// native histogram, with the classic buckets it lacks.
type eventMetric struct {
	prometheus.Metric
	h *eventHistogram
}

func (m *eventMetric) Write(out *dto.Metric) error {
	if err := m.Metric.Write(out); err != nil {
		return err
	}
	var cum uint64
	buckets := make([]*dto.Bucket, len(m.h.bounds))
	for i, bound := range m.h.bounds {
		cum += m.h.classic[i]
		buckets[i] = &dto.Bucket{CumulativeCount: new(cum), UpperBound: new(bound)}
	}
	out.Histogram.Bucket = buckets
	return nil
}
