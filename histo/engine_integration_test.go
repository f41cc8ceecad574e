package histo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/engine"
	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// scrapeUntil scrapes the engine until cond holds for the newest sample.
func scrapeUntil(t *testing.T, s *engine.Scraper, cond func(engine.Reading) bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		if s.Scrape(context.Background()) != nil {
			return false
		}
		smp, _ := s.Last()
		return cond(smp.Read)
	}, 10*time.Second, time.Millisecond)
}

// TestEngineMetricsThroughProxy: the sim as llama.cpp's llama-server (one
// slot, /metrics in llamacpp: form) behind the proxy, its /metrics scraped.
// A request that arrives while one is in the slot and another waits reads
// the engine's own counts at admission; engine and proxy totals agree; and
// traffic that reaches the engine another way (a second front door) shows
// as a prompt ratio above 1, which the proxy's own timeline cannot see.
func TestEngineMetricsThroughProxy(t *testing.T) {
	engineSrv, up := simServer(t, sim.Config{Engine: sim.EngineLlamaCpp, Slots: 1, PrefillTokensPerSec: 1e5, DecodeTokensPerSec: 400})
	s := newStack(t, up, proxy.Config{}, histo.Config{})
	sc := engine.New(engine.Config{URL: up + "/metrics", Interval: time.Hour, Totals: s.rec.EngineTotals})
	s.rec.SetEngineLoad(sc)
	// A first scrape before any traffic: the baseline of the agreement.
	scrapeUntil(t, sc, func(r engine.Reading) bool { return r.Kind == engine.KindLlamaCpp })

	var wg sync.WaitGroup
	wg.Go(func() { s.post(t, chatBody("first, it holds the only slot", 60)) })
	waitEnqueued(t, engineSrv, 0)
	wg.Go(func() { s.post(t, chatBody("second, it waits for the slot", 20)) })
	waitEnqueued(t, engineSrv, 1)
	// The scrape the third request's admission will read: one in the slot,
	// one deferred.
	scrapeUntil(t, sc, func(r engine.Reading) bool { return r.Running == 1 && r.Waiting == 1 })
	wg.Go(func() { s.post(t, chatBody("third", 20)) })
	wg.Wait()
	s.last(t, 3)
	var third histo.Request
	for _, rq := range s.rec.Recent(3) {
		if rq.PromptTokens > 0 && rq.Index == 2 {
			third = rq
		}
	}
	require.Equal(t, 2, third.Index, "the third request's record")
	require.Equal(t, histo.Count(1), third.Engine.RunningAtAdmit)
	require.Equal(t, histo.Count(1), third.Engine.WaitingAtAdmit)
	// llama.cpp's own timings are beside the proxy's prefill, not in it.
	require.True(t, third.Engine.Prefill.Known(), "timings.prompt_ms")
	require.GreaterOrEqual(t, int64(third.Engine.CachedTokens), int64(0), "timings.cache_n")

	// All traffic came through the proxy: the totals agree exactly.
	scrapeUntil(t, sc, func(r engine.Reading) bool { return r.Running == 0 && r.Waiting == 0 })
	g, ok := sc.Agreement()
	require.True(t, ok)
	require.InDelta(t, 1, g.PromptRatio, 1e-9, "%+v", g)
	require.InDelta(t, 1, g.OutputRatio, 1e-9, "%+v", g)

	// A second front door: a request straight to the engine.
	before, _ := sc.Last()
	resp, err := http.Post(up+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("from another replica", 20)))
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	scrapeUntil(t, sc, func(r engine.Reading) bool {
		return r.Running == 0 && r.Waiting == 0 && r.OutputTokens > before.Read.OutputTokens
	})
	g2, _ := sc.Agreement()
	require.Greater(t, g2.PromptRatio, 1.0, "the engine saw work the proxy did not: %+v", g2)
	require.False(t, math.IsNaN(g2.PrefillRatio), "llama.cpp's prompt_seconds_total against the split's prefill")
	t.Logf("agreement through the proxy %+v; with a second front door %+v", g, g2)

	// The snapshot's extension carries it, with a note on the other door.
	doc, err := snapshot.Build(s.rec.Current(), snapshot.PrefillModel{})
	require.NoError(t, err)
	var sec histo.EngineSection
	require.NoError(t, json.Unmarshal(doc.Anvilproxy.Engine, &sec))
	require.Equal(t, "ok", sec.State)
	require.Equal(t, "llamacpp", sec.Kind)
	require.InDelta(t, g2.PromptRatio, float64(sec.PromptRatio), 1e-9)
	require.Equal(t, histo.SharedYes, sec.Shared, "every request through the proxy has its usage")
	require.InDelta(t, 0, float64(sec.UnaccountedShare), 1e-9)
	require.Contains(t, strings.Join(doc.Anvilproxy.Notes, "\n"), "other front doors share the engine")
}

// TestEngineMetricsAbsent: an engine without /metrics (the sim as ollama
// answers 404) leaves every engine count null and the split as it was.
func TestEngineMetricsAbsent(t *testing.T) {
	_, up := simServer(t, sim.Config{Engine: sim.EngineOllama, Slots: 1, PrefillTokensPerSec: 1e5, DecodeTokensPerSec: 2000})
	s := newStack(t, up, proxy.Config{}, histo.Config{})
	sc := engine.New(engine.Config{URL: up + "/metrics", Totals: s.rec.EngineTotals})
	s.rec.SetEngineLoad(sc)
	require.Error(t, sc.Scrape(context.Background()))
	st, _, _ := sc.Status()
	require.Equal(t, engine.StateAbsent, st)
	s.post(t, chatBody("hello", 5))
	rq := s.last(t, 1)
	require.Equal(t, histo.Count(-1), rq.Engine.WaitingAtAdmit)
	require.Equal(t, histo.Count(-1), rq.Engine.RunningAtAdmit)
	require.False(t, rq.Engine.Prefill.Known(), "ollama's OpenAI routes report no timings")
}

// TestLlamaNativeRoutesThroughProxy: the sim's llama.cpp native routes
// behind the proxy, streamed and whole: each a complete request (not
// truncated), with TTFT, the engine's token counts and cache hit, and
// llama.cpp's own prefill beside the proxy's, holding the engine's truth.
func TestLlamaNativeRoutesThroughProxy(t *testing.T) {
	engineSrv, up := simServer(t, sim.Config{Engine: sim.EngineLlamaCpp, Slots: 1, PrefillTokensPerSec: 2e4, DecodeTokensPerSec: 500})
	s := newStack(t, up, proxy.Config{}, histo.Config{})
	prompt := strings.Repeat("the same long prefix of a coding agent's prompt ", 40)
	for i, tc := range []struct {
		path   string
		stream bool
	}{{"/completion", true}, {"/completions", true}, {"/completion", false}, {"/completions", true}} {
		id := fmt.Sprintf("native-%d", i)
		body := fmt.Sprintf(`{"prompt":%q,"n_predict":12,"stream":%v}`, prompt+fmt.Sprint(i), tc.stream)
		req, err := http.NewRequest(http.MethodPost, s.base+tc.path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Request-Id", id)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)

		rq := s.last(t, i+1)
		truth, ok := engineSrv.Truth(id)
		require.True(t, ok)
		require.Equal(t, "llama_completion", rq.Route, tc.path)
		require.False(t, rq.Failed, "%s stream=%v: ended by \"stop\": true", tc.path, tc.stream)
		require.False(t, rq.Truncated)
		require.Equal(t, tc.stream, rq.Stream)
		require.True(t, rq.UsageSeen)
		require.EqualValues(t, truth.PromptTokens, rq.PromptTokens)
		require.EqualValues(t, truth.CompletionTokens, rq.OutputTokens)
		require.Equal(t, "usage", rq.OutputTokenSource)
		require.EqualValues(t, truth.CachedTokens, rq.CachedTokens, "timings.cache_n")
		require.EqualValues(t, truth.CachedTokens, rq.Engine.CachedTokens)
		require.EqualValues(t, truth.PromptTokens-truth.CachedTokens, rq.Engine.PromptEval, "timings.prompt_n")
		require.True(t, rq.Engine.Prefill.Known())
		require.InDelta(t, truth.Prefill.Seconds()*1e3, rq.Engine.Prefill.Millis(), 1, "timings.prompt_ms is the engine's prefill")
		if tc.stream {
			require.True(t, rq.TTFT.Known(), "TTFT of a native stream")
		}
		if i > 0 {
			require.Positive(t, int64(rq.CachedTokens), "the shared prefix was a cache hit")
		}
	}
}
