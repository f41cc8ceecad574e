package histo_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/snapshot"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// The accuracy tests put the proxy, given no hint of the engine's shape,
// in front of the simulator as a FIFO engine with a prefix cache it does
// not report, and compare each request's queue/prefill split and inferred
// cache with the engine's own record of the request (sim.Truth), which
// never leaves the engine. Nothing the proxy computes can read the truth,
// so the tests cannot pass by construction.

// accEngine is the engine of the accuracy tests: 20,000 prompt tokens/s
// (a 1,000-token prompt takes 50 ms cold, ~1 ms from cache), 400 output
// tokens/s, one token per event, exact completion lengths (so a request's
// output token count names it), no cached count reported.
func accEngine(slots int) sim.Config {
	return sim.Config{
		Slots: slots, PrefillTokensPerSec: 20000, DecodeTokensPerSec: 400, TokensPerEvent: 1,
		ExactLength: true, UnreportedCache: true, Seed: 1,
	}
}

// accStack is a proxy and Recorder in front of a fresh simulator.
type accStack struct {
	*stack
	sim *sim.Server
}

func newAccStack(t *testing.T, slots int, hcfg histo.Config) *accStack {
	t.Helper()
	s, err := sim.New(accEngine(slots))
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return &accStack{stack: newStack(t, hs.URL, proxy.Config{}, hcfg), sim: s}
}

// msgsBody is a streamed chat request with usage asked for.
func msgsBody(msgs []map[string]string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{
		"model": "m", "stream": true, "stream_options": map[string]any{"include_usage": true},
		"max_tokens": maxTokens, "messages": msgs,
	})
	return string(b)
}

// coldPrompt is a ~tokens-token prompt that shares no cache block with any
// other key: the key comes first.
func coldPrompt(key string, tokens int) []map[string]string {
	text := key + " " + strings.Repeat("lorem ipsum ", tokens*4/12+1)
	return []map[string]string{{"role": "user", "content": text[:tokens*4]}}
}

// send posts body with X-Request-Id id and waits for the whole response.
func (s *accStack) send(t *testing.T, id, body string) {
	t.Helper()
	req, err := http.NewRequest("POST", s.base+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// record returns the proxy's record of the request that generated
// outputTokens (each request of a test asks for a different length).
func (s *accStack) record(t *testing.T, outputTokens int) histo.Request {
	t.Helper()
	var found *histo.Request
	require.Eventually(t, func() bool {
		for _, rq := range s.rec.Recent(512) {
			if int(rq.OutputTokens) == outputTokens {
				found = &rq
				return true
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond, "no record with %d output tokens", outputTokens)
	return *found
}

// conversation runs turns of one growing conversation, one after another
// as an agent does: every turn resends the history and adds ~100 tokens,
// so the engine serves all but the first from its prefix cache. Output
// lengths are 10+turn. It returns the history for a next turn.
func (s *accStack) conversation(t *testing.T, turns int) []map[string]string {
	t.Helper()
	msgs := coldPrompt("conversation", 1000)
	for i := range turns {
		s.send(t, fmt.Sprintf("turn-%d", i), msgsBody(msgs, 10+i))
		msgs = append(msgs,
			map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d %s", i, strings.Repeat("x", 200))},
			map[string]string{"role": "user", "content": fmt.Sprintf("next %d %s", i, strings.Repeat("y", 200))})
	}
	return msgs
}

// burstReq is one request of a burst.
type burstReq struct {
	id        string
	body      string
	maxTokens int
}

// burst sends reqs at once, each as soon as the engine has queued the one
// before, and waits for them all. The engine's FIFO order is then the
// order the proxy sent them in: requests that reach an engine within the
// same few milliseconds may be served in either order, which neither the
// proxy nor anyone outside the engine can see (docs/queue-split.md).
func (s *accStack) burst(t *testing.T, reqs []burstReq) {
	t.Helper()
	before := enqueued(s.sim)
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() { defer wg.Done(); s.send(t, r.id, r.body) }()
		waitEnqueued(t, s.sim, before+int64(i))
	}
	wg.Wait()
}

// coldBurst is n requests of distinct cold 1,000-token prompts asking for
// 40+i output tokens (100 ms of decode), keyed by prefix.
func coldBurst(prefix string, n, first int) []burstReq {
	out := make([]burstReq, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", prefix, i)
		out[i] = burstReq{id: id, body: msgsBody(coldPrompt(id, 1000), first+i), maxTokens: first + i}
	}
	return out
}

// mixedBurst is n requests of distinct cold prompts of 300 to 2,000
// tokens asking for 20 to 150 output tokens, in an order that mixes short
// and long: slots free at scattered times.
func mixedBurst(prefix string, n int) []burstReq {
	out := make([]burstReq, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", prefix, i)
		tokens, output := 300+(i*700)%1700, 20+(i*53)%131
		out[i] = burstReq{id: id, body: msgsBody(coldPrompt(id, tokens), output), maxTokens: output}
	}
	return out
}

// skipInaccurate skips an accuracy test with -short (seconds of simulated
// traffic) and under the race detector (raceEnabled).
func skipInaccurate(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("seconds of simulated traffic")
	}
	if raceEnabled {
		t.Skip("the race detector's delays are in every stamp")
	}
}

// queueTolerance is the accuracy the split must reach: max(25 ms, 10%).
func queueTolerance(truth time.Duration) time.Duration {
	return max(25*time.Millisecond, truth/10)
}

// checkQueues compares every burst request's queue with the engine's
// truth; it returns how many were within the bar and the largest error.
func (s *accStack) checkQueues(t *testing.T, reqs []burstReq) (within int, worst time.Duration) {
	t.Helper()
	for _, r := range reqs {
		truth, ok := s.sim.Truth(r.id)
		require.True(t, ok, r.id)
		rq := s.record(t, r.maxTokens)
		require.Equal(t, histo.SourceOccupancy, rq.QueueSource, r.id)
		got := time.Duration(rq.Queue)
		diff := got - truth.Queue
		t.Logf("%s: queue %v, truth %v (error %v); prefill %v, truth %v", r.id,
			got.Round(100*time.Microsecond), truth.Queue.Round(100*time.Microsecond), diff.Round(100*time.Microsecond),
			time.Duration(rq.Prefill).Round(100*time.Microsecond), truth.Prefill.Round(100*time.Microsecond))
		if diff.Abs() <= queueTolerance(truth.Queue) {
			within++
		} else {
			t.Logf("%s: off the bar", r.id)
		}
		worst = max(worst, diff.Abs())
	}
	return within, worst
}

// TestQueueAccuracyFIFO: on FIFO engines of 1 and 3 slots, with no hint,
// at least 95% of the requests of concurrent bursts are split within
// max(25 ms, 10%) of their true queue time: from a cold start, after a
// conversation's worth of cache-hit traffic (with a cache hit in the
// burst), and with a wrong --engine-slots. The ones missed on a loaded
// host are the first to wait behind a hint too large before any evidence
// (docs/queue-split.md "Limits").
func TestQueueAccuracyFIFO(t *testing.T) {
	skipInaccurate(t)
	cases := []struct {
		name         string
		slots, hint  int
		conversation bool
	}{
		{"1 slot", 1, 0, false},
		{"3 slots", 3, 0, false},
		{"1 slot after a conversation", 1, 0, true},
		{"3 slots after a conversation", 3, 0, true},
		{"1 slot, --engine-slots 4", 1, 4, false},
		{"3 slots, --engine-slots 1", 3, 1, false},
		{"3 slots, --engine-slots 8, after a conversation", 3, 8, true},
		{"3 slots, mixed lengths", 3, 0, false},
		{"1 slot, mixed lengths, --engine-slots 2", 1, 2, false},
	}
	var within, total int
	defer func() {
		t.Logf("%d of %d requests within the bar", within, total)
		require.GreaterOrEqual(t, float64(within), 0.95*float64(total))
	}()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newAccStack(t, tc.slots, histo.Config{EngineSlots: tc.hint})
			reqs := coldBurst("burst", 2*tc.slots+2, 40)
			if strings.Contains(tc.name, "mixed") {
				// As many as the hint's slots would serve in three rounds:
				// a hint too large is refuted by requests that waited with
				// fewer in the engine (two of them), and five mixed
				// lengths on one slot left too few on a loaded host (a
				// CI run; under four busy loops on 2 cores, 2 of 23 runs,
				// and 1 of 25 on the build before session 20).
				reqs = mixedBurst("mixed", 3*max(tc.slots, tc.hint)+2)
			}
			if tc.conversation {
				msgs := s.conversation(t, 10)
				// The conversation's next turn, a cache hit, joins the burst.
				reqs = append(reqs[:2], append([]burstReq{{id: "next-turn", body: msgsBody(msgs, 90), maxTokens: 90}}, reqs[2:]...)...)
			}
			s.burst(t, reqs)
			in, worst := s.checkQueues(t, reqs)
			within, total = within+in, total+len(reqs)
			t.Logf("largest queue error: %v", worst)
			slots := s.rec.Slots()
			require.Equal(t, tc.slots, slots.Effective, "the slot count the split ends up with: %+v", slots)
			doc, err := snapshot.Build(s.rec.Current(), snapshot.PrefillModel{})
			require.NoError(t, err)
			var inDoc histo.SlotsSection
			require.NoError(t, json.Unmarshal(doc.Anvilproxy.EngineSlots, &inDoc))
			require.Equal(t, slots, inDoc)
			note := "the --engine-slots hint disagreed with what the proxy observed"
			if tc.hint != 0 && tc.hint != tc.slots {
				require.Contains(t, []string{histo.SlotsHintLow, histo.SlotsHintHigh}, slots.State)
				require.True(t, hasNote(doc, note), "%v", doc.Anvilproxy.Notes)
			} else {
				require.False(t, hasNote(doc, note), "%v", doc.Anvilproxy.Notes)
			}
		})
	}
}

// TestInferredCacheHits: with an engine that reports no cached tokens, a
// repeat of a cold prompt is inferred at least 80% cached and the cold
// prompt itself at most 20%, and the reported ratio has no data rather
// than 0%.
func TestInferredCacheHits(t *testing.T) {
	skipInaccurate(t)
	s := newAccStack(t, 1, histo.Config{})
	for i := range 8 { // the cold rate needs 8 samples
		s.send(t, fmt.Sprintf("cold-%d", i), msgsBody(coldPrompt(fmt.Sprintf("cold-%d", i), 1000), 10+i))
	}
	_, n, ok := s.rec.PrefillRate()
	require.True(t, ok, "%d samples", n)
	prompt := coldPrompt("the-prompt", 2000)
	s.send(t, "first", msgsBody(prompt, 30))
	s.send(t, "repeat", msgsBody(prompt, 31))
	first, repeat := s.record(t, 30), s.record(t, 31)
	truthFirst, _ := s.sim.Truth("first")
	truthRepeat, _ := s.sim.Truth("repeat")
	require.Equal(t, histo.Count(-1), first.CachedTokens, "the engine reported nothing")
	share := func(rq histo.Request) float64 { return float64(rq.CacheInferredTokens) / float64(rq.PromptTokens) }
	t.Logf("cold prompt: inferred %d of %d cached (truth %d); repeat: %d (truth %d)",
		first.CacheInferredTokens, first.PromptTokens, truthFirst.CachedTokens, repeat.CacheInferredTokens, truthRepeat.CachedTokens)
	require.LessOrEqual(t, share(first), 0.2)
	require.GreaterOrEqual(t, share(repeat), 0.8)
	require.Greater(t, truthRepeat.CachedTokens, truthRepeat.PromptTokens*9/10, "the engine did serve it from cache")

	w := s.rec.Current()
	require.NotNil(t, w.Cache)
	require.Zero(t, w.Cache.EngineReported.Requests)
	require.True(t, math.IsNaN(float64(w.Cache.EngineReported.Ratio)), "nothing reported is no data, not 0%")
	require.Equal(t, int64(2), w.Cache.Inferred.Requests, "the cold samples came before the rate was ready")
	require.Equal(t, int64(repeat.CacheInferredTokens+first.CacheInferredTokens), w.Cache.Inferred.CachedTokens)

	// The snapshot keeps the two apart and says why one is empty.
	doc, err := snapshot.Build(w, snapshot.PrefillModel{})
	require.NoError(t, err)
	var ext map[string]any
	b, err := json.Marshal(doc.Anvilproxy)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &ext))
	cache := ext["cache"].(map[string]any)
	require.Nil(t, cache["engine_reported"].(map[string]any)["ratio"], "no data, not 0")
	require.InDelta(t, float64(w.Cache.Inferred.Ratio), cache["inferred"].(map[string]any)["ratio"], 1e-9)
	require.True(t, hasNote(doc, "the engine reported no cached prompt tokens"), "%v", doc.Anvilproxy.Notes)
	var table strings.Builder
	require.NoError(t, snapshot.WriteTable(&table, doc))
	require.Contains(t, table.String(), "cache hit   engine-reported not reported; inferred from prefill time")
}

// hasNote reports whether doc carries a note starting with prefix.
func hasNote(doc *snapshot.Document, prefix string) bool {
	for _, n := range doc.Anvilproxy.Notes {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

// TestColdRateSurvivesCacheHits: the cold prefill rate learns from cold
// prompts only; a conversation served from cache does not make it absurd
// (the bug: 211,816 tokens/s after one cold request and nine hits), and a
// later cold request on an idle engine is split as prefill, not queue.
func TestColdRateSurvivesCacheHits(t *testing.T) {
	skipInaccurate(t)
	s := newAccStack(t, 1, histo.Config{})
	for i := range 8 {
		s.send(t, fmt.Sprintf("cold-%d", i), msgsBody(coldPrompt(fmt.Sprintf("cold-%d", i), 1000), 10+i))
	}
	s.conversation(t, 10) // output lengths 10..19: distinct from what follows
	rate, _, ok := s.rec.PrefillRate()
	require.True(t, ok)
	require.InDelta(t, 20000, rate, 20000*0.25, "the cold rate, not the cache-hit rate")
	s.send(t, "cold-after", msgsBody(coldPrompt("cold-after", 2000), 60))
	rq := s.record(t, 60)
	truth, _ := s.sim.Truth("cold-after")
	t.Logf("cold request after the conversation: queue %v, prefill %v (truth %v / %v)", time.Duration(rq.Queue), time.Duration(rq.Prefill), truth.Queue, truth.Prefill)
	require.LessOrEqual(t, time.Duration(rq.Queue), 25*time.Millisecond)
	require.InDelta(t, float64(truth.Prefill), float64(rq.Prefill), float64(25*time.Millisecond))
}
