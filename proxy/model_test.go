package proxy

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRequestModel: the scan reads what decoding the whole body reads,
// escapes decoded, and a body it cannot read is decoded instead.
func TestRequestModel(t *testing.T) {
	cases := []struct{ body, want string }{
		{`{"model":"qwen3-8b","messages":[]}`, "qwen3-8b"},
		{`{"messages":[{"role":"user","content":"\"model\":\"no\""}],"model":"yes"}`, "yes"},
		{`{"model":"caf\u00e9"}`, "café"},
		{`{"model":"café"}`, "café"},
		{`{"mod\u0065l":"escaped-key"}`, "escaped-key"},
		{`{"model":"a","model":"b"}`, "b"},
		{`{"model":7}`, ""},
		{`{"Model":"x"}`, ""},
		{`{"model":"cut`, ""},
		{`not json`, ""},
		{``, ""},
		{"{\"model\":\"\xff\"}", "\uFFFD"},
	}
	for _, c := range cases {
		require.Equal(t, c.want, string(requestModel([]byte(c.body))), c.body)
		if c.body != "" && c.body[0] == '{' {
			require.Equal(t, string(decodeModel([]byte(c.body))), string(requestModel([]byte(c.body))), c.body)
		}
	}
}

func agentBody(n int) []byte {
	msg := `{"role":"user","content":"` + strings.Repeat(`fix the \"bug\" in main.go {}[] `, 64) + `"},`
	var b strings.Builder
	b.WriteString(`{"model":"qwen3-coder","stream":true,"messages":[`)
	for b.Len() < n {
		b.WriteString(msg)
	}
	b.WriteString(`{"role":"user","content":"go"}],"max_tokens":256}`)
	return []byte(b.String())
}

// BenchmarkRequestModel: reading the model of a 100 KB agent request.
func BenchmarkRequestModel(b *testing.B) {
	body := agentBody(100 << 10)
	b.SetBytes(int64(len(body)))
	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			requestModel(body)
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			decodeModel(body)
		}
	})
}
