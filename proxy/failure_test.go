package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestUpstreamUnreachableIs502(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: "http://" + addr}, log)

	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"content":"SECRET-PROMPT"}]}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Contains(t, string(body), addr)
	require.Contains(t, string(body), `"code":502`)
	require.NotContains(t, string(body), "SECRET")
	tr := log.next(t)
	require.Equal(t, SideUpstream, tr.ErrSide)
	require.Equal(t, ErrConnect, tr.ErrKind)
	require.Equal(t, http.StatusBadGateway, tr.Status)
}

func TestUpstreamHeaderTimeoutIs504(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
	})
	defer close(release)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL, UpstreamReadTimeout: 200 * time.Millisecond}, log)
	start := time.Now()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
	require.Less(t, time.Since(start), 3*time.Second)
	require.Equal(t, ErrUpstreamTimeout, log.next(t).ErrKind)
}

// TestStreamNotCutByIdleTimeout: a stream longer than the idle timeouts but
// never idle that long completes. The timeouts are eight gaps long, so that
// a gap stretched by a loaded machine does not reach one.
func TestStreamNotCutByIdleTimeout(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		for i := 0; i < 16; i++ {
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	log := newTraceLog()
	const idle = 400 * time.Millisecond
	base, _ := startProxy(t, Config{Upstream: up.URL, UpstreamReadTimeout: idle, ClientWriteTimeout: idle}, log)
	got := get(t, base+"/v1/chat/completions")
	require.Equal(t, 17, strings.Count(string(got), "data: "))
	tr := log.next(t)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.Greater(t, tr.End.Sub(tr.Recv), 3*idle/2, "the stream was not longer than the timeouts")
}

func TestUpstreamIdleMidStreamAborts(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-release
	})
	defer close(release)
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL, UpstreamReadTimeout: 200 * time.Millisecond}, log)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "an idle upstream must abort the client's stream, not end it")
	tr := log.next(t)
	require.Equal(t, SideUpstream, tr.ErrSide)
	require.Equal(t, ErrUpstreamTimeout, tr.ErrKind)
}

func TestBodyTooLargeIs413(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		t.Error("an oversized request reached the upstream")
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL, MaxBodyBytes: 1024}, log)
	big := strings.Repeat("x", 4096)

	t.Run("content-length", func(t *testing.T) {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(big))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		require.Equal(t, ErrBodyTooLarge, log.next(t).ErrKind)
	})
	t.Run("chunked", func(t *testing.T) {
		// An io.Reader of unknown length makes net/http send a chunked body.
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", io.MultiReader(strings.NewReader(big)))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		require.Equal(t, ErrBodyTooLarge, log.next(t).ErrKind)
	})
}

// TestUpstreamDiesMidStream: the client's response must be aborted (no
// terminating chunk), never a well-formed ending.
func TestUpstreamDiesMidStream(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // closes the connection without the last chunk
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", string(got))
	tr := log.next(t)
	require.Equal(t, SideUpstream, tr.ErrSide)
	require.Equal(t, ErrUpstreamBroken, tr.ErrKind)
}

// TestClientDisconnectClosesUpstream: when the client goes away mid-stream,
// the upstream connection is closed at once so the engine stops.
func TestClientDisconnectClosesUpstream(t *testing.T) {
	gone := make(chan time.Time, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		for {
			select {
			case <-r.Context().Done():
				gone <- time.Now()
				return
			case <-time.After(10 * time.Millisecond):
			}
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
			w.(http.Flusher).Flush()
		}
	})
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up.URL}, log)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		_, err := br.ReadString('\n')
		require.NoError(t, err)
	}
	left := time.Now()
	resp.Body.Close()
	select {
	case at := <-gone:
		// The proxy notices at its next write, 10 ms away; a second leaves
		// room for a loaded machine. A proxy that kept relaying for nobody
		// would never close: the upstream streams forever.
		require.Less(t, at.Sub(left), time.Second, "upstream saw the disconnect %v after the client left", at.Sub(left))
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw the client leave")
	}
	tr := log.next(t)
	require.Equal(t, SideClient, tr.ErrSide)
	require.Equal(t, ErrClientGone, tr.ErrKind)
	require.Eventually(t, func() bool { return upstreamConns(p) == 0 }, 5*time.Second, 10*time.Millisecond)
}

// TestMalformedSSEForwardedAndCounted: bad event data and an oversized event
// are relayed unchanged and counted as parse errors; the relay never stalls.
func TestMalformedSSEForwardedAndCounted(t *testing.T) {
	body := "data: {not json\n\n" +
		"data: " + strings.Repeat("y", 4000) + "\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n" +
		"data: [DONE]\n\n"
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		io.WriteString(w, body)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL, MaxEventBytes: 1024}, log)
	require.Equal(t, body, string(get(t, base+"/v1/chat/completions")))
	tr := log.next(t)
	require.GreaterOrEqual(t, tr.ParseErrors, 2)
	require.Equal(t, 1, tr.ContentEvents)
	require.False(t, tr.FirstContent.IsZero())
}

// TestTruncatedStreamIsAFailure: a stream that ends cleanly (HTTP 200, the
// chunked terminator) but without finish_reason, usage or [DONE], as
// ollama's do when it stops a repeating generation, is relayed as it came
// and recorded as an upstream failure of kind truncated.
func TestTruncatedStreamIsAFailure(t *testing.T) {
	const event = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		fmt.Fprint(w, event)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err, "the proxy forwards the stream as the engine ended it")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, event, string(got))
	tr := log.next(t)
	require.True(t, tr.Truncated)
	require.Equal(t, SideUpstream, tr.ErrSide)
	require.Equal(t, ErrTruncated, tr.ErrKind)
	require.Equal(t, "truncated", tr.ErrKind.String())
	require.True(t, tr.Failed())
}
