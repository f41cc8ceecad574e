package sim

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

func TestChatStream(t *testing.T) {
	for _, usage := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_usage=%v", usage), func(t *testing.T) {
			cfg := fast()
			cfg.NaturalLengths = ReferenceLengths // longer than the limit: it cuts the answer
			_, ts := start(t, cfg)
			resp := post(t, context.Background(), ts.URL+"/v1/chat/completions",
				chatBody(true, usage, "max_tokens", 100), "X-Request-Id", "r1")
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
			require.Equal(t, "r1", resp.Header.Get("X-Request-Id"))
			evs, err := readAll(resp.Body)
			require.NoError(t, err)

			require.Equal(t, "[DONE]", evs[len(evs)-1].data)
			evs = evs[:len(evs)-1]
			first := decode[map[string]any](t, evs[0].data)
			require.JSONEq(t, fmt.Sprintf(`{"id":"chatcmpl-r1","object":"chat.completion.chunk","created":%v,
				"model":%q,"choices":[{"index":0,"delta":{"role":"assistant","content":""},
				"logprobs":null,"finish_reason":null}]}`, first["created"], DefaultModel), evs[0].data)

			var u *testUsage
			if usage {
				last := decode[testChunk](t, evs[len(evs)-1].data)
				require.Empty(t, last.Choices)
				require.NotNil(t, last.Usage)
				u, evs = last.Usage, evs[:len(evs)-1]
			}
			var reasoning, content, finishes int
			var reasoningText, contentText string
			for i, ev := range evs[1:] {
				c := decode[testChunk](t, ev.data)
				require.Equal(t, "chatcmpl-r1", c.ID)
				require.Equal(t, "chat.completion.chunk", c.Object)
				require.Nil(t, c.Usage)
				require.Len(t, c.Choices, 1)
				d := c.Choices[0].Delta
				switch {
				case d.ReasoningContent != nil:
					require.Zero(t, content, "reasoning after content")
					require.Equal(t, *d.ReasoningContent, *d.Reasoning)
					reasoning++
					reasoningText += *d.ReasoningContent
				case d.Content != nil:
					content++
					contentText += *d.Content
				default:
					t.Fatalf("event %d has no delta: %s", i, ev.data)
				}
				if c.Choices[0].FinishReason != nil {
					finishes++
					require.Equal(t, "length", *c.Choices[0].FinishReason)
					require.Equal(t, len(evs)-2, i, "finish_reason before the last chunk")
				}
			}
			require.Equal(t, 1, finishes)
			require.Positive(t, reasoning)
			require.Positive(t, content)
			require.Equal(t, 50, words(reasoningText))
			require.Equal(t, 50, words(contentText))
			if usage {
				require.Equal(t, 100, u.CompletionTokens)
				require.Equal(t, 50, u.CompletionTokensDetails.ReasoningTokens)
				require.Equal(t, u.PromptTokens+u.CompletionTokens, u.TotalTokens)
				require.Equal(t, len(`user`+"\n"+`write a function`+"\n")/4, u.PromptTokens)
			}
		})
	}
}

func TestChatNonStream(t *testing.T) {
	s, ts := start(t, fast())
	resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(false, false))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	body := decodeBody[struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Role             string  `json:"role"`
				Content          *string `json:"content"`
				ReasoningContent *string `json:"reasoning_content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage testUsage `json:"usage"`
	}](t, resp)
	require.Regexp(t, `^chatcmpl-[0-9a-f]{32}$`, body.ID)
	require.Equal(t, "chat.completion", body.Object)
	require.Equal(t, DefaultModel, body.Model)
	require.Len(t, body.Choices, 1)
	msg := body.Choices[0].Message
	require.Equal(t, "assistant", msg.Role)
	require.Equal(t, "stop", body.Choices[0].FinishReason, "no limit set")
	require.Equal(t, 64, body.Usage.CompletionTokens)
	require.Equal(t, 32, body.Usage.CompletionTokensDetails.ReasoningTokens)
	require.Equal(t, 32, words(*msg.ReasoningContent))
	require.Equal(t, 32, words(*msg.Content))
	require.NotContains(t, *msg.Content, "function", "the prompt is never echoed")

	st := s.Stats()
	require.Equal(t, Stats{Requests: 1, Completed: 1, PromptTokens: int64(body.Usage.PromptTokens),
		CompletionTokens: 64}, st)
}

func TestChatReasoningOff(t *testing.T) {
	_, ts := start(t, fast())
	for name, extra := range map[string][]any{
		"reasoning_effort":     {"reasoning_effort", "none"},
		"chat_template_kwargs": {"chat_template_kwargs", map[string]any{"enable_thinking": false}},
	} {
		t.Run(name, func(t *testing.T) {
			resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(true, true, extra...))
			evs, err := readAll(resp.Body)
			require.NoError(t, err)
			for _, ev := range evs[1 : len(evs)-2] {
				c := decode[testChunk](t, ev.data)
				require.Nil(t, c.Choices[0].Delta.ReasoningContent, ev.data)
				require.NotNil(t, c.Choices[0].Delta.Content, ev.data)
			}
			u := decode[testChunk](t, evs[len(evs)-2].data).Usage
			require.Equal(t, 64, u.CompletionTokens)
			require.Zero(t, u.CompletionTokensDetails.ReasoningTokens)
		})
	}
}

func TestCompletions(t *testing.T) {
	_, ts := start(t, fast())
	body := map[string]any{"prompt": "def fib(n):", "max_tokens": 20, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	resp := post(t, context.Background(), ts.URL+"/v1/completions", body)
	evs, err := readAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "[DONE]", evs[len(evs)-1].data)
	var text string
	for _, ev := range evs[:len(evs)-2] {
		c := decode[testChunk](t, ev.data)
		require.Equal(t, "text_completion", c.Object)
		require.Regexp(t, "^cmpl-", c.ID)
		text += *c.Choices[0].Text
	}
	require.Equal(t, 20, words(text))
	u := decode[testChunk](t, evs[len(evs)-2].data).Usage
	require.Equal(t, 20, u.CompletionTokens)
	require.Equal(t, len("def fib(n):")/4, u.PromptTokens)

	body["stream"] = false
	resp = post(t, context.Background(), ts.URL+"/v1/completions", body)
	c := decodeBody[testChunk](t, resp)
	require.Equal(t, "length", *c.Choices[0].FinishReason)
	require.Equal(t, 20, words(*c.Choices[0].Text))
	require.Equal(t, 20, c.Usage.CompletionTokens)
}

func TestTimingModes(t *testing.T) {
	for _, tc := range []struct {
		mode      TimingMode
		usage     bool
		where     string // "usage", "last" or ""
		wantKey   string
		wantValue float64
	}{
		{mode: TimingNone, usage: true},
		{mode: TimingVLLM, usage: true, where: "usage", wantKey: "queue_time_ms"},
		{mode: TimingVLLM, usage: false}, // vLLM sends metrics on the usage chunk only
		{mode: TimingLlamaCpp, usage: true, where: "usage", wantKey: "predicted_n", wantValue: 64},
		{mode: TimingLlamaCpp, usage: false, where: "last", wantKey: "predicted_n", wantValue: 64},
	} {
		t.Run(fmt.Sprintf("%v/usage=%v", tc.mode, tc.usage), func(t *testing.T) {
			cfg := fast()
			cfg.Timings = tc.mode
			_, ts := start(t, cfg)
			resp := post(t, context.Background(), ts.URL+"/v1/chat/completions", chatBody(true, tc.usage))
			evs, err := readAll(resp.Body)
			require.NoError(t, err)
			found := ""
			for i, ev := range evs[:len(evs)-1] {
				c := decode[testChunk](t, ev.data)
				report := c.Metrics
				if c.Timings != nil {
					report = c.Timings
				}
				if report == nil {
					continue
				}
				require.Empty(t, found, "two chunks carry timing")
				require.Equal(t, len(evs)-2, i, "timing is on the last chunk")
				found = "last"
				if c.Usage != nil {
					found = "usage"
				}
				require.Contains(t, report, tc.wantKey)
				if tc.wantValue != 0 {
					require.Equal(t, tc.wantValue, report[tc.wantKey])
				}
			}
			require.Equal(t, tc.where, found)
		})
	}
}

// TestTimingModesNonStream runs in a synctest bubble: the reported prefill
// is the knob's, exactly.
func TestTimingModesNonStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := fast()
		cfg.Timings = TimingVLLM
		v := startVirtual(t, cfg)
		resp := v.post(t, context.Background(), "/v1/chat/completions", chatBody(false, false),
			"X-Sim-Prefill", "30ms")
		m := decodeBody[testChunk](t, resp).Metrics
		for _, k := range []string{"time_to_first_token_ms", "generation_time_ms", "queue_time_ms",
			"mean_itl_ms", "tokens_per_second", "prefill_time_ms", "decode_time_ms"} {
			require.Contains(t, m, k)
		}
		require.Equal(t, 30.0, m["prefill_time_ms"])
		require.Equal(t, m["prefill_time_ms"], m["time_to_first_token_ms"])
	})
}

func TestTimingModeText(t *testing.T) {
	for _, m := range []TimingMode{TimingAuto, TimingNone, TimingVLLM, TimingLlamaCpp} {
		b, err := m.MarshalText()
		require.NoError(t, err)
		var got TimingMode
		require.NoError(t, got.UnmarshalText(b))
		require.Equal(t, m, got)
	}
	var m TimingMode
	require.Error(t, m.UnmarshalText([]byte("tgi")))
}

func TestChatPrompt(t *testing.T) {
	body := `{"tools":[{"type":"function","function":{"name":"ls"}}],"messages":[
		{"role":"system","content":"sys"},
		{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},
		{"role":"tool","content":"out"}]}`
	var j job
	require.NoError(t, (&chat{}).parse([]byte(body), &j))
	require.Equal(t, `[{"type":"function","function":{"name":"ls"}}]`+"\n"+
		"system\nsys\n"+
		`user`+"\n"+`a{"type":"image_url","image_url":{"url":"u"}}`+"\n"+
		"assistant\n\n"+`[{"id":"1"}]`+"\n"+
		"tool\nout\n", j.prompt)
	require.True(t, j.reasoning)
	require.False(t, j.limited)
}
