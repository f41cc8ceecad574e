package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPrefixCache(t *testing.T) {
	_, ts := start(t, fast())
	system := strings.Repeat("You are a careful coding agent. ", 100) // 3,200 bytes
	ask := func(msgs ...any) testUsage {
		t.Helper()
		resp := post(t, context.Background(), ts.URL+"/v1/chat/completions",
			map[string]any{"messages": msgs, "max_tokens": 4})
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return *decodeBody[testChunk](t, resp).Usage
	}
	sys := map[string]any{"role": "system", "content": system}
	user := map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "fix the bug"}}}
	asst := map[string]any{"role": "assistant", "content": "done"}

	first := ask(sys, user)
	require.Zero(t, first.PromptTokensDetails.CachedTokens)

	// An append-only turn reuses every full block of the first prompt.
	second := ask(sys, user, asst, map[string]any{"role": "user", "content": "thanks"})
	require.Greater(t, second.PromptTokens, first.PromptTokens)
	require.Equal(t, first.PromptTokens/16*16, second.PromptTokensDetails.CachedTokens)

	// A timestamp at the start of the system prompt misses from there on.
	edited := map[string]any{"role": "system", "content": "2026-10-05T11:43:06Z " + system}
	third := ask(edited, user)
	require.Zero(t, third.PromptTokensDetails.CachedTokens)

	// The same prompt again hits all but its last partial block and token.
	again := ask(sys, user)
	require.Equal(t, (first.PromptTokens-1)/16*16, again.PromptTokensDetails.CachedTokens)
}

func TestPrefixCacheEviction(t *testing.T) {
	c := newPrefixCache(1, 4, 4) // 4-byte blocks, 4 blocks
	a := c.hashes("aaaabbbbccccdddd")
	require.Len(t, a, 4)
	require.Zero(t, c.match(a, 5))
	c.insert(a)
	require.Equal(t, 4, c.match(a, 5))
	require.Equal(t, 3, c.match(a, 4), "at least one token is computed")

	// A new 2-block prompt evicts the tail of a, not its head.
	b := c.hashes("xxxxyyyy")
	c.insert(b)
	require.Equal(t, 2, c.match(a, 5))
	require.Equal(t, 2, c.match(b, 3))

	// Chained hashes: the same block after a different prefix is a miss.
	require.NotEqual(t, c.hashes("bbbb")[0], a[1])
}

// hold starts a stream that keeps a slot until its context is canceled.
func hold(t *testing.T, url string, headers ...string) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp := post(t, ctx, url+"/v1/chat/completions", chatBody(true, false), headers...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return cancel
}

func TestAdmission(t *testing.T) {
	cfg := fast()
	cfg.MaxQueue = 2
	s, ts := start(t, cfg)
	var holders []context.CancelFunc
	for range 4 {
		holders = append(holders, hold(t, ts.URL, "X-Sim-Prefill", "1h"))
	}
	waitStats(t, s, func(st Stats) bool { return st.Active == 4 })

	// Queued streams get their headers at once; their first event waits.
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	a := post(t, ctxA, ts.URL+"/v1/chat/completions", chatBody(true, false), "X-Sim-Event-Gap", "1h")
	waitStats(t, s, func(st Stats) bool { return st.Queued == 1 })
	hold(t, ts.URL)
	waitStats(t, s, func(st Stats) bool { return st.Queued == 2 })

	full := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(true, false))
	require.Equal(t, http.StatusTooManyRequests, full.StatusCode)
	require.Empty(t, full.Header.Get("Retry-After"))
	e := decodeBody[map[string]map[string]any](t, full)["error"]
	require.Equal(t, "rate_limit_error", e["type"])
	require.Equal(t, float64(429), e["code"])

	// FIFO: the first slot freed goes to a, the first in line.
	holders[0]()
	ev, err := newSSE(a.Body).next()
	require.NoError(t, err)
	require.Contains(t, ev.data, `"role":"assistant"`)
	st := s.Stats()
	require.Equal(t, 4, st.Active)
	require.Equal(t, 1, st.Queued)
	require.Equal(t, int64(1), st.Rejected429)

	for _, c := range holders[1:] {
		c()
	}
	cancelA()
	waitStats(t, s, idle)
}

// The abort tests run in a bubble: the client's leaving and the engine's
// noticing happen at one virtual instant, so "at once" is exact.

func TestAbortInQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Slots = 1
		v := startVirtual(t, cfg)
		holder, release := context.WithCancel(context.Background())
		defer release()
		require.Equal(t, http.StatusOK, v.post(t, holder, "/v1/chat/completions", chatBody(true, false), "X-Sim-Prefill", "1h").StatusCode)
		ctx, cancel := context.WithCancel(context.Background())
		v.post(t, ctx, "/v1/chat/completions", chatBody(true, false), "X-Request-Id", "queued")
		synctest.Wait()
		require.Equal(t, 1, v.s.Stats().Queued)

		left := time.Now()
		cancel()
		ev := <-v.s.Aborts()
		require.Equal(t, "chatcmpl-queued", ev.ID)
		require.Equal(t, PhaseQueue, ev.Phase)
		require.Equal(t, left, ev.At, "noticed at once")
		synctest.Wait()
		st := v.s.Stats()
		require.Equal(t, 0, st.Queued)
		require.Equal(t, 1, st.Active)
	})
}

func TestAbort(t *testing.T) {
	for _, tc := range []struct {
		phase   Phase
		headers []string
		events  int // events to read before leaving
	}{
		{PhasePrefill, []string{"X-Sim-Prefill", "1h"}, 0},
		{PhaseDecode, []string{"X-Sim-Event-Gap", "20ms"}, 3},
	} {
		t.Run(string(tc.phase), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				v := startVirtual(t, fast())
				for _, stream := range []bool{true, false} {
					if !stream && tc.events > 0 {
						continue
					}
					ctx, cancel := context.WithCancel(context.Background())
					body := chatBody(stream, false, "max_tokens", 1000)
					read := make(chan struct{}) // the client has read its events
					done := make(chan struct{})
					go func() {
						defer close(done)
						req := mustRequest(t, ctx, "http://sim/v1/chat/completions", body, tc.headers...)
						resp, err := v.client.Do(req)
						if err != nil {
							close(read)
							return
						}
						defer resp.Body.Close()
						r := newSSE(resp.Body)
						for range tc.events {
							if _, err := r.next(); err != nil {
								break
							}
						}
						close(read)
						<-ctx.Done()
					}()
					if stream || tc.events > 0 {
						<-read
					}
					synctest.Wait()
					require.Equal(t, 1, v.s.Stats().Active)
					left := time.Now()
					cancel()
					ev := <-v.s.Aborts()
					require.Equal(t, tc.phase, ev.Phase)
					require.Equal(t, left, ev.At, "noticed at once")
					if tc.phase == PhaseDecode {
						require.Positive(t, ev.Tokens)
						require.Less(t, ev.Tokens, 1000)
					}
					<-done
					synctest.Wait()
					require.True(t, idle(v.s.Stats()))
					require.Equal(t, ev.At, v.s.Stats().LastAbort)
				}
			})
		})
	}
}

func mustRequest(t *testing.T, ctx context.Context, url string, body any, headers ...string) *http.Request {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return req
}

func TestFailAfterEvents(t *testing.T) {
	for _, tc := range []struct {
		name     string
		after    string
		wantData int // data events before the cut; -1: all output events
	}{
		{name: "mid-stream", after: "3", wantData: 4},         // role chunk + 3 output events
		{name: "before-output", after: "0", wantData: 1},      // role chunk only
		{name: "before-usage", after: "100000", wantData: -1}, // no usage chunk, no [DONE]
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ts := start(t, fast())
			resp := post(t, context.Background(), ts.URL+"/v1/chat/completions",
				chatBody(true, true, "max_tokens", 40), "X-Sim-Fail-After-Events", tc.after)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			evs, err := readAll(resp.Body)
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			for _, ev := range evs {
				require.NotEqual(t, "[DONE]", ev.data)
				require.NotContains(t, ev.data, `"usage"`)
			}
			if tc.wantData >= 0 {
				require.Len(t, evs, tc.wantData)
			} else {
				require.Contains(t, evs[len(evs)-1].data, `"finish_reason":"length"`)
			}
			waitStats(t, s, idle)
			require.Equal(t, int64(1), s.Stats().Failed)
		})
	}
}

func TestFailAfterEventsNonStream(t *testing.T) {
	s, ts := start(t, fast())
	req := mustRequest(t, context.Background(), ts.URL+"/v1/chat/completions",
		chatBody(false, false), "X-Sim-Fail-After-Events", "2")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	require.Error(t, err)
	require.True(t, errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF), err)
	waitStats(t, s, idle)
	require.Equal(t, int64(1), s.Stats().Failed)
}

// TestDecodeRate checks the calibration a proxy measures: decode rate as
// (completion_tokens-1)/(last output event - first output event), and
// prefill time as the wait for the first output event.
func TestDecodeRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.DecodeTokensPerSec = 1000
		cfg.PrefillTokensPerSec = 20000
		cfg.NaturalLengths = []int{1000} // the limit of 300 cuts it
		v := startVirtual(t, cfg)
		prompt := strings.Repeat("x", 4*4000) // 4,000 tokens: 200 ms of prefill
		body := map[string]any{"messages": []any{map[string]any{"role": "user", "content": prompt}},
			"max_tokens": 300, "stream": true}
		sent := time.Now()
		resp := v.post(t, context.Background(), "/v1/chat/completions", body)
		evs, err := readAll(resp.Body)
		require.NoError(t, err)
		out := evs[1 : len(evs)-1] // without the role chunk and [DONE]
		prefill := out[0].at.Sub(sent)
		gen := out[len(out)-1].at.Sub(out[0].at)
		rate := 299 / gen.Seconds()
		t.Logf("prefill %v (want 200ms), decode %.0f tok/s (want 1000), %d events", prefill, rate, len(out))
		// Time is virtual: what is left is the prompt's framing tokens and
		// the 1 ms prefill overhead, and the rounding of the event times.
		require.InDelta(t, 200, float64(prefill.Microseconds())/1e3, 5)
		require.InDelta(t, 1000, rate, 1)
		require.InDelta(t, 300.0/5, float64(len(out)), 25, "~5 tokens per event")
	})
}

func TestEventGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := startVirtual(t, fast())
		resp := v.post(t, context.Background(), "/v1/chat/completions",
			chatBody(true, false, "max_tokens", 30), "X-Sim-Event-Gap", "15ms")
		evs, err := readAll(resp.Body)
		require.NoError(t, err)
		out := evs[1 : len(evs)-1]
		require.Greater(t, len(out), 2)
		for i := 1; i < len(out); i++ {
			require.Equal(t, 15*time.Millisecond, out[i].at.Sub(out[i-1].at), "gap before event %d", i)
		}
	})
}

func TestPlan(t *testing.T) {
	j := &job{maxTokens: 1000, reasoning: true, bodyHash: 42}
	cfg, err := withDefaults(Config{})
	require.NoError(t, err)
	p := newPlan(j, cfg)
	var events, reasoning int
	sawContent := false
	for !p.done() {
		n, r := p.next()
		require.GreaterOrEqual(t, n, 1)
		require.LessOrEqual(t, n, 9)
		if events == 0 {
			require.Equal(t, 1, n, "the first token comes alone out of prefill")
		}
		if r {
			require.False(t, sawContent, "reasoning after content")
			reasoning += n
		}
		sawContent = sawContent || !r
		events++
	}
	require.Equal(t, 500, reasoning)
	require.Equal(t, 1000, p.emitted)
	require.InDelta(t, 200, events, 30)
	require.Equal(t, newPlan(j, cfg).text(10), newPlan(j, cfg).text(10), "deterministic")
}
