package histo

import (
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// BenchmarkRecord is the cost of one finished streaming request into every
// histogram, counter, the window and the engine timeline. The target is
// under 2 µs. The requests arrive 300 ms apart and last 2.3 s, so about
// eight overlap, as on an engine with a few slots under load.
func BenchmarkRecord(b *testing.B) {
	benchmarkRecord(b, 300*time.Millisecond)
}

// BenchmarkRecordSameStamps records one trace over and over: every
// request overlaps every other, so each Record scans the whole timeline
// (occRing requests), the worst case of the occupancy split.
func BenchmarkRecordSameStamps(b *testing.B) {
	benchmarkRecord(b, 0)
}

func benchmarkRecord(b *testing.B, apart time.Duration) {
	r, _, _ := newTest(b, Config{SLOs: []SLO{{"ttft", 2 * time.Second}, {"tpot", 50 * time.Millisecond}}, Now: time.Now})
	for i := range modelSamples {
		tr := monotonic(idle(int64(4000+i), 8000)) // the proxy's stamps carry monotonic readings
		r.Record(&tr)
	}
	base := monotonic(chat())
	base.InflightAtAdmit = 6
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%50_000 == 49_999 {
			b.StopTimer()
			r.Rotate() // bound the window's records, as in production; Rotate has its own benchmark
			b.StartTimer()
		}
		tr := shifted(&base, time.Duration(i)*apart)
		r.Record(&tr)
	}
}

// shifted is tr with every stamp moved by d.
func shifted(tr *proxy.Trace, d time.Duration) proxy.Trace {
	out := *tr
	for _, p := range []*time.Time{&out.Recv, &out.Admit, &out.Sent, &out.Headers, &out.FirstEvent,
		&out.FirstOutput, &out.FirstContent, &out.LastToken, &out.End, &out.ClientDone} {
		if !p.IsZero() {
			*p = p.Add(d)
		}
	}
	return out
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

// BenchmarkRotateLoaded is the cost of ending a window as a loaded proxy
// does: 6,400 records spread over every concurrency level the knee keeps
// apart, so each window section carries its full set of distributions
// (each one HDR-encoded for the snapshot).
func BenchmarkRotateLoaded(b *testing.B) {
	r, _, _ := newTest(b, Config{Now: time.Now})
	trs := make([]proxy.Trace, maxLevel+1)
	for i := range trs {
		trs[i] = chat()
		trs[i].InflightAtAdmit = i
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for i := range 6400 {
			r.Record(&trs[i%len(trs)])
		}
		b.StartTimer()
		r.Rotate()
	}
}
