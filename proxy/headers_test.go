package proxy

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// rawExchange sends a raw HTTP/1.1 request and returns the raw response head.
func rawExchange(t *testing.T, base, request string) *http.Response {
	t.Helper()
	br, _ := rawDial(t, base, request)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	return resp
}

func TestHopByHopHeadersStrippedBothWays(t *testing.T) {
	seen := make(chan http.Header, 1)
	hosts := make(chan string, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		hosts <- r.Host
		h := w.Header()
		h.Set("Connection", "X-Up-Hop")
		h.Set("X-Up-Hop", "1")
		h.Add("Connection", "X-Up-B") // a second Connection header counts too
		h.Set("X-Up-B", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Alt-Svc", `h2="evil.example:443"`)
		h.Set("Proxy-Authenticate", "Basic")
		h.Set("X-End-To-End", "kept")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("{}"))
	})
	base, _ := startProxy(t, Config{Upstream: up.URL}, newTraceLog())
	resp := rawExchange(t, base, "POST /v1/models?x=1 HTTP/1.1\r\n"+
		"Host: client.example\r\n"+
		"Connection: keep-alive, X-Client-Hop\r\n"+
		"X-Client-Hop: 1\r\n"+
		"Connection: X-Client-Secret\r\n"+ // a second Connection header counts too
		"X-Client-Secret: s3cr3t\r\n"+
		"Keep-Alive: timeout=5\r\n"+
		"Proxy-Authorization: Basic Zm9v\r\n"+
		"Te: trailers\r\n"+
		"Upgrade: websocket\r\n"+
		"X-Forwarded-For: 10.9.9.9\r\n"+
		"Authorization: Bearer sk-test\r\n"+
		"X-Custom: Mixed-Case\r\n"+
		"Content-Length: 2\r\n\r\n{}")
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	got := <-seen
	for _, h := range []string{"X-Client-Hop", "X-Client-Secret", "Keep-Alive", "Proxy-Authorization", "Upgrade"} {
		require.Empty(t, got.Get(h), "request header %s crossed the proxy", h)
	}
	// TE is hop-by-hop, but a client that takes trailers is asked for them
	// upstream with exactly "trailers", as Go's ReverseProxy does.
	require.Equal(t, "trailers", got.Get("Te"))
	require.Equal(t, "Bearer sk-test", got.Get("Authorization"))
	require.Equal(t, "Mixed-Case", got.Get("X-Custom"))
	require.Equal(t, "10.9.9.9, 127.0.0.1", got.Get("X-Forwarded-For"))
	require.Equal(t, strings.TrimPrefix(up.URL, "http://"), <-hosts)

	for _, h := range []string{"X-Up-Hop", "X-Up-B", "Keep-Alive", "Alt-Svc", "Proxy-Authenticate"} {
		require.Empty(t, resp.Header.Get(h), "response header %s crossed the proxy", h)
	}
	require.Equal(t, "kept", resp.Header.Get("X-End-To-End"))
}

// TestLowercaseHopHeadersStripped: HTTP/1.1 clients such as Node's undici
// send lower-case names; header names are matched case-insensitively.
func TestLowercaseHopHeadersStripped(t *testing.T) {
	seen := make(chan http.Header, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.Header()["connection"] = []string{"x-up-hop"}
		w.Header()["x-up-hop"] = []string{"1"}
		w.Header()["x-queue-time"] = []string{"7"}
		w.WriteHeader(http.StatusOK)
	})
	base, _ := startProxy(t, Config{Upstream: up.URL}, newTraceLog())
	resp := rawExchange(t, base, "GET /v1/models HTTP/1.1\r\nhost: x\r\n"+
		"connection: keep-alive, x-client-hop\r\nx-client-hop: 1\r\nkeep-alive: timeout=5\r\n"+
		"proxy-authorization: Basic Zm9v\r\nx-forwarded-for: 10.0.0.1\r\n\r\n")
	defer resp.Body.Close()
	got := <-seen
	for _, h := range []string{"X-Client-Hop", "Keep-Alive", "Proxy-Authorization"} {
		require.Empty(t, got.Get(h), "request header %s crossed the proxy", h)
	}
	require.Equal(t, "10.0.0.1, 127.0.0.1", got.Get("X-Forwarded-For"))
	require.Empty(t, resp.Header.Get("X-Up-Hop"))
}

func TestPreserveHostAndNoForwardedFor(t *testing.T) {
	seen := make(chan *http.Request, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r
		w.WriteHeader(http.StatusNoContent)
	})
	base, _ := startProxy(t, Config{Upstream: up.URL, PreserveHost: true, NoForwardedFor: true}, newTraceLog())
	// The second: a Connection header naming Host must not lose it.
	for _, head := range []string{"Host: client.example\r\n", "Host: client.example\r\nConnection: Host\r\n"} {
		resp := rawExchange(t, base, "GET /health HTTP/1.1\r\n"+head+"\r\n")
		resp.Body.Close()
		require.Equal(t, http.StatusNoContent, resp.StatusCode)
		r := <-seen
		require.Equal(t, "client.example", r.Host, "%q", head)
		require.Empty(t, r.Header.Get("X-Forwarded-For"))
	}
}

func TestPathQueryMethodAndPrefixForwarded(t *testing.T) {
	seen := make(chan string, 1)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Method + " " + r.RequestURI
		w.WriteHeader(http.StatusOK)
	})
	base, _ := startProxy(t, Config{Upstream: up.URL + "/engine/"}, newTraceLog())
	resp := rawExchange(t, base, "DELETE /v1/things/a%2Fb/../c?q=1&q=2;x HTTP/1.1\r\nHost: h\r\n\r\n")
	resp.Body.Close()
	require.Equal(t, "DELETE /engine/v1/things/a%2Fb/../c?q=1&q=2;x", <-seen)
}

func TestModelLabelBounded(t *testing.T) {
	s := newModelSet(nil, 3)
	for i := 0; i < 10000; i++ {
		s.label([]byte(strings.Repeat("m", i%50+1)))
	}
	require.Len(t, s.known, 3)
	require.Equal(t, ModelOther, s.label([]byte("new")))
	allow := newModelSet([]string{"a"}, 3)
	require.Equal(t, "a", allow.label([]byte("a")))
	require.Equal(t, ModelOther, allow.label([]byte("b")))
	require.Equal(t, "", allow.label(nil))
}

func TestRouteOf(t *testing.T) {
	tests := []struct {
		path string
		want Route
	}{
		{"/v1/chat/completions", RouteChat},
		{"/v1/completions", RouteCompletions},
		{"/v1/responses", RouteResponses},
		{"/v1/messages", RouteMessages},
		{"/v1/models", RouteModels},
		{"/health", RouteHealth},
		{"/metrics", RouteMetrics},
		{"/v1/chat/completionsX", RouteOther},
		// llama.cpp: its native protocol without /v1, OpenAI's with it.
		{"/completion", RouteLlamaCompletion},
		{"/completions", RouteLlamaCompletion},
		{"/llama/v1/completions", RouteCompletions},
		{"/chat/completions", RouteChat},
		{"/completionsX", RouteOther},
		{"/", RouteOther},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, routeOf([]byte(tt.path)), tt.path)
	}
}

// bufioOf reads s.
func bufioOf(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

// TestStripOnlyFoundEqualsStripAll: deleting only the hop-by-hop names a
// request's raw block or a response's headers hold (stripRequestHops,
// stripResponseHops) leaves exactly the bytes that deleting every name
// leaves (stripHops), for heads as fasthttp parses them: cookies kept as
// sent, Connection: close and HTTP/1.0's implied close, names in any case,
// names any of several Connection headers lists, trailers announced,
// obs-fold; every head is one fasthttp accepts (a refused one fails).
func TestStripOnlyFoundEqualsStripAll(t *testing.T) {
	requests := []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nCookie: b=2;a=1\r\nCookie: c=3\r\nConnection: keep-alive\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
		"POST / HTTP/1.0\r\nHost: h\r\n\r\n",
		"POST / HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n",
		"POST / HTTP/1.1\r\nhost: h\r\nconnection: Keep-Alive, x-client-hop\r\nx-client-hop: 1\r\nkeep-alive: timeout=5\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nProxy-Authorization: Basic Zm9v\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nUpgrade: websocket\r\nAlt-Svc: kept-on-requests\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nTrailer: X-Sum\r\nConnection: X-Sum, Upgrade\r\nX-Sum: 1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nX-Long: a\r\n b\r\nConnection: X-Long\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nConnection: Content-Type, Authorization\r\nContent-Type: text/plain\r\nAuthorization: x\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\nX-A: 1\r\nconnection: X-A, X-B\r\nX-B: 2\r\nConnection: close\r\n\r\n",
	}
	for _, raw := range requests {
		var parsed, all, found fasthttp.RequestHeader
		require.NoError(t, parsed.Read(bufioOf(raw)), "request %q", raw)
		parsed.CopyTo(&all)
		parsed.CopyTo(&found)
		stripHops(&all)
		stripRequestHops(&found)
		require.Equal(t, string(all.Header()), string(found.Header()), "request %q", raw)
		require.NotContains(t, string(found.Header()), "X-A", "request %q", raw)
		require.NotContains(t, string(found.Header()), "X-B", "request %q", raw)
		require.Equal(t, all.ConnectionClose(), found.ConnectionClose(), "request %q", raw)
	}
	responses := []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nDate: x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5, max=100\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nconnection: x-up-hop\r\nx-up-hop: 1\r\nalt-svc: h2=\":443\"\r\nProxy-Authenticate: Basic\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nServer: e\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum, Alt-Svc\r\nX-Sum: 1\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: Content-Type, Server\r\nContent-Type: text/plain\r\nServer: e\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: X-Up-A\r\nX-Up-A: 1\r\nconnection: x-up-b, Keep-Alive\r\nX-Up-B: 2\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
	}
	for _, raw := range responses {
		var parsed, all, found fasthttp.ResponseHeader
		require.NoError(t, parsed.Read(bufioOf(raw)), "response %q", raw)
		parsed.CopyTo(&all)
		parsed.CopyTo(&found)
		stripHops(&all)
		all.Del("Alt-Svc")
		stripResponseHops(&found)
		require.Equal(t, string(all.Header()), string(found.Header()), "response %q", raw)
		require.NotContains(t, string(found.Header()), "X-Up-", "response %q", raw)
		require.Equal(t, all.ConnectionClose(), found.ConnectionClose(), "response %q", raw)
	}
}
