package sim

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// names returns the event names, collapsing runs of the same delta event.
func names(t *testing.T, evs []sseEvent) []string {
	t.Helper()
	var out []string
	for _, ev := range evs {
		typ := decode[map[string]any](t, ev.data)["type"]
		require.Equal(t, ev.name, typ, "event line and type agree")
		if len(out) > 0 && strings.HasSuffix(ev.name, "delta") && out[len(out)-1] == ev.name+"*" {
			continue
		}
		if strings.HasSuffix(ev.name, ".delta") || ev.name == "content_block_delta" {
			out = append(out, ev.name+"*")
			continue
		}
		out = append(out, ev.name)
	}
	return out
}

type testRespObject struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Output []struct {
		Type    string `json:"type"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		TotalTokens        int `json:"total_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
	} `json:"usage"`
}

type testRespEvent struct {
	Type           string         `json:"type"`
	SequenceNumber int            `json:"sequence_number"`
	Delta          string         `json:"delta"`
	Response       testRespObject `json:"response"`
}

func TestResponses(t *testing.T) {
	_, ts := start(t, fast())
	body := map[string]any{
		"instructions":      "be brief",
		"input":             []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "hi"}}}},
		"max_output_tokens": 40,
		"stream":            true,
	}
	resp := post(t, context.Background(), ts.URL+"/v1/responses", body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs, err := readAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added",
		"response.reasoning_text.delta*", "response.reasoning_text.done",
		"response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added",
		"response.output_text.delta*", "response.output_text.done",
		"response.content_part.done", "response.output_item.done",
		"response.completed",
	}, names(t, evs))

	var reasoning, text string
	for i, ev := range evs {
		e := decode[testRespEvent](t, ev.data)
		require.Equal(t, i, e.SequenceNumber)
		switch e.Type {
		case "response.reasoning_text.delta":
			reasoning += e.Delta
		case "response.output_text.delta":
			text += e.Delta
		}
	}
	require.Equal(t, 20, words(reasoning))
	require.Equal(t, 20, words(text))
	done := decode[testRespEvent](t, evs[len(evs)-1].data).Response
	require.Equal(t, "completed", done.Status)
	require.Regexp(t, "^resp_", done.ID)
	require.Equal(t, 40, done.Usage.OutputTokens)
	require.Equal(t, 20, done.Usage.OutputTokensDetails.ReasoningTokens)
	require.Equal(t, len("system\nbe brief\nuser\nhi\n")/4, done.Usage.InputTokens)
	require.Equal(t, reasoning, done.Output[0].Content[0].Text)
	require.Equal(t, text, done.Output[1].Content[0].Text)

	resp = post(t, context.Background(), ts.URL+"/v1/responses", map[string]any{
		"input": "hi", "max_output_tokens": 10, "reasoning": map[string]any{"effort": "none"}})
	full := decodeBody[testRespObject](t, resp)
	require.Equal(t, "completed", full.Status)
	require.Len(t, full.Output, 1)
	require.Equal(t, "message", full.Output[0].Type)
	require.Equal(t, 10, words(full.Output[0].Content[0].Text))
	require.Equal(t, 10, full.Usage.OutputTokens)
	require.Equal(t, full.Usage.InputTokens+10, full.Usage.TotalTokens)
}

type testAnthEvent struct {
	Type    string `json:"type"`
	Index   *int   `json:"index"`
	Message struct {
		ID    string `json:"id"`
		Usage struct {
			InputTokens          int `json:"input_tokens"`
			CacheReadInputTokens int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	} `json:"message"`
	ContentBlock struct {
		Type string `json:"type"`
	} `json:"content_block"`
	Delta struct {
		Type       string `json:"type"`
		Thinking   string `json:"thinking"`
		Text       string `json:"text"`
		Signature  string `json:"signature"`
		StopReason string `json:"stop_reason"`
	} `json:"delta"`
	Usage struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

func TestMessages(t *testing.T) {
	_, ts := start(t, fast())
	system := strings.Repeat("You are Claude Code. ", 40)
	body := map[string]any{
		"system":     []any{map[string]any{"type": "text", "text": system}},
		"messages":   []any{map[string]any{"role": "user", "content": "hello there"}},
		"max_tokens": 30,
		"thinking":   map[string]any{"type": "enabled", "budget_tokens": 1024},
		"stream":     true,
	}
	resp := post(t, context.Background(), ts.URL+"/v1/messages", body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs, err := readAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, []string{
		"message_start", "content_block_start", "ping", "content_block_delta*", "content_block_stop",
		"content_block_start", "content_block_delta*", "content_block_stop",
		"message_delta", "message_stop",
	}, names(t, evs))

	var kinds []string
	var thinking, text string
	for _, ev := range evs {
		e := decode[testAnthEvent](t, ev.data)
		switch e.Type {
		case "content_block_start":
			kinds = append(kinds, e.ContentBlock.Type)
		case "content_block_delta":
			thinking += e.Delta.Thinking
			text += e.Delta.Text
			if e.Delta.Type == "signature_delta" {
				require.NotEmpty(t, e.Delta.Signature)
				require.Equal(t, 0, *e.Index)
			}
		}
	}
	require.Equal(t, []string{"thinking", "text"}, kinds)
	require.Equal(t, 15, words(thinking))
	require.Equal(t, 15, words(text))
	start := decode[testAnthEvent](t, evs[0].data).Message
	require.Regexp(t, "^msg_", start.ID)
	prompt := len("system\n"+system+"\nuser\nhello there\n") / 4
	require.Equal(t, prompt, start.Usage.InputTokens+start.Usage.CacheReadInputTokens)
	require.Zero(t, start.Usage.CacheReadInputTokens)
	end := decode[testAnthEvent](t, evs[len(evs)-2].data)
	require.Equal(t, "max_tokens", end.Delta.StopReason)
	require.Equal(t, 30, end.Usage.OutputTokens)

	// Again without streaming: the cached system prompt is excluded from
	// input_tokens, as Anthropic counts it.
	body["stream"] = false
	resp = post(t, context.Background(), ts.URL+"/v1/messages", body)
	msg := decodeBody[struct {
		Type    string `json:"type"`
		Content []struct {
			Type     string `json:"type"`
			Thinking string `json:"thinking"`
			Text     string `json:"text"`
		} `json:"content"`
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens          int `json:"input_tokens"`
			CacheReadInputTokens int `json:"cache_read_input_tokens"`
			OutputTokens         int `json:"output_tokens"`
		} `json:"usage"`
	}](t, resp)
	require.Equal(t, "message", msg.Type)
	require.Equal(t, "thinking", msg.Content[0].Type)
	require.Equal(t, "text", msg.Content[1].Type)
	require.Positive(t, msg.Usage.CacheReadInputTokens)
	require.Equal(t, prompt, msg.Usage.InputTokens+msg.Usage.CacheReadInputTokens)
	require.Equal(t, 30, msg.Usage.OutputTokens)
}

func TestMessagesErrors(t *testing.T) {
	_, ts := start(t, fast())
	resp := post(t, context.Background(), ts.URL+"/v1/messages",
		map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}, "max_tokens": 5},
		"X-Sim-Status", "529")
	require.Equal(t, 529, resp.StatusCode)
	e := decodeBody[map[string]any](t, resp)
	require.Equal(t, "error", e["type"])
	require.Equal(t, "overloaded_error", e["error"].(map[string]any)["type"])
}
