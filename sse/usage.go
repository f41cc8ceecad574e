package sse

// Usage is the token accounting of a request; -1 means unknown. It is a
// plain value, safe to copy.
type Usage struct {
	PromptTokens     int64 // all input tokens, cached ones included
	CompletionTokens int64 // all output tokens, reasoning ones included
	CachedTokens     int64 // input tokens served from the engine's prefix cache
	ReasoningTokens  int64 // output tokens spent on reasoning
}

// UnknownUsage returns a Usage with every count unknown.
func UnknownUsage() Usage {
	return Usage{PromptTokens: -1, CompletionTokens: -1, CachedTokens: -1, ReasoningTokens: -1}
}

// Merge overwrites each count of u with the one of v if v's is known. Later
// events win because their counts are newer: Anthropic's output_tokens in
// message_delta is cumulative.
func (u *Usage) Merge(v Usage) {
	merge(&u.PromptTokens, v.PromptTokens)
	merge(&u.CompletionTokens, v.CompletionTokens)
	merge(&u.CachedTokens, v.CachedTokens)
	merge(&u.ReasoningTokens, v.ReasoningTokens)
}

func mergeMs(dst *float64, v float64) {
	if v >= 0 {
		*dst = v
	}
}

func merge(dst *int64, v int64) {
	if v >= 0 {
		*dst = v
	}
}

// Timing is what the engine reported about the request's own phases;
// negative means not reported. It is a plain value, safe to copy.
type Timing struct {
	QueueMs      float64 // time the request waited in the engine before it was scheduled
	PrefillMs    float64 // time the engine spent on the prompt
	DecodeMs     float64 // time the engine spent generating after the prompt (llama.cpp predicted_ms)
	InferenceMs  float64 // time from the engine's scheduling to its end, prompt and generation (TGI x-inference-time)
	TotalMs      float64 // the engine's whole handling of the request, from its handler's start to the end (ollama total_duration)
	LoadMs       float64 // getting a loaded model runner, within TotalMs (ollama load_duration)
	CachedTokens int64   // prompt tokens the engine took from its cache (llama.cpp cache_n)
	PromptEval   int64   // prompt tokens the engine evaluated, cache hits excluded (llama.cpp prompt_n)
}

// UnknownTiming returns a Timing with nothing reported.
func UnknownTiming() Timing {
	return Timing{QueueMs: -1, PrefillMs: -1, DecodeMs: -1, InferenceMs: -1, TotalMs: -1, LoadMs: -1, CachedTokens: -1, PromptEval: -1}
}

func unknownTiming() Timing { return UnknownTiming() }

// Merge overwrites each value of t with the one of v if v's is known: the
// final event's timings are the request's whole ones.
func (t *Timing) Merge(v Timing) {
	mergeMs(&t.QueueMs, v.QueueMs)
	mergeMs(&t.PrefillMs, v.PrefillMs)
	mergeMs(&t.DecodeMs, v.DecodeMs)
	mergeMs(&t.InferenceMs, v.InferenceMs)
	mergeMs(&t.TotalMs, v.TotalMs)
	mergeMs(&t.LoadMs, v.LoadMs)
	merge(&t.CachedTokens, v.CachedTokens)
	merge(&t.PromptEval, v.PromptEval)
}

// openaiUsage reads an OpenAI usage object. Chat and completions name the
// counts prompt/completion, the Responses API input/output; both count
// cached tokens inside the prompt.
func openaiUsage(s *Scanner, c *Chunk) {
	if !s.Object() {
		return
	}
	c.Flags |= FlagUsage
	u := &c.Usage
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "prompt_tokens", "input_tokens":
			u.PromptTokens = s.int()
		case "completion_tokens", "output_tokens":
			u.CompletionTokens = s.int()
		case "prompt_tokens_details", "input_tokens_details":
			u.CachedTokens = intField(s, "cached_tokens")
		case "completion_tokens_details", "output_tokens_details":
			u.ReasoningTokens = intField(s, "reasoning_tokens")
		default:
			s.Skip()
		}
	}
}

// anthropicUsage reads an Anthropic usage object. Its input_tokens excludes
// cache reads and writes, so the prompt is the sum of the three
// (docs.anthropic.com, "Prompt caching", tracking cache performance).
func anthropicUsage(s *Scanner, c *Chunk) {
	if !s.Object() {
		return
	}
	c.Flags |= FlagUsage
	input, read, created := int64(-1), int64(-1), int64(-1)
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "input_tokens":
			input = s.int()
		case "cache_read_input_tokens":
			read = s.int()
		case "cache_creation_input_tokens":
			created = s.int()
		case "output_tokens":
			c.Usage.CompletionTokens = s.int()
		default:
			s.Skip()
		}
	}
	if input >= 0 {
		c.Usage.PromptTokens = input + max(read, 0) + max(created, 0)
	}
	c.Usage.CachedTokens = read
}

// vllmMetrics reads vLLM's per-request "metrics" object (vLLM PR 46768,
// --enable-per-request-metrics). It reports time_to_first_token_ms and
// queue_time_ms; prefill is their difference unless a prefill_time_ms is
// given.
func vllmMetrics(s *Scanner, c *Chunk) {
	if !s.Object() {
		return
	}
	c.Flags |= FlagTiming
	t := &c.Timing
	ttft := -1.0
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "queue_time_ms":
			t.QueueMs = s.float()
		case "prefill_time_ms":
			t.PrefillMs = s.float()
		case "time_to_first_token_ms":
			ttft = s.float()
		default:
			s.Skip()
		}
	}
	if t.PrefillMs < 0 && ttft >= 0 && t.QueueMs >= 0 {
		t.PrefillMs = max(ttft-t.QueueMs, 0)
	}
}

// llamaTimings reads llama.cpp's "timings" object: prompt_ms is the prompt
// evaluation time, prompt_n the prompt tokens evaluated, cache_n the prompt
// tokens reused from the slot's cache (prompt_n + cache_n is the prompt),
// predicted_ms the generation time (llama.cpp tools/server/README.md).
func llamaTimings(s *Scanner, c *Chunk) {
	if !s.Object() {
		return
	}
	c.Flags |= FlagTiming
	for k := s.Key(); k != nil; k = s.Key() {
		switch string(k) {
		case "prompt_ms":
			c.Timing.PrefillMs = s.float()
		case "prompt_n":
			c.Timing.PromptEval = s.int()
		case "predicted_ms":
			c.Timing.DecodeMs = s.float()
		case "cache_n":
			c.Timing.CachedTokens = s.int()
		default:
			s.Skip()
		}
	}
}

// intField consumes a value and returns the integer under name if the value
// is an object that has one, or -1.
func intField(s *Scanner, name string) int64 {
	n := int64(-1)
	if !s.Object() {
		return n
	}
	for k := s.Key(); k != nil; k = s.Key() {
		if string(k) == name {
			n = s.int()
		} else {
			s.Skip()
		}
	}
	return n
}
