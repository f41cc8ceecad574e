package proxy

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy/retry"
)

// stampTransport records when each attempt started and when its response
// ended, as the client saw them.
type stampTransport struct {
	mu          sync.Mutex
	start, done []time.Time
	rt          http.Transport // its own pool: a shared one could hold a dead connection from an earlier test's server
}

func (s *stampTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.start = append(s.start, time.Now())
	s.mu.Unlock()
	resp, err := s.rt.RoundTrip(r)
	s.mu.Lock()
	s.done = append(s.done, time.Now())
	s.mu.Unlock()
	return resp, err
}

// TestOpenAISDKRetriesCounted drives the official Go SDK, with its built-in
// retries, against the sim answering 429 to the first two attempts of each
// request: the proxy counts three attempts of one logical request, each
// retry after a 429, with gaps equal to the SDK's backoff sleeps.
func TestOpenAISDKRetriesCounted(t *testing.T) {
	_, up := startSim(t, fastSim)
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up}, log)
	stamps := &stampTransport{}
	defer stamps.rt.CloseIdleConnections()
	client := openai.NewClient(
		option.WithBaseURL(base+"/v1"),
		option.WithAPIKey("sk-test"),
		option.WithHTTPClient(&http.Client{Transport: stamps}),
		option.WithMaxRetries(2),
		option.WithHeader("X-Sim-Fail-Attempts", "2"),
	)
	resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     "qwen",
		MaxTokens: openai.Int(8),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	})
	require.NoError(t, err)
	require.Equal(t, int64(8), resp.Usage.CompletionTokens)

	var trs []Trace
	for i := 0; i < 3; i++ {
		trs = append(trs, log.next(t))
	}
	logical := trs[0].Retry.LogicalID
	for i, tr := range trs {
		require.Equal(t, logical, tr.Retry.LogicalID, "attempt %d", i)
		require.Equal(t, i, tr.Retry.Attempt)
		if i == 0 {
			require.False(t, tr.Retry.Retry)
			require.Equal(t, 429, tr.Status)
			continue
		}
		require.True(t, tr.Retry.Retry)
		require.True(t, tr.Retry.ByHeader, "the SDK sends X-Stainless-Retry-Count")
		require.Equal(t, retry.Ending429, tr.Retry.PrevOutcome)
		// The client and the proxy stamp the same backoff at two ends of a
		// loopback hop each; on a loaded machine each hop can take tens of
		// milliseconds. The SDK's backoffs are 0.5 s and more.
		backoff := stamps.start[i].Sub(stamps.done[i-1])
		require.InDelta(t, backoff.Seconds(), tr.Retry.Gap.Seconds(), 0.1, "attempt %d: gap %v, SDK slept %v", i, tr.Retry.Gap, backoff)
		require.Less(t, tr.Retry.Gap, tr.Retry.SincePrev, "attempt %d: the gap runs from the previous attempt's end, not its start", i)
	}
	require.Equal(t, 200, trs[2].Status)
	st := p.Retries().Stats()
	require.Equal(t, int64(3), st.Attempts)
	require.Equal(t, int64(1), st.Logical)
	require.Equal(t, int64(2), st.RetriesBy[retry.Ending429])
	require.InDelta(t, 3.0, st.Amplification, 1e-9)
}

// TestPlainResendAfterAbortWastesTokens: a client without the SDK header
// that gives up mid-stream and sends the same body again is a retry found
// by body hash, and the tokens of the abandoned stream count as wasted.
func TestPlainResendAfterAbortWastesTokens(t *testing.T) {
	_, up := startSim(t, fastSim)
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up}, log)
	body := `{"stream":true,"stream_options":{"include_usage":true},"max_tokens":400,"messages":[{"role":"user","content":"same"}]}`

	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Sim-Event-Gap", "5ms")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 10; i++ {
		_, err := br.ReadString('\n')
		require.NoError(t, err)
	}
	resp.Body.Close() // the client's own timeout
	first := log.next(t)
	require.Equal(t, ErrClientGone, first.ErrKind)

	// A different body from the same client is not a retry.
	resp, err = http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(strings.Replace(body, "same", "other", 1)))
	require.NoError(t, err)
	resp.Body.Close()
	require.False(t, log.next(t).Retry.Retry)

	resp, err = http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	resp.Body.Close()
	second := log.next(t)
	require.True(t, second.Retry.Retry)
	require.False(t, second.Retry.ByHeader)
	require.Equal(t, first.Retry.LogicalID, second.Retry.LogicalID)
	require.Equal(t, retry.EndingClientAbortMidStream, second.Retry.PrevOutcome)
	require.Greater(t, second.Retry.WastedCompletion, int64(0), "the abandoned stream's tokens are wasted")
	require.Equal(t, int64(2), p.Retries().Stats().Logical)
}
