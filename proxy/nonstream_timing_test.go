//go:build !race

package proxy_test

import (
	"bytes"
	"net"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// smallAnswer is a non-stream chat completion of the size the bench's
// emitter sends.
var smallAnswer = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1767225600,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`)

// BenchmarkNonStream is one non-stream chat request per op on a kept-alive
// client connection, through a real Proxy with the real recorder, to an
// upstream that answers at once: what the proxy spends per request
// (go test -bench NonStream -cpuprofile).
func BenchmarkNonStream(b *testing.B) {
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(smallAnswer)
	}}
	go up.Serve(upLn) //nolint:errcheck // ends at Shutdown
	defer up.Shutdown()
	rec, err := histo.New(histo.Config{}, prometheus.NewRegistry())
	require.NoError(b, err)
	p, err := proxy.New(proxy.Config{Upstream: "http://" + upLn.Addr().String()}, zap.NewNop(), rec)
	require.NoError(b, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := p.Server()
	go srv.Serve(p.Listener(ln)) //nolint:errcheck // ends at Shutdown
	defer srv.Shutdown()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(b, err)
	defer c.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	buf := make([]byte, 4096)
	one := func() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		got := 0
		for {
			k, err := c.Read(buf[got:])
			if err != nil {
				b.Fatal(err)
			}
			got += k
			if bytes.HasSuffix(buf[:got], smallAnswer) {
				return
			}
		}
	}
	for range 100 {
		one()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		one()
	}
}
