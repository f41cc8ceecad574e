package histo

import (
	"math"

	"github.com/HdrHistogram/hdrhistogram-go"
)

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

// distShape is the range, precision and unit of a Dist's histogram: it
// holds integers, per of them to one reported unit.
type distShape struct {
	max int64
	sig int
	per float64
}

var (
	// msShape records microseconds up to an hour and reports milliseconds.
	// Two significant digits bound the error to 0.8% at 25 KB per dense
	// histogram, an eighth of the per-metric ones (hdr.go): sections hold
	// many of them (one pair per concurrency level).
	msShape = distShape{max: unitMax[Microseconds], sig: 2, per: 1000}
	// shareShape records ratios rounded to thousandths, each thousandth in
	// a bucket of its own.
	shareShape = distShape{max: 1000, sig: 3, per: 1000}
)

// distRec records one Dist's values. The zero value is empty and
// allocates its histogram on the first value. It is not safe for
// concurrent use.
type distRec struct {
	h       *hdrhistogram.Histogram
	clamped int64
}

func (s distShape) new() *hdrhistogram.Histogram { return hdrhistogram.New(1, s.max, s.sig) }

// record adds v, in the reported unit, clamped to the range.
func (d *distRec) record(s distShape, v float64) {
	if d.h == nil {
		d.h = s.new()
	}
	x := int64(math.Round(v * s.per))
	if x < 0 || x > s.max {
		x = min(max(x, 0), s.max)
		d.clamped++
	}
	_ = d.h.RecordValue(x) // in range
}

// clone copies d, for Recorder.Current.
func (d *distRec) clone() distRec {
	c := *d
	if d.h != nil {
		c.h = d.h.Clone()
	}
	return c
}

// dist summarizes and encodes d.
func (d *distRec) dist(s distShape) Dist {
	return s.summarize(d.h, d.clamped)
}

func (s distShape) summarize(h *hdrhistogram.Histogram, clamped int64) Dist {
	out := Dist{P50: nan, P90: nan, P95: nan, P99: nan, Max: nan, Clamped: clamped}
	if h == nil || h.TotalCount() == 0 {
		return out
	}
	out.Count = h.TotalCount()
	at := func(q float64) Float { return Float(float64(h.ValueAtQuantile(q)) / s.per) }
	out.P50, out.P90, out.P95, out.P99 = at(50), at(90), at(95), at(99)
	out.Max = Float(float64(h.Max()) / s.per)
	if enc, err := h.Encode(hdrhistogram.V2CompressedEncodingCookieBase); err == nil {
		out.HDR = string(enc)
	}
	return out
}

// mergeDists combines ds exactly from their histograms. A Dist with
// samples but no readable histogram (a file edited by hand) counts, but
// makes the merged percentiles unknown rather than wrong.
func mergeDists(s distShape, ds ...Dist) Dist {
	h := s.new()
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
		return Dist{Count: count, Clamped: clamped, P50: nan, P90: nan, P95: nan, P99: nan, Max: nan}
	}
	return s.summarize(h, clamped)
}
