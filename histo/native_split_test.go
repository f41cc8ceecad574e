package histo_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// TestOllamaNativeSplit: the sim as ollama with 1 and 3 slots (its
// prefill lock and its slot freed at the stream's end), bursts of its
// native /api/chat and /api/generate requests, streamed and "stream":
// false, through a proxy given no hint. ollama's own prompt_eval_duration
// is the split's prefill (queue_source server_prefill) with no timeline
// needed, so every request is within max(25 ms, 10%) of the engine's
// truth; the engine's figures in /requests are its durations. A whole
// answer has no first output: its queue is total − prompt_eval − eval
// (wholeSplit), its TTFO stays null.
func TestOllamaNativeSplit(t *testing.T) {
	skipInaccurate(t)
	for _, tc := range []struct {
		slots int
		whole bool
	}{{1, false}, {3, false}, {1, true}, {3, true}} {
		slots := tc.slots
		t.Run(fmt.Sprintf("slots%d/whole=%v", slots, tc.whole), func(t *testing.T) {
			s, up := simServer(t, sim.Config{Engine: sim.EngineOllama, Slots: slots, PrefillTokensPerSec: 20000,
				DecodeTokensPerSec: 400, TokensPerEvent: 1, ExactLength: true, Seed: 1})
			st := newStack(t, up, proxy.Config{}, histo.Config{})
			const n = 6
			sendInOrder(t, s, n, func(i int) {
				path, body := nativeRequest(i, tc.whole)
				postNative(t, st.base+path, fmt.Sprintf("native-%d", i), body)
			})
			for i := range n {
				id := fmt.Sprintf("native-%d", i)
				truth, ok := s.Truth(id)
				require.True(t, ok, id)
				rq := (&accStack{stack: st, sim: s}).record(t, 20+3*i+1) // eval_count: the answer and its end-of-sequence step
				require.Equal(t, histo.SourceServerPrefill, rq.QueueSource, id)
				require.False(t, rq.Failed, id)
				require.Equal(t, !tc.whole, rq.Stream, id)
				require.Equal(t, !tc.whole, rq.TTFO.Known(), id)
				require.InDelta(t, rq.Engine.Prefill.Millis(), rq.Prefill.Millis(), 0.001, "the split's prefill is prompt_eval_duration")
				require.True(t, rq.Engine.Prefill.Known() && rq.Engine.Decode.Known() && rq.Engine.Total.Known(), id)
				require.InDelta(t, truth.FirstToken.Sub(truth.Admitted).Seconds()*1e3, rq.Engine.Prefill.Millis(), 0.01, id)
				diff := time.Duration(rq.Queue) - truth.Queue
				t.Logf("%s (%s): queue %.1f ms, truth %.1f ms, error %+.2f ms; prefill %.1f ms, truth %.1f ms",
					id, rq.Route, rq.Queue.Millis(), truth.Queue.Seconds()*1e3, diff.Seconds()*1e3, rq.Prefill.Millis(), truth.Prefill.Seconds()*1e3)
				require.LessOrEqual(t, diff.Abs(), queueTolerance(truth.Queue), id)
			}
		})
	}
}

// nativeRequest is the i-th request of a native burst: a cold prompt of
// its own length, alternately /api/chat and /api/generate, streamed or
// whole; it answers 20+3i tokens (postNative), its key in the records.
func nativeRequest(i int, whole bool) (path, body string) {
	prompt := coldPrompt(fmt.Sprintf("native-%d", i), 400+200*i)[0]["content"]
	var b []byte
	if i%2 == 0 {
		path = "/api/chat"
		b, _ = json.Marshal(map[string]any{"model": "m", "stream": !whole,
			"messages": []map[string]string{{"role": "user", "content": prompt}}})
	} else {
		path = "/api/generate"
		b, _ = json.Marshal(map[string]any{"model": "m", "stream": !whole, "prompt": prompt})
	}
	return path, string(b)
}

func postNative(t *testing.T, url, id, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Request-Id", id)
	// Natural stops, so that ollama's release at the stream's end and its
	// end-of-sequence step are in play.
	req.Header.Set("X-Sim-Completion-Tokens", fmt.Sprint(20+3*idIndex(id)))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func idIndex(id string) int {
	var i int
	_, _ = fmt.Sscanf(id, "native-%d", &i)
	return i
}

// TestLlamaNativeWholeSplit: the sim as llama-server with 1 and 3 slots, a
// burst of whole (non-stream) /completion answers through a proxy given
// no hint: with no first output, the split is timings.prompt_ms as the
// prefill and the upstream time less prompt_ms and predicted_ms as the
// queue (wholeSplit), within max(25 ms, 10%) of the engine's truth plus
// its work before the prefill.
func TestLlamaNativeWholeSplit(t *testing.T) {
	skipInaccurate(t)
	for _, slots := range []int{1, 3} {
		t.Run(fmt.Sprintf("slots%d", slots), func(t *testing.T) {
			s, up := simServer(t, sim.Config{Engine: sim.EngineLlamaCpp, Slots: slots, PrefillTokensPerSec: 20000,
				DecodeTokensPerSec: 400, TokensPerEvent: 1, ExactLength: true, Seed: 1})
			st := newStack(t, up, proxy.Config{}, histo.Config{})
			const n = 6
			sendInOrder(t, s, n, func(i int) {
				id := fmt.Sprintf("native-%d", i)
				prompt := coldPrompt(id, 400+200*i)[0]["content"]
				b, _ := json.Marshal(map[string]any{"prompt": prompt, "stream": false})
				postNative(t, st.base+"/completion", id, string(b))
			})
			for i := range n {
				id := fmt.Sprintf("native-%d", i)
				truth, ok := s.Truth(id)
				require.True(t, ok, id)
				rq := (&accStack{stack: st, sim: s}).record(t, 20+3*i)
				require.Equal(t, "llama_completion", rq.Route, id)
				require.False(t, rq.Stream, id)
				require.False(t, rq.TTFO.Known(), id)
				require.Equal(t, histo.SourceServerPrefill, rq.QueueSource, id)
				require.InDelta(t, rq.Engine.Prefill.Millis(), rq.Prefill.Millis(), 0.001, id)
				// The slot's RAM-cache save/restore before the prompt
				// (truth.PrePrefill, the sim's 15 ms per switch) is not in
				// prompt_ms: it lands in the queue, as on a stream split by
				// server_prefill (docs/engines.md).
				diff := time.Duration(rq.Queue) - truth.Queue - truth.PrePrefill
				t.Logf("%s: queue %.1f ms, truth %.1f ms + %.1f ms before the prefill, error %+.2f ms", id, rq.Queue.Millis(),
					truth.Queue.Seconds()*1e3, truth.PrePrefill.Seconds()*1e3, diff.Seconds()*1e3)
				require.LessOrEqual(t, diff.Abs(), queueTolerance(truth.Queue), id)
			}
		})
	}
}
