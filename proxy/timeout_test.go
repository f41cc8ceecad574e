package proxy

import (
	"errors"
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

// TestSlowClientsCutByReadTimeout: slowloris (headers trickled) and a slow
// body are cut by the total request read timeout, and never reach upstream.
func TestSlowClientsCutByReadTimeout(t *testing.T) {
	var hits atomic.Int32
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	base, _ := startProxy(t, Config{Upstream: up.URL, ReadTimeout: 300 * time.Millisecond}, newTraceLog())
	for name, parts := range map[string][]string{
		"slow headers": {"POST /v1/chat/completions HTTP/1.1\r\n", "Host: x\r\n", "X-A: 1\r\n", "X-B: 2\r\n", "X-C: 3\r\n", "X-D: 4\r\n", "X-E: 5\r\n"},
		"slow body":    {"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", "{", "\"", "a", "\"", ":", "1"},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			require.NoError(t, err)
			defer c.Close()
			start := time.Now()
			for _, p := range parts {
				if _, err := c.Write([]byte(p)); err != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			require.NoError(t, c.SetReadDeadline(time.Now().Add(3*time.Second)))
			_, err = io.ReadAll(c) // the proxy answers 408 or closes; either way the read ends
			require.NoError(t, err)
			require.Less(t, time.Since(start), 2*time.Second, "the slow client was not cut")
		})
	}
	require.Zero(t, hits.Load())
}

// TestStalledClientDropped: a client that stops reading is dropped after
// the per-write idle timeout, and the upstream connection is closed.
func TestStalledClientDropped(t *testing.T) {
	upGone := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		ev := []byte("data: " + strings.Repeat("x", 16<<10) + "\n\n")
		for {
			if _, err := w.Write(ev); err != nil {
				close(upGone)
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL, ClientWriteTimeout: 300 * time.Millisecond}, log)
	c := rawPost(t, base, "/v1/chat/completions", `{}`) // never reads
	defer c.Close()
	select {
	case <-upGone:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream kept streaming to a stalled client")
	}
	tr := log.next(t)
	require.Equal(t, ErrClientGone, tr.ErrKind)
}

// TestSlowReaderBackpressure: a client that reads slowly makes the proxy
// throttle the upstream through TCP instead of buffering the stream, and a
// second stream is unaffected.
func TestSlowReaderBackpressure(t *testing.T) {
	var written atomic.Int64
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		if r.URL.Query().Get("fast") != "" {
			for i := 0; i < 20; i++ {
				fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
				w.(http.Flusher).Flush()
			}
			return
		}
		ev := []byte("data: " + strings.Repeat("y", 4000) + "\n\n")
		for written.Load() < 200<<20 {
			if _, err := w.Write(ev); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			written.Add(int64(len(ev)))
		}
	})
	base, _ := startProxy(t, Config{Upstream: up.URL}, newTraceLog())
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	slow, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	defer slow.Body.Close()
	buf := make([]byte, 1024)
	for i := 0; i < 20; i++ { // ~20 KiB over 400 ms
		_, err := slow.Body.Read(buf)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
	}

	start := time.Now()
	got := get(t, base+"/v1/chat/completions?fast=1")
	require.Equal(t, 20, strings.Count(string(got), "data: "))
	// Held up, the fast stream would wait behind 200 MiB for a client
	// reading 1 KiB per 20 ms: minutes, not the 3 s allowed here.
	require.Less(t, time.Since(start), 3*time.Second, "a slow reader held up another stream")

	// Socket buffers hold a few MiB at most; the proxy itself holds one read.
	require.Less(t, written.Load(), int64(32<<20), "the upstream was not throttled")
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	require.Less(t, int64(after.HeapAlloc)-int64(before.HeapAlloc), int64(16<<20), "the proxy buffered the stream")
}

// TestPipelinedNonReaderCut: a client that pipelines requests and never
// reads their answers is cut by ClientWriteTimeout when the responses are
// ones the relay does not write itself: a 204 (fasthttp writes it), and a
// 103 written straight to the connection before it. Such a connection is
// busy, not idle, so the listener's eviction never reclaims it: without a
// write deadline on those writes it was held forever (40,000 unread 204s
// in 3 s, never cut). The responses carry a 2 KB header so that the
// socket buffers fill in a few hundred requests; the client's own socket
// sees the cut as a failed write (reset or broken pipe).
func TestPipelinedNonReaderCut(t *testing.T) {
	pad := strings.Repeat("p", 2048)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Pad", pad)
		if r.URL.Path == "/v1/hints" {
			w.WriteHeader(http.StatusEarlyHints)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	const timeout = 100 * time.Millisecond
	base, _ := startProxy(t, Config{Upstream: up.URL, ClientWriteTimeout: timeout}, nil)
	for _, path := range []string{"/v1/empty", "/v1/hints"} {
		t.Run(path, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.(*net.TCPConn).SetReadBuffer(4096)) // never read
			req := []byte(strings.Repeat("GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n", 16))
			start := time.Now()
			sent := 0
			for {
				require.Less(t, time.Since(start), 5*time.Second, "never cut after %d requests", sent)
				require.NoError(t, c.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
				_, err := c.Write(req)
				if err == nil {
					sent += 16
					continue
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue // the proxy reads no more: it is stuck on a write, or about to cut
				}
				t.Logf("cut after %v and %d requests: %v", time.Since(start).Round(time.Millisecond), sent, err)
				return
			}
		})
	}
}
