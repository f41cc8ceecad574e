package sim

import (
	"bytes"
	"encoding/json"
	"errors"
)

// responses renders POST /v1/responses (the OpenAI Responses API): every
// event is a typed object with a sequence_number and an SSE "event:" line.
// A stream is response.created and response.in_progress; for each output
// item (reasoning, then message) output_item.added, content_part.added, the
// text deltas, the text's done event, content_part.done, output_item.done;
// then response.completed carrying the whole response with usage. There is
// no [DONE].
//
// The response always completes: OpenAI would end a response cut by
// max_output_tokens with response.incomplete instead.
type responses struct {
	cfg    *Config
	j      *job
	seq    int
	cur    string     // type of the open output item, "" if none
	output []respItem // finished output items
}

func newResponses(s *Server) protocol { return &responses{cfg: &s.cfg} }

func (*responses) prefix() string { return "resp_" }

type responsesRequest struct {
	Input           json.RawMessage `json:"input"`
	Instructions    string          `json:"instructions"`
	Tools           json.RawMessage `json:"tools"`
	Stream          bool            `json:"stream"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Reasoning       struct {
		Effort string `json:"effort"`
	} `json:"reasoning"`
}

func (p *responses) parse(body []byte, j *job) error {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return err
	}
	var b promptBuilder
	b.raw(req.Tools)
	if req.Instructions != "" {
		b.WriteString("system\n" + req.Instructions + "\n")
	}
	if err := appendInput(&b, req.Input); err != nil {
		return err
	}
	j.prompt = b.String()
	j.maxTokens, j.limited = tokenLimit(req.MaxOutputTokens)
	j.reasoning = req.Reasoning.Effort != "none"
	j.stream = req.Stream
	p.j = j
	return nil
}

// appendInput appends the input: a string is one user message; in an array,
// items with a role are messages and other items (function calls and their
// outputs) count as "type\n" and their JSON.
func appendInput(b *promptBuilder, input json.RawMessage) error {
	input = bytes.TrimSpace(input)
	if len(input) > 0 && input[0] == '"' {
		return b.message("user", input)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil || len(items) == 0 {
		return errors.New("input must be a string or a non-empty array of items")
	}
	for _, raw := range items {
		var it struct {
			Type    string          `json:"type"`
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(raw, &it); err != nil {
			return err
		}
		if it.Role != "" {
			if err := b.message(it.Role, it.Content); err != nil {
				return err
			}
			continue
		}
		b.WriteString(it.Type + "\n")
		b.raw(raw)
	}
	return nil
}

type respObject struct {
	ID        string       `json:"id"`
	Object    string       `json:"object"`
	CreatedAt int64        `json:"created_at"`
	Status    string       `json:"status"`
	Model     string       `json:"model"`
	Output    []respItem   `json:"output"`
	Usage     *respUsage   `json:"usage"`
	Metrics   *vllmMetrics `json:"metrics,omitempty"`
}

type respItem struct {
	ID      string      `json:"id"`
	Type    string      `json:"type"`
	Status  string      `json:"status"`
	Role    string      `json:"role,omitempty"`
	Summary *[]struct{} `json:"summary,omitempty"`
	Content []respPart  `json:"content"`
}

type respPart struct {
	Type        string      `json:"type"`
	Text        string      `json:"text"`
	Annotations *[]struct{} `json:"annotations,omitempty"`
}

type respUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type respEvent struct {
	Type           string      `json:"type"`
	Response       *respObject `json:"response,omitempty"`
	ItemID         string      `json:"item_id,omitempty"`
	OutputIndex    *int        `json:"output_index,omitempty"`
	ContentIndex   *int        `json:"content_index,omitempty"`
	Item           *respItem   `json:"item,omitempty"`
	Part           *respPart   `json:"part,omitempty"`
	Delta          string      `json:"delta,omitempty"`
	Text           *string     `json:"text,omitempty"`
	Logprobs       *[]struct{} `json:"logprobs,omitempty"`
	SequenceNumber int         `json:"sequence_number"`
}

// item returns the output item of type kind ("reasoning" or "message")
// holding text.
func (p *responses) item(kind, text, status string) respItem {
	it := respItem{ID: p.itemID(kind), Type: kind, Status: status, Content: []respPart{}}
	if kind == "reasoning" {
		it.Summary = &[]struct{}{}
		if text != "" || status == "completed" {
			it.Content = []respPart{{Type: "reasoning_text", Text: text}}
		}
		return it
	}
	it.Role = "assistant"
	if text != "" || status == "completed" {
		it.Content = []respPart{textPart(text)}
	}
	return it
}

func (p *responses) itemID(kind string) string {
	if kind == "reasoning" {
		return "rs_" + p.j.base
	}
	return "msg_" + p.j.base
}

func textPart(text string) respPart {
	return respPart{Type: "output_text", Text: text, Annotations: &[]struct{}{}}
}

func (p *responses) send(e *eventWriter, ev *respEvent) error {
	ev.SequenceNumber = p.seq
	p.seq++
	return e.send(ev.Type, ev)
}

func (p *responses) object(status string, res *result) *respObject {
	o := &respObject{
		ID:        p.j.id,
		Object:    "response",
		CreatedAt: p.j.created,
		Status:    status,
		Model:     p.cfg.Model,
		Output:    p.output,
	}
	if o.Output == nil {
		o.Output = []respItem{}
	}
	if status == "completed" {
		o.Usage = newRespUsage(p.j, res)
		o.Metrics, _ = timing(p.cfg.Timings, res)
	}
	return o
}

// newRespUsage is the Responses usage object. When the cache is
// unreported it says cached_tokens 0, as ollama's /v1/responses always does.
func newRespUsage(j *job, res *result) *respUsage {
	u := &respUsage{
		InputTokens:  res.promptTokens,
		OutputTokens: res.completionTokens,
		TotalTokens:  res.promptTokens + res.completionTokens,
	}
	if !j.hideCached {
		u.InputTokensDetails.CachedTokens = res.cachedTokens
	}
	u.OutputTokensDetails.ReasoningTokens = res.reasoningTokens
	return u
}

func (p *responses) open(e *eventWriter, res *result) error {
	if err := p.send(e, &respEvent{Type: "response.created", Response: p.object("in_progress", res)}); err != nil {
		return err
	}
	return p.send(e, &respEvent{Type: "response.in_progress", Response: p.object("in_progress", res)})
}

func (p *responses) delta(e *eventWriter, res *result, d delta) error {
	kind, event := "message", "response.output_text.delta"
	if d.reasoning {
		kind, event = "reasoning", "response.reasoning_text.delta"
	}
	if p.cur != kind {
		if err := p.closeItem(e, res); err != nil {
			return err
		}
		if err := p.openItem(e, kind); err != nil {
			return err
		}
	}
	ev := p.partEvent(event)
	ev.Delta = d.text
	if !d.reasoning {
		ev.Logprobs = &[]struct{}{}
	}
	return p.send(e, ev)
}

// partEvent returns an event about content part 0 of the open item.
func (p *responses) partEvent(typ string) *respEvent {
	idx, zero := len(p.output), 0
	return &respEvent{Type: typ, ItemID: p.itemID(p.cur), OutputIndex: &idx, ContentIndex: &zero}
}

func (p *responses) openItem(e *eventWriter, kind string) error {
	p.cur = kind
	idx := len(p.output)
	it := p.item(kind, "", "in_progress")
	if err := p.send(e, &respEvent{Type: "response.output_item.added", OutputIndex: &idx, Item: &it}); err != nil {
		return err
	}
	ev := p.partEvent("response.content_part.added")
	part := textPart("")
	if kind == "reasoning" {
		part = respPart{Type: "reasoning_text"}
	}
	ev.Part = &part
	return p.send(e, ev)
}

func (p *responses) closeItem(e *eventWriter, res *result) error {
	if p.cur == "" {
		return nil
	}
	text, done := res.content.String(), "response.output_text.done"
	if p.cur == "reasoning" {
		text, done = res.reasoning.String(), "response.reasoning_text.done"
	}
	it := p.item(p.cur, text, "completed")
	ev := p.partEvent(done)
	ev.Text = &text
	if p.cur == "message" {
		ev.Logprobs = &[]struct{}{}
	}
	if err := p.send(e, ev); err != nil {
		return err
	}
	ev = p.partEvent("response.content_part.done")
	ev.Part = &it.Content[0]
	if err := p.send(e, ev); err != nil {
		return err
	}
	idx := len(p.output)
	if err := p.send(e, &respEvent{Type: "response.output_item.done", OutputIndex: &idx, Item: &it}); err != nil {
		return err
	}
	p.output = append(p.output, it)
	p.cur = ""
	return nil
}

func (p *responses) close(e *eventWriter, res *result) error {
	if err := p.closeItem(e, res); err != nil {
		return err
	}
	return p.send(e, &respEvent{Type: "response.completed", Response: p.object("completed", res)})
}

func (p *responses) body(res *result) any {
	if res.reasoning.Len() > 0 {
		p.output = append(p.output, p.item("reasoning", res.reasoning.String(), "completed"))
	}
	if res.content.Len() > 0 {
		p.output = append(p.output, p.item("message", res.content.String(), "completed"))
	}
	return p.object("completed", res)
}

func (*responses) errorBody(status int, msg string) any { return newOpenAIError(status, msg) }
