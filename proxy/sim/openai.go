package sim

import (
	"encoding/json"
	"net/http"
	"time"
)

// jsonNull is an explicit null for a field that is omitted when unset.
var jsonNull = json.RawMessage("null")

// The shapes shared by the OpenAI chat completions and completions
// endpoints, as vLLM serializes them (field order included).

// openAIObject is every object the two endpoints send, a streamed chunk or
// a whole response: only the object name and the choices' type differ.
// Usage is set on a whole response and on the usage-only chunk.
type openAIObject[C any] struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []C           `json:"choices"`
	Usage   *openAIUsage  `json:"usage,omitempty"`
	Metrics *vllmMetrics  `json:"metrics,omitempty"`
	Timings *llamaTimings `json:"timings,omitempty"`
}

// openAIStream is the part of a chat completions or completions protocol
// that does not depend on the endpoint: the bound job, whether the stream
// ends with a usage-only chunk, the stream's close and the error body.
// Like the protocol that embeds it, it serves one request.
type openAIStream[C any] struct {
	cfg          *Config
	j            *job
	chunkObject  string // the "object" of a streamed chunk
	includeUsage bool   // stream_options.include_usage, on a stream
}

// bind binds the stream to j once parse has filled it; includeUsage is
// the request's stream_options.include_usage.
func (o *openAIStream[C]) bind(j *job, includeUsage bool) {
	o.j = j
	o.includeUsage = j.stream && includeUsage
}

func newOpenAIObject[C any](cfg *Config, j *job, object string, choices []C) *openAIObject[C] {
	return &openAIObject[C]{
		ID:      j.id,
		Object:  object,
		Created: j.created,
		Model:   cfg.Model,
		Choices: choices,
	}
}

// wholeObject is an object with the usage and the engine timing: a
// non-stream response, or the usage-only chunk.
func wholeObject[C any](cfg *Config, j *job, object string, choices []C, res *result) *openAIObject[C] {
	out := newOpenAIObject(cfg, j, object, choices)
	out.Usage = newOpenAIUsage(j, res)
	out.Metrics, out.Timings = timing(cfg.Timings, res)
	return out
}

// chunk is a streamed chunk of one choice.
func (o *openAIStream[C]) chunk(choice C) *openAIObject[C] {
	return newOpenAIObject(o.cfg, o.j, o.chunkObject, []C{choice})
}

// lastTimings is the llama.cpp timings the last output chunk carries, as
// llama.cpp puts them there, unless a usage-only chunk follows to carry them.
func (o *openAIStream[C]) lastTimings(res *result) *llamaTimings {
	if o.includeUsage {
		return nil
	}
	_, t := timing(o.cfg.Timings, res)
	return t
}

// finalChunk reports whether the finish reason travels in a chunk of its
// own after the last output event, as llama.cpp and ollama send it at the
// stream's end (ReleaseStreamEnd), instead of on the last output event.
func (o *openAIStream[C]) finalChunk() bool { return o.cfg.Release == ReleaseStreamEnd }

// close sends the final chunk when finalChunk (the finish reason, choice
// built by finish, and the llama.cpp timings), the usage-only chunk if
// stream_options.include_usage, then [DONE].
func (o *openAIStream[C]) close(e *eventWriter, res *result, finish func() C) error {
	if o.finalChunk() {
		chunk := o.chunk(finish())
		chunk.Timings = o.lastTimings(res)
		if err := e.send("", chunk); err != nil {
			return err
		}
	}
	if o.includeUsage {
		if err := e.send("", wholeObject(o.cfg, o.j, o.chunkObject, []C{}, res)); err != nil {
			return err
		}
	}
	return e.done()
}

func (*openAIStream[C]) errorBody(status int, msg string) any { return newOpenAIError(status, msg) }

type openAIUsage struct {
	PromptTokens            int                `json:"prompt_tokens"`
	TotalTokens             int                `json:"total_tokens"`
	CompletionTokens        int                `json:"completion_tokens"`
	PromptTokensDetails     *promptDetails     `json:"prompt_tokens_details,omitempty"` // nil when the cache is unreported
	CompletionTokensDetails completionsDetails `json:"completion_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type completionsDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

func newOpenAIUsage(j *job, res *result) *openAIUsage {
	u := &openAIUsage{
		PromptTokens:            res.promptTokens,
		TotalTokens:             res.promptTokens + res.completionTokens,
		CompletionTokens:        res.completionTokens,
		CompletionTokensDetails: completionsDetails{ReasoningTokens: res.reasoningTokens},
	}
	if !j.hideCached {
		u.PromptTokensDetails = &promptDetails{CachedTokens: res.cachedTokens}
	}
	return u
}

// vllmMetrics is vLLM's per-request "metrics" object
// (--enable-per-request-metrics, docs/features/per_request_metrics.md),
// plus prefill_time_ms and decode_time_ms, which name the same spans as
// time_to_first_token_ms and generation_time_ms the way docs/design.md "Stamps and phases" does.
type vllmMetrics struct {
	TimeToFirstTokenMs float64  `json:"time_to_first_token_ms"` // scheduled → first token
	GenerationTimeMs   float64  `json:"generation_time_ms"`     // first → last token
	QueueTimeMs        float64  `json:"queue_time_ms"`
	MeanITLMs          *float64 `json:"mean_itl_ms"` // null for one token
	TokensPerSecond    float64  `json:"tokens_per_second"`
	PrefillTimeMs      float64  `json:"prefill_time_ms"`
	DecodeTimeMs       float64  `json:"decode_time_ms"`
}

func newVLLMMetrics(res *result) *vllmMetrics {
	m := &vllmMetrics{
		TimeToFirstTokenMs: ms(res.prefill),
		GenerationTimeMs:   ms(res.decode),
		QueueTimeMs:        ms(res.queue),
		PrefillTimeMs:      ms(res.prefill),
		DecodeTimeMs:       ms(res.decode),
	}
	if res.completionTokens > 1 {
		itl := ms(res.decode) / float64(res.completionTokens-1)
		m.MeanITLMs = &itl
	}
	if busy := (res.prefill + res.decode).Seconds(); busy > 0 {
		m.TokensPerSecond = float64(res.completionTokens) / busy
	}
	return m
}

// llamaTimings is llama.cpp server's "timings" object. prompt_n counts only
// the tokens evaluated, cache_n the ones reused from the cache.
type llamaTimings struct {
	CacheN              int     `json:"cache_n"`
	PromptN             int     `json:"prompt_n"`
	PromptMs            float64 `json:"prompt_ms"`
	PromptPerTokenMs    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMs         float64 `json:"predicted_ms"`
	PredictedPerTokenMs float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
}

func newLlamaTimings(res *result) *llamaTimings {
	t := &llamaTimings{
		CacheN:      res.cachedTokens,
		PromptN:     res.promptTokens - res.cachedTokens,
		PromptMs:    ms(res.prefill),
		PredictedN:  res.completionTokens,
		PredictedMs: ms(res.decode),
	}
	t.PromptPerTokenMs, t.PromptPerSecond = rates(t.PromptMs, t.PromptN)
	t.PredictedPerTokenMs, t.PredictedPerSecond = rates(t.PredictedMs, t.PredictedN)
	return t
}

func rates(totalMs float64, n int) (perTokenMs, perSecond float64) {
	if n == 0 || totalMs == 0 {
		return 0, 0
	}
	return totalMs / float64(n), float64(n) / totalMs * 1e3
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// timing returns the Timings report of res, at most one of them non-nil.
func timing(mode TimingMode, res *result) (*vllmMetrics, *llamaTimings) {
	switch mode {
	case TimingVLLM:
		return newVLLMMetrics(res), nil
	case TimingLlamaCpp:
		return nil, newLlamaTimings(res)
	}
	return nil, nil
}

// openAIError is the error body of the OpenAI API and vLLM.
type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func newOpenAIError(status int, msg string) any {
	var e openAIError
	e.Error.Message = msg
	e.Error.Code = status
	switch {
	case status == http.StatusTooManyRequests:
		e.Error.Type = "rate_limit_error"
	case status == http.StatusNotFound:
		e.Error.Type = "not_found_error"
	case status >= 500:
		e.Error.Type = "server_error"
	default:
		e.Error.Type = "invalid_request_error"
	}
	return &e
}

// finishReason is the OpenAI finish reason of a job generated in full.
func finishReason(j *job) *string {
	r := "stop"
	if j.limited {
		r = "length"
	}
	return &r
}
