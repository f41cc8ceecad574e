package sim

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// ollamaObject is a line of ollama's native stream, or its whole answer.
type ollamaObject struct {
	Model    string  `json:"model"`
	Response *string `json:"response"`
	Thinking string  `json:"thinking"`
	Message  *struct {
		Role     string `json:"role"`
		Content  string `json:"content"`
		Thinking string `json:"thinking"`
	} `json:"message"`
	Done               bool   `json:"done"`
	DoneReason         string `json:"done_reason"`
	Choices            any    `json:"choices"`
	TotalDuration      int64  `json:"total_duration"`
	LoadDuration       int64  `json:"load_duration"`
	PromptEvalCount    int    `json:"prompt_eval_count"`
	PromptEvalDuration int64  `json:"prompt_eval_duration"`
	EvalCount          int    `json:"eval_count"`
	EvalDuration       int64  `json:"eval_duration"`
}

// text returns the object's content and thinking, of either route.
func (o *ollamaObject) text() (content, thinking string) {
	if o.Message != nil {
		return o.Message.Content, o.Message.Thinking
	}
	if o.Response != nil {
		content = *o.Response
	}
	return content, o.Thinking
}

type ndjsonLine struct {
	data string
	at   time.Time
}

// readLines splits an NDJSON body by hand, stamping each line on arrival.
func readLines(t *testing.T, r io.Reader) []ndjsonLine {
	t.Helper()
	br := bufio.NewReader(r)
	var out []ndjsonLine
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			require.Empty(t, line, "every line ends in LF")
			return out
		}
		require.NoError(t, err)
		out = append(out, ndjsonLine{data: strings.TrimSuffix(line, "\n"), at: time.Now()})
	}
}

// TestOllamaNativeStream: /api/generate and /api/chat stream NDJSON as
// ollama does: lines with the new text and "done": false, then one done
// line with done_reason and the Metrics, which are the sim's own truth
// measured as ollama measures it (prompt_eval_duration from slot start to
// the first token, eval_duration from it to the done line, eval_count
// with the end-of-sequence step). Under synctest the clocks are exact.
func TestOllamaNativeStream(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		tokens     int
		reason     string
		thinking   bool
	}{
		{"generate", "/api/generate", map[string]any{"model": "m", "prompt": strings.Repeat("p", 400)}, 64, "stop", false},
		{"generate/limit", "/api/generate", map[string]any{"model": "m", "prompt": strings.Repeat("p", 400), "options": map[string]any{"num_predict": 10}}, 10, "length", false},
		{"chat/think", "/api/chat", map[string]any{"model": "m", "think": true, "messages": []any{map[string]any{"role": "user", "content": strings.Repeat("c", 400)}}}, 64, "stop", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := fast()
				cfg.Engine = EngineOllama
				cfg.Slots = 1
				v := startVirtual(t, cfg)
				// A first request holds the one slot, so the second queues.
				first := make(chan struct{})
				go func() {
					defer close(first)
					resp := v.post(t, context.Background(), tc.path, tc.body, "X-Request-Id", "first", "X-Sim-Event-Gap", "5ms")
					_, _ = io.Copy(io.Discard, resp.Body)
				}()
				time.Sleep(time.Millisecond)
				resp := v.post(t, context.Background(), tc.path, tc.body, "X-Request-Id", "o", "X-Sim-Event-Gap", "5ms")
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
				lines := readLines(t, resp.Body)
				<-first
				require.Greater(t, len(lines), 2)
				var content, thinking strings.Builder
				for _, l := range lines[:len(lines)-1] {
					o := decode[ollamaObject](t, l.data)
					require.False(t, o.Done)
					require.Nil(t, o.Choices)
					require.Zero(t, o.EvalCount)
					c, th := o.text()
					content.WriteString(c)
					thinking.WriteString(th)
				}
				final := decode[ollamaObject](t, lines[len(lines)-1].data)
				require.True(t, final.Done)
				require.Equal(t, tc.reason, final.DoneReason)
				require.Equal(t, tc.path == "/api/chat", final.Message != nil)
				if tc.thinking {
					require.Positive(t, words(thinking.String()))
					require.Equal(t, tc.tokens, words(thinking.String())+words(content.String()))
				} else {
					require.Equal(t, tc.tokens, words(content.String()))
					require.Empty(t, thinking.String())
				}

				tr := truthOf(t, v.s, "o")
				require.Equal(t, OutcomeCompleted, tr.Outcome)
				require.Positive(t, tr.Queue, "it waited for the first request's slot")
				require.Equal(t, tr.PromptTokens, final.PromptEvalCount, "the prompt, cached tokens included")
				wantEval := tc.tokens + 1 // ollama counts the end-of-sequence step
				if tc.reason == "length" {
					wantEval = tc.tokens
				}
				require.Equal(t, wantEval, final.EvalCount)
				done := lines[len(lines)-1].at
				require.Equal(t, done.Sub(tr.Arrived), time.Duration(final.TotalDuration))
				require.Equal(t, tr.FirstToken.Sub(tr.Admitted), time.Duration(final.PromptEvalDuration))
				require.Equal(t, done.Sub(tr.FirstToken), time.Duration(final.EvalDuration))
				// What the durations leave of the total is the queue: the
				// wait before the slot started.
				rest := time.Duration(final.TotalDuration - final.LoadDuration - final.PromptEvalDuration - final.EvalDuration)
				require.Equal(t, tr.Queue, rest+time.Duration(final.LoadDuration))
				require.Equal(t, done, tr.Released, "the slot goes with the done line")
			})
		})
	}
}

// TestOllamaNativeWhole: "stream": false answers the done object with the
// whole text; a body without messages is a 400 with ollama's error shape.
func TestOllamaNativeWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineOllama
		v := startVirtual(t, cfg)
		resp := v.post(t, context.Background(), "/api/chat", map[string]any{"model": "m", "stream": false,
			"messages": []any{map[string]any{"role": "user", "content": strings.Repeat("w", 400)}}})
		require.Contains(t, resp.Header.Get("Content-Type"), "application/json")
		o := decodeBody[ollamaObject](t, resp)
		require.True(t, o.Done)
		require.Equal(t, 64, words(o.Message.Content))
		require.Equal(t, 65, o.EvalCount)
		require.Positive(t, o.PromptEvalDuration)
		require.Equal(t, o.TotalDuration, o.PromptEvalDuration+o.EvalDuration, "no queue, no load: virtual time")

		resp = v.post(t, context.Background(), "/api/chat", map[string]any{"model": "m", "messages": []any{}})
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		e := decodeBody[map[string]string](t, resp)
		require.NotEmpty(t, e["error"])
	})
}

// TestOllamaNativeTruncated: a truncated stream ends cleanly without its
// done line, as ollama's does when it stops a repeating generation.
func TestOllamaNativeTruncated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Engine = EngineOllama
		v := startVirtual(t, cfg)
		resp := v.post(t, context.Background(), "/api/generate", map[string]any{"model": "m", "prompt": "hello"},
			"X-Sim-Truncate-After-Events", "3")
		lines := readLines(t, resp.Body)
		require.Len(t, lines, 3)
		for _, l := range lines {
			require.False(t, decode[ollamaObject](t, l.data).Done)
		}
	})
}
