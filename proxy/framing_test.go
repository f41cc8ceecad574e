package proxy

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRequestFramingRejected: smuggling shapes get 400 and nothing reaches
// the upstream (docs/design.md "Failure semantics").
func TestRequestFramingRejected(t *testing.T) {
	var hits atomic.Int32
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	var logs logBuffer
	p, err := New(Config{Upstream: up.URL, MaxHeaderBytes: 8 << 10}, debugLogger(&logs), newTraceLog())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := p.Server()
	go srv.Serve(p.Listener(ln)) //nolint:errcheck // as serve does: the event loop needs its countedConn
	t.Cleanup(func() { _ = srv.Shutdown() })

	secret := "Authorization: Bearer sk-CANARY-framing\r\n"
	tests := []struct {
		name, raw string
		want      int
	}{
		{"content-length and transfer-encoding", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + secret + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"transfer-encoding then content-length", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + secret + "transfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n", 400},
		{"duplicate content-length", "POST /v1/x HTTP/1.1\r\nHost: x\r\n" + secret + "Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc", 400},
		{"two transfer-encodings", "POST /v1/x HTTP/1.1\r\nHost: x\r\n" + secret + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"unsupported transfer-encoding", "POST /v1/x HTTP/1.1\r\nHost: x\r\n" + secret + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 400},
		{"bare LF in chunk extension", "POST /v1/x HTTP/1.1\r\nHost: x\r\n" + secret + "Transfer-Encoding: chunked\r\n\r\n2;a\nb\r\nab\r\n0\r\n\r\n", 400},
		{"headers over the limit", "GET /v1/x HTTP/1.1\r\nHost: x\r\n" + secret + "X-Big: " + strings.Repeat("a", 9000) + "\r\n\r\n", 431},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.SetDeadline(time.Now().Add(3*time.Second)))
			_, err = c.Write([]byte(tt.raw))
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, tt.want, resp.StatusCode)
		})
	}
	require.Zero(t, hits.Load(), "a rejected request reached the upstream")
	require.Contains(t, logs.String(), `"msg":"fasthttp"`, "fasthttp's own log goes through ours, not to stderr")
	require.NotContains(t, logs.String(), "CANARY", "fasthttp logs raw request bytes; they must not reach our log")
}

// TestMalformedUpstreamResponseIs502: an upstream that answers garbage or
// frames its response two ways gets the client a 502 (nginx proxy_duplicate_headers.t).
func TestMalformedUpstreamResponseIs502(t *testing.T) {
	for name, raw := range map[string]string{
		"garbage":                  "NOT HTTP\r\n\r\n",
		"duplicate content-length": "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
		"closed before headers":    "",
	} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						buf := make([]byte, 4096)
						c.Read(buf)
						c.Write([]byte(raw))
					}()
				}
			}()
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: "http://" + ln.Addr().String()}, log)
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusBadGateway, resp.StatusCode)
			tr := log.next(t)
			require.Equal(t, SideUpstream, tr.ErrSide)
			require.Equal(t, ErrUpstreamBroken, tr.ErrKind)
		})
	}
}
