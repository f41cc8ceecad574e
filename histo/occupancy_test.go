package histo

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// served is a request on a synthetic engine timeline: sent at arrive ms,
// first output at first, the stream's end (the slot let go) at last, its
// last token 0.2 ms before, 2,000 prompt tokens; inflight is the proxy's
// in-flight count at its admission.
func served(arrive, first, last float64, inflight int) proxy.Trace {
	tr := chat()
	tr.Recv, tr.Admit, tr.Sent = at(arrive), at(arrive), at(arrive)
	tr.Connect = 0
	tr.Headers, tr.FirstEvent, tr.FirstOutput, tr.FirstContent = at(first), at(first), at(first), at(first)
	tr.LastToken, tr.End, tr.ClientDone = at(last-0.2), at(last), at(last+0.1)
	tr.ReasoningEvents = 0
	tr.PromptTokens, tr.CachedTokens = 2000, -1
	tr.InflightAtAdmit = inflight
	return tr
}

func TestOccupancyOneSlot(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	// Three requests at once on one slot: each waits for the one before.
	a := served(0, 100, 300, 0)
	b := served(1, 400, 600, 1) // slot free at 300: 299 ms queued, 100 ms prefill
	c := served(2, 610, 800, 2) // slot free at 600: 598 ms queued, a 10 ms cache hit
	for _, tr := range []*proxy.Trace{&a, &b, &c} {
		r.Record(tr)
	}
	got := r.Recent(3) // newest first
	require.Equal(t, Span(0), got[2].Queue)
	require.Equal(t, SourceOccupancy, got[1].QueueSource)
	require.Equal(t, Span(ms2d(299)), got[1].Queue)
	require.Equal(t, Span(ms2d(100)), got[1].Prefill)
	require.Equal(t, Span(ms2d(598)), got[0].Queue)
	require.Equal(t, Span(ms2d(10)), got[0].Prefill)
	s := r.Slots()
	require.Equal(t, 1, s.Effective)
	require.Equal(t, Count(1), s.Learned)
	require.Equal(t, SlotsLearned, s.State)
}

// TestOccupancyStreamsAtOnce: a request that ran beside two others proves
// three slots, and the request after them is placed by the first end.
func TestOccupancyStreamsAtOnce(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	a := served(0, 100, 300, 0)
	b := served(1, 110, 320, 1)
	c := served(2, 120, 340, 2)
	d := served(3, 400, 500, 3) // three ahead; the first let its slot go at 300
	for _, tr := range []*proxy.Trace{&a, &b, &c, &d} {
		r.Record(tr)
	}
	got := r.Recent(4)
	for _, rq := range got[1:] {
		require.Equal(t, Span(0), rq.Queue, "ran at once")
	}
	require.Equal(t, Span(ms2d(297)), got[0].Queue, "the first end freed its slot")
	require.Equal(t, 3, r.Slots().Effective)
}

// TestOccupancyUnrecordedAhead: a request still running when a later one
// is recorded is ahead of it all the same (the proxy's in-flight count);
// it cannot have freed the later one's slot.
func TestOccupancyUnrecordedAhead(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	a := served(0, 50, 100, 0) // ends early
	// A second request, sent at 1 ms, is still decoding: not recorded yet.
	x := served(2, 210, 400, 2) // two ahead: one slot freed at 100 → 98 ms queued on 2 slots
	r.Record(&a)
	r.Record(&x)
	rq := r.Recent(1)[0]
	require.Equal(t, Span(ms2d(98)), rq.Queue)
	require.Equal(t, 1, r.Slots().Effective, "a request not recorded yet is no proof of a second slot")
}

// TestOccupancyLongGeneration: thousands of requests that finished while
// one long generation ran do not push the requests ahead of it off the
// timeline.
func TestOccupancyLongGeneration(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	a := served(0, 100, 300, 0)
	r.Record(&a)
	long := served(1, 400, 600_000, 1) // waited for a; then ten minutes of output
	for i := range 3000 {              // answered 503 at once: they never ran beside it
		x := served(float64(2000+i*100), float64(2010+i*100), float64(2050+i*100), 1)
		x.Status, x.FirstOutput, x.FirstContent, x.LastToken = 503, time.Time{}, time.Time{}, time.Time{}
		r.Record(&x)
	}
	r.Record(&long)
	rq := r.Recent(1)[0]
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.Equal(t, Span(ms2d(299)), rq.Queue)
}

// TestOccupancyOtherRoutes: a /v1/models request in flight when a
// request was admitted is in the proxy's in-flight count, but held no
// slot: it is not a request ahead.
func TestOccupancyOtherRoutes(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	models := served(0, 0, 0, 0)
	models.Route, models.FirstOutput, models.LastToken, models.ClientDone = proxy.RouteModels, at(0), at(0), at(50)
	a := served(1, 100, 300, 1) // the models request was in flight
	r.Record(&models)
	r.Record(&a)
	rq := r.Recent(1)[0]
	require.Equal(t, Span(0), rq.Queue)
	require.Equal(t, Count(-1), r.Slots().Learned, "a found nothing ahead: no evidence")
}

// TestOccupancyHintTooLarge: --engine-slots 4 on a one-slot engine. The
// requests whose first output came right after another's end set the hint
// aside, with one warning line.
func TestOccupancyHintTooLarge(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	r, _, _ := newTest(t, Config{EngineSlots: 4, Log: zap.New(core)})
	trs := []proxy.Trace{
		served(0, 100, 300, 0),
		served(1, 310, 500, 1),
		served(2, 510, 700, 2),
		served(3, 710, 900, 3),
	}
	for i := range trs {
		r.Record(&trs[i])
	}
	got := r.Recent(4)
	for i, want := range []float64{697, 498, 299, 0} {
		require.Equal(t, Span(ms2d(want)), got[i].Queue, "request %d", 3-i)
	}
	s := r.Slots()
	require.Equal(t, SlotsHintHigh, s.State)
	require.Equal(t, 1, s.Effective)
	require.Equal(t, Count(4), s.Hint)
	require.Equal(t, 1, logs.Len(), "one warning")
	entry := logs.All()[0]
	require.Contains(t, entry.Message, "--engine-slots")
	require.Equal(t, int64(4), entry.ContextMap()["engine_slots"])
}

// TestOccupancyHintTooSmall: --engine-slots 1 on an engine that ran three
// streams at once.
func TestOccupancyHintTooSmall(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	r, _, _ := newTest(t, Config{EngineSlots: 1, Log: zap.New(core)})
	trs := []proxy.Trace{served(0, 100, 300, 0), served(1, 110, 320, 1), served(2, 120, 340, 2)}
	for i := range trs {
		r.Record(&trs[i])
	}
	for _, rq := range r.Recent(3) {
		require.Equal(t, Span(0), rq.Queue)
	}
	s := r.Slots()
	require.Equal(t, SlotsHintLow, s.State)
	require.Equal(t, 3, s.Effective)
	require.Equal(t, 1, logs.Len())
}

// TestOccupancyHintKept: a right hint is not set aside by a request that
// merely had another's end fall within its prefill; without the hint that
// request is ambiguous, and the split takes the conservative reading.
func TestOccupancyHintKept(t *testing.T) {
	run := func(hint int) (Span, SlotsSection) {
		r, _, _ := newTest(t, Config{EngineSlots: hint})
		a := served(0, 100, 150, 0)  // a cold 2,000-token prompt: 100 ms of prefill
		b := served(10, 160, 300, 1) // the same size: 150 ms from arrival is prefill, a's end at 150 within it
		r.Record(&a)
		r.Record(&b)
		return r.Recent(1)[0].Queue, r.Slots()
	}
	q, s := run(2)
	require.Equal(t, Span(0), q)
	require.Equal(t, SlotsHint, s.State)
	require.Equal(t, 2, s.Effective)

	q, s = run(0)
	require.Equal(t, Span(ms2d(140)), q, "no evidence of a second slot: it waited for a's end")
	require.Equal(t, 1, s.Effective)
}

// TestOccupancyFreedAtStreamEnd: ollama lets a slot go with the stream's
// final chunk, one decode step after the last content token (155–240 ms
// under host load); the next request waited until then, not until the
// last token.
func TestOccupancyFreedAtStreamEnd(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	a := served(0, 100, 500, 0)
	a.LastToken = at(300) // the final chunk came 200 ms after the last token
	b := served(1, 600, 800, 1)
	r.Record(&a)
	r.Record(&b)
	rq := r.Recent(1)[0]
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.Equal(t, Span(ms2d(499)), rq.Queue, "a's slot was free at its stream's end")
	require.Equal(t, Span(ms2d(100)), rq.Prefill)
}

// TestOccupancyRightHintKeptOnTwoSlots: llama.cpp -np 2 with
// --engine-slots 2, a burst of four: c and d each take the slot the first
// end frees, and the other request ahead of them ends during their
// prefill. That end is not the one they waited for: judged from the start
// two slots predict, their prefill is ordinary, and the right hint is
// never reported too large (it was, as hint_too_large, before).
func TestOccupancyRightHintKeptOnTwoSlots(t *testing.T) {
	for _, hint := range []int{2, 0} {
		r, _, _ := newTest(t, Config{EngineSlots: hint})
		trs := []proxy.Trace{
			served(0, 100, 400, 0),   // slot 1
			served(1, 110, 540, 1),   // slot 2
			served(2, 560, 900, 2),   // slot 1 at 400; b ends at 540, during its prefill
			served(3, 700, 1000, 3),  // slot 2 at 540
			served(4, 1060, 1200, 4), // slot 1 at 900; d ends at 1000, during its prefill
			served(5, 1160, 1300, 5), // slot 2 at 1000
		}
		for i := range trs {
			r.Record(&trs[i])
		}
		got := r.Recent(len(trs))
		for i, want := range []float64{0, 0, 398, 537, 896, 995} {
			require.Equal(t, Span(ms2d(want)), got[len(trs)-1-i].Queue, "hint %d, request %d", hint, i)
		}
		s := r.Slots()
		require.Equal(t, 2, s.Effective, "hint %d", hint)
		if hint != 0 {
			require.Equal(t, SlotsHint, s.State)
		}
	}
}

// TestOccupancyAbandonedPrefill: a client leaves during its prefill; the
// engine goes on prefilling the whole prompt before it frees the slot. The
// next request's wait until then is queue, not prefill: the slot is held
// for the cold prefill the cost model predicts for the abandoned prompt.
func TestOccupancyAbandonedPrefill(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	// Eight cold prompts teach the model 20,000 tokens/s: 2,000 tokens in
	// 100 ms.
	for i := range 8 {
		tr := served(float64(i*1000), float64(i*1000+100), float64(i*1000+200), 0)
		r.Record(&tr)
	}
	_, _, ok := r.PrefillRate()
	require.True(t, ok)
	gone := leftInPrefill(10000, 10050, 8000) // 400 ms of prefill; the client left at 50 ms
	gone.End, gone.Status = at(10050), 0
	next := served(10010, 10500, 10700, 1) // its slot came at 10,400: 390 ms of queue, 100 ms of prefill
	r.Record(&gone)
	r.Record(&next)
	rq := r.Recent(1)[0]
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.InDelta(t, 390, rq.Queue.Millis(), 5, "the engine prefilled the abandoned prompt")
	require.InDelta(t, 100, rq.Prefill.Millis(), 5)

	// Without usage the abandoned prompt is sized from its body.
	r2, _, _ := newTest(t, Config{})
	for i := range 8 {
		tr := served(float64(i*1000), float64(i*1000+100), float64(i*1000+200), 0)
		tr.ReqBytes = 8000 // 2,000 tokens: 0.25 per byte
		r2.Record(&tr)
	}
	gone.PromptTokens, gone.ReqBytes = -1, 32000
	r2.Record(&gone)
	r2.Record(&next)
	require.InDelta(t, 390, r2.Recent(1)[0].Queue.Millis(), 5)
}

// TestOccupancyAbandonedPrefillMisjudged: the held slot is the cost
// model's estimate of the abandoned prefill (400 ms here), and the engine
// may take longer or shorter (ollama's 2,000-token abandoned prefill ran
// past the estimate, or ended before the next request's first output,
// depending on the host's load: queue 0 in one run). The next request's
// own prefill, whose new tokens are known, tells when it began.
func TestOccupancyAbandonedPrefillMisjudged(t *testing.T) {
	for _, tc := range []struct {
		name              string
		slot, first, want float64 // the engine let the abandoned slot go at slot; want: the queue
	}{
		{"the engine took longer", 10700, 10800, 690},
		{"the engine took less, before the next request's first output", 10200, 10300, 190},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _, _ := newTest(t, Config{})
			trainSolo(r)                              // 20,000 tokens/s
			gone := leftInPrefill(10000, 10050, 8000) // 400 ms by the model; the client left at 50 ms
			gone.End, gone.Status = at(10050), 0
			next := served(10010, tc.first, tc.first+200, 1) // 2,000 new tokens: 100 ms of prefill
			next.CachedTokens = 0
			r.Record(&gone)
			r.Record(&next)
			rq := r.Recent(1)[0]
			require.Equal(t, SourceOccupancy, rq.QueueSource)
			require.InDelta(t, tc.want, rq.Queue.Millis(), max(25, tc.want/10), "within max(25 ms, 10%%)")
		})
	}
}

// TestOccupancyAbandonedPrefillOutranEstimate: the cost model's estimate
// of the abandoned prefill (400 ms) ended before its client left (600 ms),
// the engine prefilling on to 2,000 ms, as ollama did under load in the
// real-engine suite (estimated 362 ms, left at 600, prefilled 2,249: the
// leaving, taken for the end, gave the next request 1.3 ms of queue for a
// true 1,659). The engine was still prefilling when the client left, so
// the next request's own prefill tells when the slot came free, whether it
// was admitted just before the leaving was stamped or just after; when the
// engine had finished at the leaving, it tells that too.
func TestOccupancyAbandonedPrefillOutranEstimate(t *testing.T) {
	for _, tc := range []struct {
		name                string
		arrive, first, want float64 // the next request; want: its queue
	}{
		{"admitted before the leaving was stamped", 10599, 12100, 1401},
		{"admitted after it", 10601, 12100, 1399},
		{"the engine had finished at the leaving", 10601, 10701, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _, _ := newTest(t, Config{})
			trainSolo(r)                              // 20,000 tokens/s
			gone := leftInPrefill(10000, 10600, 8000) // 400 ms by the model; the client left at 600 ms
			inflight := 0
			if tc.arrive < 10600 {
				inflight = 1
			}
			next := served(tc.arrive, tc.first, tc.first+200, inflight) // 2,000 new tokens: 100 ms of prefill
			next.CachedTokens = 0
			r.Record(&gone)
			r.Record(&next)
			rq := r.Recent(1)[0]
			require.Equal(t, SourceOccupancy, rq.QueueSource)
			require.InDelta(t, tc.want, rq.Queue.Millis(), max(25, tc.want/10), "within max(25 ms, 10%%)")
		})
	}
}

func TestSlotLearnerWindow(t *testing.T) {
	l := newSlotLearner(0)
	require.Equal(t, 1, l.effective(), "nothing learned: 1")
	l.observe(5, 5, false, false)
	require.Equal(t, 5, l.effective())
	for range slotWindow {
		l.observe(2, 2, false, false)
	}
	require.Equal(t, 2, l.effective(), "the old evidence slid out")
	require.Equal(t, SlotsLearned, l.section().State)
	require.Equal(t, Count(-1), l.section().Hint)
}

// TestSlotLearnerKVBound: issue 23, "a correct hint is never reported as
// wrong". Behind vLLM with --engine-slots 4 (its max_num_seqs) and a KV
// cache that holds two requests, requests wait for an end with two in the
// engine. While the engine's /metrics said its KV cache held requests
// back (kvHeld), those waits are the cache's: counted as kv_bound, never
// against the hint. The same waits without that evidence (no /metrics,
// or a cache with room: a wrong hint of 4 on a 2-slot engine) set the
// hint aside after hintRefuted, as before.
func TestSlotLearnerKVBound(t *testing.T) {
	l := newSlotLearner(4)
	for range 50 {
		require.False(t, l.observe(2, 2, true, true))
	}
	s := l.section()
	require.Equal(t, SlotsHint, s.State, "waits the KV cache explains do not refute the hint")
	require.Equal(t, 4, s.Effective)
	require.Equal(t, Count(2), s.Learned)
	require.Equal(t, int64(50), s.Waited)
	require.Equal(t, int64(50), s.KVBound)

	require.False(t, l.observe(2, 2, false, true), "kvBound without a wait is nothing")
	require.Equal(t, int64(50), l.section().KVBound)
	require.False(t, l.observe(2, 2, true, false), "one wait without KV evidence: not yet")
	require.True(t, l.observe(2, 2, true, false), "the second sets the hint aside")
	s = l.section()
	require.Equal(t, SlotsHintHigh, s.State)
	require.Equal(t, 2, s.Effective)

	for range slotWindow { // the evidence slides out of the window
		l.observe(4, 4, false, false)
	}
	s = l.section()
	require.Equal(t, SlotsHint, s.State)
	require.Zero(t, s.KVBound)
	require.Zero(t, s.Waited)
}

// TestRecordAllocs: Record, with the timeline, stays free of allocations
// once the labeled observers exist.
func TestRecordAllocs(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	tr := monotonic(chat())
	for range chunkSize + 1 {
		r.Record(&tr) // the first chunk of the window is allocated here
	}
	require.Zero(t, testing.AllocsPerRun(500, func() { r.Record(&tr) }))
	// Nor does Record make a caller's Trace escape: a func-valued phase
	// definition would (the arguments of an indirect call escape), and a
	// caller that keeps its Trace on the stack would pay for it.
	require.Zero(t, testing.AllocsPerRun(500, func() {
		local := tr
		r.Record(&local)
	}))
}

// TestOccupancyBeforeFirstRecorded: a request received before the first
// one recorded (it ran longer) is placed like any other.
func TestOccupancyBeforeFirstRecorded(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	early := served(0, 20, 5000, 0) // first output before short was even received
	short := served(50, 100, 200, 1)
	r.Record(&short)
	r.Record(&early)
	rq := r.Recent(1)[0]
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.Equal(t, Span(0), rq.Queue)
	require.Equal(t, 2, r.Slots().Effective, "they ran side by side")
}

// TestFirstOutputAllocs: the live first-output hook runs on the relay
// path: no allocations, its prefill's estimates included (liveEstimate:
// the prompt sized from its body while its usage is not known).
func TestFirstOutputAllocs(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	trainSolo(r)
	tr := monotonic(served(100000, 100100, 100300, 0))
	tr.PromptTokens, tr.ReqBytes, tr.Prefix.Tracked = -1, 8000, true
	pt, _ := r.liveEstimate(&tr)
	require.Positive(t, pt, "an estimate from the body's size")
	require.Zero(t, testing.AllocsPerRun(500, func() { tr.ID++; r.FirstOutput(&tr) }))
}

// TestBatchLockSharedBatches: on ollama's llamarunner (one thread, P=4)
// requests that arrive during another's prefill wait for it under the
// runner's lock, then take their slots together and share their batches:
// each one's prefill from there is about the sum of theirs, longer than
// its own estimate. The one that held the lock has the longest answer, so
// the others are recorded first and see its prefill only live. Two such
// bursts teach the proxy the lock; the third is split right.
func TestBatchLockSharedBatches(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	for i := range 8 { // 1 ms per token, alone
		tr := served(float64(i*10000), float64(i*10000+600), float64(i*10000+700), 0)
		tr.PromptTokens, tr.Prefix.Tracked = 600, true // ollama reports no cached count; the prefix tracker saw no reuse
		r.Record(&tr)
	}
	var last [3]Request
	for b := range 3 {
		base := 100000 + float64(b)*20000
		holder := served(base, base+600, base+9000, 0)
		holder.PromptTokens, holder.Prefix.Tracked = 600, true
		holder.ID = uint64(1000 + 10*b)
		r.FirstOutput(&holder)
		for i := range 3 { // took their slots at base+600 together: 1,800 tokens on one thread
			w := served(base+1+float64(i), base+2400+float64(i), base+3000+float64(100*i), 1+i)
			w.PromptTokens, w.Prefix.Tracked = 600, true
			w.ID = holder.ID + 1 + uint64(i)
			r.Record(&w)
			last[i] = r.Recent(1)[0]
		}
		r.Record(&holder)
	}
	for i, rq := range last {
		require.Equal(t, SourceOccupancy, rq.QueueSource)
		require.InDelta(t, 599-float64(i), rq.Queue.Millis(), 25, "request %d waited for the holder's prefill", i+1)
	}

	// A request whose first output came 2 ms after one of theirs shared
	// their batches: it did not wait for that prefill to end (a prefill of
	// 2 ms is none), though it arrived during it.
	late := served(100000+2*20000+1000, 100000+2*20000+2404, 100000+2*20000+2600, 3)
	late.PromptTokens, late.Prefix.Tracked = 600, true
	r.Record(&late)
	rq := r.Recent(1)[0]
	require.GreaterOrEqual(t, rq.Prefill.Millis(), 300.0, "queue %.1f ms", rq.Queue.Millis())
}

// TestOccupancyNeverSentNotAhead: a request the proxy admitted but never
// sent (its upstream dial failed) held no slot, yet the proxy counted it
// in flight at the admissions while it was. On two slots, w arrives with
// x and y in them and z, never sent, in the proxy's count: it waited for
// x's end (300 ms), not y's (350 ms). Off the timeline, z was a request
// ahead not recorded yet, and w was placed at y's end.
func TestOccupancyNeverSentNotAhead(t *testing.T) {
	r, _, _ := newTest(t, Config{EngineSlots: 2})
	x := served(0, 100, 300, 0)
	y := served(1, 120, 350, 1)
	z := served(2, 0, 0, 2)
	z.Sent, z.Headers, z.FirstEvent, z.FirstOutput, z.FirstContent, z.LastToken, z.End = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
	z.ClientDone, z.Status, z.ErrSide, z.ErrKind = at(5), 502, proxy.SideUpstream, proxy.ErrConnect
	w := served(4, 400, 700, 3)
	for i, tr := range []*proxy.Trace{&z, &x, &y, &w} {
		tr.ID = uint64(i + 1)
		r.Record(tr)
	}
	rq := r.Recent(1)[0]
	require.InDelta(t, 296, rq.Queue.Millis(), 1, "queue %.1f ms (%s)", rq.Queue.Millis(), rq.QueueSource)
}

// leftInPrefill is a request of tokens prompt tokens that arrived at
// arrive (ms) and whose client left at left, before any output: no first
// output, no end, status 499.
func leftInPrefill(arrive, left float64, tokens int64) proxy.Trace {
	tr := served(arrive, 0, 0, 0)
	tr.PromptTokens = tokens
	tr.FirstOutput, tr.FirstContent, tr.LastToken = time.Time{}, time.Time{}, time.Time{}
	tr.End, tr.ClientDone = time.Time{}, at(left)
	tr.ErrSide, tr.ErrKind, tr.Status = proxy.SideClient, proxy.ErrClientGone, 499
	tr.UsageSeen, tr.CompletionTokens = false, -1
	return tr
}

// trainSolo records 8 requests of 2,000 prompt tokens, each alone, each
// prefilled in 100 ms (20,000 tokens/s), 1 s apart from 0.
func trainSolo(r *Recorder) {
	for i := range 8 {
		tr := served(float64(i*1000), float64(i*1000+100), float64(i*1000+200), 0)
		r.Record(&tr)
	}
}

// trainPerToken records 8 requests of 600 prompt tokens, each alone, each
// prefilled in 600 ms (1 ms per token), numbered as the proxy numbers them;
// ollama reports no cached count and the prefix tracker saw no reuse.
func trainPerToken(r *Recorder) {
	for i := range 8 {
		tr := served(float64(i*10000), float64(i*10000+600), float64(i*10000+700), 0)
		tr.PromptTokens, tr.Prefix.Tracked = 600, true
		tr.ID, tr.AdmitSeq, tr.ReleaseSeq = uint64(i+1), uint64(2*i+1), uint64(2*i+2)
		r.Record(&tr)
	}
}

// burst600 gives trs, in their order of admission, trainPerToken's
// 600-token prompts and the proxy's numbers from 100.
func burst600(trs ...*proxy.Trace) {
	for i, tr := range trs {
		tr.PromptTokens, tr.Prefix.Tracked = 600, true
		tr.ID, tr.AdmitSeq, tr.ReleaseSeq = uint64(100+i), uint64(100+i), uint64(200+i)
	}
}

// TestBatchLockHolderAdmittedAfter: ollama's handlers race for the engine,
// and a request admitted a fraction of a millisecond after another can take
// the runner's lock first (ollama P=2, hint 2, a fresh proxy's first burst:
// the proxy's 2nd request waited 105 ms for the 3rd's prefill, admitted
// 0.1 ms after it). The one that waited had nobody counted in flight at its
// admission, and ended first: the holder, still in flight at its Record, is
// seen only by its live first output, and the live table was read only for
// requests with more in flight at admission than recorded. Split as
// unqueued, its queue is the holder's prefill.
func TestBatchLockHolderAdmittedAfter(t *testing.T) {
	r, _, _ := newTest(t, Config{EngineSlots: 2})
	trainPerToken(r)
	base := 100000.0
	w := served(base, base+1200, base+1300, 0) // admitted first, waited for h's prefill
	h := served(base+0.1, base+600, base+5000, 1)
	burst600(&w, &h)
	r.FirstOutput(&h)
	r.Record(&w)
	rq := r.Recent(1)[0]
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.InDelta(t, 600, rq.Queue.Millis(), 25, "queue %.1f ms: it waited for the prefill of the request admitted after it", rq.Queue.Millis())
	r.Record(&h)
}

// TestBatchLockSharedWithLive: on a fresh proxy (no hint, no lock
// learned) two requests waited for a holder's prefill under ollama's
// lock, took their slots together at its end and shared their batches,
// their first outputs 1 ms apart; the first of them is recorded while the
// other and the holder are in flight. The holder's prefill (one batch) ran
// past its estimate (1,000 ms for 500 ms: the host's load), so it is not known to
// have run alone, and the waiter's prefill from its end (shared, twice its
// own estimate) fits no estimate: without the one it shared with, seen
// only live as a first output after its own, its vote was none and it was
// split as unqueued (ollama P=4, no hint, first burst: 0 ms for 275). The
// live request whose first output came with its own and whose start under
// the lock is the same took its slot with it (sharedStart). The same
// holds with the right hint (--engine-slots 4).
func TestBatchLockSharedWithLive(t *testing.T) {
	for _, cfg := range []Config{{}, {EngineSlots: 4}} {
		r, _, _ := newTest(t, cfg)
		trainPerToken(r)
		base := 100000.0
		h := served(base, base+1000, base+9000, 0)
		w1 := served(base+1, base+2200, base+2300, 1)
		w2 := served(base+1.2, base+2201, base+5000, 2)
		burst600(&h, &w1, &w2)
		h.PromptTokens = 500 // one batch: nobody joined it at a first batch's end
		r.FirstOutput(&h)
		r.FirstOutput(&w1)
		r.FirstOutput(&w2)
		r.Record(&w1)
		rq := r.Recent(1)[0]
		require.Equal(t, SourceOccupancy, rq.QueueSource)
		require.InDelta(t, 999, rq.Queue.Millis(), 25, "hint %d: queue %.1f ms: it waited for the holder's prefill", cfg.EngineSlots, rq.Queue.Millis())
		r.Record(&w2)
		r.Record(&h)
	}
}
