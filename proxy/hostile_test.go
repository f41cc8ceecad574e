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

// The tests of this file are hostile clients and engines against the
// client side of the proxy (RELIABILITY.md §6.3 and §6.4, issue 24):
// tunnels that end or idle, a hijack fasthttp drops, requests the proxy
// must refuse on their head alone.

// guardedEnv is a proxy served through its guarded listener, with its
// Trace log.
type guardedEnv struct {
	addr string
	p    *Proxy
	log  *traceLog
	ln   *guardedListener
}

func startGuarded(t *testing.T, cfg Config) *guardedEnv {
	t.Helper()
	log := newTraceLog()
	p, err := New(cfg, zap.NewNop(), log)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gl := p.Listener(ln).(*guardedListener)
	srv := p.Server()
	go srv.Serve(gl) //nolint:errcheck // ends at Shutdown
	t.Cleanup(func() { _ = srv.Shutdown() })
	return &guardedEnv{addr: ln.Addr().String(), p: p, log: log, ln: gl}
}

// openConns is how many client connections the guarded listener counts.
func (e *guardedEnv) openConns(t *testing.T) int64 {
	t.Helper()
	return e.ln.open.Load()
}

// requireReleased waits until the proxy holds nothing for any request: no
// request in flight or upstream, no upstream connection or pool token, no
// hijacked connection, no client connection slot.
func (e *guardedEnv) requireReleased(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		return e.p.Inflight() == 0 && e.p.upstream.Load() == 0 && upstreamConns(e.p) == 0 &&
			len(e.p.pool.sem) == 0 && e.p.Hijacked() == 0 && e.openConns(t) == 0
	}, 5*time.Second, 10*time.Millisecond, "inflight %d, upstream %d, upstream conns %d, tokens %d, hijacked %d, client conns %d",
		e.p.Inflight(), e.p.upstream.Load(), upstreamConns(e.p), len(e.p.pool.sem), e.p.Hijacked(), e.openConns(t))
}

const wsRequest = "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: k\r\nSec-WebSocket-Version: 13\r\n\r\n"

const switching = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"

// upgradeUpstream answers an upgrade with a 101 and then runs tunnel on
// the connection; any other request gets a small 200.
func upgradeUpstream(t *testing.T, tunnel func(c net.Conn, br *bufio.Reader)) *rawUpstream {
	return startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			req, _, err := u.readRequest(br)
			if err != nil {
				return
			}
			if req.Header.Get("Upgrade") == "" {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				continue
			}
			io.WriteString(c, switching)
			tunnel(c, br)
			return
		}
	})
}

// dialTunnel opens a WebSocket tunnel through the proxy at addr.
func dialTunnel(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	br, c := rawDial(t, "http://"+addr, wsRequest)
	line, _ := readHead(t, br)
	require.Equal(t, "HTTP/1.1 101 Switching Protocols", line)
	return c, br
}

// TestTunnelEngineCloseReachesClient (U5b): when the engine ends a tunnel
// the client reads EOF (the proxy half-closes its side), and once the
// client closes too the tunnel releases everything it held: its
// goroutines, its --max-conns slot, the pool token, the in-flight counts;
// its Trace is recorded. The client side was never closed: fasthttp's
// hijacked connection ignores Close.
func TestTunnelEngineCloseReachesClient(t *testing.T) {
	up := upgradeUpstream(t, func(c net.Conn, br *bufio.Reader) {
		io.WriteString(c, "bye")
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, br) // until the proxy closes its side
	})
	e := startGuarded(t, Config{Upstream: up.URL(), MaxClientConns: 10, MaxUpstreamConns: 1})
	c, br := dialTunnel(t, e.addr)
	got, err := io.ReadAll(br)
	require.NoError(t, err, "the client never read the end of the tunnel")
	require.Equal(t, "bye", string(got))
	// Half-closed: the client can still send its last bytes.
	_, err = io.WriteString(c, "last")
	require.NoError(t, err)
	c.Close()
	tr := e.log.next(t)
	require.True(t, tr.Upgraded)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.Equal(t, int64(3), tr.TunnelDown)
	e.requireReleased(t)

	// The pool token came back: another request is served at once.
	resp, err := http.Get("http://" + e.addr + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}

// TestTunnelEngineResetClosesClient (U5b): an engine that resets a tunnel
// ends it at once on both sides (the client's socket is closed under
// fasthttp's wrapper, whose Close does nothing), not at the idle timeout
// (10 min here), and the tunnel is recorded upstream_broken.
func TestTunnelEngineResetClosesClient(t *testing.T) {
	up := upgradeUpstream(t, func(c net.Conn, br *bufio.Reader) {
		buf := make([]byte, 5)
		io.ReadFull(br, buf)
		reset(c)
	})
	e := startGuarded(t, Config{Upstream: up.URL(), MaxClientConns: 10})
	c, br := dialTunnel(t, e.addr)
	io.WriteString(c, "hello")
	start := time.Now()
	_, _ = io.ReadAll(br) // EOF or a reset: either way, closed
	require.Less(t, time.Since(start), 3*time.Second)
	tr := e.log.next(t)
	require.Equal(t, ErrUpstreamBroken, tr.ErrKind)
	e.requireReleased(t)
}

// TestTunnelHalfClose (U5b): a client that half-closes after its last
// message still gets the engine's answer to it, as through Go's
// ReverseProxy, which half-closes (CloseWrite) the other side at the first
// EOF instead of closing both.
func TestTunnelHalfClose(t *testing.T) {
	up := upgradeUpstream(t, func(c net.Conn, br *bufio.Reader) {
		got, _ := io.ReadAll(br) // the client's bytes, to its EOF
		io.WriteString(c, "got "+string(got))
	})
	e := startGuarded(t, Config{Upstream: up.URL(), MaxClientConns: 10})
	c, br := dialTunnel(t, e.addr)
	io.WriteString(c, "question")
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	got, err := io.ReadAll(br)
	require.NoError(t, err)
	require.Equal(t, "got question", string(got))
	tr := e.log.next(t)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.Equal(t, int64(len("question")), tr.TunnelUp)
	c.Close()
	e.requireReleased(t)
}

// TestTunnelIdleTimeout (U5b): a tunnel silent both ways is closed on both
// sides at --upstream-read-timeout (no sooner, within its slack and a
// loaded machine's margin), recorded as upstream_timeout, and releases
// what it held. It used to be held for ever.
func TestTunnelIdleTimeout(t *testing.T) {
	engineDone := make(chan struct{})
	up := upgradeUpstream(t, func(c net.Conn, br *bufio.Reader) {
		io.Copy(io.Discard, br)
		close(engineDone)
	})
	const idle = 300 * time.Millisecond
	e := startGuarded(t, Config{Upstream: up.URL(), MaxClientConns: 10, UpstreamReadTimeout: idle})
	c, br := dialTunnel(t, e.addr)
	start := time.Now()
	_, err := io.ReadAll(br)
	took := time.Since(start)
	require.NoError(t, err)
	require.GreaterOrEqual(t, took, idle-20*time.Millisecond, "closed before the idle timeout")
	require.Less(t, took, 3*time.Second)
	select {
	case <-engineDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the engine side of an idle tunnel was never closed")
	}
	tr := e.log.next(t)
	require.Equal(t, ErrUpstreamTimeout, tr.ErrKind)
	c.Close()
	e.requireReleased(t)
}

// TestTunnelTrafficRenewsIdle (U5b): traffic either way keeps a tunnel
// open past --upstream-read-timeout: messages every 50 ms for 1.2 s with a
// 300 ms idle timeout, echoed, and then sent one way only (the engine
// answers nothing). Writes to the engine bypassed the deadline renewal, so
// the tunnel died at about 353 ms (and every WebSocket 10 min after its
// upgrade with the defaults).
func TestTunnelTrafficRenewsIdle(t *testing.T) {
	for _, echo := range []bool{true, false} {
		t.Run("echo="+strconv.FormatBool(echo), func(t *testing.T) {
			up := upgradeUpstream(t, func(c net.Conn, br *bufio.Reader) {
				buf := make([]byte, 256)
				for {
					n, err := br.Read(buf)
					if err != nil {
						return
					}
					if echo {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
				}
			})
			const idle = 300 * time.Millisecond
			e := startGuarded(t, Config{Upstream: up.URL(), MaxClientConns: 10, UpstreamReadTimeout: idle})
			c, br := dialTunnel(t, e.addr)
			deadline := time.Now().Add(1200 * time.Millisecond)
			for i := 0; time.Now().Before(deadline); i++ {
				msg := "m" + strconv.Itoa(i%10)
				_, err := io.WriteString(c, msg)
				require.NoError(t, err, "message %d", i)
				if echo {
					buf := make([]byte, len(msg))
					_, err = io.ReadFull(br, buf)
					require.NoError(t, err, "message %d", i)
					require.Equal(t, msg, string(buf))
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !echo {
				// Still open: a last message goes through and the tunnel then
				// idles out, never sooner.
				_, err := io.WriteString(c, "x")
				require.NoError(t, err)
				select {
				case <-e.log.done:
					t.Fatal("the tunnel ended while one direction carried messages")
				default:
				}
			}
			c.Close()
			tr := e.log.next(t)
			require.Equal(t, ErrNone, tr.ErrKind)
			require.True(t, tr.Upgraded)
			e.requireReleased(t)
		})
	}
}

// TestPipelinedUpgradeResetReleases (U5c): a client that pipelines a
// request and then an upgrade, and resets the connection, makes fasthttp's
// flush of the first response fail before the hijack starts: neither the
// tunnel nor anything else ran, and the request held its in-flight count,
// its upstream connection and its pool token for ever, with no Trace.
// Twenty tries leave nothing held and two Traces each.
func TestPipelinedUpgradeResetReleases(t *testing.T) {
	var upgrades atomic.Int32
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			req, _, err := u.readRequest(br)
			if err != nil {
				return
			}
			if req.Header.Get("Upgrade") == "" {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				continue
			}
			upgrades.Add(1)
			// The client's reset is in before the 101, which comes before
			// the client watch starts looking (watchDelay): only the flush
			// before the hijack sees the reset.
			time.Sleep(10 * time.Millisecond) // half of watchDelay (Linux)
			io.WriteString(c, switching)
			io.Copy(io.Discard, br)
			return
		}
	})
	e := startGuarded(t, Config{Upstream: up.URL(), MaxClientConns: 100, MaxUpstreamConns: 4})
	const tries = 20
	for range tries {
		c, err := net.Dial("tcp", e.addr)
		require.NoError(t, err)
		_, err = io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"+wsRequest)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
		reset(c)
	}
	// Each try is the GET's Trace and, when the reset came after the GET's
	// answer was flushed (every response is, before the next request is
	// read: the relay's first write deadline, set through the request), the
	// upgrade's; a reset that came first ends the connection at that
	// flush, and the upgrade is never read.
	for gets := 0; gets < tries; {
		if tr := e.log.next(t); tr.Route == RouteModels {
			gets++
		}
	}
	// Some upgrades must have reached the engine, else the resets beat
	// every GET's answer and the test proved nothing.
	if upgrades.Load() == 0 {
		t.Skip("no upgrade reached the engine: every reset came before its GET's answer")
	}
	e.requireReleased(t)
	require.Eventually(t, func() bool {
		e.log.mu.Lock()
		defer e.log.mu.Unlock()
		return len(e.log.traces) >= int(up.requests.Load())
	}, 5*time.Second, 10*time.Millisecond, "requests the engine read without a Trace")
	resp, err := http.Get("http://" + e.addr + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}

// TestDeclaredBodyOverLimitRefusedAtOnce (L2b): a declared Content-Length
// over --max-body-bytes gets 413 on its head, with less than fasthttp's
// 8 KiB pre-read of body sent (it got 408 after the whole read timeout),
// and a chunked body over the limit gets the same answer: one JSON error
// naming no upstream (the engine was never involved), recorded like any
// refusal. An Expect: 100-continue client gets that body too, instead of
// an empty 413. The engine sees none of them.
func TestDeclaredBodyOverLimitRefusedAtOnce(t *testing.T) {
	var hits atomic.Int32
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL, MaxBodyBytes: 1 << 20, ReadTimeout: 30 * time.Second}, log)
	host := strings.TrimPrefix(up.URL, "http://")
	for _, tt := range []struct{ name, raw string }{
		{"declared", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n" + strings.Repeat("a", 100)},
		{"chunked", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
			strings.Repeat("10000\r\n"+strings.Repeat("a", 0x10000)+"\r\n", 17)},
		{"expect", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 67108864\r\n\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			br, _ := rawDial(t, base, tt.raw)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
			require.Less(t, time.Since(start), 3*time.Second, "the 413 waited for the body")
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			require.JSONEq(t, `{"error":{"message":"anvilproxy: request body too large","type":"body_too_large","code":413}}`, string(body))
			require.NotContains(t, string(body), host)
			tr := log.next(t)
			require.Equal(t, ErrBodyTooLarge, tr.ErrKind)
			require.Equal(t, 413, tr.Status)
		})
	}
	require.Zero(t, hits.Load(), "a body over the limit reached the engine")
}

// TestUnknownHTTPVersionIs505 (S10): a request line naming HTTP/2.0 (a
// text request line, not the h2 preface) or HTTP/1.9 is answered 505 and
// the connection closed; the engine sees nothing. fasthttp forwarded them
// as they came.
func TestUnknownHTTPVersionIs505(t *testing.T) {
	var hits atomic.Int32
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	for _, v := range []string{"HTTP/2.0", "HTTP/1.9", "HTTP/1.2"} {
		br, _ := rawDial(t, base, "GET /v1/models "+v+"\r\nHost: x\r\n\r\n")
		line, err := br.ReadString('\n')
		require.NoError(t, err, v)
		require.True(t, strings.HasPrefix(line, "HTTP/1.1 505 "), "%s: %q", v, line)
		tr := log.next(t)
		require.Equal(t, 505, tr.Status)
		require.Equal(t, ErrBadRequest, tr.ErrKind)
	}
	require.Zero(t, hits.Load(), "an unknown HTTP version was forwarded")
}

// TestQueueFullIs429 (L7): with --max-inflight 1 and --max-queue 1, a third
// request while one is upstream and one waits gets the proxy's own 429
// (an engine's rejection, which SDKs retry with back-off), with a JSON body
// naming no upstream, and a Trace limited/proxy; once the first ends, the
// waiting one is served. A queue-full answered 503 went unnoticed before.
func TestQueueFullIs429(t *testing.T) {
	release := make(chan struct{})
	var hits atomic.Int32
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			<-release
		}
		io.WriteString(w, "{}")
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up.URL, MaxInflight: 1, MaxQueue: 1, MaxQueueWait: time.Minute}, log)
	first := make(chan exchange, 2)
	go func() { first <- post(t, base+"/v1/chat/completions", `{"model":"m"}`) }()
	require.Eventually(t, func() bool { return hits.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	go func() { first <- post(t, base+"/v1/chat/completions", `{"model":"m"}`) }()
	require.Eventually(t, func() bool { return p.limit.waiting.Load() == 1 }, 5*time.Second, 5*time.Millisecond)

	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Contains(t, string(body), `"type":"limited"`)
	require.NotContains(t, string(body), strings.TrimPrefix(up.URL, "http://"))
	tr := log.next(t)
	require.Equal(t, ErrLimited, tr.ErrKind)
	require.Equal(t, SideProxy, tr.ErrSide)
	require.Equal(t, 429, tr.Status)

	close(release)
	require.Equal(t, 200, (<-first).status)
	require.Equal(t, 200, (<-first).status)
}

// TestInjectUsageKeepsPartialLastEvent (U6): under --inject-usage the relay
// holds an incomplete event until its end; a stream that ends inside one
// (no blank line after the last event) still reaches the client byte for
// byte, the held bytes included. Dropping them at EOF went unnoticed.
func TestInjectUsageKeepsPartialLastEvent(t *testing.T) {
	const stream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"cut"
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		io.WriteString(w, stream)
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL, InjectUsage: true}, log)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, stream, string(got))
	tr := log.next(t)
	require.True(t, tr.UsageInject)
	require.Equal(t, int64(len(stream)), tr.RespBytes)
	require.True(t, tr.Truncated)
}

// TestHonestClientServedUnderAttack (L8): every limit attacked at once —
// slow body liars declaring 4 MiB and sending 9 KB, a flood of connections
// that connect and wait (new and idle keep-alive) filling --max-conns
// again and again, WebSocket tunnels held open — while an honest client
// keeps being served: 30 POSTs, each on a new connection, all 200 and
// byte-identical, none slower than 2 s. (The admin port's flood is
// TestAdminConnectionBound.)
func TestHonestClientServedUnderAttack(t *testing.T) {
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			req, body, err := u.readRequest(br)
			if err != nil {
				return
			}
			if req.Header.Get("Upgrade") != "" {
				io.WriteString(c, switching)
				io.Copy(io.Discard, br)
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n")
			c.Write(body)
		}
	})
	e := startGuarded(t, Config{Upstream: up.URL(), MaxClientConns: 40, MaxInflightBodyBytes: 8 << 20,
		MaxUpstreamConns: 8, ReadTimeout: time.Minute})
	stop := make(chan struct{})
	attackers := make(chan net.Conn, 1024)
	t.Cleanup(func() {
		close(stop)
		for {
			select {
			case c := <-attackers:
				c.Close()
			default:
				return
			}
		}
	})
	dial := func() net.Conn {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			return nil
		}
		select {
		case attackers <- c:
		default:
			c.Close()
			return nil
		}
		return c
	}
	for range 4 { // tunnels, held silent
		c, br := dialTunnel(t, e.addr)
		_ = br
		attackers <- c
	}
	for range 10 { // slow body liars
		if c := dial(); c != nil {
			io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n"+strings.Repeat("a", 9000))
		}
	}
	go func() { // the flood: connections that wait, idle keep-alive ones among them
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if c := dial(); c != nil && i%2 == 0 {
				io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n") // then idle
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	require.Eventually(t, func() bool { return e.p.Stats().IdleClosed.Load() > 40 }, 10*time.Second, 10*time.Millisecond,
		"the flood never filled the connection bound")

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for i := range 30 {
		body := `{"model":"m","messages":[{"role":"user","content":"honest ` + strconv.Itoa(i) + `"}]}`
		start := time.Now()
		resp, err := client.Post("http://"+e.addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err, "honest request %d", i)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode, "honest request %d: %s", i, got)
		require.Equal(t, body, string(got))
		require.Less(t, time.Since(start), 2*time.Second, "honest request %d", i)
	}
	t.Logf("idle connections closed for room: %d, refused: %d", e.p.Stats().IdleClosed.Load(), e.p.Stats().ConnsRefused.Load())
}
