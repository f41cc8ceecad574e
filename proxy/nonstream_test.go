package proxy

import (
	"net"
	"testing"
	"time"

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
	var req, parsed, req2 fasthttp.RequestHeader
	var resp fasthttp.ResponseHeader
	require.NoError(t, parsed.Read(bufioOf("POST / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nCookie: a=1\r\n\r\n")))
	allocs := testing.AllocsPerRun(200, func() {
		req.Set("Connection", "keep-alive, X-Hop")
		req.Set("X-Hop", "1")
		stripHops(&req)
		parsed.CopyTo(&req2)
		stripRequestHops(&req2)
		resp.Set("Connection", "X-Hop")
		resp.Set("X-Hop", "1")
		stripResponseHops(&resp)
	})
	require.Empty(t, req.Peek("X-Hop"))
	require.Empty(t, req2.Peek("X-Hop"))
	require.Empty(t, resp.Peek("X-Hop"))
	require.Zero(t, allocs, "stripHops allocates")
}

// BenchmarkStripHops is the two strippings of one request with the
// headers a client and an engine typically send, parsed as fasthttp parses
// them (the request's from its raw block, which stripRequestHops reads).
func BenchmarkStripHops(b *testing.B) {
	var parsed, req fasthttp.RequestHeader
	var resp fasthttp.ResponseHeader
	require.NoError(b, parsed.Read(bufioOf("POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"+
		"Content-Type: application/json\r\nAuthorization: Bearer x\r\nAccept: */*\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n")))
	resp.Set("Content-Type", "application/json")
	resp.Set("Date", "Wed, 02 Dec 2026 01:00:00 GMT")
	b.ReportAllocs()
	for range b.N { // the response: idempotent, each round strips what the first left
		parsed.CopyTo(&req)
		stripRequestHops(&req)
		stripResponseHops(&resp)
	}
}

// TestContentTypeAllocs: deciding whether a response streams, and whether
// its body is JSON to read usage from, allocates nothing for the bare types
// engines send; a type with parameters is still parsed whole.
func TestContentTypeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for ct, want := range map[string][2]bool{
		"text/event-stream":                {true, false},
		" Text/Event-Stream ":              {true, false},
		"text/event-stream; charset=utf-8": {true, false},
		"text/event-streamx":               {false, false},
		"application/json":                 {false, true},
		"APPLICATION/JSON":                 {false, true},
		"application/json; charset=utf-8":  {false, true},
		"application/problem+json":         {false, true},
		"application/jsonx":                {false, false},
		"text/plain":                       {false, false},
	} {
		require.Equal(t, want, [2]bool{isEventStream([]byte(ct)), isJSON([]byte(ct))}, ct)
	}
	for ct, want := range map[string]bool{
		"application/x-ndjson": true, " Application/X-NDJSON ": true, "application/x-ndjson; charset=utf-8": true,
		"application/jsonl": true, "application/x-ndjsonx": false, "application/json": false,
	} {
		require.Equal(t, want, isNDJSON([]byte(ct)), ct)
	}
	sse, js, nd := []byte("text/event-stream"), []byte("application/json"), []byte("application/x-ndjson")
	require.Zero(t, testing.AllocsPerRun(100, func() { isEventStream(sse); isEventStream(js); isJSON(js); isNDJSON(nd) }))
}

// TestPeekIdleAllocs: the check of an idle upstream connection at its
// reuse allocates nothing after the connection's first.
func TestPeekIdleAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer raw.Close()
	peer, err := ln.Accept()
	require.NoError(t, err)
	defer peer.Close()
	c := &upConn{Conn: raw, raw: raw}
	state, _ := c.peekIdle()
	require.Equal(t, peekQuiet, state)
	require.Zero(t, testing.AllocsPerRun(100, func() { c.peekIdle() }))
	_, err = peer.Write([]byte("HTTP/1.1 408 Request Timeout\r\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { s, _ := c.peekIdle(); return s == peekData }, 5*time.Second, time.Millisecond)
	_, n := c.peekIdle()
	require.True(t, is408(c.peek.b[:n]))
}

// TestMarkIdleAllocs: marking a client connection idle at every request's
// end, and busy at the next, allocates nothing.
func TestMarkIdleAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := &guardedListener{}
	a, b := &countedConn{l: l}, &countedConn{l: l}
	require.Zero(t, testing.AllocsPerRun(100, func() {
		l.markIdle(a, true)
		l.markIdle(b, true)
		l.markIdle(a, false)
		l.markIdle(a, true)
	}))
	require.Same(t, b, l.idle.Oldest())
	require.Same(t, a, l.idle.Newest())
	l.markIdle(b, false)
	l.markIdle(a, false)
	require.Zero(t, l.idle.Len())
	require.Nil(t, l.idle.Oldest())
}
