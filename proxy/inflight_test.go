package proxy

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gatedRecorder holds each Record until the test lets it through.
type gatedRecorder struct {
	*traceLog
	entered, release chan struct{}
}

func (g *gatedRecorder) Record(t *Trace) {
	g.entered <- struct{}{}
	<-g.release
	g.traceLog.Record(t)
}

// TestInflightUntilRecorded: a request leaves Inflight only once its Trace
// is recorded. Shutdown waits for Inflight() == 0 and then writes the
// final snapshot; a request that had left Inflight before its Record
// (release used to lower the count first) could be missing from it.
func TestInflightUntilRecorded(t *testing.T) {
	for _, stream := range []bool{false, true} {
		up := startUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
			if stream {
				sseHeaders(w)
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
				return
			}
			_, _ = io.WriteString(w, `{"ok":true}`)
		})
		rec := &gatedRecorder{traceLog: newTraceLog(), entered: make(chan struct{}), release: make(chan struct{})}
		base, p := startProxy(t, Config{Upstream: up.URL}, rec)
		done := make(chan error, 1)
		go func() {
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", nil)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			done <- err
		}()
		select {
		case <-rec.entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("stream=%v: no Record within 5 s", stream)
		}
		inflight := p.Inflight()
		close(rec.release) // before any assertion: a held Record would hold the server's shutdown
		require.EqualValues(t, 1, inflight, "stream=%v: in flight while its Trace is being recorded", stream)
		rec.next(t)
		require.Eventually(t, func() bool { return p.Inflight() == 0 }, 5*time.Second, time.Millisecond, "stream=%v", stream)
		require.NoError(t, <-done)
	}
}
