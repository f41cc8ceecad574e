package histo

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkRefit: one refit of a full window (Record pays it once every
// refitFull samples once the window is full, every refitEvery before).
func BenchmarkRefit(b *testing.B) {
	truth := costFit{t0: 0.02, a: 0.25e-3, b: 2e-7}
	rng := rand.New(rand.NewPCG(1, 2))
	var m rateModel
	for i := range modelSamples {
		n := 300 + 1700*rng.Float64()
		c := 4000 * rng.Float64()
		x := rateSample{n: n, pos: c + n/2, t: truth.cost(n, c) * (0.9 + 0.2*rng.Float64())}
		if i%3 == 0 {
			x.t *= 1.5
		}
		m.addLocked(x)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.refitLocked()
	}
}
