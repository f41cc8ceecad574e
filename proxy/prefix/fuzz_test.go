package prefix

import (
	"testing"

	"github.com/anvilproxy/anvilproxy/sse"
)

// FuzzObserve checks that no body makes Observe panic or break its
// invariants, for every protocol.
func FuzzObserve(f *testing.F) {
	seeds := []string{
		`{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a\u00e9\ud83d\ude00"}]}],"tools":[{"type":"function"}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"x"}]}`,
		`{"instructions":"i","input":[{"type":"function_call","call_id":"c"},{"role":"user","content":"u"}]}`,
		`{"input":"hello","tools":[]}`,
		`{"system":[{"type":"text","text":"s","cache_control":{}}],"messages":[{"role":"user","content":"hi"}]}`,
		`{"prompt":"once upon a time"}`,
		`{"prompt":[1,2,3]}`,
		`{"messages":[{"role":"user","content":"\ud800"}]}`,
		`{"messages":[{"content":[[[[[[[[[]]]]]]]]]}]}`,
		`{"messages":[{"role":"user","content":"unterminated}]}`,
		`{"a":"\\"}`,
		`{"messages":[{"role":"user"} {"role":"user"}]}`,
		`{"messages":[1,]}`,
		`{}`, `[]`, `null`, ``, `{"`,
	}
	for _, s := range seeds {
		for p := range sse.Protocol(5) {
			f.Add(uint8(p), []byte(s))
		}
	}
	tr, err := New(Config{MaxIndexBytes: 64 << 10, VolatileFields: []string{"id", "a.b"}, VolatilePatterns: []string{`\d+`}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, proto uint8, body []byte) {
		r := tr.Observe(sse.Protocol(proto%5), body, t0)
		if !r.Tracked {
			if r.Untracked == TrackedOK || r.Reuse != -1 {
				t.Fatalf("untracked without reason: %+v", r)
			}
			return
		}
		if r.ReusableBytes < 0 || r.ReusableBytes > r.PromptBytes || r.Segments == 0 {
			t.Fatalf("bad result %+v", r)
		}
		if r.PromptBytes > 0 && (r.Reuse < 0 || r.Reuse > 1) {
			t.Fatalf("bad reuse %+v", r)
		}
		if s := tr.Stats(); s.IndexBytes > s.IndexCapBytes {
			t.Fatalf("index over cap: %+v", s)
		}
		// A second identical request is a full reuse unless the cap is too
		// small to keep it.
		if r2 := tr.Observe(sse.Protocol(proto%5), body, t0); r2.Drift.Happened {
			t.Fatalf("repeat drifted: %+v", r2)
		}
	})
}
