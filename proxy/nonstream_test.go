package proxy

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// TestStripHopsAllocs: removing the headers a Connection header names
// allocates nothing (its copy of the names stays on the stack); it runs
// twice per request, the request's head and the response's.
func TestStripHopsAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	var req fasthttp.RequestHeader
	var resp fasthttp.ResponseHeader
	allocs := testing.AllocsPerRun(200, func() {
		req.Set("Connection", "keep-alive, X-Hop")
		req.Set("X-Hop", "1")
		stripHops(&req)
		resp.Set("Connection", "X-Hop")
		resp.Set("X-Hop", "1")
		stripResponseHops(&resp)
	})
	require.Empty(t, req.Peek("X-Hop"))
	require.Empty(t, resp.Peek("X-Hop"))
	require.Zero(t, allocs, "stripHops allocates")
}
