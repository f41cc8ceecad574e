package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

func startSim(t *testing.T, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	s, err := sim.New(cfg)
	require.NoError(t, err)
	// The sim's own http.Server: it closes idle keep-alive connections
	// after 5 s, as uvicorn does, so every test meets that.
	hs := httptest.NewUnstartedServer(s)
	hs.Config = s.HTTPServer()
	hs.Start()
	t.Cleanup(hs.Close)
	return s, hs.URL
}

// fastSim is the sim at rates that keep tests short.
var fastSim = sim.Config{PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 5000}

func TestTraceAgainstSim(t *testing.T) {
	s, up := startSim(t, fastSim)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up}, log)
	body := `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"max_tokens":40,` +
		`"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}]}`

	for i, wantCold := range []bool{true, false} {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(string(raw), "data: [DONE]\n\n"))

		tr := log.next(t)
		require.Equal(t, wantCold, tr.Cold, "request %d", i)
		require.Equal(t, RouteChat, tr.Route)
		require.Equal(t, "m1", tr.Model)
		require.True(t, tr.Stream)
		require.Equal(t, 200, tr.Status)
		require.Equal(t, ErrNone, tr.ErrKind)
		require.False(t, tr.Truncated)
		require.Equal(t, int64(len(raw)), tr.RespBytes)
		stamps := []time.Time{tr.Recv, tr.Sent, tr.Headers, tr.FirstEvent, tr.FirstOutput, tr.FirstContent, tr.LastToken, tr.End, tr.ClientDone}
		for j := 1; j < len(stamps); j++ {
			require.False(t, stamps[j].IsZero(), "stamp %d missing", j)
			require.False(t, stamps[j].Before(stamps[j-1]), "stamp %d before stamp %d", j, j-1)
		}
		require.True(t, tr.FirstOutput.Before(tr.FirstContent), "reasoning comes first: TTFO < TTFT")
		require.True(t, tr.UsageSeen)
		require.Equal(t, int64(40), tr.CompletionTokens)
		require.Greater(t, tr.PromptTokens, int64(200))
		require.Greater(t, tr.ReasoningEvents, 0)
		require.Greater(t, tr.ContentEvents, 0)
		require.Equal(t, 3, tr.EmptyEvents, "the role chunk, the usage chunk and [DONE] carry no output")
		if i == 1 {
			require.Greater(t, tr.CachedTokens, int64(0), "the second identical prompt hits the sim's prefix cache")
		}
	}
	require.Equal(t, int64(2), s.Stats().Completed)
}

func TestNonStreamUsageAgainstSim(t *testing.T) {
	_, up := startSim(t, fastSim)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up}, log)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":12,"messages":[{"role":"user","content":"hi there"}]}`))
	require.NoError(t, err)
	var got struct {
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	resp.Body.Close()
	tr := log.next(t)
	require.False(t, tr.Stream)
	require.True(t, tr.UsageSeen)
	require.Equal(t, got.Usage.PromptTokens, tr.PromptTokens)
	require.Equal(t, got.Usage.CompletionTokens, tr.CompletionTokens)
}

// TestSimStopsWhenClientLeaves: the engine observes the client's
// disconnect and stops generating at once: within a second here, room for
// a loaded machine and far inside the 8 s the 2,000 tokens would take.
func TestSimStopsWhenClientLeaves(t *testing.T) {
	s, up := startSim(t, sim.Config{PrefillTokensPerSec: 1e6}) // default decode: 235 tok/s
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up}, log)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"go"}]}`))
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 6; i++ { // a few events in
		_, err := br.ReadString('\n')
		require.NoError(t, err)
	}
	left := time.Now()
	resp.Body.Close()
	select {
	case ev := <-s.Aborts():
		require.Equal(t, sim.PhaseDecode, ev.Phase)
		require.Less(t, ev.At.Sub(left), time.Second, "the engine kept generating %v after the client left", ev.At.Sub(left))
		require.Less(t, ev.Tokens, 2000)
	case <-time.After(5 * time.Second):
		t.Fatal("the engine never noticed the client leaving")
	}
	tr := log.next(t)
	require.Equal(t, ErrClientGone, tr.ErrKind)
	require.Equal(t, int64(1), s.Stats().Aborted)
}

func TestSimErrorsPassThrough(t *testing.T) {
	_, up := startSim(t, fastSim)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up}, log)
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Sim-Status", "429")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 429, resp.StatusCode)
	tr := log.next(t)
	require.Equal(t, 429, tr.Status)
	require.True(t, tr.Failed())
}
