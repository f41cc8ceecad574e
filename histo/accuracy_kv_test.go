package histo_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/engine"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// KV-cache pressure (issue 23): a continuous-batching engine admits a
// request when a sequence slot is free *and* its prompt and completion fit
// in the KV cache (vLLM's scheduler: max_num_seqs and the block budget;
// the sim's Config.KVCacheTokens). With a KV cache short for the traffic,
// requests wait although a slot is free: four sequence slots, room in the
// KV cache for two of these requests. The occupancy split sees slots, not
// blocks, so what it makes of that wait is measured here against the
// sim's truth, in each way a user may run the proxy: no hint, the engine's
// max_num_seqs as --engine-slots, that hint with the engine's /metrics
// scraped (its waiting count), and the engine's per-request metrics
// (vLLM --enable-per-request-metrics), the evidence that needs no
// inference.

// kvEngine is vLLM with 4 sequence slots and a KV cache of kv tokens.
func kvEngine(timings sim.TimingMode, kv int) sim.Config {
	return sim.Config{
		Slots: 4, KVCacheTokens: kv, PrefillTokensPerSec: 20000, DecodeTokensPerSec: 400, TokensPerEvent: 1,
		ExactLength: true, UnreportedCache: true, Seed: 1, Timings: timings,
	}
}

// kvCase is one way of running the proxy in front of the KV-short engine.
type kvCase struct {
	name    string
	hint    int               // --engine-slots
	scrape  bool              // the engine's /metrics scraped every 5 ms
	timings sim.TimingMode    // the engine's per-request report
	source  histo.QueueSource // what the split must take its queue from; "" if any
	bar     bool              // the bar holds today (else it is measured and logged: kvBarMissed)
}

var kvCases = []kvCase{
	{name: "nohint", timings: sim.TimingNone},
	{name: "hint4", hint: 4, timings: sim.TimingNone},
	// The engine's /metrics scraped every 5 ms: its running count during a
	// request's wait bounds its queue (waitedBound, engineload.go).
	{name: "nohint+metrics", scrape: true, timings: sim.TimingNone, bar: true},
	{name: "hint4+metrics", hint: 4, scrape: true, timings: sim.TimingNone, bar: true},
	{name: "per-request-metrics", timings: sim.TimingVLLM, source: histo.SourceServer, bar: true},
}

// kvBurst is one burst against the KV-short engine: its requests and the
// KV cache that holds them back.
type kvBurst struct {
	name string
	kv   int
	reqs []burstReq
}

var kvBursts = []kvBurst{
	// Eight cold 1,000-token prompts asking for 40–47 tokens in a KV cache
	// of 2,200: two fit at a time, as if the engine had two slots.
	{"uniform", 2200, coldBurst("kv", 8, 40)},
	// Eight cold prompts of 300 to 2,000 tokens asking for 20 to 150 in a
	// KV cache of 2,600: one to four fit at a time, whichever they are; no
	// slot count describes the engine.
	{"mixed", 2600, mixedBurst("kv", 8)},
	// One 1,000-token prompt generating 600 tokens, then five cold prompts
	// of 2,500 tokens in a KV cache of 4,000: each large one waits for the
	// one before it to end, with the cache 40% or 63% used, never the 90%
	// that says "full" when the cache's size is unknown. The engine's
	// cache_config_info gives the size: the free tokens are fewer than the
	// prompt (kvHeld).
	{"large", 4000, largeBurst("kv", 5)},
}

// largeBurst is a long request holding 40% of a 4,000-token KV cache,
// then n cold prompts of 2,500 tokens that fit only one at a time.
func largeBurst(prefix string, n int) []burstReq {
	out := []burstReq{{id: prefix + "-hog", body: msgsBody(coldPrompt(prefix+"-hog", 1000), 600), maxTokens: 600}}
	for i := range n {
		id := fmt.Sprintf("%s-large-%d", prefix, i)
		out = append(out, burstReq{id: id, body: msgsBody(coldPrompt(id, 2500), 20+i), maxTokens: 20 + i})
	}
	return out
}

// TestQueueAccuracyKVPressure: see the file's comment. Each case sends
// one cold request (the cold rate's first sample), then a burst, and
// holds each request's queue to the bar, max(25 ms, 10%) of the engine's
// record, for at least 95% of them. Beside each figure the log has the
// engine's waiting count at arrival and what the cold-rate estimate
// would have made of the wait (TTFO − prompt ÷ learned rate).
func TestQueueAccuracyKVPressure(t *testing.T) {
	skipInaccurate(t)
	for _, b := range kvBursts {
		for _, c := range kvCases {
			t.Run(b.name+"/"+c.name, func(t *testing.T) { runKVCase(t, b, c) })
		}
	}
}

func runKVCase(t *testing.T, b kvBurst, c kvCase) {
	s, up := simServer(t, kvEngine(c.timings, b.kv))
	st := newStack(t, up, proxy.Config{}, histo.Config{EngineSlots: c.hint})
	acc := &accStack{stack: st, sim: s}
	if c.scrape {
		scrapeEngine(t, st, up, kvScrape)
	}
	acc.send(t, "warm", msgsBody(coldPrompt("warm", 1000), 3))
	acc.burst(t, b.reqs)

	rate, _, _ := st.rec.PrefillRate()
	within, waited := 0, 0
	var worst time.Duration
	for _, r := range b.reqs {
		truth, ok := s.Truth(r.id)
		require.True(t, ok, r.id)
		rq := acc.record(t, r.maxTokens)
		if c.source != "" {
			require.Equal(t, c.source, rq.QueueSource, r.id)
		}
		got := time.Duration(rq.Queue)
		diff := got - truth.Queue
		if rq.Queue.Known() && diff.Abs() <= queueTolerance(truth.Queue) {
			within++
		}
		worst = max(worst, diff.Abs())
		if truth.Queue > 25*time.Millisecond {
			waited++
		}
		alt := "n/a"
		if rate > 0 && rq.TTFO.Known() {
			est := time.Duration(float64(rq.PromptTokens) / rate * float64(time.Second))
			alt = fmt.Sprintf("%+.1f ms", (time.Duration(rq.TTFO)-time.Duration(rq.Connect)-est-truth.Queue).Seconds()*1e3)
		}
		t.Logf("%s: queue %.1f ms (%s), truth %.1f ms, error %+.1f ms | engine waiting at arrival %d, running %d | cold-rate estimate's error %s",
			r.id, rq.Queue.Millis(), rq.QueueSource, truth.Queue.Seconds()*1e3, diff.Seconds()*1e3,
			rq.Engine.WaitingAtAdmit, rq.Engine.RunningAtAdmit, alt)
	}
	// Requests waited with a slot free: the KV cache held them.
	require.GreaterOrEqual(t, waited, 3, "the KV cache must hold requests back although slots are free")
	share := float64(within) / float64(len(b.reqs))
	sl := st.rec.Slots()
	t.Logf("%s/%s: %d of %d within max(25 ms, 10%%) (%.0f%%), largest error %v; slots learned %d, state %q, waited %d, kv_bound %d",
		b.name, c.name, within, len(b.reqs), 100*share, worst.Round(100*time.Microsecond), sl.Learned, sl.State, sl.Waited, sl.KVBound)
	if c.hint > 0 && c.scrape {
		// The hint is right (max_num_seqs): the engine's /metrics said its
		// KV cache held the requests that waited with slots free (issue 23).
		// Without /metrics the proxy cannot tell, and sets it aside.
		require.Equal(t, histo.SlotsHint, sl.State, "a right hint reported wrong")
	}
	if share < 0.95 {
		if c.bar {
			t.Errorf("%s/%s: %d of %d within the bar, want ≥ 95%%", b.name, c.name, within, len(b.reqs))
		} else {
			kvBarMissed(t, "%s/%s: %d of %d within the bar (%.0f%%), want ≥ 95%%", b.name, c.name, within, len(b.reqs), 100*share)
		}
	}
}

// scrapeEngine scrapes the engine at up every interval into st's Recorder
// until the test ends, and waits for the first scrape.
func scrapeEngine(t *testing.T, st *stack, up string, interval time.Duration) {
	sc := engine.New(engine.Config{URL: up + "/metrics", Interval: interval, Totals: st.rec.EngineTotals})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { sc.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	st.rec.SetEngineLoad(sc)
	require.Eventually(t, func() bool { _, ok := sc.Last(); return ok }, 5*time.Second, 5*time.Millisecond)
}

// TestWrongHintSetAsideWithMetrics: the engine's /metrics excuses only
// the waits its KV cache explains. The same vLLM of 4 sequence slots with
// a KV cache of room (the sim's 1M tokens: it reads 0.00) and the same
// burst: --engine-slots 6 is still set aside as hint_too_large, with no
// wait counted kv_bound; the right 4 stays hint.
func TestWrongHintSetAsideWithMetrics(t *testing.T) {
	skipInaccurate(t)
	for _, c := range []struct {
		hint int
		want string
	}{{6, histo.SlotsHintHigh}, {4, histo.SlotsHint}} {
		t.Run(fmt.Sprint("hint", c.hint), func(t *testing.T) {
			s, up := simServer(t, kvEngine(sim.TimingNone, 0))
			st := newStack(t, up, proxy.Config{}, histo.Config{EngineSlots: c.hint})
			scrapeEngine(t, st, up, kvScrape)
			acc := &accStack{stack: st, sim: s}
			acc.send(t, "warm", msgsBody(coldPrompt("warm", 1000), 3))
			acc.burst(t, coldBurst("roomy", 8, 40))
			sl := st.rec.Slots()
			t.Logf("--engine-slots %d: state %q, learned %d, waited %d, kv_bound %d", c.hint, sl.State, sl.Learned, sl.Waited, sl.KVBound)
			require.Equal(t, c.want, sl.State)
			require.Zero(t, sl.KVBound, "a KV cache with room holds nothing back")
		})
	}
}

// kvScrape is the scrape interval of the cases that read the engine's
// /metrics: the resolution of the bound its running count gives.
const kvScrape = 5 * time.Millisecond

// kvBarMissed reports a KV-pressure case the split does not reach: with
// neither the engine's per-request metrics nor its /metrics, nothing the
// proxy sees tells a wait for KV blocks from a prefill, so by default the
// figure is logged as "BAR NOT MET"; ANVIL_KV_BARS=1 makes it fail.
func kvBarMissed(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("ANVIL_KV_BARS") == "1" {
		t.Errorf(format, args...)
		return
	}
	t.Logf("BAR NOT MET (KV pressure; ANVIL_KV_BARS=1 enforces it): "+format, args...)
}
