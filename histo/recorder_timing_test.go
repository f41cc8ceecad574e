package histo

import (
	"testing"
	"time"
)

// BenchmarkRecord is the cost of one finished streaming request into every
// histogram, counter and the window. The target is under 2 µs.
func BenchmarkRecord(b *testing.B) {
	r, _, _ := newTest(b, Config{SLOs: []SLO{{"ttft", 2 * time.Second}, {"tpot", 50 * time.Millisecond}}, Now: time.Now})
	for i := range modelSamples {
		tr := idle(int64(4000+i), 8000)
		r.Record(&tr)
	}
	tr := monotonic(chat())
	tr.InflightAtAdmit = 6 // split by the model, like a loaded engine
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%50_000 == 49_999 {
			b.StopTimer()
			r.Rotate() // bound the window's records, as in production; Rotate has its own benchmark
			b.StartTimer()
		}
		r.Record(&tr)
	}
}

// BenchmarkRecordParallel is Record from every core at once, with a window
// rotation every 20 ms: the contention on the Recorder's lock.
func BenchmarkRecordParallel(b *testing.B) {
	r, _, _ := newTest(b, Config{Now: time.Now})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				r.Rotate()
			}
		}
	}()
	tr := monotonic(chat())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		tr := tr
		for pb.Next() {
			r.Record(&tr)
		}
	})
	b.StopTimer()
	close(stop)
	<-done
}

func BenchmarkObserveGap(b *testing.B) {
	r, _, _ := newTest(b, Config{})
	b.ReportAllocs()
	var d time.Duration
	for b.Loop() {
		d = (d + 7*time.Microsecond) % time.Second
		r.ObserveGap(d)
	}
}

func BenchmarkObserveRelay(b *testing.B) {
	r, _, _ := newTest(b, Config{})
	b.ReportAllocs()
	var d time.Duration
	for b.Loop() {
		d = (d + 130*time.Nanosecond) % time.Millisecond
		r.ObserveRelay(d)
	}
}

func BenchmarkObserveGapParallel(b *testing.B) {
	r, _, _ := newTest(b, Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.ObserveGap(4 * time.Millisecond)
		}
	})
}

// BenchmarkRotate is the cost of ending a window with 1,000 records.
func BenchmarkRotate(b *testing.B) {
	r, _, _ := newTest(b, Config{Now: time.Now})
	tr := chat()
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for range 1000 {
			r.Record(&tr)
		}
		b.StartTimer()
		r.Rotate()
	}
}

// BenchmarkCurrent is the cost of copying the window in progress (for
// /snapshot), most of it under the Recorder's lock.
func BenchmarkCurrent(b *testing.B) {
	r, _, _ := newTest(b, Config{Now: time.Now})
	tr := monotonic(chat())
	for range 1000 {
		r.Record(&tr)
	}
	b.ReportAllocs()
	for b.Loop() {
		r.Current()
	}
}
