package histo

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/histo/selfcheck"
)

func TestRotate(t *testing.T) {
	r, _, clk := newTest(t, Config{})
	tr := chat()
	r.Record(&tr)
	r.Record(&tr)
	r.ObserveGap(4 * time.Millisecond)
	r.ObserveRelay(20 * time.Microsecond)

	clk.t = t0.Add(time.Minute)
	w := r.Rotate()
	require.Equal(t, t0, w.Start)
	require.Equal(t, t0.Add(time.Minute), w.End)
	require.Equal(t, 2, w.Requests.Len())
	require.Equal(t, []int{0, 1}, []int{w.Requests.At(0).Index, w.Requests.At(1).Index})
	require.Equal(t, int64(2), w.Hist[MetricTTFT].TotalCount())
	require.Equal(t, int64(1), w.Hist[MetricInterEvent].TotalCount())
	require.Equal(t, int64(1), w.Hist[MetricOverhead].TotalCount())
	require.Equal(t, int64(2), w.QueueSources[SourceOccupancy])
	require.Equal(t, int64(2), w.Goodput.Requests)

	// The next window starts empty where the last one ended.
	tr.ID = 8
	r.Record(&tr)
	clk.t = t0.Add(2 * time.Minute)
	cur := r.Current()
	require.Equal(t, t0.Add(time.Minute), cur.Start)
	require.Equal(t, 1, cur.Requests.Len())
	require.Equal(t, uint64(8), cur.Requests.At(0).ID)
	require.Equal(t, 0, cur.Requests.At(0).Index)
	require.Equal(t, int64(1), cur.Hist[MetricTTFT].TotalCount())
	require.Zero(t, cur.Hist[MetricInterEvent].TotalCount())

	// Current is a copy: recording more does not change it.
	r.Record(&tr)
	require.Equal(t, 1, cur.Requests.Len())
	require.Equal(t, int64(1), cur.Hist[MetricTTFT].TotalCount())

	// A finished window is the caller's: later traffic does not reach it.
	require.Equal(t, int64(2), w.Hist[MetricTTFT].TotalCount())

	// The cumulative histograms hold the finished windows and the one in
	// progress: a per-event one too, whose window is added to its total only
	// at Rotate. A clamped value counts in both.
	r.ObserveGap(2 * time.Hour)
	cum := r.cumulative()
	require.Equal(t, t0, cum.Start)
	require.Zero(t, cum.Requests.Len())
	require.Equal(t, int64(4), cum.Hist[MetricTTFT].TotalCount())
	require.Equal(t, int64(2), cum.Hist[MetricInterEvent].TotalCount())
	require.Equal(t, int64(1), cum.Clamped[MetricInterEvent])
	r.Rotate()
	cum = r.cumulative()
	require.Equal(t, int64(2), cum.Hist[MetricInterEvent].TotalCount())
	require.Equal(t, int64(1), cum.Clamped[MetricInterEvent])
	require.Equal(t, int64(1), cum.Hist[MetricOverhead].TotalCount())
	require.Equal(t, int64(4), cum.Goodput.Requests)
}

func TestWindowRecordCap(t *testing.T) {
	r, reg, _ := newTest(t, Config{MaxWindowRequests: chunkSize + 3})
	tr := chat()
	for range chunkSize + 10 {
		r.Record(&tr)
	}
	w := r.Rotate()
	require.Equal(t, chunkSize+3, w.Requests.Len())
	require.Equal(t, int64(7), w.Dropped)
	require.Equal(t, int64(chunkSize+10), w.Hist[MetricE2E].TotalCount(), "dropped records still count")
	require.Equal(t, int64(chunkSize+10), w.Goodput.Requests)
	require.Equal(t, chunkSize+2, w.Requests.At(chunkSize+2).Index)
	n, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range n {
		if mf.GetName() == "anvilproxy_histo_records_dropped_total" {
			require.Equal(t, 7.0, mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
}

// TestRecordsSharedWhileRecording: the Requests of Current and Rotate are
// views of the window's chunks, not copies, read here while Record appends
// to the same chunks from another goroutine. Under -race this holds the
// sharing to be race-free; everywhere it holds each view to its records as
// they were, whole and in order, across chunk boundaries and after the
// window it came from rotated.
func TestRecordsSharedWhileRecording(t *testing.T) {
	r, _, _ := newTest(t, Config{Now: time.Now})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tr := monotonic(chat())
		for id := uint64(0); ; id++ {
			select {
			case <-stop:
				return
			default:
			}
			tr.ID = id
			r.Record(&tr)
		}
	})
	defer wg.Wait()
	defer close(stop)

	var kept []*Window // Current's views, read again after their window rotated
	for rotations := 0; rotations < 3; {
		cur := r.Current()
		requireRecords(t, cur)
		kept = append(kept, cur)
		if cur.Requests.Len() > 2*chunkSize+chunkSize/2 {
			requireRecords(t, r.Rotate())
			rotations++
		}
	}
	for _, w := range kept {
		requireRecords(t, w)
	}
}

// requireRecords checks that w's records are those of one window, whole
// and in order: positions from 0, IDs consecutive (every record is kept).
func requireRecords(t *testing.T, w *Window) {
	t.Helper()
	i := 0
	for rq := range w.Requests.All() {
		if rq.Index != i || rq.ID != w.Requests.At(0).ID+uint64(i) || rq != w.Requests.At(i) {
			t.Fatalf("record %d: index %d, ID %d after %d at 0", i, rq.Index, rq.ID, w.Requests.At(0).ID)
		}
		i++
	}
	require.Equal(t, w.Requests.Len(), i)
}

func TestWindowEncode(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	tr := chat()
	r.Record(&tr)
	w := r.Rotate()

	// Two windows merge exactly after a round trip.
	h, err := hdrhistogram.Decode([]byte(dist.Encode(w.Hist[MetricTTFT])))
	require.NoError(t, err)
	require.True(t, h.Equals(w.Hist[MetricTTFT]))
	sum := NewHistogram(MetricTTFT)
	require.Zero(t, sum.Merge(h))
	require.Zero(t, sum.Merge(h))
	require.Equal(t, int64(2), sum.TotalCount())
	require.InDelta(t, 1300.0, MetricTTFT.Float(sum.ValueAtQuantile(50)), 1.3)
}

func TestMetricUnits(t *testing.T) {
	require.Equal(t, Microseconds, MetricTTFT.Unit())
	require.Equal(t, MilliTokensPerSecond, MetricDecodeRate.Unit())
	require.Equal(t, Tokens, MetricPromptTokens.Unit())
	require.Equal(t, 1.5, MetricE2E.Float(1500))              // µs → ms
	require.Equal(t, 231.964, MetricDecodeRate.Float(231964)) // mtok/s → tok/s
	require.Equal(t, 62327.0, MetricPromptTokens.Float(62327))
	seen := map[string]bool{}
	for m := range NumMetrics {
		require.NotEqual(t, "unknown", m.String())
		require.False(t, seen[m.String()], m.String())
		seen[m.String()] = true
	}
}

// TestRecorderWindowQuality: every window carries the probe's verdict; a
// Recorder whose probe never ran says so. In a bubble time is virtual and
// the probe's ticks are never late, so the verdict is good at the default
// thresholds (PressureDir has no PSI files) however loaded the host.
func TestRecorderWindowQuality(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _, _ := newTest(t, Config{SelfCheck: selfcheck.Config{Period: time.Millisecond, PressureDir: t.TempDir()}})
		require.Equal(t, selfcheck.VerdictUnknown, r.Current().Quality.Verdict)
		r.SelfCheck().Start()
		t.Cleanup(r.SelfCheck().Stop) // a failure must not leave the bubble blocked
		time.Sleep(5 * time.Millisecond)
		synctest.Wait() // the probe has handled the tick due now
		cur := r.Current().Quality
		require.Equal(t, selfcheck.VerdictGood, cur.Verdict, "%v", cur.Reasons)
		require.Equal(t, int64(5), cur.TimerOvershootMs.Count)
		r.SelfCheck().Stop()
		require.Equal(t, selfcheck.VerdictGood, r.Rotate().Quality.Verdict)
		require.Equal(t, selfcheck.VerdictUnknown, r.Rotate().Quality.Verdict)
		require.Nil(t, r.cumulative().Quality)
	})
}
