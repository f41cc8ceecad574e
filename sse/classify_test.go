package sse

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// classifyStream parses a recorded stream and classifies every event.
func classifyStream(t *testing.T, proto Protocol, file string) (flags []string, u Usage, tm Timing) {
	t.Helper()
	in, err := os.ReadFile(filepath.Join("testdata", file))
	require.NoError(t, err)
	p := NewParser(0)
	p.Feed(in)
	u, tm = UnknownUsage(), unknownTiming()
	var ev Event
	var c Chunk
	for {
		ok, err := p.Next(&ev)
		require.NoError(t, err)
		if !ok {
			break
		}
		Classify(proto, &ev, &c)
		flags = append(flags, c.Flags.String())
		u.Merge(c.Usage)
		if c.Flags&FlagTiming != 0 {
			tm = c.Timing
		}
	}
	require.Zero(t, p.Pending())
	return flags, u, tm
}

func TestClassifyStreams(t *testing.T) {
	tests := []struct {
		name   string
		proto  Protocol
		flags  []string
		usage  Usage
		timing Timing
	}{
		{
			name:  "vllm_chat_reasoning.sse",
			proto: ProtocolChat,
			flags: []string{
				"role", "reasoning", "reasoning", "reasoning", "content", "content", "content",
				"finish", "usage", "done",
			},
			usage:  Usage{PromptTokens: 14, CompletionTokens: 27, CachedTokens: -1, ReasoningTokens: -1},
			timing: unknownTiming(),
		},
		{
			name:   "openai_chat.sse",
			proto:  ProtocolChat,
			flags:  []string{"role", "content", "content", "content", "finish", "usage", "done"},
			usage:  Usage{PromptTokens: 19, CompletionTokens: 10, CachedTokens: 0, ReasoningTokens: 0},
			timing: unknownTiming(),
		},
		{
			name:  "openai_tools.sse",
			proto: ProtocolChat,
			flags: []string{
				"role|tool_call", "tool_call", "tool_call", "tool_call", "tool_call", "0", "tool_call",
				"finish", "usage", "done",
			},
			usage:  Usage{PromptTokens: 1108, CompletionTokens: 17, CachedTokens: 1024, ReasoningTokens: 0},
			timing: unknownTiming(),
		},
		{
			name:   "llamacpp_chat.sse",
			proto:  ProtocolChat,
			flags:  []string{"role", "reasoning", "reasoning", "content", "content", "finish|usage|timing", "done"},
			usage:  Usage{PromptTokens: 68, CompletionTokens: 25, CachedTokens: 60, ReasoningTokens: -1},
			timing: Timing{QueueMs: -1, PrefillMs: 43.237, DecodeMs: 238.74, CachedTokens: 60, PromptEval: 8},
		},
		{
			// llama.cpp's native /completion stream: no choices, no
			// usage object, no [DONE]; "stop": true ends it.
			name:   "llamacpp_completion.sse",
			proto:  ProtocolLlama,
			flags:  []string{"content|usage", "content|usage", "content|usage", "usage", "finish|usage|done|timing"},
			usage:  Usage{PromptTokens: 68, CompletionTokens: 4, CachedTokens: 60, ReasoningTokens: -1},
			timing: Timing{QueueMs: -1, PrefillMs: 43.237, DecodeMs: 38.2, CachedTokens: 60, PromptEval: 8},
		},
		{
			name:   "vllm_metrics.sse",
			proto:  ProtocolChat,
			flags:  []string{"role", "content", "content", "finish", "usage|timing", "done"},
			usage:  Usage{PromptTokens: 42, CompletionTokens: 8, CachedTokens: 32, ReasoningTokens: -1},
			timing: Timing{QueueMs: 12.3, PrefillMs: 85.2 - 12.3, DecodeMs: -1, CachedTokens: -1, PromptEval: -1},
		},
		{
			name:   "completions.sse",
			proto:  ProtocolCompletions,
			flags:  []string{"content", "content", "content", "finish", "usage", "done"},
			usage:  Usage{PromptTokens: 6, CompletionTokens: 8, CachedTokens: -1, ReasoningTokens: -1},
			timing: unknownTiming(),
		},
		{
			name:  "responses.sse",
			proto: ProtocolResponses,
			flags: []string{
				"0", "0", "0", "0", "reasoning", "reasoning", "0", "0", "0",
				"0", "0", "content", "content", "content", "0", "0", "0",
				"finish|usage|done",
			},
			usage:  Usage{PromptTokens: 36, CompletionTokens: 187, CachedTokens: 0, ReasoningTokens: 128},
			timing: unknownTiming(),
		},
		{
			name:   "responses_tool.sse",
			proto:  ProtocolResponses,
			flags:  []string{"0", "0", "tool_call", "tool_call", "tool_call", "tool_call", "0", "0", "finish|usage|done"},
			usage:  Usage{PromptTokens: 291, CompletionTokens: 23, CachedTokens: 256, ReasoningTokens: 0},
			timing: unknownTiming(),
		},
		{
			name:  "anthropic_thinking.sse",
			proto: ProtocolMessages,
			flags: []string{
				"usage", "0", "ping", "reasoning", "reasoning", "0", "0",
				"0", "content", "content", "0", "finish|usage", "done",
			},
			usage:  Usage{PromptTokens: 12 + 2048, CompletionTokens: 97, CachedTokens: 2048, ReasoningTokens: -1},
			timing: unknownTiming(),
		},
		{
			name:  "anthropic_tool.sse",
			proto: ProtocolMessages,
			flags: []string{
				"usage", "0", "content", "0", "tool_call", "0", "tool_call", "tool_call", "0",
				"finish|usage", "done",
			},
			usage:  Usage{PromptTokens: 472 + 1536, CompletionTokens: 89, CachedTokens: 0, ReasoningTokens: -1},
			timing: unknownTiming(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flags, usage, timing := classifyStream(t, tt.proto, tt.name)
			require.Equal(t, tt.flags, flags)
			require.Equal(t, tt.usage, usage)
			require.InDelta(t, tt.timing.QueueMs, timing.QueueMs, 1e-9)
			require.InDelta(t, tt.timing.PrefillMs, timing.PrefillMs, 1e-9)
			require.Equal(t, tt.timing.CachedTokens, timing.CachedTokens)
			require.InDelta(t, tt.timing.DecodeMs, timing.DecodeMs, 1e-9)
			require.Equal(t, tt.timing.PromptEval, timing.PromptEval)
		})
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name  string
		proto Protocol
		typ   string
		data  string
		want  string
	}{
		{name: "chat role with empty content", proto: ProtocolChat, data: `{"choices":[{"delta":{"role":"assistant","content":""}}]}`, want: "role"},
		{name: "chat null content", proto: ProtocolChat, data: `{"choices":[{"delta":{"content":null}}]}`, want: "0"},
		{name: "chat escaped newline is output", proto: ProtocolChat, data: `{"choices":[{"delta":{"content":"\n"}}]}`, want: "content"},
		{name: "chat escaped quote", proto: ProtocolChat, data: `{"choices":[{"delta":{"content":"\"}\""}}]}`, want: "content"},
		{name: "chat reasoning", proto: ProtocolChat, data: `{"choices":[{"delta":{"reasoning":"hm"}}]}`, want: "reasoning"},
		{name: "chat empty reasoning", proto: ProtocolChat, data: `{"choices":[{"delta":{"reasoning_content":"","content":null}}]}`, want: "0"},
		{name: "chat refusal", proto: ProtocolChat, data: `{"choices":[{"delta":{"refusal":"I can't"}}]}`, want: "content"},
		{name: "chat tool call without name or arguments", proto: ProtocolChat, data: `{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"arguments":""}}]}}]}`, want: "0"},
		{name: "chat legacy function_call", proto: ProtocolChat, data: `{"choices":[{"delta":{"function_call":{"arguments":"{"}}}]}`, want: "tool_call"},
		{name: "chat empty finish_reason", proto: ProtocolChat, data: `{"choices":[{"delta":{},"finish_reason":""}]}`, want: "0"},
		{name: "chat several choices", proto: ProtocolChat, data: `{"choices":[{"delta":{"content":"a"}},{"delta":{"reasoning":"b"},"finish_reason":"length"}]}`, want: "reasoning|content|finish"},
		{name: "chat usage before choices", proto: ProtocolChat, data: `{"usage":{"prompt_tokens":1},"choices":[{"delta":{"content":"a"}}]}`, want: "content|usage"},
		{name: "chat null usage", proto: ProtocolChat, data: `{"choices":[],"usage":null}`, want: "0"},
		{name: "chat pretty-printed", proto: ProtocolChat, data: "{\n  \"choices\" : [ {\n    \"delta\" : { \"content\" : \"x\" } } ]\n}", want: "content"},
		{name: "chat metrics alone", proto: ProtocolChat, data: `{"id":"chatcmpl-1","object":"chat.completion.chunk","metrics":{"queue_time_ms":1.5}}`, want: "timing"},
		{name: "chat error object", proto: ProtocolChat, data: `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`, want: "error"},
		{name: "chat old vLLM error", proto: ProtocolChat, data: `{"object":"error","message":"boom","type":"BadRequestError","param":null,"code":400}`, want: "error"},
		{name: "chat not JSON", proto: ProtocolChat, data: `hello`, want: "unparsed"},
		{name: "chat truncated JSON", proto: ProtocolChat, data: `{"choices":[{"delta":{"content":"hi"`, want: "unparsed"},
		{name: "chat unknown shape", proto: ProtocolChat, data: `{"foo":1}`, want: "unparsed"},
		{name: "chat array", proto: ProtocolChat, data: `[{"choices":[]}]`, want: "unparsed"},
		{name: "chat empty data", proto: ProtocolChat, data: ``, want: "unparsed"},
		{name: "done", proto: ProtocolChat, data: `[DONE]`, want: "done"},
		{name: "done is exact", proto: ProtocolChat, data: ` [DONE]`, want: "unparsed"},
		{name: "error event with text", proto: ProtocolChat, typ: "error", data: `upstream timed out`, want: "error|unparsed"},
		{name: "completions text", proto: ProtocolCompletions, data: `{"choices":[{"text":" Paris","finish_reason":null}]}`, want: "content"},
		{name: "completions empty text", proto: ProtocolCompletions, data: `{"choices":[{"text":"","finish_reason":"stop"}]}`, want: "finish"},
		{name: "responses type from event field", proto: ProtocolResponses, typ: "response.output_text.delta", data: `{"delta":"x"}`, want: "content"},
		{name: "responses JSON type wins", proto: ProtocolResponses, typ: "message", data: `{"delta":"x","type":"response.reasoning_text.delta"}`, want: "reasoning"},
		{name: "responses empty delta", proto: ProtocolResponses, data: `{"type":"response.output_text.delta","delta":""}`, want: "0"},
		{name: "responses refusal", proto: ProtocolResponses, data: `{"type":"response.refusal.delta","delta":"no"}`, want: "content"},
		{name: "responses unknown type", proto: ProtocolResponses, data: `{"type":"response.audio.delta","delta":"AAAA"}`, want: "0"},
		{name: "responses failed", proto: ProtocolResponses, data: `{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"},"usage":null}}`, want: "done|error"},
		{name: "responses incomplete", proto: ProtocolResponses, data: `{"type":"response.incomplete","response":{"status":"incomplete","usage":{"input_tokens":5,"output_tokens":9}}}`, want: "finish|usage|done"},
		{name: "responses error", proto: ProtocolResponses, data: `{"type":"error","code":"ERR_SOMETHING","message":"x","param":null,"sequence_number":1}`, want: "error"},
		{name: "responses message item added", proto: ProtocolResponses, data: `{"type":"response.output_item.added","item":{"type":"message","content":[{"type":"output_text","text":"x"}]}}`, want: "0"},
		{name: "responses item done is not output", proto: ProtocolResponses, data: `{"type":"response.output_item.done","item":{"type":"function_call","name":"f","arguments":"{}"}}`, want: "0"},
		{name: "responses without type", proto: ProtocolResponses, data: `{"delta":"x"}`, want: "unparsed"},
		{name: "messages ping", proto: ProtocolMessages, typ: "ping", data: `{"type": "ping"}`, want: "ping"},
		{name: "messages error", proto: ProtocolMessages, typ: "error", data: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, want: "error"},
		{name: "messages signature", proto: ProtocolMessages, data: `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}`, want: "0"},
		{name: "messages empty thinking", proto: ProtocolMessages, data: `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":""}}`, want: "0"},
		{name: "messages delta without stop reason", proto: ProtocolMessages, data: `{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":3}}`, want: "usage"},
		{name: "messages type from event field", proto: ProtocolMessages, typ: "message_stop", data: `{}`, want: "done"},
		{name: "messages not JSON", proto: ProtocolMessages, data: `{"type":"message_stop"`, want: "unparsed"},
		{name: "unknown protocol", proto: ProtocolUnknown, data: `{"choices":[{"delta":{"content":"x"}}]}`, want: "unparsed"},
		{name: "unknown protocol done", proto: ProtocolUnknown, data: `[DONE]`, want: "done"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Chunk
			Classify(tt.proto, &Event{Type: []byte(tt.typ), Data: []byte(tt.data)}, &c)
			require.Equal(t, tt.want, c.Flags.String())
		})
	}
}

func TestClassifyUsage(t *testing.T) {
	unknown := UnknownUsage()
	tests := []struct {
		name  string
		proto Protocol
		data  string
		want  Usage
	}{
		{
			name:  "chat details null",
			proto: ProtocolChat,
			data:  `{"choices":[],"usage":{"prompt_tokens":14,"total_tokens":41,"completion_tokens":27,"prompt_tokens_details":null,"completion_tokens_details":null}}`,
			want:  Usage{PromptTokens: 14, CompletionTokens: 27, CachedTokens: -1, ReasoningTokens: -1},
		},
		{
			name:  "chat details",
			proto: ProtocolChat,
			data:  `{"choices":[],"usage":{"completion_tokens_details":{"reasoning_tokens":7},"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":96},"prompt_tokens":100,"completion_tokens":9}}`,
			want:  Usage{PromptTokens: 100, CompletionTokens: 9, CachedTokens: 96, ReasoningTokens: 7},
		},
		{
			name:  "numbers that are not plain integers",
			proto: ProtocolChat,
			data:  `{"usage":{"prompt_tokens":12.0,"completion_tokens":-3,"prompt_tokens_details":{"cached_tokens":"5"},"completion_tokens_details":{"reasoning_tokens":1e2}}}`,
			want:  Usage{PromptTokens: 12, CompletionTokens: -1, CachedTokens: -1, ReasoningTokens: 100},
		},
		{
			name:  "responses",
			proto: ProtocolResponses,
			data:  `{"type":"response.completed","response":{"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":4},"output_tokens":187,"output_tokens_details":{"reasoning_tokens":128},"total_tokens":223}}}`,
			want:  Usage{PromptTokens: 36, CompletionTokens: 187, CachedTokens: 4, ReasoningTokens: 128},
		},
		{
			name:  "anthropic start",
			proto: ProtocolMessages,
			data:  `{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_creation_input_tokens":200,"cache_read_input_tokens":3000,"output_tokens":1}}}`,
			want:  Usage{PromptTokens: 3210, CompletionTokens: 1, CachedTokens: 3000, ReasoningTokens: -1},
		},
		{
			name:  "anthropic without cache fields",
			proto: ProtocolMessages,
			data:  `{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}`,
			want:  Usage{PromptTokens: 10, CompletionTokens: 1, CachedTokens: -1, ReasoningTokens: -1},
		},
		{
			name:  "anthropic delta",
			proto: ProtocolMessages,
			data:  `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`,
			want:  Usage{PromptTokens: -1, CompletionTokens: 15, CachedTokens: -1, ReasoningTokens: -1},
		},
		{
			name:  "anthropic delta with input",
			proto: ProtocolMessages,
			data:  `{"type":"message_delta","usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":15}}`,
			want:  Usage{PromptTokens: 15, CompletionTokens: 15, CachedTokens: 5, ReasoningTokens: -1},
		},
		{name: "no usage", proto: ProtocolChat, data: `{"choices":[]}`, want: unknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Chunk
			Classify(tt.proto, &Event{Data: []byte(tt.data)}, &c)
			require.Equal(t, tt.want, c.Usage)
		})
	}
}

func TestClassifyTiming(t *testing.T) {
	tests := []struct {
		name string
		data string
		want Timing
	}{
		{
			name: "vllm prefill from ttft",
			data: `{"choices":[],"metrics":{"time_to_first_token_ms":100.5,"queue_time_ms":20.25}}`,
			want: Timing{QueueMs: 20.25, PrefillMs: 80.25, CachedTokens: -1, DecodeMs: -1, InferenceMs: -1, TotalMs: -1, LoadMs: -1, PromptEval: -1},
		},
		{
			name: "vllm prefill reported",
			data: `{"choices":[],"metrics":{"prefill_time_ms":30,"time_to_first_token_ms":100,"queue_time_ms":20}}`,
			want: Timing{QueueMs: 20, PrefillMs: 30, CachedTokens: -1, DecodeMs: -1, InferenceMs: -1, TotalMs: -1, LoadMs: -1, PromptEval: -1},
		},
		{
			name: "vllm queue only",
			data: `{"choices":[],"metrics":{"queue_time_ms":1e1}}`,
			want: Timing{QueueMs: 10, PrefillMs: -1, CachedTokens: -1, DecodeMs: -1, InferenceMs: -1, TotalMs: -1, LoadMs: -1, PromptEval: -1},
		},
		{
			name: "llama.cpp",
			data: `{"choices":[],"timings":{"cache_n":236,"prompt_n":1,"prompt_ms":30.958,"predicted_ms":1.5}}`,
			want: Timing{QueueMs: -1, PrefillMs: 30.958, DecodeMs: 1.5, InferenceMs: -1, TotalMs: -1, LoadMs: -1, CachedTokens: 236, PromptEval: 1},
		},
		{
			name: "not numbers",
			data: `{"choices":[],"timings":{"cache_n":null,"prompt_ms":"fast"}}`,
			want: Timing{QueueMs: -1, PrefillMs: -1, CachedTokens: -1, DecodeMs: -1, InferenceMs: -1, TotalMs: -1, LoadMs: -1, PromptEval: -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Chunk
			Classify(ProtocolChat, &Event{Data: []byte(tt.data)}, &c)
			require.Equal(t, FlagTiming, c.Flags&FlagTiming)
			require.Equal(t, tt.want, c.Timing)
		})
	}
}

func TestClassifyBody(t *testing.T) {
	tests := []struct {
		name  string
		proto Protocol
		body  string
		want  string
		usage Usage
	}{
		{
			name:  "openai chat",
			proto: ProtocolChat,
			body: `{"id":"chatcmpl-1","object":"chat.completion","created":1764412260,"model":"gpt-4o-mini-2024-07-18",
				"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help?","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],
				"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}},
				"service_tier":"default","system_fingerprint":"fp_560af6e559"}`,
			want:  "role|content|finish|usage",
			usage: Usage{PromptTokens: 19, CompletionTokens: 10, CachedTokens: 0, ReasoningTokens: 0},
		},
		{
			name:  "vllm chat with reasoning and a tool call",
			proto: ProtocolChat,
			body: `{"id":"chatcmpl-2","object":"chat.completion","created":1764412200,"model":"Qwen/Qwen3-8B",
				"choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning_content":"Need the weather.",
				"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
				"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],
				"usage":{"prompt_tokens":300,"total_tokens":340,"completion_tokens":40,"prompt_tokens_details":null},"prompt_logprobs":null}`,
			want:  "role|reasoning|tool_call|finish|usage",
			usage: Usage{PromptTokens: 300, CompletionTokens: 40, CachedTokens: -1, ReasoningTokens: -1},
		},
		{
			name:  "llama.cpp chat",
			proto: ProtocolChat,
			body: `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Hello! 👋","reasoning_content":"Need friendly greeting."}}],
				"created":1781202801,"model":"gpt-oss-20b","object":"chat.completion",
				"usage":{"completion_tokens":25,"prompt_tokens":68,"total_tokens":93,"prompt_tokens_details":{"cached_tokens":60}},
				"id":"chatcmpl-3","timings":{"cache_n":60,"prompt_n":8,"prompt_ms":43.237,"predicted_n":25,"predicted_ms":238.74}}`,
			want:  "role|reasoning|content|finish|usage|timing",
			usage: Usage{PromptTokens: 68, CompletionTokens: 25, CachedTokens: 60, ReasoningTokens: -1},
		},
		{
			name:  "completions",
			proto: ProtocolCompletions,
			body: `{"id":"cmpl-1","object":"text_completion","created":1764412500,"model":"Qwen/Qwen3-8B",
				"choices":[{"index":0,"text":" Paris. It is known for","logprobs":null,"finish_reason":"length","stop_reason":null}],
				"usage":{"prompt_tokens":6,"total_tokens":14,"completion_tokens":8}}`,
			want:  "content|finish|usage",
			usage: Usage{PromptTokens: 6, CompletionTokens: 8, CachedTokens: -1, ReasoningTokens: -1},
		},
		{
			name:  "responses",
			proto: ProtocolResponses,
			body: `{"id":"resp_1","object":"response","created_at":1764412400,"status":"completed","error":null,"model":"o4-mini-2025-04-16",
				"output":[{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"**Greeting**"}]},
				{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"text":"Hi there!"}]}],
				"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":187,"output_tokens_details":{"reasoning_tokens":128},"total_tokens":223}}`,
			want:  "reasoning|content|finish|usage",
			usage: Usage{PromptTokens: 36, CompletionTokens: 187, CachedTokens: 0, ReasoningTokens: 128},
		},
		{
			name:  "responses function call",
			proto: ProtocolResponses,
			body: `{"id":"resp_2","object":"response","status":"completed","output":[{"id":"fc_1","type":"function_call","status":"completed",
				"arguments":"{\"location\":\"Paris\"}","call_id":"call_1","name":"get_weather"}],
				"usage":{"input_tokens":291,"input_tokens_details":{"cached_tokens":256},"output_tokens":23,"output_tokens_details":{"reasoning_tokens":0}}}`,
			want:  "tool_call|finish|usage",
			usage: Usage{PromptTokens: 291, CompletionTokens: 23, CachedTokens: 256, ReasoningTokens: 0},
		},
		{
			name:  "responses empty reasoning summary",
			proto: ProtocolResponses,
			body:  `{"object":"response","status":"incomplete","output":[{"type":"reasoning","summary":[]}],"usage":null}`,
			want:  "finish",
			usage: UnknownUsage(),
		},
		{
			name:  "responses failed",
			proto: ProtocolResponses,
			body:  `{"object":"response","status":"failed","error":{"code":"server_error","message":"x"},"output":[],"usage":null}`,
			want:  "error",
			usage: UnknownUsage(),
		},
		{
			name:  "anthropic",
			proto: ProtocolMessages,
			body: `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929",
				"content":[{"type":"thinking","thinking":"Let me check.","signature":"EqQB"},{"type":"text","text":"Checking the weather."},
				{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"location":"Paris"}}],
				"stop_reason":"tool_use","stop_sequence":null,
				"usage":{"input_tokens":472,"cache_creation_input_tokens":0,"cache_read_input_tokens":1536,"output_tokens":89}}`,
			want:  "reasoning|content|tool_call|finish|usage",
			usage: Usage{PromptTokens: 2008, CompletionTokens: 89, CachedTokens: 1536, ReasoningTokens: -1},
		},
		{
			name:  "anthropic error",
			proto: ProtocolMessages,
			body:  `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			want:  "error",
			usage: UnknownUsage(),
		},
		{name: "chat error", proto: ProtocolChat, body: `{"error":{"message":"model not found","type":"NotFoundError","code":404}}`, want: "error", usage: UnknownUsage()},
		{name: "html", proto: ProtocolChat, body: `<html><body>502 Bad Gateway</body></html>`, want: "unparsed", usage: UnknownUsage()},
		{name: "empty", proto: ProtocolResponses, body: ``, want: "unparsed", usage: UnknownUsage()},
		{name: "truncated", proto: ProtocolMessages, body: `{"type":"message","content":[{"type":"text","text":"Hi`, want: "unparsed", usage: UnknownUsage()},
		{name: "unknown protocol", proto: ProtocolUnknown, body: `{}`, want: "unparsed", usage: UnknownUsage()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Chunk
			ClassifyBody(tt.proto, []byte(tt.body), &c)
			require.Equal(t, tt.want, c.Flags.String())
			require.Equal(t, tt.usage, c.Usage)
		})
	}
}

func TestUsageMerge(t *testing.T) {
	u := UnknownUsage()
	u.Merge(Usage{PromptTokens: 10, CompletionTokens: 1, CachedTokens: 0, ReasoningTokens: -1})
	u.Merge(Usage{PromptTokens: -1, CompletionTokens: 97, CachedTokens: -1, ReasoningTokens: -1})
	require.Equal(t, Usage{PromptTokens: 10, CompletionTokens: 97, CachedTokens: 0, ReasoningTokens: -1}, u)
}

func TestStrings(t *testing.T) {
	require.Equal(t, "0", Flags(0).String())
	require.Equal(t, "role|tool_call", (FlagRole | FlagToolCall).String())
	require.Equal(t, "timing|0x8000", (FlagTiming | 1<<15).String())
	for p, want := range map[Protocol]string{
		ProtocolUnknown: "unknown", ProtocolChat: "chat", ProtocolCompletions: "completions",
		ProtocolResponses: "responses", ProtocolMessages: "messages", 99: "unknown",
	} {
		require.Equal(t, want, p.String())
	}
}

// TestClassifyLlama holds llama.cpp's native completion events to their
// own end marker: only the literal "stop": true ends the stream.
func TestClassifyLlama(t *testing.T) {
	for _, tt := range []struct {
		data string
		want string
	}{
		{`{"content":"x","stop":false}`, "content"},
		{`{"content":"","stop":true}`, "finish|done"},
		{`{"content":"x","stop":"true"}`, "content"},
		{`{"stop":null,"content":null}`, "0"},
		{`{"error":{"code":500,"message":"slot unavailable","type":"server_error"}}`, "error"},
		{`{"choices":[{"text":"x","finish_reason":null}]}`, "content"},
		{`{"id_slot":0,"model":"m"}`, "unparsed"},
		{`{"content":"x","stop":tru}`, "content"}, // the scanner does not spell-check literals; not true, so no end
	} {
		var c Chunk
		Classify(ProtocolLlama, &Event{Data: []byte(tt.data)}, &c)
		require.Equal(t, tt.want, c.Flags.String(), tt.data)
	}
	// A whole non-stream body: the same object, read once.
	var c Chunk
	ClassifyBody(ProtocolLlama, []byte(`{"content":"LoRA is","stop":true,"tokens_predicted":3,"tokens_evaluated":68,"tokens_cached":71,"timings":{"cache_n":60,"prompt_n":8,"prompt_ms":43.2}}`), &c)
	require.Equal(t, "content|finish|usage|done|timing", c.Flags.String())
	require.Equal(t, Usage{PromptTokens: 68, CompletionTokens: 3, CachedTokens: 60, ReasoningTokens: -1}, c.Usage)
	require.Equal(t, "llama_completion", ProtocolLlama.String())
}
