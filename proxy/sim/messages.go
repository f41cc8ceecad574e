package sim

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
)

// messages renders POST /v1/messages (the Anthropic Messages API) as
// Anthropic streams it, each event with its "event:" line: message_start
// (usage.input_tokens excludes cache reads, which are
// cache_read_input_tokens), then per content block (thinking, then text)
// content_block_start, content_block_delta events (thinking_delta, then a
// signature_delta; text_delta), content_block_stop, with a ping after the
// first block starts; then message_delta with stop_reason and the cumulative
// output_tokens, then message_stop.
type messages struct {
	cfg   *Config
	j     *job
	cur   string // type of the open content block, "" if none
	index int    // index of the open block, or of the next one
	pings int
}

func newMessages(s *Server) protocol { return &messages{cfg: &s.cfg} }

func (*messages) prefix() string { return "msg_" }

type messagesRequest struct {
	System   json.RawMessage `json:"system"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools     json.RawMessage `json:"tools"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
	Thinking  struct {
		Type string `json:"type"`
	} `json:"thinking"`
}

func (m *messages) parse(body []byte, j *job) error {
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return err
	}
	if len(req.Messages) == 0 {
		return errors.New("messages must not be empty")
	}
	var b promptBuilder
	b.raw(req.Tools)
	if len(req.System) > 0 {
		if err := b.message("system", req.System); err != nil {
			return err
		}
	}
	for _, msg := range req.Messages {
		if err := b.message(msg.Role, msg.Content); err != nil {
			return err
		}
	}
	j.prompt = b.String()
	j.maxTokens, j.limited = tokenLimit(req.MaxTokens)
	j.reasoning = req.Thinking.Type == "enabled" || req.Thinking.Type == "adaptive"
	j.stream = req.Stream
	m.j = j
	return nil
}

type anthMessage struct {
	ID           string      `json:"id"`
	Type         string      `json:"type"`
	Role         string      `json:"role"`
	Model        string      `json:"model"`
	Content      []anthBlock `json:"content"`
	StopReason   *string     `json:"stop_reason"`
	StopSequence *string     `json:"stop_sequence"`
	Usage        anthUsage   `json:"usage"`
}

// anthUsage is the Messages usage object; the cache fields are nil when
// the cache is unreported, as from ollama's /v1/messages.
type anthUsage struct {
	InputTokens              int  `json:"input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens,omitempty"`
	OutputTokens             int  `json:"output_tokens"`
}

type anthBlock struct {
	Type      string  `json:"type"`
	Thinking  *string `json:"thinking,omitempty"`
	Signature *string `json:"signature,omitempty"`
	Text      *string `json:"text,omitempty"`
}

type anthEvent struct {
	Type         string       `json:"type"`
	Message      *anthMessage `json:"message,omitempty"`
	Index        *int         `json:"index,omitempty"`
	ContentBlock *anthBlock   `json:"content_block,omitempty"`
	Delta        any          `json:"delta,omitempty"`
	Usage        *anthOutput  `json:"usage,omitempty"`
}

type anthDelta struct {
	Type      string `json:"type"`
	Thinking  string `json:"thinking,omitempty"`
	Text      string `json:"text,omitempty"`
	Signature string `json:"signature,omitempty"`
}

type anthStop struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

type anthOutput struct {
	OutputTokens int `json:"output_tokens"`
}

func (m *messages) stopReason() string {
	if m.j.limited {
		return "max_tokens"
	}
	return "end_turn"
}

// signature stands in for the opaque signature of a thinking block.
func (m *messages) signature() string {
	return base64.StdEncoding.EncodeToString([]byte("anvilproxy-sim:" + m.j.base))
}

func newAnthUsage(j *job, res *result) anthUsage {
	if j.hideCached {
		return anthUsage{InputTokens: res.promptTokens, OutputTokens: res.completionTokens}
	}
	created, read := 0, res.cachedTokens
	return anthUsage{
		InputTokens:              res.promptTokens - res.cachedTokens,
		CacheCreationInputTokens: &created,
		CacheReadInputTokens:     &read,
		OutputTokens:             res.completionTokens,
	}
}

func (m *messages) open(e *eventWriter, res *result) error {
	usage := newAnthUsage(m.j, res)
	usage.OutputTokens = 1 // as Anthropic sends before any output
	return e.send("message_start", &anthEvent{Type: "message_start", Message: &anthMessage{
		ID:      m.j.id,
		Type:    "message",
		Role:    "assistant",
		Model:   m.cfg.Model,
		Content: []anthBlock{},
		Usage:   usage,
	}})
}

func (m *messages) delta(e *eventWriter, res *result, d delta) error {
	kind, dl := "text", anthDelta{Type: "text_delta", Text: d.text}
	if d.reasoning {
		kind, dl = "thinking", anthDelta{Type: "thinking_delta", Thinking: d.text}
	}
	if m.cur != kind {
		if err := m.closeBlock(e); err != nil {
			return err
		}
		if err := m.openBlock(e, kind); err != nil {
			return err
		}
	}
	return m.sendBlock(e, "content_block_delta", &anthEvent{Delta: dl})
}

func (m *messages) sendBlock(e *eventWriter, typ string, ev *anthEvent) error {
	ev.Type, ev.Index = typ, &m.index
	return e.send(typ, ev)
}

func (m *messages) openBlock(e *eventWriter, kind string) error {
	m.cur = kind
	empty := ""
	block := &anthBlock{Type: kind, Text: &empty}
	if kind == "thinking" {
		block = &anthBlock{Type: kind, Thinking: &empty, Signature: &empty}
	}
	if err := m.sendBlock(e, "content_block_start", &anthEvent{ContentBlock: block}); err != nil {
		return err
	}
	if m.pings > 0 {
		return nil
	}
	m.pings++
	return e.send("ping", &anthEvent{Type: "ping"})
}

func (m *messages) closeBlock(e *eventWriter) error {
	if m.cur == "" {
		return nil
	}
	if m.cur == "thinking" {
		sig := anthDelta{Type: "signature_delta", Signature: m.signature()}
		if err := m.sendBlock(e, "content_block_delta", &anthEvent{Delta: sig}); err != nil {
			return err
		}
	}
	if err := m.sendBlock(e, "content_block_stop", &anthEvent{}); err != nil {
		return err
	}
	m.cur = ""
	m.index++
	return nil
}

func (m *messages) close(e *eventWriter, res *result) error {
	if err := m.closeBlock(e); err != nil {
		return err
	}
	if err := e.send("message_delta", &anthEvent{
		Type:  "message_delta",
		Delta: anthStop{StopReason: m.stopReason()},
		Usage: &anthOutput{OutputTokens: res.completionTokens},
	}); err != nil {
		return err
	}
	return e.send("message_stop", &anthEvent{Type: "message_stop"})
}

func (m *messages) body(res *result) any {
	content := []anthBlock{}
	if res.reasoning.Len() > 0 {
		thinking, sig := res.reasoning.String(), m.signature()
		content = append(content, anthBlock{Type: "thinking", Thinking: &thinking, Signature: &sig})
	}
	if res.content.Len() > 0 {
		text := res.content.String()
		content = append(content, anthBlock{Type: "text", Text: &text})
	}
	stop := m.stopReason()
	return &anthMessage{
		ID:         m.j.id,
		Type:       "message",
		Role:       "assistant",
		Model:      m.cfg.Model,
		Content:    content,
		StopReason: &stop,
		Usage:      newAnthUsage(m.j, res),
	}
}

// anthError is the Anthropic error body.
type anthError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (*messages) errorBody(status int, msg string) any {
	e := &anthError{Type: "error"}
	e.Error.Message = msg
	switch {
	case status == http.StatusTooManyRequests:
		e.Error.Type = "rate_limit_error"
	case status == http.StatusNotFound:
		e.Error.Type = "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		e.Error.Type = "request_too_large"
	case status == 529 || status == http.StatusServiceUnavailable:
		e.Error.Type = "overloaded_error"
	case status >= 500:
		e.Error.Type = "api_error"
	default:
		e.Error.Type = "invalid_request_error"
	}
	return e
}
