package sim

import (
	"encoding/json"
	"errors"
	"strings"
)

// completion renders the legacy POST /v1/completions as vLLM does:
// "text_completion" chunks with choices[].text, no role chunk and no
// reasoning, the last chunk carrying finish_reason, then the usage-only
// chunk if stream_options.include_usage, then [DONE].
type completion struct {
	cfg          *Config
	j            *job
	includeUsage bool
}

func newCompletion(s *Server) protocol { return &completion{cfg: &s.cfg} }

func (*completion) prefix() string { return "cmpl-" }

type completionRequest struct {
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens *int `json:"max_tokens"`
}

func (c *completion) parse(body []byte, j *job) error {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return err
	}
	var prompt string
	if err := json.Unmarshal(req.Prompt, &prompt); err != nil {
		var prompts []string
		if err := json.Unmarshal(req.Prompt, &prompts); err != nil || len(prompts) == 0 {
			return errors.New("prompt must be a string or a non-empty array of strings")
		}
		prompt = strings.Join(prompts, "\n")
	}
	j.prompt = prompt
	j.maxTokens, j.limited = tokenLimit(req.MaxTokens)
	j.stream = req.Stream
	c.j = j
	c.includeUsage = req.Stream && req.StreamOptions.IncludeUsage
	return nil
}

type completionChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *openAIUsage       `json:"usage,omitempty"`
	Metrics *vllmMetrics       `json:"metrics,omitempty"`
	Timings *llamaTimings      `json:"timings,omitempty"`
}

type completionChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   *string   `json:"stop_reason"`
}

func (c *completion) chunk(choices []completionChoice) *completionChunk {
	return &completionChunk{
		ID:      c.j.id,
		Object:  "text_completion",
		Created: c.j.created,
		Model:   c.cfg.Model,
		Choices: choices,
	}
}

func (*completion) open(*eventWriter, *result) error { return nil }

func (c *completion) delta(e *eventWriter, res *result, d delta) error {
	chunk := c.chunk([]completionChoice{{Text: d.text}})
	if d.last {
		chunk.Choices[0].FinishReason = finishReason(c.j)
		if !c.includeUsage {
			_, chunk.Timings = timing(c.cfg.Timings, res)
		}
	}
	return e.send("", chunk)
}

func (c *completion) close(e *eventWriter, res *result) error {
	if c.includeUsage {
		chunk := c.chunk([]completionChoice{})
		chunk.Usage = newOpenAIUsage(c.j, res)
		chunk.Metrics, chunk.Timings = timing(c.cfg.Timings, res)
		if err := e.send("", chunk); err != nil {
			return err
		}
	}
	return e.done()
}

func (c *completion) body(res *result) any {
	out := c.chunk([]completionChoice{{Text: res.content.String(), FinishReason: finishReason(c.j)}})
	out.Usage = newOpenAIUsage(c.j, res)
	out.Metrics, out.Timings = timing(c.cfg.Timings, res)
	return out
}

func (*completion) errorBody(status int, msg string) any { return newOpenAIError(status, msg) }
