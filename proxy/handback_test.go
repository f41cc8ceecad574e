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
	requireLoopStreams(t, before, clients*requests, "every stream went through a loop")

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

// gatedLog is a traceLog whose first Record waits until gate is closed,
// saying on entered that it began.
type gatedLog struct {
	*traceLog
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedLog) Record(t *Trace) {
	g.once.Do(func() {
		close(g.entered)
		<-g.gate
	})
	g.traceLog.Record(t)
}

// TestLoopNextRequestBeforeReport: once the loop handed a keep-alive
// connection back, the client's next request is served while the last
// stream's Trace is still being reported: a Record that takes its time does
// not stand before the next request's first byte (BENCHMARKS.md "Session
// 15"). The stream stays in Inflight until its Record returned (shutdown
// waits on that for its last snapshot), and both Traces are recorded.
func TestLoopNextRequestBeforeReport(t *testing.T) {
	up := sseUpstream(t, 2, 0)
	rec := &gatedLog{traceLog: newTraceLog(), entered: make(chan struct{}), gate: make(chan struct{})}
	base, p := startProxy(t, Config{Upstream: up.URL(), EventLoop: true}, rec)
	released := false
	defer func() {
		if !released {
			close(rec.gate)
		}
	}()
	before := loopStreamsStarted()
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"stream\":true}"
	br, c := rawDial(t, base, req)
	defer c.Close()
	want := scriptedEvent(0) + scriptedEvent(1) + "data: [DONE]\n\n"
	read := func() {
		t.Helper()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, want, string(body))
	}
	read()
	select {
	case <-rec.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the first stream's Record never began")
	}
	requireLoopStreams(t, before, 1, "the first stream went through the loop")

	_, err := io.WriteString(c, req)
	require.NoError(t, err)
	read() // with the first Record still held
	requireLoopStreams(t, before, 2, "the second stream went through the loop")
	require.GreaterOrEqual(t, p.Inflight(), int64(1), "the first stream left Inflight before its Record returned")

	close(rec.gate)
	released = true
	for range 2 { // in either order: the second's Record may pass the first's
		tr := rec.next(t)
		require.Equal(t, ErrNone, tr.ErrKind)
		require.True(t, tr.Stream)
	}
	require.Eventually(t, func() bool { return p.Inflight() == 0 }, 5*time.Second, time.Millisecond)
}
