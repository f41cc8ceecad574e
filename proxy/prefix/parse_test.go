package prefix

import (
	"fmt"
	"strings"
	"testing"

	"github.com/anvilproxy/anvilproxy/sse"
	"github.com/stretchr/testify/require"
)

// segments returns the canonical segments of body as "kind/role/index: text".
func segments(t *testing.T, tr *Tracker, proto sse.Protocol, body string) []string {
	t.Helper()
	sc := &scratch{proto: proto}
	require.Equal(t, TrackedOK, tr.build(sc, []byte(body)))
	tr.resolve(sc)
	var out []string
	for _, s := range sc.segs {
		out = append(out, fmt.Sprintf("%s/%s/%d: %s", s.kind, s.role, s.index, sc.canon.dst[s.start:s.end]))
	}
	return out
}

func TestCanonicalSegments(t *testing.T) {
	tr := newTracker(t, Config{VolatileFields: []string{"id"}})
	for _, tc := range []struct {
		name  string
		proto sse.Protocol
		body  string
		want  []string
	}{{
		name:  "chat",
		proto: sse.ProtocolChat,
		body: `{"model":"m","stream":true,"tools":[ {"type":"function", "function":{"name":"a"}}, {"type":"function","function":{"name":"b"}} ],
			"messages":[
				{"role":"system","content":"sys\u00e9 \"q\""},
				{"role":"developer","content":[{"type":"text","text":"dev"}]},
				{"role":"user","content":[{"type":"text","text":"look "},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"here"}]},
				{"content":null,"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"a","arguments":"{}"}}]},
				{"role":"tool","tool_call_id":"c1","content":"out"},
				{"role":"system","content":"late"}
			]}`,
		want: []string{
			`system/system/0: sysé "q"`,
			`system/developer/1: dev`,
			`tools/none/0: {"type":"function","function":{"name":"a"}}` + "\n" + `{"type":"function","function":{"name":"b"}}`,
			`message/user/2: look {"type":"image_url","image_url":{"url":"data:x"}}here`,
			"message/assistant/3: \x1ftool_calls:[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}}]",
			"message/tool/4: out\x1ftool_call_id:\"c1\"",
			`message/system/5: late`,
		},
	}, {
		name:  "responses",
		proto: sse.ProtocolResponses,
		body: `{"model":"m","instructions":"be brief","tools":[{"type":"function","name":"sh"}],"input":[
				{"role":"developer","content":"dev"},
				{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},
				{"type":"reasoning","id":"rs_1","summary":[]},
				{"type":"function_call","id":"fc_1","call_id":"c1","name":"sh","arguments":"{}"},
				{"type":"function_call_output","call_id":"c1","output":"ok"}
			]}`,
		want: []string{
			`system/system/0: be brief`,
			`system/developer/0: dev`,
			`tools/none/0: {"type":"function","name":"sh"}`,
			"message/user/1: hi\x1ftype:\"message\"",
			"message/assistant/2: \x1ftype:\"reasoning\"\x1fsummary:[]",
			"message/assistant/3: \x1ftype:\"function_call\"\x1fcall_id:\"c1\"\x1fname:\"sh\"\x1farguments:\"{}\"",
			"message/tool/4: ok\x1ftype:\"function_call_output\"\x1fcall_id:\"c1\"",
		},
	}, {
		name:  "responses string input",
		proto: sse.ProtocolResponses,
		body:  `{"input":"hello"}`,
		want:  []string{`message/user/0: hello`},
	}, {
		name:  "anthropic",
		proto: sse.ProtocolMessages,
		body: `{"model":"m","max_tokens":10,"metadata":{"user_id":"u"},
			"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}},{"type":"text","text":" more"}],
			"tools":[{"name":"t","input_schema":{},"cache_control":{"type":"ephemeral"}}],
			"messages":[
				{"role":"user","content":"hi"},
				{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"tool_use","id":"tu","name":"t","input":{}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu","content":"r","cache_control":{"type":"ephemeral"}}]}
			]}`,
		want: []string{
			`system/system/0: sys more`,
			`tools/none/0: {"name":"t","input_schema":{}}`,
			`message/user/0: hi`,
			`message/assistant/1: {"type":"thinking","thinking":"hm","signature":"s"}{"type":"tool_use","name":"t","input":{}}`,
			`message/user/2: {"type":"tool_result","tool_use_id":"tu","content":"r"}`,
		},
	}, {
		name:  "completions",
		proto: sse.ProtocolCompletions,
		body:  `{"prompt":["once upon"],"max_tokens":5}`,
		want:  []string{`prompt/none/0: once upon`},
	}, {
		name:  "ollama chat",
		proto: sse.ProtocolOllama,
		body:  `{"model":"m","stream":true,"options":{"num_predict":5},"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}]}`,
		want: []string{
			`system/system/0: sys`,
			`tools/none/0: {"type":"function","function":{"name":"f"}}`,
			`message/user/1: hi`,
		},
	}, {
		name:  "ollama generate",
		proto: sse.ProtocolOllama,
		body:  `{"model":"m","prompt":"once upon","system":"be brief","think":false}`,
		want:  []string{`system/system/0: be brief`, `prompt/none/0: once upon`},
	}, {
		name:  "completions token ids",
		proto: sse.ProtocolCompletions,
		body:  `{"prompt":[1, 2, 3]}`,
		want:  []string{`prompt/none/0: [1,2,3]`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, segments(t, tr, tc.proto, tc.body))
		})
	}
}

func TestCompletionsChunks(t *testing.T) {
	tr := newTracker(t, Config{})
	text := strings.Repeat("0123456789abcdef", 600) // 9600 bytes: chunks of 4096, 4096, 1408
	got := segments(t, tr, sse.ProtocolCompletions, `{"prompt":"`+text+`"}`)
	require.Len(t, got, 3)

	// A prompt that grows is reused up to its old end; an edit in the
	// second chunk is a drift at its offset in the whole prompt.
	r0 := tr.Observe(sse.ProtocolCompletions, []byte(`{"prompt":"`+text+`"}`), t0)
	r1 := tr.Observe(sse.ProtocolCompletions, []byte(`{"prompt":"`+text+` and more"}`), t0)
	require.False(t, r1.Drift.Happened)
	require.Equal(t, r0.PromptBytes, r1.ReusableBytes)
	edited := text[:5000] + "X" + text[5001:] + " and more"
	r2 := tr.Observe(sse.ProtocolCompletions, []byte(`{"prompt":"`+edited+`"}`), t0)
	require.True(t, r2.Drift.Happened)
	require.Equal(t, SegmentPrompt, r2.Drift.Segment)
	require.Equal(t, int64(5000), r2.Drift.Offset)
	require.Equal(t, ClassOther, r2.Drift.Class)
	require.Equal(t, int64(5000), r2.ReusableBytes)
	require.Equal(t, r0.ConversationID, r2.ConversationID)
}

func TestAnthropicCacheControlMovesWithoutDrift(t *testing.T) {
	// Claude Code marks the newest message with cache_control on every
	// turn; that is a hint to the server, not prompt text.
	tr := newTracker(t, Config{})
	msgs := []string{`{"role":"user","content":[{"type":"text","text":"Please refactor the storage layer of this service."}]}`}
	for i := range 6 {
		if i > 0 {
			msgs = append(msgs,
				fmt.Sprintf(`{"role":"assistant","content":[{"type":"tool_use","id":"tu%d","name":"read","input":{"path":"f%d.go"}}]}`, i, i),
				fmt.Sprintf(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu%d","content":"contents of file %d"}]}`, i, i))
		}
		marked := append([]string(nil), msgs...)
		last := marked[len(marked)-1]
		marked[len(marked)-1] = strings.Replace(last, `"}]}`, `","cache_control":{"type":"ephemeral"}}]}`, 1)
		body := `{"model":"claude","system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],"messages":[` + strings.Join(marked, ",") + `]}`
		r := tr.Observe(sse.ProtocolMessages, []byte(body), t0)
		require.True(t, r.Tracked, body)
		require.False(t, r.Drift.Happened, "turn %d: %+v", i, r.Drift)
		require.Equal(t, i, r.Turn)
	}
}

func TestResponsesConversation(t *testing.T) {
	tr := newTracker(t, Config{})
	items := []string{`{"role":"user","content":[{"type":"input_text","text":"Explain the failing build on the main branch."}]}`}
	var prev Result
	for i := range 4 {
		if i > 0 {
			items = append(items,
				fmt.Sprintf(`{"type":"function_call","call_id":"c%d","name":"sh","arguments":"{\"cmd\":\"ls\"}"}`, i),
				fmt.Sprintf(`{"type":"function_call_output","call_id":"c%d","output":"file%d"}`, i, i))
		}
		body := `{"model":"gpt","instructions":"You are Codex.","tools":[{"type":"function","name":"sh"}],"input":[` + strings.Join(items, ",") + `],"store":false}`
		r := tr.Observe(sse.ProtocolResponses, []byte(body), t0)
		require.False(t, r.Drift.Happened)
		if i > 0 {
			require.Equal(t, prev.PromptBytes, r.ReusableBytes)
		}
		prev = r
	}
}
