package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCaptureOverflowReadsNoHole: a non-stream answer larger than
// MaxCaptureBytes is not read for usage. Its chunks arrive one by one, and
// a capture that skipped the chunk that overflowed but kept the smaller
// ones after it would parse a body with a hole: here the head and tail
// join into valid JSON whose usage is not the answer's. The client still
// gets every byte.
func TestCaptureOverflowReadsNoHole(t *testing.T) {
	head := `{"id":"x",`
	middle := `"pad":"` + strings.Repeat("a", 8<<10) + `","usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2},`
	tail := `"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`
	up := startUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for _, part := range []string{head, middle, tail} {
			_, _ = io.WriteString(w, part)
			w.(http.Flusher).Flush()
			time.Sleep(30 * time.Millisecond) // one read each at the proxy
		}
	})
	for _, loop := range []bool{false, true} {
		rec := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up.URL, MaxCaptureBytes: 1 << 10, EventLoop: loop}, rec)
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, head+middle+tail, string(got), "event loop %v", loop)
		tr := rec.next(t)
		require.EqualValues(t, -1, tr.PromptTokens, "event loop %v: usage read from a capture with a hole", loop)
		require.EqualValues(t, len(got), tr.RespBytes)
	}
}
