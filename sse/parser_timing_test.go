package sse

import (
	"bytes"
	"os"
	"testing"
)

func readStream(b *testing.B, name string) []byte {
	b.Helper()
	in, err := os.ReadFile("testdata/" + name)
	if err != nil {
		b.Fatal(err)
	}
	return in
}

// BenchmarkParser parses a long chat stream fed in 4 KiB reads.
func BenchmarkParser(b *testing.B) {
	one := readStream(b, "openai_chat.sse")
	in := bytes.Repeat(one, 100)
	p := NewParser(0)
	var ev Event
	events := 0
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		p.Reset()
		for rest := in; len(rest) > 0; {
			k := min(4096, len(rest))
			p.Feed(rest[:k])
			rest = rest[k:]
			for ok, _ := p.Next(&ev); ok; ok, _ = p.Next(&ev) {
				events++
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}

// BenchmarkParserEventPerRead feeds one event per read, as engines flush
// each event on its own.
func BenchmarkParserEventPerRead(b *testing.B) {
	in := readStream(b, "vllm_chat_reasoning.sse")
	reads := bytes.SplitAfter(in, []byte("\n\n"))
	p := NewParser(0)
	var ev Event
	events := 0
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		p.Reset()
		for _, r := range reads {
			p.Feed(r)
			for ok, _ := p.Next(&ev); ok; ok, _ = p.Next(&ev) {
				events++
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
}

func benchmarkClassify(b *testing.B, proto Protocol, typ, data string) {
	ev := Event{Type: []byte(typ), Data: []byte(data)}
	var c Chunk
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		Classify(proto, &ev, &c)
	}
	if c.Flags&(FlagContent|FlagUsage) == 0 {
		b.Fatalf("flags %v", c.Flags)
	}
}

func BenchmarkClassifyChat(b *testing.B) {
	benchmarkClassify(b, ProtocolChat, "", `{"id":"chatcmpl-8c1f2e4a9b7d4f0e8a6c3b2d1e0f9a8b","object":"chat.completion.chunk","created":1764412200,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":" I help you today?"},"logprobs":null,"finish_reason":null}]}`)
}

func BenchmarkClassifyChatUsage(b *testing.B) {
	benchmarkClassify(b, ProtocolChat, "", `{"id":"chatcmpl-CXj4Ykq2Vb0mZ3tRfLwQ8sN1pE6aH","object":"chat.completion.chunk","created":1764412260,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_560af6e559","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"obfuscation":"k3Vq"}`)
}

func BenchmarkClassifyCompletions(b *testing.B) {
	benchmarkClassify(b, ProtocolCompletions, "", `{"id":"cmpl-3f1b2c4d5e6f4a7b8c9d0e1f2a3b4c5d","object":"text_completion","created":1764412500,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`)
}

func BenchmarkClassifyResponses(b *testing.B) {
	benchmarkClassify(b, ProtocolResponses, "response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":11,"item_id":"msg_68a1c0d4","output_index":1,"content_index":0,"delta":"Hi there!","logprobs":[],"obfuscation":"a"}`)
}

func BenchmarkClassifyMessages(b *testing.B) {
	benchmarkClassify(b, ProtocolMessages, "content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hello!"}}`)
}

// BenchmarkParseAndClassify runs every recorded stream through a Parser
// and Classify, one event per read.
func BenchmarkParseAndClassify(b *testing.B) {
	for _, name := range []string{"vllm_chat_reasoning.sse", "responses.sse", "anthropic_thinking.sse"} {
		proto := map[string]Protocol{
			"vllm_chat_reasoning.sse": ProtocolChat,
			"responses.sse":           ProtocolResponses,
			"anthropic_thinking.sse":  ProtocolMessages,
		}[name]
		b.Run(name, func(b *testing.B) {
			in := readStream(b, name)
			reads := bytes.SplitAfter(in, []byte("\n\n"))
			p := NewParser(0)
			var ev Event
			var c Chunk
			events := 0
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				p.Reset()
				for _, r := range reads {
					p.Feed(r)
					for ok, _ := p.Next(&ev); ok; ok, _ = p.Next(&ev) {
						Classify(proto, &ev, &c)
						events++
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
		})
	}
}
