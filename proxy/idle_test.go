package proxy

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
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

// idleClosingUpstream is a raw socket server that behaves like uvicorn: it
// answers each request (echoing its X-Request-Id in the body, so that a
// response delivered to the wrong request is seen), then waits for the next
// request on the connection for a random time up to maxIdle and closes the
// connection when none came, wherever the proxy is in its use of it. Like
// uvicorn, which arms its keep-alive timer when a response completes, it
// does not time a new connection's first request: with time scaled down a
// hundredfold, a loaded machine's delay between the proxy's dial and its
// write would otherwise read as an engine closing a connection nobody had
// used, which no real engine does.
func idleClosingUpstream(t *testing.T, maxIdle time.Duration, seed uint64) *rawUpstream {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 1))
	idle := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return time.Duration(rng.Int64N(int64(maxIdle)))
	}
	return startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for first := true; ; first = false {
			if !first {
				_ = c.SetReadDeadline(time.Now().Add(idle()))
			}
			if _, err := br.Peek(1); err != nil {
				return // idle too long: close, as uvicorn's keep-alive timeout does
			}
			_ = c.SetReadDeadline(time.Time{})
			req, _, err := u.readRequest(br)
			if err != nil {
				return
			}
			body := `{"id":"` + req.Header.Get("X-Request-Id") + `"}`
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
}

// TestIdleClosingUpstreamNever502 (C7): an engine that closes idle
// keep-alive connections at random times while 64 clients send requests
// with random gaps gets zero 502s and zero responses delivered to the wrong
// request, over at least 5,000 requests. Time runs 100 times faster than
// the world by default (engine idle close 0–60 ms, client gaps 0–80 ms,
// proxy idle timeout 40 ms); ANVIL_IDLE_SOAK=1 runs it at the world's pace
// (0–6 s, 0–8 s, the default 4 s), which takes about five minutes.
func TestIdleClosingUpstreamNever502(t *testing.T) {
	scale := time.Duration(100)
	if os.Getenv("ANVIL_IDLE_SOAK") != "" {
		scale = 1
	}
	const clients, total = 64, 5000
	up := idleClosingUpstream(t, 6*time.Second/scale, 7)
	counter := &outcomeCounter{}
	cfg := Config{Upstream: up.URL()}
	if scale != 1 {
		cfg.UpstreamIdleTimeout = DefaultUpstreamIdleTimeout / scale
	}
	base, p := startProxy(t, cfg, counter)

	var sent, bad, wrong atomic.Int64
	var firstBad atomic.Value
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
			defer client.CloseIdleConnections()
			for n := sent.Add(1); n <= total; n = sent.Add(1) {
				time.Sleep(time.Duration(rng.Int64N(int64(8 * time.Second / scale))))
				id := "req-" + strconv.FormatInt(n, 10)
				req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
				req.Header.Set("X-Request-Id", id)
				resp, err := client.Do(req)
				if err != nil {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, err.Error())
					continue
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil || resp.StatusCode != 200:
					bad.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("%d %s %v", resp.StatusCode, body, err))
				case string(body) != `{"id":"`+id+`"}`:
					wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, wrong.Load(), "responses delivered to the wrong request")
	require.Zero(t, bad.Load(), "failed requests; the first: %v", firstBad.Load())
	require.Equal(t, int64(total), counter.total())
	st := p.Stats()
	t.Logf("%d requests on %d upstream connections; redials: idle_timeout %d, peer_closed %d, unsolicited %d, reused_failed %d",
		total, up.accepted.Load(), st.Redials(RedialIdleTimeout), st.Redials(RedialPeerClosed),
		st.Redials(RedialUnsolicited), st.Redials(RedialReusedFailed))
	require.Positive(t, st.Redials(RedialPeerClosed)+st.Redials(RedialReusedFailed)+st.Redials(RedialIdleTimeout),
		"the engine never closed a connection the proxy held: the test proves nothing")
}

// TestReusedConnectionClosedByEngine (C7): the uvicorn case, step by step.
// A connection the engine closed while it sat idle is not reused, and the
// request after the engine's idle timeout gets its answer, not a 502.
func TestReusedConnectionClosedByEngine(t *testing.T) {
	engineClosed := make(chan struct{}, 2)
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond)) // the engine's keep-alive timeout
			req, _, err := u.readRequest(br)
			if err != nil {
				c.Close()
				engineClosed <- struct{}{}
				return
			}
			body := req.URL.Path
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	log := newTraceLog()
	// The proxy's own idle timeout is longer than the engine's here, as with
	// a misconfigured --upstream-idle-timeout: the peek at reuse catches it.
	base, p := startProxy(t, Config{Upstream: up.URL(), UpstreamIdleTimeout: time.Minute}, log)
	client := keepAliveClient(t)
	require.Equal(t, "/v1/a", string(postOn(t, client, base+"/v1/a", "").body))
	log.next(t)
	select { // a tool call between two turns, longer than the engine's keep-alive
	case <-engineClosed:
	case <-time.After(5 * time.Second):
		t.Fatal("the engine never closed the idle connection")
	}
	got := postOn(t, client, base+"/v1/b", "")
	require.Equal(t, 200, got.status, "%s", got.body)
	require.Equal(t, "/v1/b", string(got.body))
	tr := log.next(t)
	require.True(t, tr.Cold, "the closed connection was reused")
	require.False(t, tr.Redialed)
	require.Equal(t, uint64(1), p.Stats().Redials(RedialPeerClosed))
	require.Equal(t, int32(2), up.accepted.Load())
}

// TestIdleTimeoutClosesFirst (C7): the proxy closes an idle upstream
// connection after --upstream-idle-timeout, before the engine would.
func TestIdleTimeoutClosesFirst(t *testing.T) {
	closed := make(chan struct{}, 1)
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			if _, _, err := u.readRequest(br); err != nil {
				closed <- struct{}{}
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	base, p := startProxy(t, Config{Upstream: up.URL(), UpstreamIdleTimeout: 100 * time.Millisecond}, newTraceLog())
	start := time.Now()
	// A client that stays: one that leaves takes its idle upstream
	// connection with it at once (TestClientCloseClosesItsUpstream).
	require.Equal(t, 200, postOn(t, keepAliveClient(t), base+"/v1/models", "").status)
	select {
	case <-closed:
		took := time.Since(start)
		require.Greater(t, took, 90*time.Millisecond, "closed before the idle timeout")
	case <-time.After(5 * time.Second):
		t.Fatal("the idle connection was never closed")
	}
	require.Eventually(t, func() bool { return upstreamConns(p) == 0 }, 5*time.Second, 10*time.Millisecond)
}

// TestBodylessResponseWithBodyNotReused (C7): a HEAD answered with a body
// and a 204 with one leave bytes no response accounts for; the connection
// is closed, and the next request gets its own answer, never those bytes.
func TestBodylessResponseWithBodyNotReused(t *testing.T) {
	for _, tc := range []struct{ method, head string }{
		{"HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n"},
		{"POST", "HTTP/1.1 204 No Content\r\nContent-Length: 8\r\n\r\n"},
	} {
		t.Run(tc.method, func(t *testing.T) {
			var n atomic.Int32
			up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
				for {
					if _, _, err := u.readRequest(br); err != nil {
						return
					}
					if n.Add(1) == 1 {
						io.WriteString(c, tc.head+"SMUGGLED")
						continue
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
				}
			})
			base, _ := startProxy(t, Config{Upstream: up.URL()}, newTraceLog())
			req, _ := http.NewRequest(tc.method, base+"/v1/models", nil)
			resp, err := (&http.Transport{}).RoundTrip(req)
			require.NoError(t, err)
			resp.Body.Close()
			got := post(t, base+"/v1/models", "")
			require.Equal(t, "second", string(got.body))
			require.Equal(t, int32(2), up.accepted.Load(), "the connection with a body it should not have was used again")
		})
	}
}
