package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fast is a Config quick enough for tests: prefill ~free, 64 tokens in
// ~13 ms. Every answer's natural length is 64, so a request without a
// limit gets 64 tokens and "stop"; one with a smaller limit is cut by it.
func fast() Config {
	return Config{
		PrefillTokensPerSec: 1e6,
		DecodeTokensPerSec:  5000,
		NaturalLengths:      []int{64},
		DefaultMaxTokens:    64,
		Seed:                1,
	}
}

func start(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(cfg)
	require.NoError(t, err)
	ts := httptest.NewUnstartedServer(s)
	ts.Config = s.HTTPServer()
	ts.Start()
	t.Cleanup(ts.Close)
	return s, ts
}

// post sends body as JSON; headers alternate names and values.
func post(t *testing.T, ctx context.Context, url string, body any, headers ...string) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func chatBody(stream, usage bool, extra ...any) map[string]any {
	b := map[string]any{
		"model":    "anything",
		"messages": []any{map[string]any{"role": "user", "content": "write a function"}},
		"stream":   stream,
	}
	if usage {
		b["stream_options"] = map[string]any{"include_usage": true}
	}
	for i := 0; i+1 < len(extra); i += 2 {
		b[extra[i].(string)] = extra[i+1]
	}
	return b
}

// sseEvent is one parsed event, stamped when the test read it.
type sseEvent struct {
	name string
	data string
	at   time.Time
}

// sseReader parses text/event-stream by hand, so these tests depend on no
// other anvilproxy package and check the bytes the proxy would see.
type sseReader struct{ br *bufio.Reader }

func newSSE(r io.Reader) *sseReader { return &sseReader{br: bufio.NewReader(r)} }

func (r *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	for {
		line, err := r.br.ReadString('\n')
		if err != nil {
			if err == io.EOF && (line != "" || ev.data != "") {
				err = io.ErrUnexpectedEOF
			}
			return ev, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			ev.at = time.Now()
			return ev, nil
		case strings.HasPrefix(line, "event: "):
			ev.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: ") && ev.data == "":
			ev.data = line[len("data: "):]
		default:
			return ev, fmt.Errorf("unexpected SSE line %q", line)
		}
	}
}

// readAll returns the events up to the end of the stream and the error that
// ended it, nil for a clean EOF.
func readAll(r io.Reader) ([]sseEvent, error) {
	sr := newSSE(r)
	var evs []sseEvent
	for {
		ev, err := sr.next()
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func decode[T any](t *testing.T, data string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(data), &v), data)
	return v
}

func decodeBody[T any](t *testing.T, resp *http.Response) T {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return decode[T](t, string(b))
}

type testUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

type testChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text  *string `json:"text"`
		Delta struct {
			Role             *string `json:"role"`
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
			Reasoning        *string `json:"reasoning"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage   *testUsage     `json:"usage"`
	Metrics map[string]any `json:"metrics"`
	Timings map[string]any `json:"timings"`
}

// words counts filler tokens: one word and a space each.
func words(s string) int { return len(strings.Fields(s)) }

func waitStats(t *testing.T, s *Server, ok func(Stats) bool) {
	t.Helper()
	require.Eventually(t, func() bool { return ok(s.Stats()) }, 5*time.Second, time.Millisecond,
		"stats never matched: %+v", s.Stats())
}

func idle(st Stats) bool { return st.Active == 0 && st.Queued == 0 }
