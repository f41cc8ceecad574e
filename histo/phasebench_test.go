package histo

import (
	"testing"
	"time"
)

// BenchmarkPhases: a request's phases from its Trace into its Request and
// their HDR values, the part of Record the phase table drives
// (BENCHMARKS.md "Phase table").
func BenchmarkPhases(b *testing.B) {
	tr := chat()
	sp := split{Queue: time.Millisecond, Prefill: 2 * time.Millisecond, Source: SourceModel, OK: true}
	var rq Request
	var sum int64
	b.ReportAllocs()
	for b.Loop() {
		v := evalPhases(&tr, &sp)
		newRequest(&rq, &tr, sp, &v)
		for m, raw := range v {
			if h, ok := Metric(m).hdrValue(raw); ok {
				sum += h
			}
		}
	}
	_ = sum
}
