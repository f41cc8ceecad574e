package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTrailersForwarded (P3): trailers an engine sends after a chunked body
// reach a client that accepts them (TE: trailers, as gRPC-style clients
// send), and only such a client; the upstream is asked for them only then.
func TestTrailersForwarded(t *testing.T) {
	te := make(chan string, 2)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		te <- r.Header.Get("Te")
		w.Header().Set("Trailer", "X-Checksum")
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		w.Header().Set("X-Checksum", "abc123")
	})
	base, _ := startProxy(t, Config{Upstream: up.URL}, newTraceLog())
	for _, accepts := range []bool{true, false} {
		req, err := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(`{}`))
		require.NoError(t, err)
		if accepts {
			req.Header.Set("TE", "trailers")
		}
		resp, err := (&http.Transport{}).RoundTrip(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, "data: {}\n\n", string(body))
		if accepts {
			require.Equal(t, "trailers", <-te)
			require.Equal(t, "abc123", resp.Trailer.Get("X-Checksum"), "accepts=%v", accepts)
		} else {
			require.Empty(t, <-te)
			require.Empty(t, resp.Trailer.Get("X-Checksum"))
		}
	}
}
