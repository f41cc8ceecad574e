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
	openAIStream[completionChoice]
}

func newCompletion(s *Server) protocol {
	return &completion{openAIStream[completionChoice]{cfg: &s.cfg, chunkObject: "text_completion"}}
}

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
	c.bind(j, req.StreamOptions.IncludeUsage)
	return nil
}

type completionChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   *string   `json:"stop_reason"`
}

func (*completion) open(*eventWriter, *result) error { return nil }

func (c *completion) delta(e *eventWriter, res *result, d delta) error {
	chunk := c.chunk(completionChoice{Text: d.text})
	if d.last && !c.finalChunk() {
		chunk.Choices[0].FinishReason = finishReason(c.j)
		chunk.Timings = c.lastTimings(res)
	}
	return e.send("", chunk)
}

func (c *completion) close(e *eventWriter, res *result) error {
	return c.openAIStream.close(e, res, func() completionChoice {
		return completionChoice{FinishReason: finishReason(c.j)}
	})
}

func (c *completion) body(res *result) any {
	// A whole completion is a "text_completion" too, as vLLM sends it.
	choice := completionChoice{Text: res.content.String(), FinishReason: finishReason(c.j)}
	return wholeObject(c.cfg, c.j, c.chunkObject, []completionChoice{choice}, res)
}
