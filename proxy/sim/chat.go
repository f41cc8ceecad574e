package sim

import (
	"encoding/json"
	"errors"
)

// chat renders POST /v1/chat/completions as vLLM does: a role chunk, then
// reasoning deltas (both "reasoning_content" and "reasoning", as recent vLLM
// sends), then content deltas, the last one carrying finish_reason, then the
// usage-only chunk if stream_options.include_usage, then [DONE].
type chat struct {
	openAIStream[chatChunkChoice]
}

func newChat(s *Server) protocol {
	return &chat{openAIStream[chatChunkChoice]{cfg: &s.cfg, chunkObject: "chat.completion.chunk"}}
}

func (*chat) prefix() string { return "chatcmpl-" }

type chatRequest struct {
	Messages []struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		ToolCalls json.RawMessage `json:"tool_calls"`
	} `json:"messages"`
	Tools         json.RawMessage `json:"tools"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int   `json:"max_tokens"`
	MaxCompletionTokens *int   `json:"max_completion_tokens"`
	ReasoningEffort     string `json:"reasoning_effort"`
	ChatTemplateKwargs  struct {
		EnableThinking *bool `json:"enable_thinking"`
	} `json:"chat_template_kwargs"`
}

func (c *chat) parse(body []byte, j *job) error {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return err
	}
	if len(req.Messages) == 0 {
		return errors.New("messages must not be empty")
	}
	var b promptBuilder
	b.raw(req.Tools)
	for _, m := range req.Messages {
		if err := b.message(m.Role, m.Content); err != nil {
			return err
		}
		b.raw(m.ToolCalls)
	}
	j.prompt = b.String()
	j.maxTokens, j.limited = tokenLimit(req.MaxCompletionTokens, req.MaxTokens)
	j.reasoning = req.ReasoningEffort != "none" &&
		(req.ChatTemplateKwargs.EnableThinking == nil || *req.ChatTemplateKwargs.EnableThinking)
	j.stream = req.Stream
	c.bind(j, req.StreamOptions.IncludeUsage)
	return nil
}

type chatChunkChoice struct {
	Index        int             `json:"index"`
	Delta        chatDelta       `json:"delta"`
	Logprobs     *struct{}       `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason,omitempty"` // vLLM sets it, to null, on the final choice only
}

type chatDelta struct {
	Role             string  `json:"role,omitempty"`
	Content          *string `json:"content,omitempty"`
	ReasoningContent string  `json:"reasoning_content,omitempty"`
	Reasoning        string  `json:"reasoning,omitempty"`
}

func (c *chat) open(e *eventWriter, _ *result) error {
	empty := ""
	return e.send("", c.chunk(chatChunkChoice{Delta: chatDelta{Role: "assistant", Content: &empty}}))
}

func (c *chat) delta(e *eventWriter, res *result, d delta) error {
	choice := chatChunkChoice{}
	if d.reasoning {
		choice.Delta = chatDelta{ReasoningContent: d.text, Reasoning: d.text}
	} else {
		choice.Delta = chatDelta{Content: &d.text}
	}
	chunk := c.chunk(choice)
	if d.last && !c.finalChunk() {
		chunk.Choices[0] = c.finish(chunk.Choices[0])
		chunk.Timings = c.lastTimings(res)
	}
	return e.send("", chunk)
}

// finish sets the finish reason on the final choice.
func (c *chat) finish(choice chatChunkChoice) chatChunkChoice {
	choice.FinishReason = finishReason(c.j)
	choice.StopReason = jsonNull
	return choice
}

func (c *chat) close(e *eventWriter, res *result) error {
	return c.openAIStream.close(e, res, func() chatChunkChoice { return c.finish(chatChunkChoice{}) })
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     *struct{}   `json:"logprobs"`
	FinishReason *string     `json:"finish_reason"`
	StopReason   *string     `json:"stop_reason"`
}

type chatMessage struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	ReasoningContent *string    `json:"reasoning_content"`
	Reasoning        *string    `json:"reasoning"`
	ToolCalls        []struct{} `json:"tool_calls"`
}

func (c *chat) body(res *result) any {
	msg := chatMessage{Role: "assistant", ToolCalls: []struct{}{}}
	if res.content.Len() > 0 {
		content := res.content.String()
		msg.Content = &content
	}
	if res.reasoning.Len() > 0 {
		reasoning := res.reasoning.String()
		msg.ReasoningContent, msg.Reasoning = &reasoning, &reasoning
	}
	choice := chatChoice{Message: msg, FinishReason: finishReason(c.j)}
	return wholeObject(c.cfg, c.j, "chat.completion", []chatChoice{choice}, res)
}
