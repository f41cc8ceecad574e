//go:build !race

package sse

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// streamProtocols maps each recorded stream to its protocol.
var streamProtocols = map[string]Protocol{
	"vllm_chat_reasoning.sse":    ProtocolChat,
	"openai_chat.sse":            ProtocolChat,
	"openai_tools.sse":           ProtocolChat,
	"llamacpp_chat.sse":          ProtocolChat,
	"llamacpp_completion.sse":    ProtocolLlama,
	"llamacpp_chat_prompt_n.sse": ProtocolChat,
	"vllm_metrics.sse":           ProtocolChat,
	"completions.sse":            ProtocolCompletions,
	"responses.sse":              ProtocolResponses,
	"responses_tool.sse":         ProtocolResponses,
	"anthropic_thinking.sse":     ProtocolMessages,
	"anthropic_tool.sse":         ProtocolMessages,
}

// parseAndClassify runs a stream through p in pieces of size n and returns
// the number of events.
func parseAndClassify(p *Parser, proto Protocol, in []byte, n int) int {
	var ev Event
	var c Chunk
	events := 0
	p.Reset()
	for len(in) > 0 {
		k := min(n, len(in))
		p.Feed(in[:k])
		in = in[k:]
		for {
			ok, err := p.Next(&ev)
			if !ok && err == nil {
				break
			}
			if ok {
				Classify(proto, &ev, &c)
				events++
			}
		}
	}
	return events
}

func TestAllocsParseAndClassify(t *testing.T) {
	files := streamFiles(t)
	require.Len(t, files, len(streamProtocols))
	for name, in := range files {
		proto, ok := streamProtocols[name]
		require.True(t, ok, name)
		for _, n := range []int{len(in), 4096, 64, 1} {
			p := NewParser(0)
			parseAndClassify(p, proto, in, n) // grow the buffers
			allocs := testing.AllocsPerRun(50, func() { parseAndClassify(p, proto, in, n) })
			require.Zero(t, allocs, "%s in pieces of %d bytes", name, n)
		}
	}
}

// splitAndClassify runs an NDJSON stream through l in pieces of size n and
// returns the number of lines.
func splitAndClassify(l *Lines, in []byte, n int) int {
	var ev Event
	var c Chunk
	lines := 0
	l.Reset()
	for len(in) > 0 {
		k := min(n, len(in))
		l.Feed(in[:k])
		in = in[k:]
		for {
			ok, err := l.Next(&ev)
			if !ok && err == nil {
				break
			}
			if ok {
				Classify(ProtocolOllama, &ev, &c)
				lines++
			}
		}
	}
	return lines
}

func TestAllocsLinesAndClassify(t *testing.T) {
	for name, in := range ndjsonFiles(t) {
		for _, n := range []int{len(in), 4096, 64, 1} {
			l := NewLines(0)
			require.NotZero(t, splitAndClassify(l, in, n)) // grow the buffers
			allocs := testing.AllocsPerRun(50, func() { splitAndClassify(l, in, n) })
			require.Zero(t, allocs, "%s in pieces of %d bytes", name, n)
		}
	}
	in := []byte("{\"response\":\"0123456789\"}\n\n{\"done\":true}\n")
	l := NewLines(10)
	splitAndClassify(l, in, 3)
	require.Zero(t, testing.AllocsPerRun(50, func() { splitAndClassify(l, in, 3) }), "a line too large")
}

func TestAllocsTooLarge(t *testing.T) {
	in := []byte("data: 0123456789\ndata: 0123456789\n\ndata: ok\n\n")
	p := NewParser(10)
	parseAndClassify(p, ProtocolChat, in, 3)
	require.Zero(t, testing.AllocsPerRun(50, func() { parseAndClassify(p, ProtocolChat, in, 3) }))
}

func TestAllocsClassifyBody(t *testing.T) {
	var c Chunk
	for _, tt := range []struct {
		proto Protocol
		body  string
	}{
		{ProtocolChat, `{"choices":[{"message":{"role":"assistant","content":"x","tool_calls":[{"function":{"name":"f"}}]},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":0}},"timings":{"prompt_ms":1.5},"metrics":{"queue_time_ms":2.25}}`},
		{ProtocolResponses, `{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}],"usage":{"input_tokens":1}}`},
		{ProtocolMessages, `{"type":"message","content":[{"type":"text","text":"x"}],"stop_reason":"end_turn","usage":{"input_tokens":1}}`},
		{ProtocolChat, `{"choices":[{"delta":{"content":"unterminated`},
		{ProtocolLlama, `{"content":"x","stop":true,"tokens_predicted":3,"tokens_evaluated":9,"generation_settings":{"stop":[]},"timings":{"cache_n":1,"prompt_n":8,"prompt_ms":2.5,"predicted_ms":4}}`},
		{ProtocolOllama, `{"model":"m","message":{"role":"assistant","content":"x","thinking":"y","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},"done":true,"done_reason":"stop","total_duration":27118881,"load_duration":3674993,"prompt_eval_count":25,"prompt_eval_duration":654849,"eval_count":45,"eval_duration":15708497}`},
	} {
		body := []byte(tt.body)
		allocs := testing.AllocsPerRun(50, func() { ClassifyBody(tt.proto, body, &c) })
		require.Zero(t, allocs, tt.body)
	}
}

// TestAllocsClassifyMalformed feeds Classify what could make a careless
// scanner allocate: numbers strconv rejects (its errors escape), deep
// nesting and broken strings.
func TestAllocsClassifyMalformed(t *testing.T) {
	var c Chunk
	for _, data := range []string{
		`{"usage":{"prompt_tokens":1e400,"completion_tokens":-nan,"total_tokens":0x1p3}}`,
		`{"metrics":{"queue_time_ms":Infinity,"prefill_time_ms":1e99999,"time_to_first_token_ms":1_000}}`,
		`{"timings":{"prompt_ms":12345678901234567890123456789012345,"cache_n":99999999999999999999}}`,
		`{"choices":[{"delta":{"content":"\u12`,
		`{"choices":` + strings.Repeat("[", 10000),
		`{"type":"message_start","message":{"message":{"message":{"content":[[[{}]]]}}}}`,
		`{"type":"response.completed","response":{"usage":{"input_tokens":"12"}}}`,
		"\x00\xff{",
	} {
		ev := Event{Type: []byte("error"), Data: []byte(data)}
		for proto := ProtocolUnknown; proto < numProtocols; proto++ {
			allocs := testing.AllocsPerRun(20, func() {
				Classify(proto, &ev, &c)
				ClassifyBody(proto, ev.Data, &c)
			})
			require.Zero(t, allocs, "%v %.40q", proto, data)
		}
	}
}

// FuzzAllocs checks that no input makes a warmed Parser or the classifiers
// allocate.
func FuzzAllocs(f *testing.F) {
	for _, in := range streamFiles(f) {
		f.Add(in)
	}
	f.Add([]byte(`data: {"usage":{"prompt_tokens":1e400}}` + "\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var c Chunk
		p := NewParser(0)
		for proto := ProtocolUnknown; proto < numProtocols; proto++ {
			parseAndClassify(p, proto, in, 7)
			allocs := testing.AllocsPerRun(1, func() {
				parseAndClassify(p, proto, in, 7)
				ClassifyBody(proto, in, &c)
			})
			require.Zero(t, allocs, "%v", proto)
		}
	})
}
