package sim

import (
	"encoding/json"
	"errors"
	"time"
)

// ollamaAPI renders ollama's native POST /api/generate and /api/chat as
// ollama v0.17.4 does (server/routes.go GenerateHandler, ChatHandler;
// api/types.go): a stream is NDJSON, one object per line with the new
// text ("response", or "message":{"role","content"}; reasoning in
// "thinking") and "done": false, then one line with "done": true,
// done_reason and the Metrics; "stream": false answers that last object
// with the whole text. Streams are the default. The Metrics come from the
// sim's own truth as ollama computes them (docs/engines.md):
//
//	total_duration        arrival → this line
//	load_duration         arrival → the request joined the engine's queue
//	prompt_eval_count     the prompt, cached tokens included
//	prompt_eval_duration  slot start → first token (the llamarunner sums
//	                      every batch from the sequence's slot start to
//	                      its first sampled token)
//	eval_count            the output, plus the end-of-sequence step when
//	                      the answer stopped by itself
//	eval_duration         first token → this line (the end-of-sequence
//	                      step included)
type ollamaAPI struct {
	cfg  *Config
	j    *job
	chat bool // /api/chat: text in "message"
}

func newOllamaGenerate(s *Server) protocol { return &ollamaAPI{cfg: &s.cfg} }
func newOllamaChat(s *Server) protocol     { return &ollamaAPI{cfg: &s.cfg, chat: true} }

// prefix is the id prefix of the sim's records; ollama's objects carry no
// id.
func (*ollamaAPI) prefix() string { return "ollama-" }

// contentType: ollama streams application/x-ndjson (streamResponse).
func (*ollamaAPI) contentType() string { return "application/x-ndjson" }

type ollamaRequest struct {
	Prompt   string `json:"prompt"`
	System   string `json:"system"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools   json.RawMessage `json:"tools"`
	Stream  *bool           `json:"stream"`
	Think   bool            `json:"think"`
	Options struct {
		NumPredict *int `json:"num_predict"`
	} `json:"options"`
}

func (o *ollamaAPI) parse(body []byte, j *job) error {
	var req ollamaRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return err
	}
	var b promptBuilder
	if o.chat {
		if len(req.Messages) == 0 {
			return errors.New("messages must not be empty")
		}
		b.raw(req.Tools)
		for _, m := range req.Messages {
			if err := b.message(m.Role, m.Content); err != nil {
				return err
			}
		}
	} else {
		if req.Prompt == "" {
			return errors.New("prompt must not be empty") // ollama answers a model load instead
		}
		if req.System != "" {
			b.WriteString("system\n" + req.System + "\n")
		}
		b.WriteString("user\n" + req.Prompt + "\n")
	}
	o.j = j
	j.prompt = b.String()
	if n := req.Options.NumPredict; n != nil && *n >= 0 { // -1 is ollama's "no limit"
		j.maxTokens, j.limited = *n, true
	}
	j.reasoning = req.Think
	j.stream = req.Stream == nil || *req.Stream
	return nil
}

// ollamaMessage is /api/chat's message.
type ollamaMessage struct {
	Role     string `json:"role"`
	Content  string `json:"content"`
	Thinking string `json:"thinking,omitempty"`
}

// ollamaLine is one object of a stream, and the whole answer.
type ollamaLine struct {
	Model      string         `json:"model"`
	CreatedAt  time.Time      `json:"created_at"`
	Response   *string        `json:"response,omitempty"` // /api/generate: always present, even empty
	Thinking   string         `json:"thinking,omitempty"` // /api/generate
	Message    *ollamaMessage `json:"message,omitempty"`  // /api/chat
	Done       bool           `json:"done"`
	DoneReason string         `json:"done_reason,omitempty"`
	ollamaMetrics
}

// ollamaMetrics is api.Metrics: nanoseconds and counts, omitted when 0.
type ollamaMetrics struct {
	TotalDuration      time.Duration `json:"total_duration,omitempty"`
	LoadDuration       time.Duration `json:"load_duration,omitempty"`
	PromptEvalCount    int           `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration time.Duration `json:"prompt_eval_duration,omitempty"`
	EvalCount          int           `json:"eval_count,omitempty"`
	EvalDuration       time.Duration `json:"eval_duration,omitempty"`
}

// line is an object with text (content or thinking) of the request's kind.
func (o *ollamaAPI) line(content, thinking string) *ollamaLine {
	l := &ollamaLine{Model: o.cfg.Model, CreatedAt: time.Now().UTC()}
	if o.chat {
		l.Message = &ollamaMessage{Role: "assistant", Content: content, Thinking: thinking}
	} else {
		l.Response, l.Thinking = &content, thinking
	}
	return l
}

func (*ollamaAPI) open(*eventWriter, *result) error { return nil }

func (o *ollamaAPI) delta(e *eventWriter, _ *result, d delta) error {
	if d.reasoning {
		return e.line(o.line("", d.text))
	}
	return e.line(o.line(d.text, ""))
}

// final is the done object, its metrics as of now.
func (o *ollamaAPI) final(res *result, content, thinking string) *ollamaLine {
	now := time.Now()
	l := o.line(content, thinking)
	l.Done = true
	l.DoneReason = "stop"
	evalCount := res.completionTokens + 1 // the end-of-sequence token's own step
	if o.j.limited {
		l.DoneReason, evalCount = "length", res.completionTokens
	}
	l.ollamaMetrics = ollamaMetrics{
		TotalDuration:      now.Sub(o.j.arrived),
		LoadDuration:       o.j.enqueued.Sub(o.j.arrived),
		PromptEvalCount:    res.promptTokens,
		PromptEvalDuration: res.firstToken.Sub(res.admitted),
		EvalCount:          evalCount,
		EvalDuration:       now.Sub(res.firstToken),
	}
	return l
}

func (o *ollamaAPI) close(e *eventWriter, res *result) error { return e.line(o.final(res, "", "")) }

func (o *ollamaAPI) body(res *result) any {
	return o.final(res, res.content.String(), res.reasoning.String())
}

// errorBody is ollama's {"error": "…"}.
func (*ollamaAPI) errorBody(_ int, msg string) any { return map[string]string{"error": msg} }
