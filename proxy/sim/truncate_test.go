package sim

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// truncCase is one protocol's truncated stream: how many events open it
// and which events only a complete stream has.
type truncCase struct {
	path    string
	body    map[string]any
	opening int      // events before the first output event
	output  []string // names of output events (SSE event line, or "" for data-only)
	never   []string // substrings only a finished stream contains
}

var truncCases = []truncCase{
	{"/v1/chat/completions", chatBody(true, true), 1, []string{""},
		[]string{`"finish_reason":"`, `"usage"`, "[DONE]"}},
	{"/v1/completions", map[string]any{"prompt": "def f():", "stream": true, "stream_options": map[string]any{"include_usage": true}}, 0, []string{""},
		[]string{`"finish_reason":"`, `"usage"`, "[DONE]"}},
	{"/v1/messages", map[string]any{"stream": true, "max_tokens": 8192, "thinking": map[string]any{"type": "enabled"},
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}, 1, []string{"content_block_delta"},
		[]string{"message_delta", "message_stop", "stop_reason\":\""}},
	{"/v1/responses", map[string]any{"stream": true, "input": "hi"}, 2, []string{"response.reasoning_text.delta", "response.output_text.delta"},
		[]string{"response.completed", `"usage":{`}},
}

// readTruncated reads a stream that must end cleanly (chunked terminator,
// no error) and returns its events and the number of output events.
func readTruncated(t *testing.T, tc truncCase, resp *http.Response) ([]sseEvent, int) {
	t.Helper()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, []string{"chunked"}, resp.TransferEncoding)
	evs, err := readAll(resp.Body)
	require.NoError(t, err, "a truncated stream ends cleanly, unlike X-Sim-Fail-After-Events")
	require.False(t, resp.Close, "the connection stays usable")
	outputs := 0
	for i, ev := range evs {
		for _, never := range tc.never {
			require.NotContains(t, ev.name+ev.data, never, tc.path)
		}
		for _, name := range tc.output {
			if i >= tc.opening && ev.name == name {
				outputs++
			}
		}
	}
	return evs, outputs
}

func TestTruncateAfterEvents(t *testing.T) {
	for _, tc := range truncCases {
		for _, after := range []int{0, 3, 100000} {
			t.Run(fmt.Sprintf("%s/%d", tc.path, after), func(t *testing.T) {
				s, ts := start(t, fast())
				id := "trunc"
				resp := post(t, context.Background(), ts.URL+tc.path, tc.body,
					"X-Sim-Truncate-After-Events", fmt.Sprint(after), "X-Request-Id", id)
				evs, outputs := readTruncated(t, tc, resp)
				tr, ok := s.Truth(id)
				require.True(t, ok)
				require.Equal(t, OutcomeTruncated, tr.Outcome)
				require.Equal(t, int64(1), s.Stats().Truncated)
				require.Zero(t, s.Stats().Completed)
				switch after {
				case 0:
					require.Zero(t, outputs)
					require.Zero(t, tr.CompletionTokens)
					require.GreaterOrEqual(t, len(evs), tc.opening)
				case 3:
					require.Equal(t, 3, outputs)
					require.Positive(t, tr.CompletionTokens)
				default: // beyond the answer: everything but the final output event
					require.Less(t, tr.CompletionTokens, 64)
					require.Greater(t, tr.CompletionTokens, 64-2*5)
				}
			})
		}
	}
}

func TestTruncateNonStream(t *testing.T) {
	s, ts := start(t, fast())
	resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(false, false), "X-Sim-Truncate-After-Events", "1")
	c := decodeBody[testChunk](t, resp)
	require.Equal(t, "stop", *c.Choices[0].FinishReason, "a non-stream answer is never truncated")
	require.Equal(t, 64, c.Usage.CompletionTokens)
	require.Equal(t, int64(0), s.Stats().Truncated)
}

// TestTruncateRate truncates a seeded share of streams, each after part of
// its answer, and never a non-stream answer.
func TestTruncateRate(t *testing.T) {
	run := func() (truncated []int) {
		cfg := fast()
		cfg.TruncateRate = 0.3
		cfg.DecodeTokensPerSec = 1e5
		s, ts := start(t, cfg)
		for i := range 60 {
			id := fmt.Sprint("r", i)
			resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(true, true), "X-Request-Id", id)
			evs, err := readAll(resp.Body)
			require.NoError(t, err)
			tr, _ := s.Truth(id)
			if tr.Outcome == OutcomeTruncated {
				require.NotEqual(t, "[DONE]", evs[len(evs)-1].data)
				require.Positive(t, tr.CompletionTokens, "at least one token")
				require.Less(t, tr.CompletionTokens, 64, "never the whole answer")
				truncated = append(truncated, i)
				continue
			}
			require.Equal(t, OutcomeCompleted, tr.Outcome)
			require.Equal(t, "[DONE]", evs[len(evs)-1].data)
		}
		require.Equal(t, int64(len(truncated)), s.Stats().Truncated)
		return truncated
	}
	first := run()
	t.Logf("%d of 60 streams truncated at rate 0.3", len(first))
	require.InDelta(t, 18, len(first), 10)
	require.Equal(t, first, run(), "deterministic given the seed")
}
