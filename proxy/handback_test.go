//go:build linux

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestLoopHandBackShutdown: a client connection the event loop hands back
// to fasthttp after a stream (ServeConn) is one fasthttp's graceful
// shutdown closes. fasthttp keeps one entry per connection object in its
// table of connections Shutdown may close, and the goroutine that served
// the hijacked request deletes the connection's entry after it started
// the hijack handler; a stream handed back before that delete lost the new
// serve's entry, and Shutdown waited for the connection until its idle
// timeout (2 minutes): CI saw the server not exit within 10 s of SIGTERM.
// Each stream here ends in early's write, the quickest hand-back there is,
// on keep-alive connections that stay open through the shutdown. The race
// itself is rare here (the serving goroutine must be descheduled in a few
// instructions): TestAwaitRelease pins the ordering that closes it.
func TestLoopHandBackShutdown(t *testing.T) {
	ev, done := scriptedEvent(0), "data: [DONE]\n\n"
	answer := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", len(ev), ev, len(done), done)
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			if _, _, err := u.readRequest(br); err != nil {
				return
			}
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
		}
	})
	p, err := New(Config{Upstream: up.URL(), EventLoop: true}, zap.NewNop(), newTraceLog())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := p.Server()
	go srv.Serve(p.Listener(ln)) //nolint:errcheck // ends at the shutdown below

	const clients, requests = 4, 150
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"stream\":true}"
	before := loopStreamsStarted()
	conns := make([]net.Conn, clients)
	var wg sync.WaitGroup
	for i := range conns {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		conns[i] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			br := bufio.NewReader(c)
			for range requests {
				if _, err := io.WriteString(c, req); err != nil {
					t.Error(err)
					return
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Error(err)
					return
				}
				body, err := io.ReadAll(resp.Body)
				if err != nil || string(body) != ev+done {
					t.Errorf("body %q, %v", body, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	require.Equal(t, int64(clients*requests), loopStreamsStarted()-before, "every stream went through a loop")

	// fasthttp closes a connection that waits for its first request 5 s
	// after it came (as net/http does): a handed-back one counts as new.
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
	defer cancel()
	start := time.Now()
	p.Drain()
	require.NoError(t, srv.ShutdownWithContext(ctx), "the shutdown must close every handed-back connection")
	t.Logf("shutdown took %v", time.Since(start).Round(time.Millisecond))
	for _, c := range conns {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
		n, err := c.Read(make([]byte, 1))
		require.Zero(t, n)
		require.True(t, err == io.EOF || strings.Contains(fmt.Sprint(err), "reset"), "the proxy closed the connection: %v", err)
	}
}

// TestAwaitRelease: a stream hands its connection back only once
// fasthttp's serving goroutine let go of it, and gives up (the caller
// closes the connection) if that never comes.
func TestAwaitRelease(t *testing.T) {
	cc := &countedConn{}
	require.True(t, cc.awaitRelease(0), "a connection fasthttp does not hold is free at once")

	cc.hold()
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		released <- time.Now()
		cc.release()
	}()
	require.True(t, cc.awaitRelease(10*time.Second))
	require.False(t, time.Now().Before(<-released), "awaitRelease returned before the release")

	cc.hold()
	start := time.Now()
	require.False(t, cc.awaitRelease(20*time.Millisecond), "never released")
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
}
