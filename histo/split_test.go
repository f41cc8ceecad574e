package histo

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

func TestSplitSources(t *testing.T) {
	tests := []struct {
		name string
		edit func(tr *proxy.Trace)
		want split
	}{{
		name: "server reports queue and prefill",
		edit: func(tr *proxy.Trace) { tr.ServerQueue, tr.ServerPrefill = ms2d(100), ms2d(150) },
		want: split{Queue: ms2d(100), Prefill: ms2d(150), Source: SourceServer, OK: true},
	}, {
		name: "server reports queue only: prefill is the rest of TTFO",
		edit: func(tr *proxy.Trace) { tr.ServerQueue, tr.Connect = ms2d(100), ms2d(20) },
		want: split{Queue: ms2d(100), Prefill: ms2d(180), Source: SourceServer, OK: true}, // 300 − 20 − 100
	}, {
		name: "server reports queue 0",
		edit: func(tr *proxy.Trace) { tr.ServerQueue = 0 },
		want: split{Queue: 0, Prefill: ms2d(298.5), Source: SourceServer, OK: true}, // 300 − 1.5
	}, {
		name: "server reports prefill only (llama.cpp timings.prompt_ms): queue is the rest",
		edit: func(tr *proxy.Trace) { tr.ServerPrefill, tr.Connect = ms2d(150), ms2d(20) },
		want: split{Queue: ms2d(130), Prefill: ms2d(150), Source: SourceServerPrefill, OK: true}, // 300 − 20 − 150
	}, {
		name: "server prefill longer than the time to first output: no negative queue",
		edit: func(tr *proxy.Trace) { tr.ServerPrefill = ms2d(400) },
		want: split{Queue: 0, Prefill: ms2d(298.5), Source: SourceServerPrefill, OK: true},
	}, {
		name: "server prefill wins over the limiter, whose wait is part of the queue",
		edit: func(tr *proxy.Trace) {
			tr.Limited, tr.Admit, tr.FirstOutput = true, at(100), at(400)
			tr.ServerPrefill = ms2d(200)
		},
		want: split{Queue: ms2d(198.5), Prefill: ms2d(200), Source: SourceServerPrefill, OK: true}, // 100 + (400 − 100 − 1.5 − 200)
	}, {
		name: "server queue without first output or prefill",
		edit: func(tr *proxy.Trace) { tr.ServerQueue, tr.FirstOutput = ms2d(100), time.Time{} },
		want: noSplit,
	}, {
		name: "limiter held the request: the wait is exact",
		edit: func(tr *proxy.Trace) {
			tr.Limited, tr.Admit, tr.Connect = true, at(500), ms2d(10)
			tr.FirstOutput = at(800)
		},
		want: split{Queue: ms2d(500), Prefill: ms2d(290), Source: SourceLimiter, OK: true}, // 800 − 500 − 10
	}, {
		name: "server wins over limiter, and the limiter wait is part of the queue",
		edit: func(tr *proxy.Trace) {
			tr.Limited, tr.Admit = true, at(100)
			tr.ServerQueue, tr.ServerPrefill = ms2d(50), ms2d(120)
		},
		want: split{Queue: ms2d(150), Prefill: ms2d(120), Source: SourceServer, OK: true},
	}, {
		name: "nothing known and no model yet",
		edit: func(tr *proxy.Trace) {},
		want: noSplit,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _, _ := newTest(t, Config{})
			tr := chat()
			tt.edit(&tr)
			require.Equal(t, tt.want, r.splitOf(&tr))
		})
	}
}

func TestSplitModel(t *testing.T) {
	r, _, _ := newTest(t, Config{EngineSlots: 4})
	loaded := idle(4000, 8000)
	loaded.InflightAtAdmit = 6
	loaded.FirstOutput = at(3000) // 500 ms of prefill at 8,000 tokens/s: 2,500 ms queued
	loaded.FirstContent = loaded.FirstOutput

	// The requests come one after another, 10 s apart: each finds the
	// engine idle.
	k := 0
	apart := func(tr proxy.Trace) proxy.Trace { k++; return shifted(&tr, time.Duration(k)*10*time.Second) }
	for i := range modelMinSamples - 1 {
		tr := apart(idle(int64(8000+i*100), 8000))
		r.Record(&tr)
	}
	require.Equal(t, noSplit, r.splitOf(&loaded), "7 samples are not enough")
	_, n, ok := r.PrefillRate()
	require.Equal(t, modelMinSamples-1, n)
	require.False(t, ok)

	ignored := []proxy.Trace{apart(idle(8000, 2000)), apart(idle(8000, 2000)), apart(idle(40, 100))}
	ignored[0].InflightAtAdmit = 4 // engine busy: not idle
	ignored[1].Status = 500        // failed
	// ignored[2]: too few uncached tokens
	for i := range ignored {
		r.Record(&ignored[i])
	}
	_, n, _ = r.PrefillRate()
	require.Equal(t, modelMinSamples-1, n)

	tr := apart(idle(9000, 8000))
	r.Record(&tr)
	rate, n, ok := r.PrefillRate()
	require.True(t, ok)
	require.Equal(t, modelMinSamples, n)
	require.InDelta(t, 8000, rate, 1e-6)

	got := r.splitOf(&loaded)
	require.Equal(t, SourceModel, got.Source)
	require.True(t, got.OK)
	require.InDelta(t, float64(ms2d(2500)), float64(got.Queue), float64(time.Microsecond))
	require.InDelta(t, float64(ms2d(500)), float64(got.Prefill), float64(time.Microsecond))

	fast := loaded
	fast.FirstOutput = at(300) // faster than the model: no queue, never negative
	got = r.splitOf(&fast)
	require.Equal(t, split{Queue: 0, Prefill: ms2d(300), Source: SourceModel, OK: true}, got)

	// The model is applied to the uncached tokens only.
	cached := loaded
	cached.PromptTokens, cached.CachedTokens = 20000, 16000
	got = r.splitOf(&cached)
	require.InDelta(t, float64(ms2d(2500)), float64(got.Queue), float64(time.Microsecond))

	// Record falls back to the model when the timeline cannot place the
	// request: more requests overlapped it than the timeline keeps.
	for range occRing {
		f := chat()
		f.Status = 500 // never learned from
		r.Record(&f)
	}
	r.Record(&loaded)
	rq := r.Recent(1)[0]
	require.Equal(t, SourceModel, rq.QueueSource)
	require.InDelta(t, 2500.0, rq.Queue.Millis(), 1e-3)
}

func TestRateModelRobust(t *testing.T) {
	var m rateModel
	// Outliers (a request that queued behind traffic the proxy cannot see:
	// 77 times too slow) do not move the fit.
	for i := range 200 {
		n := 1000.0 + float64(i%7)*10
		x := rateSample{n: n, pos: n / 2, t: n / 7700}
		if i%5 == 0 {
			x.t *= 77
		}
		m.add(x)
	}
	rate, ok := m.rate()
	require.True(t, ok)
	require.InDelta(t, 7700, rate, 1)
	require.Equal(t, modelSamples, m.samples())

	// The window slides: after 64 new samples the old ones are gone.
	for i := range modelSamples {
		n := 1000.0 + float64(i%7)*10
		m.add(rateSample{n: n, pos: n / 2, t: n / 5000})
	}
	rate, _ = m.rate()
	require.InDelta(t, 5000.0, rate, 1e-6)
}

// TestCostModelGrowsWithContext: an engine whose prefill per new token
// grows with the cached context it attends to (llama.cpp: attention), with
// a fixed cost per request. Learned from conversation turns (the new
// tokens known from the prefix reuse), the model finds all three terms,
// and inverting it gives the turn's cached tokens; a constant rate learned
// from short cold prompts read such turns as 0.42–0.79 of the truth.
func TestCostModelGrowsWithContext(t *testing.T) {
	truth := costFit{t0: 0.002, a: 1.0 / 20000, b: 1e-8} // 2 ms, 20,000 tokens/s, +1% per 1,000 tokens of context… per 1e-8 s·token²
	var m rateModel
	for i := range 40 {
		cached := float64(i%10) * 2000
		n := 100 + float64(i%4)*300
		m.add(rateSample{n: n, pos: cached + n/2, t: truth.cost(n, cached)})
	}
	rs := m.read()
	require.True(t, rs.ready)
	require.InDelta(t, truth.t0, rs.fit.t0, 1e-6)
	require.InDelta(t, truth.a, rs.fit.a, truth.a*1e-3)
	require.InDelta(t, truth.b, rs.fit.b, truth.b*1e-3)
	for _, c := range []struct{ n, cached float64 }{{500, 19000}, {2000, 0}, {64, 30000}} {
		got := rs.fit.newTokens(truth.cost(c.n, c.cached), c.n+c.cached)
		require.InDelta(t, c.n, got, 1, "%+v", c)
	}
	// A prefill faster than the fixed cost is all cached; one slower than
	// the whole prompt cold is all new.
	require.Zero(t, rs.fit.newTokens(0.001, 5000))
	require.Equal(t, 5000.0, rs.fit.newTokens(10, 5000))
}

// TestRateModelNotLockedByAStall: ollama loads the model on its first
// request, which is then the slowest sample by far. Kept as the reference,
// it made every later cold prompt look like a cache hit until eight
// refused in a row agreed. One sample does not say what a hit is, and the
// slowest is left out of the reference before the model is ready: the
// cold prompts after the stall are learned at once, the model is ready
// after eight samples with the stall left out of the fit, and hits judged
// by the cold samples are refused. Eight refused samples that agree (an
// engine that got faster) replace the samples; eight that scatter, as
// unreported hits do, do not.
func TestRateModelNotLockedByAStall(t *testing.T) {
	r, _, _ := newTest(t, Config{EngineSlots: 1})
	k := 0
	apart := func(tr proxy.Trace) proxy.Trace { k++; return shifted(&tr, time.Duration(k)*10*time.Second) }
	stall := apart(idle(8000, 1000)) // 8,000 tokens in 8 s: the model loading
	r.Record(&stall)
	_, n, _ := r.PrefillRate()
	require.Equal(t, 1, n)

	// The engine's cold rate, about 8,000 tokens/s: learned from the
	// first, though eight times the stall's.
	cold := func(i int) proxy.Trace { return apart(idle(int64(8000+i*50), 8000)) }
	tr := cold(0)
	r.Record(&tr)
	_, n, _ = r.PrefillRate()
	require.Equal(t, 2, n, "one sample does not make the next a cache hit")

	// Hits of different sizes (3× to 10× the cold rate) are refused and
	// stay refused.
	for i := range modelMinSamples {
		tr := apart(idle(8000, 24000+8000*float64(i)))
		r.Record(&tr)
	}
	_, n, ok := r.PrefillRate()
	require.Equal(t, 2, n, "scattered fast samples are hits: refused")
	require.False(t, ok)

	// Six more cold prompts: ready, at the cold rate (the stall is off the
	// fit).
	for i := 1; i < modelMinSamples-1; i++ {
		tr := cold(i)
		r.Record(&tr)
	}
	rate, n, ok := r.PrefillRate()
	require.True(t, ok)
	require.Equal(t, modelMinSamples, n)
	require.InDelta(t, 8000, rate, 400)

	// An engine that got faster: 30,000 tokens/s eight times in a row
	// replaces the samples.
	for range modelMinSamples {
		tr := apart(idle(8000, 30000))
		r.Record(&tr)
	}
	rate, n, _ = r.PrefillRate()
	require.Equal(t, modelMinSamples, n)
	require.InDelta(t, 30000, rate, 1)

	// A learned sample breaks a run: seven agreeing fast samples, one at
	// the rate, seven more fast ones never make eight in a row.
	for _, rateTok := range []float64{90000, 90000, 90000, 90000, 90000, 90000, 90000, 30000, 90000, 90000, 90000, 90000, 90000, 90000, 90000} {
		tr := apart(idle(8000, rateTok))
		r.Record(&tr)
	}
	rate, _, _ = r.PrefillRate()
	require.Less(t, rate, 33000.0, "interleaved hits never replace the cold rate")
}

// TestCostModelRobustToSlowSamples: prefill samples scatter one way more
// than the other. A host's load, a queue misread as prefill or a stall
// only make a sample slower; against ollama a cold 1,500-token prompt read
// 29–35% cached after slow samples had pulled the fit up. Samples from
// ollama's tiny model (attention dominates: 1,500 tokens in ~0.6 s), ±10%
// of noise, and a third of them 1.3–2.5 × slow: the fit stays at the
// engine's cost, and a cold prompt does not read as cached.
func TestCostModelRobustToSlowSamples(t *testing.T) {
	truth := costFit{t0: 0.02, a: 0.25e-3, b: 2e-7}
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 23))
		var m rateModel
		for i := range modelSamples {
			n := 300 + 1700*rng.Float64()
			x := rateSample{n: n, pos: n / 2, t: truth.cost(n, 0) * (0.9 + 0.2*rng.Float64())}
			if i%3 == 0 {
				x.t *= 1.3 + 1.2*rng.Float64()
			}
			m.add(x)
		}
		rs := m.read()
		require.True(t, rs.ready)
		t.Logf("seed %d: fit %+v: 1,500 cold tokens %.3f s (truth %.3f)", seed, rs.fit, rs.fit.cost(1500, 0), truth.cost(1500, 0))
		for _, n := range []float64{500, 1500, 2000} {
			require.InDelta(t, truth.cost(n, 0), rs.fit.cost(n, 0), 0.12*truth.cost(n, 0), "seed %d: %d cold tokens (fit %+v)", seed, int(n), rs.fit)
		}
		// A cold prompt at the engine's cost reads as (nearly) all new,
		// one at the fast end of its noise as mostly new: a cached prefix
		// saves only the dense cost of its tokens (the new ones attend to
		// it all the same), so 10% less time reads as ~18% cached here.
		for _, c := range []struct{ f, most float64 }{{1, 0.1}, {0.9, 0.25}} {
			f := c.f
			cached := 1500 - rs.fit.newTokens(f*truth.cost(1500, 0), 1500)
			require.LessOrEqual(t, cached, c.most*1500, "seed %d: a cold prompt %.0f%% as fast as the engine read %.0f%% cached", seed, 100*f, 100*cached/1500)
		}
	}
}

// TestRateModelReadyDespiteSpread: ten equal cold prompts whose prefill
// spread 2.2 × (ollama at load average 10: 1.9–4.3 s for 1,500 tokens),
// the slowest first. Judged against the slowest sample, the fast half were
// refused as cache hits and the model was not ready after all ten; judged
// against the median, it is ready by the eighth.
func TestRateModelReadyDespiteSpread(t *testing.T) {
	r, _, _ := newTest(t, Config{EngineSlots: 1})
	secs := []float64{4.3, 1.9, 2.0, 3.1, 1.95, 2.2, 2.6, 1.9, 3.4, 2.05}
	for i, s := range secs {
		tr := shifted(ptr(idle(1500, 1500/s)), time.Duration(i+1)*10*time.Second)
		r.Record(&tr)
	}
	_, n, ok := r.PrefillRate()
	require.True(t, ok, "ready: %d samples", n)
}

func ptr(tr proxy.Trace) *proxy.Trace { return &tr }
