package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests of this file follow one request through an upstream or a
// client that fails at every step (RELIABILITY.md §6.4): the outcome
// is recorded right, the client can tell, and nothing is sent twice.

// rawUpstream is a TCP upstream that runs serve on every connection and
// counts the connections (dials by the proxy) and the requests it read.
type rawUpstream struct {
	ln       net.Listener
	accepted atomic.Int32
	requests atomic.Int32
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
	closed   bool
}

// startRawUpstream serves serve(conn, br) on each accepted connection,
// closing the connection when serve returns.
func startRawUpstream(t *testing.T, serve func(u *rawUpstream, c net.Conn, br *bufio.Reader)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := &rawUpstream{ln: ln}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.accepted.Add(1)
			u.mu.Lock()
			if u.closed {
				u.mu.Unlock()
				c.Close()
				return
			}
			u.conns = append(u.conns, c)
			u.wg.Add(1)
			u.mu.Unlock()
			go func() {
				defer u.wg.Done()
				defer c.Close()
				serve(u, c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		u.closed = true
		for _, c := range u.conns {
			c.Close()
		}
		u.mu.Unlock()
		u.wg.Wait()
	})
	return u
}

func (u *rawUpstream) URL() string { return "http://" + u.ln.Addr().String() }

// readRequest reads one whole request with net/http's strict parser and
// counts it.
func (u *rawUpstream) readRequest(br *bufio.Reader) (*http.Request, []byte, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, nil, err
	}
	u.requests.Add(1)
	return req, body, nil
}

// reset closes c with an RST instead of a FIN.
func reset(c net.Conn) {
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}

// TestExpect100ContinueNoHang (H6): Expect: 100-continue never leaves the
// client waiting, whatever the upstream does (Go's
// TestReverseProxyInvalidUpstream100ContinueDoNotHang).
func TestExpect100ContinueNoHang(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	mute := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n") // and then nothing
		io.Copy(io.Discard, br)
	})
	refuse := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		http.ReadRequest(br) // the headers only
		io.WriteString(c, "HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	})
	echo := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})
	tests := []struct {
		name, upstream string
		want           int
	}{
		{"dead upstream", deadURL, 502},
		{"upstream sends 100 and goes quiet", mute.URL(), 504},
		{"upstream refuses the expectation", refuse.URL(), 417},
		{"healthy upstream", echo.URL, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, _ := startProxy(t, Config{Upstream: tt.upstream, UpstreamReadTimeout: 300 * time.Millisecond}, newTraceLog())
			br, c := rawDial(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n")
			interim, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "the proxy left the client waiting for 100 Continue")
			require.Equal(t, http.StatusContinue, interim.StatusCode)
			_, err = io.WriteString(c, `{"a":"bcd"}`)
			require.NoError(t, err)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "no final response within 5s")
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tt.want, resp.StatusCode)
			if tt.want == 200 {
				require.Equal(t, `{"a":"bcd"}`, string(body))
			}
		})
	}
}

// TestClientDisconnectDuringUpload (C3): a client that sends half its body
// and leaves (FIN, RST, or a half-close that still waits for an answer)
// never causes an upstream request: neither for a small body, which
// fasthttp reads before calling the handler, nor for one larger than the
// read buffer, which the handler reads as a stream.
func TestClientDisconnectDuringUpload(t *testing.T) {
	tests := []struct {
		name  string
		size  int
		leave func(c net.Conn)
	}{
		{"small/fin", 1000, func(c net.Conn) { c.Close() }},
		{"small/rst", 1000, reset},
		{"small/half-close", 1000, func(c net.Conn) { c.(*net.TCPConn).CloseWrite() }},
		{"large/fin", 1 << 20, func(c net.Conn) { c.Close() }},
		{"large/rst", 1 << 20, reset},
		{"large/half-close", 1 << 20, func(c net.Conn) { c.(*net.TCPConn).CloseWrite() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
				if _, _, err := u.readRequest(br); err == nil {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
			log := newTraceLog()
			base, p := startProxy(t, Config{Upstream: up.URL()}, log)
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			require.NoError(t, err)
			defer c.Close()
			_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", tt.size, strings.Repeat("a", tt.size/2))
			require.NoError(t, err)
			if tt.size > 1000 { // the handler is reading the body as a stream
				require.Eventually(t, func() bool { return p.Inflight() == 1 }, 5*time.Second, time.Millisecond)
			}
			// A small body may still sit unread: what was sent stays readable
			// after a FIN or an RST (Linux drops only the send queue), so the
			// proxy reads the same half body and then the end, whenever it reads.
			tt.leave(c)
			tr := log.next(t)
			require.Equal(t, SideClient, tr.ErrSide)
			require.True(t, tr.Sent.IsZero(), "sent upstream")
			time.Sleep(50 * time.Millisecond)
			require.Zero(t, up.accepted.Load(), "the upstream was contacted")
			require.Zero(t, p.Inflight())
		})
	}
	t.Run("outcome", func(t *testing.T) {
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: "http://127.0.0.1:1"}, log)
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		require.NoError(t, err)
		_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"+strings.Repeat("a", 500))
		require.NoError(t, err)
		c.Close()
		tr := log.next(t)
		require.Equal(t, ErrClientGone, tr.ErrKind)
		require.Equal(t, StatusClientClosed, tr.Status)
	})
}

// TestResendOnlyOnceAfterSend (C4): an upstream that resets the connection
// as the request arrives is asked exactly once on a fresh connection, at
// most twice on a reused one, and the client gets 502. A reset within
// resetWindow of the write cannot be told from a close that found the
// request unread, so a POST is resent too (mayResend).
func TestResendOnlyOnceAfterSend(t *testing.T) {
	for _, method := range []string{"POST", "GET"} {
		t.Run(method, func(t *testing.T) {
			up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
				for {
					req, _, err := u.readRequest(br)
					if err != nil {
						return
					}
					if req.URL.Query().Get("reset") != "" {
						reset(c)
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
			// One kept-alive client that reads every body: a client that
			// hangs up as the response ends can race the watcher into
			// closing the slot's connection, which would look like a redial.
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			send := func(query string) int {
				req, err := http.NewRequest(method, base+"/v1/chat/completions"+query, strings.NewReader(`{"stream":true}`))
				require.NoError(t, err)
				resp, err := client.Do(req)
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			require.Equal(t, 502, send("?reset=1"), "fresh connection")
			require.Equal(t, int32(1), up.requests.Load())
			require.Equal(t, ErrUpstreamBroken, log.next(t).ErrKind)

			require.Equal(t, 200, send(""))
			log.next(t)
			// On a reused connection, a request that met a close or a reset
			// before any response byte is sent once more, on a new
			// connection (the engine most likely closed the idle connection
			// as the request crossed it), and never a third time.
			require.Equal(t, 502, send("?reset=1"), "reused connection")
			require.Equal(t, int32(4), up.requests.Load(), "re-sent exactly once")
			require.Equal(t, int32(3), up.accepted.Load())
			tr := log.next(t)
			require.Equal(t, ErrUpstreamBroken, tr.ErrKind)
			require.True(t, tr.Redialed)
		})
	}
}

// TestResendOnNewConnection (C4, C7): the one resend after a reused
// connection failed goes on a new connection, never on another idle one,
// which the engine's idle timer may have closed in the same instant (B12).
// Two idle connections are pooled, one per client connection; the engine
// reads a second request on either and closes without a byte. The request
// is a GET, which is resent on any close (a POST needs proof the engine
// never read it: TestNoResendOnceTheEngineCanHaveStarted).
func TestResendOnNewConnection(t *testing.T) {
	var arrived sync.WaitGroup
	arrived.Add(2)
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for first := true; ; first = false {
			req, _, err := u.readRequest(br)
			if err != nil {
				return
			}
			if !first && req.URL.Query().Get("die") != "" {
				return // read, then closed without a byte: as an idle close crossing the request
			}
			if req.URL.Query().Get("pair") != "" {
				arrived.Done()
				arrived.Wait() // both requests hold a connection of their own
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up.URL()}, log)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	send := func(query string) int {
		resp, err := client.Get(base + "/v1/models" + query)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.Equal(t, 200, send("?pair=1"))
		}()
	}
	wg.Wait()
	log.next(t)
	log.next(t)
	require.Eventually(t, func() bool { return upstreamConns(p) == 2 }, 5*time.Second, time.Millisecond, "two idle connections pooled")

	require.Equal(t, 200, send("?die=1"), "the resend met the other idle connection's close")
	tr := log.next(t)
	require.True(t, tr.Redialed)
	require.True(t, tr.Cold, "the resend was not on a new connection")
	require.Equal(t, int32(3), up.accepted.Load())
	require.Equal(t, uint64(1), p.Stats().Redials(RedialReusedFailed))
}

// TestUpstreamDiesMidStreamTruncationVisible (U1, with FIN and with RST):
// the events sent before the upstream died reach the client intact, and
// the client's chunked stream ends without its last chunk.
func TestUpstreamDiesMidStreamTruncationVisible(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	events := scriptedEvent(0) + scriptedEvent(1) + scriptedEvent(2)
	for _, rst := range []bool{false, true} {
		up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
			u.readRequest(br)
			io.WriteString(c, head)
			for i := 0; i < 3; i++ {
				ev := scriptedEvent(i)
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
				time.Sleep(5 * time.Millisecond)
			}
			if rst {
				reset(c)
			}
		})
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
		c := rawPost(t, base, "/v1/chat/completions", `{"stream":true}`)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		raw, err := io.ReadAll(c)
		require.NoError(t, err, "rst=%v", rst)
		require.True(t, bytes.HasPrefix(raw, []byte("HTTP/1.1 200 OK\r\n")))
		require.False(t, bytes.HasSuffix(raw, []byte("0\r\n\r\n")), "rst=%v: the broken stream got its terminating chunk", rst)
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.Equal(t, events, string(got), "rst=%v: events before the failure altered", rst)
		tr := log.next(t)
		require.Equal(t, SideUpstream, tr.ErrSide)
		require.Equal(t, ErrUpstreamBroken, tr.ErrKind)
		require.Equal(t, 3, tr.ContentEvents)
	}
}

// TestUpstreamDiesBeforeHeaders (U2): an upstream that closes or resets
// before its status line, or in the middle of its headers, gets the client
// a 502; one that completes its headers and dies has them forwarded and
// the body visibly truncated (Caddy TestTruncatedResponseHeaderOnly).
func TestUpstreamDiesBeforeHeaders(t *testing.T) {
	tests := []struct {
		name, sent string
		want       int
	}{
		{"before the status line", "", 502},
		{"mid status line", "HTTP/1.1 20", 502},
		{"mid headers", "HTTP/1.1 200 OK\r\nContent-Type: text/ev", 502},
		{"after the headers", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n", 200},
	}
	for _, tt := range tests {
		for _, rst := range []bool{false, true} {
			up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
				u.readRequest(br)
				io.WriteString(c, tt.sent)
				time.Sleep(10 * time.Millisecond)
				if rst {
					reset(c)
				}
			})
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
			got := post(t, base+"/v1/chat/completions", `{"stream":true}`)
			require.Equal(t, tt.want, got.status, "%s rst=%v", tt.name, rst)
			if tt.want == 200 {
				require.ErrorIs(t, got.readErr, io.ErrUnexpectedEOF, "%s rst=%v", tt.name, rst)
			}
			tr := log.next(t)
			require.Equal(t, ErrUpstreamBroken, tr.ErrKind, "%s rst=%v", tt.name, rst)
			require.Equal(t, SideUpstream, tr.ErrSide)
		}
	}
}

// TestFasthttpPinned (Q8): fasthttp assigns no CVEs to its security fixes
// (its SECURITY.md), so govulncheck cannot warn: the build must carry at
// least the release this checklist was verified against, v1.78.0
// (2026-11-09), which has the request-smuggling fixes of PR #1719 and #1899.
func TestFasthttpPinned(t *testing.T) {
	mod, err := os.ReadFile("../go.mod")
	require.NoError(t, err)
	for _, line := range strings.Split(string(mod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "github.com/valyala/fasthttp" {
			require.GreaterOrEqual(t, semverOrder(t, f[1]), semverOrder(t, "v1.78.0"), "fasthttp %s", f[1])
			return
		}
	}
	t.Fatal("go.mod does not require fasthttp")
}

// semverOrder maps vMAJOR.MINOR.PATCH[-pre] to a number that sorts the
// same way (pre-releases aside).
func semverOrder(t *testing.T, v string) int {
	core, _, _ := strings.Cut(strings.TrimPrefix(v, "v"), "-")
	parts := strings.Split(core, ".")
	require.Len(t, parts, 3, v)
	n := 0
	for _, p := range parts {
		d, err := strconv.Atoi(p)
		require.NoError(t, err, v)
		n = n*1000 + d
	}
	return n
}

// TestSSEWithContentLengthFlushedPerEvent (U3): an event stream framed
// with a Content-Length still reaches the client event by event: the
// upstream holds back the rest of its body until the client has the first
// event, which a proxy that waited for the whole body would never deliver.
func TestSSEWithContentLengthFlushedPerEvent(t *testing.T) {
	firstSeen := make(chan struct{})
	var heldBack atomic.Bool // the upstream's patience ran out before the client had the first event
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		u.readRequest(br)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n", len(scriptedBody(4)))
		io.WriteString(c, scriptedEvent(0))
		select {
		case <-firstSeen:
		case <-time.After(5 * time.Second):
			heldBack.Store(true)
		}
		for i := 1; i < 4; i++ {
			io.WriteString(c, scriptedEvent(i))
		}
		io.WriteString(c, "data: [DONE]\n\n")
	})
	base, _ := startProxy(t, Config{Upstream: up.URL()}, newTraceLog())
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	rest := bufio.NewReader(resp.Body)
	line, err := rest.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, scriptedEvent(0)[:len(line)], line)
	require.False(t, heldBack.Load(), "the first event waited for the end of the stream")
	close(firstSeen)
	all, err := io.ReadAll(rest)
	require.NoError(t, err)
	require.Equal(t, scriptedBody(4), line+string(all))
}
