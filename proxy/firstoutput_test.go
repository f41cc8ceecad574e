package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// firstLog is a traceLog that also observes first outputs live.
type firstLog struct {
	*traceLog
	mu    sync.Mutex
	calls []Trace // the trace as it stood at each FirstOutput call
}

func (l *firstLog) FirstOutput(t *Trace) {
	l.mu.Lock()
	l.calls = append(l.calls, *t)
	l.mu.Unlock()
}

// TestFirstOutputObserved: a Recorder that implements FirstOutputObserver
// hears of each request's first output once, when it arrives (before the
// stream ends: the split of requests recorded meanwhile needs it), with
// the stamp the trace keeps; a role-only chunk before it is no output.
func TestFirstOutputObserved(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n")
		f.Flush()
		for i := range 3 {
			time.Sleep(20 * time.Millisecond)
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"w%d\"}}]}\n\n", i)
			f.Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	rec := &firstLog{traceLog: newTraceLog()}
	base, _ := startProxy(t, Config{Upstream: up.URL}, rec)
	for range 2 {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		tr := rec.next(t)
		rec.mu.Lock()
		call := rec.calls[len(rec.calls)-1]
		n := len(rec.calls)
		rec.mu.Unlock()
		require.Equal(t, rec.read, n, "one call per request")
		require.Equal(t, tr.ID, call.ID)
		require.Equal(t, tr.FirstOutput, call.FirstOutput)
		require.False(t, call.FirstOutput.IsZero())
		require.True(t, call.End.IsZero(), "called when the first output arrived, not at the end")
		require.True(t, call.FirstOutput.After(call.FirstEvent), "the role-only chunk is no output")
	}
}
