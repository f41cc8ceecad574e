//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// withLoop runs fn with every Proxy on the event loop, as go test -loop does.
func withLoop(t *testing.T, fn func(*testing.T)) {
	t.Helper()
	was := testEventLoop
	testEventLoop = true
	defer func() { testEventLoop = was }()
	fn(t)
}

// TestLoopSuite runs the relay, fault-matrix, reliability, shutdown and
// inject tests once more with the event loop on, in every go test run
// (go test -loop runs the whole package so).
func TestLoopSuite(t *testing.T) {
	if testEventLoop {
		t.Skip("the whole package runs on the loop already")
	}
	for name, fn := range map[string]func(*testing.T){
		"RelayByteExactRandomBodies":             TestRelayByteExactRandomBodies,
		"RelayByteExactEverySplit":               TestRelayByteExactEverySplit,
		"RelayFlushesEachEvent":                  TestRelayFlushesEachEvent,
		"FlushPolicy":                            TestFlushPolicy,
		"FaultMatrix":                            TestFaultMatrix,
		"OutcomeAccounting":                      TestOutcomeAccounting,
		"UpstreamDiesMidStreamTruncationVisible": TestUpstreamDiesMidStreamTruncationVisible,
		"SSEWithContentLengthFlushedPerEvent":    TestSSEWithContentLengthFlushedPerEvent,
		"InjectUsageInvisibleToClient":           TestInjectUsageInvisibleToClient,
		"InjectUsageResponseBytes":               TestInjectUsageResponseBytes,
	} {
		t.Run(name, func(t *testing.T) { withLoop(t, fn) })
	}
}

// loopStreamsStarted counts the streams the loops took, for tests to see
// that a stream went there.
func loopStreamsStarted() int64 { return loopStarted.Load() }

// requireLoopStreams waits until n streams went to a loop since before: a
// stream whose first bytes went out with the head (loopStream.early) can
// reach its client before the loop counts it.
func requireLoopStreams(t *testing.T, before, n int64, msg string) {
	t.Helper()
	require.Eventually(t, func() bool { return loopStreamsStarted()-before == n }, 5*time.Second, time.Millisecond, msg)
}

// sseUpstream answers every request with n events, gap apart, chunked.
func sseUpstream(t *testing.T, n int, gap time.Duration) *rawUpstream {
	return startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			if _, _, err := u.readRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			for i := range n {
				ev := scriptedEvent(i)
				if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev); err != nil {
					return
				}
				time.Sleep(gap)
			}
			done := "data: [DONE]\n\n"
			fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(done), done)
		}
	})
}

// TestLoopKeepAliveHandsBack: after a stream the loop relayed, the client
// connection carries more requests, streamed and not, and a request the
// client pipelined behind the stream's is answered, not lost.
func TestLoopKeepAliveHandsBack(t *testing.T) {
	withLoop(t, func(t *testing.T) {
		up := sseUpstream(t, 3, time.Millisecond)
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		br := bufio.NewReader(c)
		req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"stream\":true}"
		want := scriptedEvent(0) + scriptedEvent(1) + scriptedEvent(2) + "data: [DONE]\n\n"
		before := loopStreamsStarted()
		read := func() {
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, want, string(body))
			require.Equal(t, []string{"chunked"}, resp.TransferEncoding)
			require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			tr := log.next(t)
			require.Equal(t, ErrNone, tr.ErrKind)
			require.Equal(t, 4, tr.Events)
		}
		_, err = io.WriteString(c, req)
		require.NoError(t, err)
		read()
		_, err = io.WriteString(c, req+req) // the second pipelined behind the first
		require.NoError(t, err)
		read()
		read()
		// The third came in fasthttp's buffer with the second: it is read
		// from there (prefixConn), and that connection, whose socket no
		// longer shows what waits, stays on the goroutine relay.
		require.Equal(t, int64(2), loopStreamsStarted()-before, "the streams went through a loop")
		// The pool binds an idle upstream connection to the client
		// connection that used it: the second stream reused the first's;
		// the third came through prefixConn, a client connection of its
		// own to the pool, and dialled.
		require.Equal(t, int32(2), up.accepted.Load(), "the upstream connection went back to the pool after the loop's stream")
	})
}

// TestLoopClientLeavesClosesUpstream: a client that closes mid-stream has
// the engine's connection closed at once (client-abort → engine-abort).
func TestLoopClientLeavesClosesUpstream(t *testing.T) {
	withLoop(t, func(t *testing.T) {
		closed := make(chan struct{})
		up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
			u.readRequest(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			ev := scriptedEvent(0)
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := br.ReadByte(); err != nil && !isTimeout(err) {
				close(closed) // the proxy closed the engine's connection
			}
		})
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
		c := rawPost(t, base, "/v1/chat/completions", `{"stream":true}`)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		buf := make([]byte, len(scriptedEvent(0)))
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		c.Close()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("the engine's connection stayed open after the client left")
		}
		tr := log.next(t)
		require.Equal(t, SideClient, tr.ErrSide)
		require.Equal(t, ErrClientGone, tr.ErrKind)
	})
}

// TestLoopBackPressure: a client that reads nothing stops the loop reading
// the engine (the engine's writes block) instead of the proxy buffering
// the stream; once it reads, every byte arrives in order.
func TestLoopBackPressure(t *testing.T) {
	withLoop(t, func(t *testing.T) {
		// ~11 MB: more than loopback sockets' buffers took (the engine
		// blocks after about 4 MB here) once the proxy stops reading.
		const events = 200_000
		var written atomic.Int64
		up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
			u.readRequest(br)
			c.(*net.TCPConn).SetWriteBuffer(64 << 10)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			for i := range events {
				ev := scriptedEvent(i)
				if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev); err != nil {
					return
				}
				written.Add(1)
			}
			done := "data: [DONE]\n\n"
			fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(done), done)
		})
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
		c := rawPost(t, base, "/v1/chat/completions", `{"stream":true}`)
		// Wait until the engine stops making progress: its writes block.
		last := int64(-1)
		for deadline := time.Now().Add(60 * time.Second); ; { // generous: the race detector slows the engine and the loop
			time.Sleep(100 * time.Millisecond)
			n := written.Load()
			if n == last {
				break
			}
			last = n
			require.True(t, time.Now().Before(deadline), "the engine never blocked")
		}
		t.Logf("the engine blocked after %d of %d events; the loop parked at most %d bytes", last, events, loopParkMax.Load())
		require.Less(t, last, int64(events), "the proxy took the whole stream while the client read nothing")
		require.LessOrEqual(t, loopParkMax.Load(), int64(2*relayBufSize), "a stream parked more than a read or two")
		require.NoError(t, c.SetReadDeadline(time.Now().Add(60*time.Second)))
		start := time.Now()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		t.Logf("read %d bytes in %v", len(body), time.Since(start))
		require.NoError(t, err)
		var want strings.Builder
		for i := range events {
			want.WriteString(scriptedEvent(i))
		}
		want.WriteString("data: [DONE]\n\n")
		require.Equal(t, want.String(), string(body))
		require.Equal(t, ErrNone, log.next(t).ErrKind)
	})
}

// TestLoopIdleTimeouts: an engine silent past UpstreamReadTimeout, and a
// client that takes nothing for ClientWriteTimeout, end the stream as on
// the goroutine relay.
func TestLoopIdleTimeouts(t *testing.T) {
	withLoop(t, func(t *testing.T) {
		up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
			u.readRequest(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			ev := scriptedEvent(0)
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			br.ReadByte() // silent until the proxy gives up
		})
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up.URL(), UpstreamReadTimeout: 200 * time.Millisecond}, log)
		c := rawPost(t, base, "/v1/chat/completions", `{"stream":true}`)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		raw, err := io.ReadAll(c)
		require.NoError(t, err)
		require.False(t, strings.HasSuffix(string(raw), "0\r\n\r\n"), "a timed-out stream got its last chunk")
		tr := log.next(t)
		require.Equal(t, SideUpstream, tr.ErrSide)
		require.Equal(t, ErrUpstreamTimeout, tr.ErrKind)
	})
}

// TestLoopAbort: Abort cuts a stream a loop holds, as ErrShutdown, and
// Inflight falls to 0.
func TestLoopAbort(t *testing.T) {
	withLoop(t, func(t *testing.T) {
		up := sseUpstream(t, 1000, 10*time.Millisecond)
		log := newTraceLog()
		base, p := startProxy(t, Config{Upstream: up.URL()}, log)
		c := rawPost(t, base, "/v1/chat/completions", `{"stream":true}`)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, err = resp.Body.Read(make([]byte, 1))
		require.NoError(t, err)
		p.Abort()
		_, err = io.ReadAll(resp.Body)
		require.Error(t, err, "the cut stream looked complete")
		tr := log.next(t)
		require.Equal(t, SideProxy, tr.ErrSide)
		require.Equal(t, ErrShutdown, tr.ErrKind)
		require.Eventually(t, func() bool { return p.Inflight() == 0 }, 5*time.Second, time.Millisecond)
	})
}

// TestLoopHTTP10CloseDelimited: an HTTP/1.0 client gets the stream
// unframed, ended by the close.
func TestLoopHTTP10CloseDelimited(t *testing.T) {
	withLoop(t, func(t *testing.T) {
		up := sseUpstream(t, 3, time.Millisecond)
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
		before := loopStreamsStarted()
		br, _ := rawDial(t, base, "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"stream\":true}")
		raw, err := io.ReadAll(br)
		require.NoError(t, err)
		head, body, ok := strings.Cut(string(raw), "\r\n\r\n")
		require.True(t, ok)
		require.Contains(t, head, "Connection: close")
		require.NotContains(t, strings.ToLower(head), "transfer-encoding")
		require.Equal(t, scriptedEvent(0)+scriptedEvent(1)+scriptedEvent(2)+"data: [DONE]\n\n", body)
		require.Equal(t, ErrNone, log.next(t).ErrKind)
		require.Equal(t, int64(1), loopStreamsStarted()-before)
	})
}

// TestLoopAllocsPerEvent: the loop allocates nothing per event (go test
// -loop runs TestRelayAllocsPerEvent on it too).
func TestLoopAllocsPerEvent(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	withLoop(t, func(t *testing.T) {
		// The responses are built before measuring: the upstream writes
		// them in pieces of 16 events, so the proxy reads many times.
		bodies := map[int][]byte{}
		for _, n := range []int{10, 5000} {
			var sb strings.Builder
			sb.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			for i := range n {
				ev := scriptedEvent(i)
				fmt.Fprintf(&sb, "%x\r\n%s\r\n", len(ev), ev)
			}
			done := "data: [DONE]\n\n"
			fmt.Fprintf(&sb, "%x\r\n%s\r\n0\r\n\r\n", len(done), done)
			bodies[n] = []byte(sb.String())
		}
		var body atomic.Pointer[[]byte]
		piece := 16 * (len(scriptedEvent(0)) + 8)
		up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
			for {
				if _, _, err := u.readRequest(br); err != nil {
					return
				}
				b := *body.Load()
				for off := 0; off < len(b); off += piece {
					if _, err := c.Write(b[off:min(off+piece, len(b))]); err != nil {
						return
					}
				}
			}
		})
		base, _ := startProxy(t, Config{Upstream: up.URL()}, NopRecorder{})
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		require.NoError(t, err)
		defer c.Close()
		br := bufio.NewReader(c)
		req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"stream\":true}"
		stream := func(n int) {
			b := bodies[n]
			body.Store(&b)
			_, err := io.WriteString(c, req)
			require.NoError(t, err)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			_, err = io.Copy(io.Discard, resp.Body)
			require.NoError(t, err)
		}
		mallocs := func(n, runs int) float64 {
			var a, b runtime.MemStats
			runtime.ReadMemStats(&a)
			for range runs {
				stream(n)
			}
			runtime.ReadMemStats(&b)
			return float64(b.Mallocs-a.Mallocs) / float64(runs)
		}
		for range 3 {
			stream(10)
			stream(5000)
		}
		before := loopStreamsStarted()
		short, long := mallocs(10, 20), mallocs(5000, 5)
		perEvent := (long - short) / (5000 - 10)
		t.Logf("allocations per stream: %.1f with 10 events, %.1f with 5,000 (this includes the test's own client and upstream); per event: %.4f", short, long, perEvent)
		require.Equal(t, int64(25), loopStreamsStarted()-before)
		require.Less(t, perEvent, 0.05, "the loop allocates per event")
	})
}

// TestLoopReadsPerEvent: an event that arrives on its own costs the loop
// one read of the engine's socket, not a second that returns EAGAIN (a
// short read drained the edge-triggered socket), and a stream whose
// engine closes right after its last bytes still ends (EPOLLRDHUP: read
// on to the EOF).
func TestLoopReadsPerEvent(t *testing.T) {
	withLoop(t, func(t *testing.T) {
		const events = 100
		up := sseUpstream(t, events, 2*time.Millisecond)
		log := newTraceLog()
		base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
		before, reads := loopStreamsStarted(), loopReads.Load()
		br, _ := rawDial(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"stream\":true}")
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.Equal(t, events+1, log.next(t).Events)
		require.Equal(t, int64(1), loopStreamsStarted()-before)
		perEvent := float64(loopReads.Load()-reads) / (events + 1)
		t.Logf("%.2f upstream reads per event", perEvent)
		require.Less(t, perEvent, 1.3, "the loop reads the engine's socket twice per event")

		// HTTP/1.0 to the client, and an engine that closes after its
		// last event, in the same write: the EOF comes with no new edge.
		closing := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
			u.readRequest(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
			time.Sleep(20 * time.Millisecond) // the loop has the stream
			io.WriteString(c, scriptedEvent(0)+"data: [DONE]\n\n")
			c.(*net.TCPConn).CloseWrite()
			time.Sleep(100 * time.Millisecond)
		})
		base2, _ := startProxy(t, Config{Upstream: closing.URL()}, newTraceLog())
		before = loopStreamsStarted()
		br2, _ := rawDial(t, base2, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"stream\":true}")
		resp2, err := http.ReadResponse(br2, nil)
		require.NoError(t, err)
		body, err := io.ReadAll(resp2.Body)
		require.NoError(t, err, "the close-delimited stream did not end")
		require.Equal(t, scriptedEvent(0)+"data: [DONE]\n\n", string(body))
		require.Equal(t, int64(1), loopStreamsStarted()-before)
	})
}
