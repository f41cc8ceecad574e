package sim

import (
	"encoding/json"
	"errors"
	"strings"
)

// native renders llama-server's own POST /completion (and its alias
// /completions) as llama.cpp does (tools/server, to_json_non_oaicompat):
// a stream is "data: {...}" objects with the new "content" and "stop":
// false, then one final object with "stop": true, the counts, stop_type and
// "timings" — no choices, no usage, no [DONE]. A whole response is that
// final object with the whole content. The timings are always there, as
// llama.cpp always sends them, whatever Config.Timings says.
type native struct {
	cfg    *Config
	j      *job
	prompt string
	limit  int // n_predict as sent; -1: none
}

func newNative(s *Server) protocol { return &native{cfg: &s.cfg} }

// prefix is the id prefix of the sim's records; llama.cpp's native objects
// carry no id.
func (*native) prefix() string { return "completion-" }

type nativeRequest struct {
	Prompt   json.RawMessage `json:"prompt"`
	NPredict *int            `json:"n_predict"`
	Stream   bool            `json:"stream"`
}

func (n *native) parse(body []byte, j *job) error {
	var req nativeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return err
	}
	var prompt string
	if err := json.Unmarshal(req.Prompt, &prompt); err != nil {
		var prompts []string
		if err := json.Unmarshal(req.Prompt, &prompts); err != nil || len(prompts) == 0 {
			return errors.New(`"prompt" must be a string or an array of strings`)
		}
		prompt = strings.Join(prompts, "\n")
	}
	n.j, n.prompt, n.limit = j, prompt, -1
	j.prompt = prompt
	if req.NPredict != nil && *req.NPredict >= 0 { // -1 is llama.cpp's "no limit"
		n.limit = *req.NPredict
		j.maxTokens, j.limited = *req.NPredict, true
	}
	j.stream = req.Stream
	return nil
}

// nativePartial is one streamed object before the end.
type nativePartial struct {
	Index           int    `json:"index"`
	Content         string `json:"content"`
	Tokens          []int  `json:"tokens"`
	Stop            bool   `json:"stop"`
	IDSlot          int    `json:"id_slot"`
	TokensPredicted int    `json:"tokens_predicted"`
	TokensEvaluated int    `json:"tokens_evaluated"`
}

// nativeFinal is the final object of a stream, and the whole response.
type nativeFinal struct {
	Index              int            `json:"index"`
	Content            string         `json:"content"`
	Tokens             []int          `json:"tokens"`
	IDSlot             int            `json:"id_slot"`
	Stop               bool           `json:"stop"`
	Model              string         `json:"model"`
	TokensPredicted    int            `json:"tokens_predicted"`
	TokensEvaluated    int            `json:"tokens_evaluated"`
	GenerationSettings nativeSettings `json:"generation_settings"`
	Prompt             string         `json:"prompt"`
	HasNewLine         bool           `json:"has_new_line"`
	Truncated          bool           `json:"truncated"`
	StopType           string         `json:"stop_type"`
	StoppingWord       string         `json:"stopping_word"`
	TokensCached       int            `json:"tokens_cached"` // the tokens the slot holds at the end: prompt and answer
	Timings            *llamaTimings  `json:"timings"`
}

type nativeSettings struct {
	NPredict int  `json:"n_predict"`
	Stream   bool `json:"stream"`
}

func (*native) open(*eventWriter, *result) error { return nil }

func (n *native) delta(e *eventWriter, res *result, d delta) error {
	return e.send("", &nativePartial{
		Content:         d.text,
		Tokens:          []int{},
		IDSlot:          res.slot,
		TokensPredicted: res.completionTokens,
		TokensEvaluated: res.promptTokens,
	})
}

func (n *native) final(res *result, content string) *nativeFinal {
	stopType := "eos"
	if n.j.limited {
		stopType = "limit"
	}
	return &nativeFinal{
		Content:            content,
		Tokens:             []int{},
		IDSlot:             res.slot,
		Stop:               true,
		Model:              n.cfg.Model,
		TokensPredicted:    res.completionTokens,
		TokensEvaluated:    res.promptTokens,
		GenerationSettings: nativeSettings{NPredict: n.limit, Stream: n.j.stream},
		Prompt:             n.prompt,
		HasNewLine:         strings.Contains(content, "\n"),
		StopType:           stopType,
		TokensCached:       res.promptTokens + res.completionTokens,
		Timings:            newLlamaTimings(res),
	}
}

// close sends the final object; in a stream its content is empty, the text
// having gone out in the partial objects.
func (n *native) close(e *eventWriter, res *result) error { return e.send("", n.final(res, "")) }

func (n *native) body(res *result) any { return n.final(res, res.content.String()) }

// errorBody is llama-server's error object, the OpenAI shape.
func (*native) errorBody(status int, msg string) any { return newOpenAIError(status, msg) }
