package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestIdleDeadline: the deadline is renewed at most once per slack, and
// the one in force never ends sooner than the idle timeout after any
// read or write, nor later than the timeout plus the slack.
func TestIdleDeadline(t *testing.T) {
	for _, d := range []time.Duration{200 * time.Millisecond, 10 * time.Minute} {
		var l idleDeadline
		slack := renewSlack(d)
		require.Equal(t, min(time.Second, d/8), slack)
		t0 := time.Unix(1000, 0)
		dl, ok := l.next(t0, d)
		require.True(t, ok, "the first call sets")
		require.Equal(t, t0.Add(d+slack), dl)
		inForce, renewals := dl, 1
		for step := time.Duration(0); step < 20*slack; step += slack / 7 {
			now := t0.Add(step)
			if dl, ok := l.next(now, d); ok {
				inForce = dl
				renewals++
			}
			require.False(t, inForce.Before(now.Add(d)), "at %v the deadline ends before the idle timeout", step)
			require.False(t, inForce.After(now.Add(d+slack)), "at %v the deadline is later than timeout plus slack", step)
		}
		require.LessOrEqual(t, renewals, 21, "renewed more than once per slack")
		l.clear()
		require.False(t, l.set())
		_, ok = l.next(t0.Add(time.Nanosecond), d)
		require.True(t, ok, "after clear the next call sets")
	}
}

// writeCounter counts the writes on every connection a listener accepts.
type writeCounter struct {
	net.Listener
	writes atomic.Int64
}

func (l *writeCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{TCPConn: c.(*net.TCPConn), n: &l.writes}, nil
}

type countingConn struct {
	*net.TCPConn
	n *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.n.Add(1)
	return c.TCPConn.Write(b)
}

// TestNonStreamResponseOneWrite: a small non-stream response, whose body
// the engine sent with its head, reaches the client in one write; a stream
// still gets its head at once and then one write per event. The streaming
// upstream sends each part only once the proxy has written the one before
// to the client, so that the parts reach the proxy in reads of their own.
func TestNonStreamResponseOneWrite(t *testing.T) {
	if testEventLoop {
		t.Skip("counts the connection's Write calls; the event loop writes the socket itself (TestLoopOneWritePerEvent counts its syscalls)")
	}
	var ln *writeCounter // set before the first request
	untilWrites := func(n int64) {
		for deadline := time.Now().Add(5 * time.Second); ln.writes.Load() < n && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("stream") != "" {
			base := ln.writes.Load()
			sseHeaders(w)
			w.(http.Flusher).Flush()
			untilWrites(base + 1) // the head
			for i := range 3 {
				_, _ = io.WriteString(w, scriptedEvent(i))
				w.(http.Flusher).Flush()
				untilWrites(base + 2 + int64(i))
			}
			return
		}
		body := `{"choices":[{"message":{"content":"hi"}}]}`
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = io.WriteString(w, body)
	})
	p, err := New(Config{Upstream: up.URL}, zap.NewNop(), newTraceLog())
	require.NoError(t, err)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln = &writeCounter{Listener: inner}
	srv := p.Server()
	go srv.Serve(ln) //nolint:errcheck // ends at Shutdown
	t.Cleanup(func() { _ = srv.Shutdown() })

	c, err := net.Dial("tcp", inner.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	br := bufio.NewReader(c)
	ask := func(path string) {
		_, err := io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
	}
	for range 3 {
		before := ln.writes.Load()
		ask("/v1/chat/completions")
		require.Equal(t, int64(1), ln.writes.Load()-before, "head and body in one write")
	}
	before := ln.writes.Load()
	ask("/v1/chat/completions?stream=1")
	require.GreaterOrEqual(t, ln.writes.Load()-before, int64(1+3), "the head at once, then one write per event")
}

// TestWriteDeadlineNotLeftOver: the write deadline a relayed body set on
// the client connection does not outlive its response. The connection then
// sits idle well past that deadline, and the next response, a 204 that
// fasthttp writes without the relay, must still go out: fasthttp clears
// the deadline after the response's flush, for HTTP/1.1 and HTTP/1.0
// keep-alive clients alike, because the relay set its first one through
// the request (relay.firstWriteDeadline).
func TestWriteDeadlineNotLeftOver(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/empty" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
	})
	const timeout = 40 * time.Millisecond // the relay's deadline: at most timeout plus an eighth
	base, _ := startProxy(t, Config{Upstream: up.URL, ClientWriteTimeout: timeout}, nil)
	for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
		t.Run(proto, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
			br := bufio.NewReader(c)
			get := func(path string) *http.Response {
				_, err := io.WriteString(c, "GET "+path+" "+proto+"\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
				require.NoError(t, err)
				resp, err := http.ReadResponse(br, nil)
				require.NoError(t, err, "the proxy wrote no response")
				_, err = io.Copy(io.Discard, resp.Body)
				require.NoError(t, err)
				return resp
			}
			resp := get("/v1/models")
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.False(t, resp.Close, "the connection must stay open for the test to mean anything")
			time.Sleep(10 * timeout) // the relay's deadline, had it stayed, has passed
			require.Equal(t, http.StatusNoContent, get("/v1/empty").StatusCode)
		})
	}
}

// deadlineCountingListener counts the write-deadline changes on the
// connections it accepts.
type deadlineCountingListener struct {
	net.Listener
	changes atomic.Int64
}

func (l *deadlineCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &deadlineCountingConn{Conn: c, l: l}, nil
}

type deadlineCountingConn struct {
	net.Conn
	l *deadlineCountingListener
}

func (c *deadlineCountingConn) SetWriteDeadline(t time.Time) error {
	c.l.changes.Add(1)
	return c.Conn.SetWriteDeadline(t)
}

// TestNonStreamWriteDeadlineChanges: a non-stream request of a kept-alive
// HTTP/1.1 client changes the client connection's write deadline twice:
// the relay's idle deadline for the head and body, set through the request
// before the head is written (relay.firstWriteDeadline) so that fasthttp
// flushes the response on its own, and fasthttp's clear after the flush
// (three before the relay set its first one through the request: a zero
// deadline set first only to ask for the flush). TestInterimNeverOvertakesTheLastResponse holds the flush, and
// TestWriteDeadlineNotLeftOver the clear.
func TestNonStreamWriteDeadlineChanges(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
	})
	p, err := New(Config{Upstream: up.URL}, zap.NewNop(), nil)
	require.NoError(t, err)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := &deadlineCountingListener{Listener: raw}
	srv := p.Server()
	go srv.Serve(p.Listener(ln)) //nolint:errcheck // ends at Shutdown
	t.Cleanup(func() { _ = srv.Shutdown() })
	c, err := net.Dial("tcp", raw.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	br := bufio.NewReader(c)
	get := func() {
		_, err := io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	get() // the connection's first request: the upstream connection is dialed
	// Its clear, too, may come after the client read it: the count is taken
	// once it stood still for 50 ms (it was one over 1 run in ~20).
	for last, still := ln.changes.Load(), 0; still < 50; still++ {
		time.Sleep(time.Millisecond)
		if now := ln.changes.Load(); now != last {
			last, still = now, 0
		}
	}
	const n = 20
	before := ln.changes.Load()
	for range n {
		get()
	}
	// fasthttp clears the deadline after its flush, which may come after
	// the client read the response: wait for the last clear.
	require.Eventually(t, func() bool { return ln.changes.Load()-before >= 2*n }, 5*time.Second, time.Millisecond)
	require.Equal(t, int64(2*n), ln.changes.Load()-before, "write-deadline changes in %d requests", n)
}
