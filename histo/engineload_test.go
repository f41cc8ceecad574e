package histo

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo/engine"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// fakeLoad is an EngineLoad that answers the counts last set at or before
// t, as a scraper of the engine's /metrics would.
type fakeLoad struct {
	mu     sync.Mutex
	points []loadPoint
}

type loadPoint struct {
	t                time.Time
	running, waiting int
	kv               float64 // KV-cache use, 0..1
}

func (f *fakeLoad) set(t time.Time, running, waiting int) { f.setKV(t, running, waiting, 0) }

// setKV is set with the engine's KV-cache use.
func (f *fakeLoad) setKV(t time.Time, running, waiting int, kv float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.points = append(f.points, loadPoint{t, running, waiting, kv})
}

func (f *fakeLoad) LoadAt(t time.Time) (running, waiting int, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.points) - 1; i >= 0; i-- {
		if p := f.points[i]; !p.t.After(t) {
			return p.running, p.waiting, true
		}
	}
	return 0, 0, false
}

// TestEngineLoadHiddenQueue: two replicas of the proxy in front of one
// two-slot engine. This one sees nothing ahead of a request, but the
// engine's /metrics said two running and three waiting when it arrived:
// its 550 ms to first output is mostly queue behind the other replica's
// traffic, not prefill (the occupancy split alone reads it as prefill).
// The engine's running count is also a hard lower bound on its slots.
func TestEngineLoadHiddenQueue(t *testing.T) {
	load := &fakeLoad{}
	r, _, _ := newTest(t, Config{})
	for i := range 8 { // 20,000 tokens/s: 2,000 tokens in 100 ms
		tr := served(float64(i*1000), float64(i*1000+100), float64(i*1000+200), 0)
		r.Record(&tr)
	}
	hidden := served(20000, 20550, 20700, 0)
	r.Record(&hidden)
	require.Equal(t, SourceOccupancy, r.Recent(1)[0].QueueSource)
	require.Equal(t, Span(0), r.Recent(1)[0].Queue, "without the engine's word: read as prefill")

	r.SetEngineLoad(load)
	load.set(at(29990), 2, 3)
	hidden = served(30000, 30550, 30700, 0)
	r.Record(&hidden)
	rq := r.Recent(1)[0]
	require.Equal(t, SourceEngineLoad, rq.QueueSource)
	require.InDelta(t, 450, rq.Queue.Millis(), 5)
	require.InDelta(t, 100, rq.Prefill.Millis(), 5)
	require.Equal(t, 2, r.Slots().Effective, "the engine ran two at once")
	require.Equal(t, int64(-1), int64(rq.CacheInferredTokens), "a split from the model infers no cache")

	// Nothing waiting: the proxy's own timeline stands.
	load.set(at(39990), 1, 0)
	idle := served(40000, 40100, 40300, 0)
	r.Record(&idle)
	rq = r.Recent(1)[0]
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.Equal(t, Span(0), rq.Queue)

	// Waiting requests the proxy can account for (its own, ahead of the
	// request) are no hidden traffic.
	a, b := served(50000, 50100, 50400, 0), served(50001, 50110, 50500, 1)
	c := served(50002, 50500, 50600, 2) // waited for a's end at 50,400
	d := served(50003, 50600, 50700, 3) // waited for b's end at 50,500
	load.set(at(50002.5), 2, 1)         // a and b running, c waiting: all the proxy's own
	for _, tr := range []*proxy.Trace{&a, &b, &c, &d} {
		r.Record(tr)
	}
	rq = r.Recent(1)[0]
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.InDelta(t, 497, rq.Queue.Millis(), 1e-6)

	r.SetEngineLoad(nil)
	hidden = served(60000, 60550, 60700, 0)
	r.Record(&hidden)
	require.Equal(t, SourceOccupancy, r.Recent(1)[0].QueueSource)
}

// fakeHistory is a fakeLoad that also gives each point's time back
// (loadHistory), as histo/engine.Scraper does.
type fakeHistory struct{ fakeLoad }

func (f *fakeHistory) SampleBefore(t time.Time) (engine.Sample, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.points) - 1; i >= 0; i-- {
		if p := f.points[i]; p.t.Before(t) {
			r := engine.Reading{Running: float64(p.running), Waiting: float64(p.waiting), KVCacheUsage: p.kv}
			return engine.Sample{At: p.t, Read: r}, true
		}
	}
	return engine.Sample{}, false
}

// TestEngineLoadWaitedBound: a continuous-batching engine of four
// sequence slots (the hint) whose KV cache holds two of these requests at
// a time. a and c run side by side; b arrives after them, waits 297 ms
// for c's end with two slots free, and prefills for 400 ms: the timeline,
// which sees slots and has no prefill estimate yet, reads the whole wait
// as prefill. The engine's scrapes during b's wait counted two
// requests running while three (a, c, and b behind them) were in the
// engine: b was waiting at each of them, and its queue is at least the
// last such scrape less its arrival, to one scrape interval.
func TestEngineLoadWaitedBound(t *testing.T) {
	run := func(interval float64, running int) (Request, SlotsSection) {
		r, _, _ := newTest(t, Config{EngineSlots: 4})
		load := &fakeHistory{}
		r.SetEngineLoad(load)
		for ms := 0.0; ms <= 1000; ms += interval {
			load.set(at(ms), running, 0)
		}
		c := served(2, 150, 300, 1)
		b := served(3, 700, 900, 2)
		a := served(0, 100, 1000, 0)
		for _, tr := range []*proxy.Trace{&c, &b, &a} {
			r.Record(tr)
		}
		return r.Recent(2)[1], r.Slots()
	}
	rq, sl := run(10, 2)
	require.Equal(t, SourceEngineLoad, rq.QueueSource)
	require.InDelta(t, 287, rq.Queue.Millis(), 1e-6, "the last scrape before c's end, less b's arrival")
	require.InDelta(t, 410, rq.Prefill.Millis(), 1e-6)
	require.Equal(t, SlotsHint, sl.State, "a bound from the engine's counts does not argue with the hint")
	require.Equal(t, int64(-1), int64(rq.CacheInferredTokens), "a split resting on the scrape interval infers no cache")

	// Scraped once a second: no scrape fell in b's wait, the timeline stands.
	rq, _ = run(1000, 2)
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.Equal(t, Span(0), rq.Queue)

	// Three running at every scrape: b ran beside a and c from its
	// arrival (an engine with room for all three); nothing bounds it.
	rq, _ = run(10, 3)
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.Equal(t, Span(0), rq.Queue)
}

// fakeReporter is a scraper's Agreement alone, for sharedEngine.
type fakeReporter struct {
	fakeLoad
	g engine.Agreement
}

func (f *fakeReporter) Status() (engine.State, int64, error) { return engine.StateOK, 0, nil }
func (f *fakeReporter) Last() (engine.Sample, bool)          { return engine.Sample{}, false }
func (f *fakeReporter) Agreement() (engine.Agreement, bool)  { return f.g, true }

// TestSharedEngine: the engine's prompt tokens at twice the proxy's say
// others share it, unless the proxy does not know the prompt tokens of
// more than sharedUnaccounted of its own requests (its clients left, or
// streamed without usage): the engine counted those, so a proxy alone
// reads above SharedPromptRatio too, and the verdict is unknown; the split
// moves only on yes.
func TestSharedEngine(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	require.False(t, r.sharedEngine(), "no scraper")
	for _, c := range []struct {
		ratio, unaccounted float64
		verdict            string
	}{
		{2, 0, SharedYes},
		{2, 0.05, SharedYes},
		{1.1, 0, SharedNo},
		{1.1, 0.3, SharedNo},
		{2, 0.3, SharedUnknown},
		{math.NaN(), 0, SharedNo},
		{2, math.NaN(), SharedUnknown},
	} {
		g := engine.Agreement{PromptRatio: c.ratio, UnaccountedShare: c.unaccounted}
		require.Equal(t, c.verdict, sharesEngine(g), "ratio %v, unaccounted %v", c.ratio, c.unaccounted)
		r.SetEngineLoad(&fakeReporter{g: g})
		require.Equal(t, c.verdict == SharedYes, r.sharedEngine(), "ratio %v, unaccounted %v", c.ratio, c.unaccounted)
	}
}
