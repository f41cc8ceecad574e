// Package dist holds the values that histo's snapshot sections and the
// self-check probe (histo/selfcheck) share: Float, a number that may be
// unknown and is then JSON null; Dist, a distribution that carries its HDR
// histogram so that windows merge exactly, with Rec to record one and Merge
// to combine them; MergeSections, the one opening of every section merge;
// and PromHistogram, the options of every Prometheus histogram. It imports
// nothing of the project. Nothing in it is safe for concurrent use unless
// said so; the package-level values are read-only.
package dist

import (
	"cmp"
	"math"
	"strconv"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/prometheus/client_golang/prometheus"
)

// Float is a float64 that may be unknown (NaN); it marshals to JSON as a
// number or null, since JSON has no NaN.
type Float float64

// NaN is the unknown Float.
var NaN = Float(math.NaN())

// Known reports whether f is a number.
func (f Float) Known() bool { return !math.IsNaN(float64(f)) }

// MarshalJSON writes the number or null.
func (f Float) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(f), 'f', -1, 64), nil
}

// UnmarshalJSON reads a number or null (NaN).
func (f *Float) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Float(math.NaN())
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	*f = Float(v)
	return err
}

// Max is the larger of a and b, ignoring an unknown one; NaN when neither
// is known. It merges a peak across sections.
func Max(a, b Float) Float {
	if !a.Known() || b > a {
		return b
	}
	return a
}

// Min is the smaller of a and b, ignoring an unknown one; NaN when neither
// is known.
func Min(a, b Float) Float {
	if !a.Known() || b < a {
		return b
	}
	return a
}

// AddCounts adds each count of src to dst's: the merge of a section's
// counts by key.
func AddCounts[K comparable](dst, src map[K]int64) {
	for k, n := range src {
		dst[k] += n
	}
}

// Millis is d in milliseconds.
func Millis(d time.Duration) Float { return Float(float64(d) / float64(time.Millisecond)) }

// NativeMaxBuckets bounds a native histogram's buckets: without a bound
// their number is unbounded. PromHistogram's histograms and histo's
// per-event ones both keep it.
const NativeMaxBuckets = 160

// PromHistogram returns the options of a native+classic Prometheus
// histogram. MaxBucketNumber and MinResetDuration bound the native
// buckets.
func PromHistogram(name, help string, buckets []float64) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{
		Name:                            name,
		Help:                            help,
		Buckets:                         buckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  NativeMaxBuckets,
		NativeHistogramMinResetDuration: time.Hour,
	}
}

// MergeSections is the one opening of every section merge: absent (nil)
// sections are left out; none merge to nil, so that a section no input
// has stays null; one merges to itself; more are combined by combine,
// which gets two or more.
func MergeSections[S any](sections []*S, combine func(in []*S) *S) *S {
	in := Present(sections)
	switch len(in) {
	case 0:
		return nil
	case 1:
		return in[0]
	}
	return combine(in)
}

// Present returns the non-nil sections.
func Present[T any](sections []*T) []*T {
	var in []*T
	for _, s := range sections {
		if s != nil {
			in = append(in, s)
		}
	}
	return in
}

// NewRec returns a Rec with its histogram allocated, for a caller that
// must not allocate it later (under a lock).
func NewRec(s Shape) Rec { return Rec{h: s.New()} }

// Empty reports whether d has no values.
func (d *Rec) Empty() bool { return d.h == nil || d.h.TotalCount() == 0 }

// Count is the number of values recorded.
func (d *Rec) Count() int64 {
	if d.h == nil {
		return 0
	}
	return d.h.TotalCount()
}

// Dist is a distribution in a snapshot section: its count, percentiles and
// maximum, and its HDR histogram (the V2 compressed encoding, base64), so
// that the sections of several windows or replicas merge exactly. The
// section field says the unit (a "_ms" key: milliseconds; a share: a ratio
// from 0 to 1). Percentiles are null without samples.
type Dist struct {
	Count   int64  `json:"count"`
	P50     Float  `json:"p50"`
	P90     Float  `json:"p90"`
	P95     Float  `json:"p95"`
	P99     Float  `json:"p99"`
	Max     Float  `json:"max"`
	Clamped int64  `json:"clamped"` // values recorded at the end of the range because they fell outside it
	HDR     string `json:"hdr"`
}

// Shape is the range, precision and unit of a Dist's histogram: it
// holds integers, per of them to one reported unit.
type Shape struct {
	max int64
	sig int
	per float64
}

var (
	// Ms records microseconds up to an hour and reports milliseconds.
	// Two significant digits bound the error to 0.8% at 25 KB per dense
	// histogram, an eighth of the per-metric ones (hdr.go): sections hold
	// many of them (one pair per concurrency level).
	Ms = Shape{max: int64(time.Hour / time.Microsecond), sig: 2, per: 1000}
	// Share records ratios rounded to thousandths, each thousandth in
	// a bucket of its own.
	Share = Shape{max: 1000, sig: 3, per: 1000}
)

// Rec records one Dist's values. The zero value is empty and
// allocates its histogram on the first value. It is not safe for
// concurrent use.
type Rec struct {
	h       *hdrhistogram.Histogram
	clamped int64
}

func (s Shape) New() *hdrhistogram.Histogram { return hdrhistogram.New(1, s.max, s.sig) }

// Record adds v, in the reported unit, clamped to the range.
func (d *Rec) Record(s Shape, v float64) {
	if d.h == nil {
		d.h = s.New()
	}
	x := int64(math.Round(v * s.per))
	if x < 0 || x > s.max {
		x = min(max(x, 0), s.max)
		d.clamped++
	}
	_ = d.h.RecordValue(x) // in range
}

// Clone copies d (for histo.Recorder.Current).
func (d *Rec) Clone() Rec {
	c := *d
	if d.h != nil {
		c.h = d.h.Clone()
	}
	return c
}

// Dist summarizes and encodes d.
func (d *Rec) Dist(s Shape) Dist {
	return s.summarize(d.h, d.clamped)
}

func (s Shape) summarize(h *hdrhistogram.Histogram, clamped int64) Dist {
	out := Dist{P50: NaN, P90: NaN, P95: NaN, P99: NaN, Max: NaN, Clamped: clamped}
	if h == nil || h.TotalCount() == 0 {
		return out
	}
	out.Count = h.TotalCount()
	at := func(q float64) Float { return Float(float64(h.ValueAtQuantile(q)) / s.per) }
	out.P50, out.P90, out.P95, out.P99 = at(50), at(90), at(95), at(99)
	out.Max = Float(float64(h.Max()) / s.per)
	out.HDR = Encode(h)
	return out
}

// Merge combines ds exactly from their histograms. A Dist with
// samples but no readable histogram (a file edited by hand) counts, but
// makes the merged percentiles unknown rather than wrong.
func Merge(s Shape, ds ...Dist) Dist {
	h := s.New()
	var count, clamped int64
	whole := true
	for _, d := range ds {
		count += d.Count
		clamped += d.Clamped
		if d.Count == 0 {
			continue
		}
		in, err := hdrhistogram.Decode([]byte(d.HDR))
		if err != nil || in.TotalCount() != d.Count {
			whole = false
			continue
		}
		h.Merge(in)
	}
	if !whole {
		return Dist{Count: count, Clamped: clamped, P50: NaN, P90: NaN, P95: NaN, P99: NaN, Max: NaN}
	}
	return s.summarize(h, clamped)
}

// Rank is the 1-based nearest rank of percentile p (0 to 100) among n
// sorted values, ceil(p/100·n) and at least 1, in integers: 0.95·20 is
// 19.000000000000004 in floating point and would round up to the wrong
// rank. It is the one nearest-rank rule of the v1 schema
// (timing_methodology.distributions) in the code base.
func Rank(p, n int64) int64 { return max(1, (p*n+99)/100) }

// NearestRank is the nearest-rank p-th percentile of sorted, which must
// not be empty.
func NearestRank[T cmp.Ordered](sorted []T, p int64) T {
	return sorted[Rank(p, int64(len(sorted)))-1]
}
