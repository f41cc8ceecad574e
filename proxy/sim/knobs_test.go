package sim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStatusKnob(t *testing.T) {
	s, ts := start(t, fast())
	for _, status := range []int{429, 500, 503} {
		resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(true, true),
			"X-Sim-Status", fmt.Sprint(status))
		require.Equal(t, status, resp.StatusCode)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		e := decodeBody[map[string]map[string]any](t, resp)["error"]
		require.Equal(t, float64(status), e["code"])
		require.NotEmpty(t, e["message"])
	}
	st := s.Stats()
	require.Equal(t, Stats{Requests: 3, Rejected429: 1, Failed: 2}, st)
}

func TestBadKnob(t *testing.T) {
	_, ts := start(t, fast())
	for _, h := range [][]string{
		{"X-Sim-Status", "200"},
		{"X-Sim-Fail-Attempts", "-1"},
		{"X-Sim-Fail-After-Events", "x"},
		{"X-Sim-Event-Gap", "50"},
		{"X-Sim-Prefill", "-1s"},
		{"X-Sim-Completion-Tokens", "0"},
		{"X-Sim-Report-Cached", "maybe"},
		{"X-Sim-Truncate-After-Events", "-2"},
		{"X-Sim-Completion-Tokens", "many"},
	} {
		resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(true, true), h...)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, h)
		e := decodeBody[map[string]map[string]any](t, resp)["error"]
		require.Contains(t, e["message"], h[0])
		require.Equal(t, "invalid_request_error", e["type"])
	}
}

func TestBadRequest(t *testing.T) {
	_, ts := start(t, fast())
	for path, body := range map[string]any{
		"/v1/chat/completions": map[string]any{"messages": []any{}},
		"/v1/completions":      map[string]any{"prompt": 42},
		"/v1/responses":        map[string]any{"input": 42},
		"/v1/messages":         map[string]any{"messages": "hi"},
	} {
		resp := post(t, context.Background(), ts.URL+path, body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, path)
	}
	resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(false, false, "max_tokens", 0))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestFailAttempts(t *testing.T) {
	s, ts := start(t, fast())
	send := func(body any) int {
		resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", body, "X-Sim-Fail-Attempts", "2")
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	a, b := chatBody(false, false), chatBody(false, false, "max_tokens", 5)
	require.Equal(t, []int{429, 429, 429, 200, 200, 429, 200},
		[]int{send(a), send(a), send(b), send(a), send(a), send(b), send(b)})
	st := s.Stats()
	require.Equal(t, int64(4), st.Rejected429)
	require.Equal(t, int64(3), st.Completed)
}

func TestFailRate(t *testing.T) {
	sequence := func() string {
		cfg := fast()
		cfg.FailRate = 0.5
		cfg.Seed = 7
		_, ts := start(t, cfg)
		var b strings.Builder
		for range 40 {
			resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(false, false, "max_tokens", 1))
			io.Copy(io.Discard, resp.Body)
			b.WriteString(map[int]string{200: ".", 500: "x"}[resp.StatusCode])
		}
		return b.String()
	}
	first := sequence()
	require.Len(t, first, 40)
	require.InDelta(t, 20, strings.Count(first, "x"), 12)
	require.Equal(t, first, sequence(), "same seed, same failures")
}

// TestPrefillKnob: X-Sim-Prefill sets the wait for the first event, to
// the nanosecond in virtual time.
func TestPrefillKnob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := startVirtual(t, fast())
		sent := time.Now()
		resp := v.post(t, context.Background(), "/v1/chat/completions", chatBody(true, false), "X-Sim-Prefill", "150ms")
		ev, err := newSSE(resp.Body).next()
		require.NoError(t, err)
		require.Equal(t, 150*time.Millisecond, ev.at.Sub(sent))
	})
}

// TestCalibratedDefaults checks the zero Config against the seed run:
// prefill ~7,700 tokens/s and decode ~235 tokens/s (TPOT ~4.26 ms).
func TestCalibratedDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := startVirtual(t, Config{})
		prompt := strings.Repeat("y", 4*770) // 770 tokens: 100 ms of prefill
		body := map[string]any{"messages": []any{map[string]any{"role": "user", "content": prompt}},
			"max_tokens": 48, "stream": true}
		sent := time.Now()
		resp := v.post(t, context.Background(), "/v1/chat/completions", body)
		evs, err := readAll(resp.Body)
		require.NoError(t, err)
		out := evs[1 : len(evs)-1]
		prefill := out[0].at.Sub(sent)
		tpot := out[len(out)-1].at.Sub(out[0].at) / 47
		t.Logf("prefill %v (want ~100ms), TPOT %v (want ~4.26ms)", prefill, tpot)
		// Virtual time: the prompt's framing tokens and the 1 ms prefill
		// overhead are all that separate prefill from 100 ms.
		require.InDelta(t, 100, float64(prefill.Microseconds())/1e3, 5)
		require.InDelta(t, 4.26, float64(tpot.Microseconds())/1e3, 0.01)
	})
}

func TestNewValidation(t *testing.T) {
	for _, cfg := range []Config{
		{Slots: -1},
		{PrefillTokensPerSec: -5},
		{ReasoningShare: 1.5},
		{FailRate: 2},
		{Timings: 9},
		{Engine: 7},
		{Cache: 9},
		{Release: -1},
		{Head: 4},
		{Abandon: 9},
		{BatchLock: 9},
		{BatchTokens: -1},
		{NaturalLengths: []int{}},
		{NaturalLengths: []int{300, 0}},
	} {
		_, err := New(cfg)
		require.Error(t, err, "%+v", cfg)
	}
	s, err := New(Config{})
	require.NoError(t, err)
	require.Equal(t, Config{
		Model: DefaultModel, Cache: CacheShared, Release: ReleaseLastToken, Head: HeadAdmission, Timings: TimingNone, Slots: 4,
		Abandon: AbandonStop, BatchLock: LockNone, BatchTokens: 2048, SwitchCost: -1, Metrics: MetricsVLLM, MaxQueue: 64, PrefillTokensPerSec: 7700,
		DecodeTokensPerSec: 235, TokensPerEvent: 5, BytesPerToken: 4, DefaultMaxTokens: 256,
		ReasoningShare: 0.5, CacheBlockTokens: 16, CacheBlocks: 1 << 16,
		NaturalLengths: ReferenceLengths, KeepAliveTimeout: 5 * time.Second,
	}, s.cfg)
}

func TestEndpoints(t *testing.T) {
	_, ts := start(t, Config{Model: "m1"})
	get := func(path string) (*http.Response, string) {
		resp, err := http.Get(ts.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(b)
	}
	resp, body := get("/health")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, body)

	resp, body = get("/v1/models")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	models := decode[struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}](t, body)
	require.Equal(t, "list", models.Object)
	require.Equal(t, "m1", models.Data[0].ID)

	resp, body = get("/metrics")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
	require.Contains(t, body, "# TYPE sim_requests_total counter\nsim_requests_total 0\n")
	require.Contains(t, body, `vllm:num_requests_waiting{engine="0",model_name="m1"} 0`+"\n")

	resp, _ = get("/v2/nothing")
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = get("/v1/chat/completions")
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}
