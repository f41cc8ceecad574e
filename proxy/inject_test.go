package proxy

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestInjectIncludeUsage(t *testing.T) {
	tests := []struct {
		name, body string
		want       string // "" means left alone
	}{
		{name: "no options", body: `{"stream":true,"model":"m"}`, want: `{"stream_options":{"include_usage":true},"stream":true,"model":"m"}`},
		{name: "asked already", body: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "asked false", body: `{"stream":true,"stream_options":{"include_usage":false,"x":1}}`, want: `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
		{name: "null options", body: `{"stream":true,"stream_options":null}`, want: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "not streamed", body: `{"stream":false}`},
		{name: "stream absent", body: `{"model":"m"}`},
		{name: "not JSON", body: `not json`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := injectIncludeUsage([]byte(tt.body))
			require.Equal(t, tt.want != "", ok)
			if ok {
				require.JSONEq(t, tt.want, string(got))
			}
		})
	}
}

// TestInjectUsageInvisibleToClient: with --inject-usage the client's bytes
// equal what it gets without the flag, while the proxy reads the usage.
func TestInjectUsageInvisibleToClient(t *testing.T) {
	body := `{"model":"m","stream":true,"max_tokens":30,"messages":[{"role":"user","content":"count"}]}`
	created := regexp.MustCompile(`"created":\d+`)
	fetch := func(inject bool) (string, Trace) {
		_, up := startSim(t, fastSim) // a fresh sim: same seed, same text
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up, InjectUsage: inject}, log)
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("X-Request-Id", "fixed")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return created.ReplaceAllString(string(got), `"created":0`), log.next(t)
	}
	plain, plainTr := fetch(false)
	injected, injTr := fetch(true)
	require.Equal(t, plain, injected)
	require.NotContains(t, injected, `"usage"`)

	require.False(t, plainTr.UsageSeen)
	n, src := plainTr.OutputTokens()
	require.Equal(t, "chunks", src)
	require.Less(t, n, int64(30), "several tokens per event: chunks undercount")

	require.True(t, injTr.UsageInject)
	require.True(t, injTr.UsageSeen)
	n, src = injTr.OutputTokens()
	require.Equal(t, "usage", src)
	require.Equal(t, int64(30), n)
}

// TestInjectUsageResponseBytes: response_bytes is what the client got,
// not counting the usage event the proxy hid from it.
func TestInjectUsageResponseBytes(t *testing.T) {
	_, up := startSim(t, fastSim)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up, InjectUsage: true}, log)
	body := `{"model":"m","stream":true,"max_tokens":30,"messages":[{"role":"user","content":"count"}]}`
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	tr := log.next(t)
	require.True(t, tr.UsageInject)
	require.True(t, tr.UsageSeen, "the proxy read the hidden usage event")
	require.NotContains(t, string(got), `"usage"`)
	require.Equal(t, int64(len(got)), tr.RespBytes)
}
