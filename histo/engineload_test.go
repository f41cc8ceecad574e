package histo

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
}

func (f *fakeLoad) set(t time.Time, running, waiting int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.points = append(f.points, loadPoint{t, running, waiting})
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
