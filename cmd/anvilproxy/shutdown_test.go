package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGracefulShutdownDrainsStreams (G1, F6): SIGTERM with 20 streams in
// flight: the listener stops accepting, every stream finishes byte for
// byte as the upstream sent it, the final snapshot counts all of them, and
// the process exits 0.
func TestGracefulShutdownDrainsStreams(t *testing.T) {
	const streams = 20
	up, upURL := startTapSim(t, 60) // 90 tokens: 1.5 s a stream
	s := startProc(t, upURL)
	results := startStreams(s.proxyURL, streams, 90)
	require.Eventually(t, func() bool { return up.begun() == streams }, 10*time.Second, 5*time.Millisecond,
		"every stream is past its first events")
	s.signal(t)

	// The listener closes while the streams still drain (1.5 s of them):
	// a refused dial after the exit would prove nothing.
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(s.proxyURL, "http://"), time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 10*time.Second, 5*time.Millisecond, "the listener still accepts after SIGTERM")
	require.False(t, s.hasExited(), "the check must come while the streams drain")

	for i := 0; i < streams; i++ {
		r := <-results
		require.NoError(t, r.err, r.id)
		require.Equal(t, 200, r.status, r.id)
		require.True(t, strings.HasSuffix(r.body, "data: [DONE]\n\n"), "%s: cut", r.id)
		require.Equal(t, up.body(r.id), r.body, "%s: altered", r.id)
	}
	require.Equal(t, 0, s.wait(t, 5*time.Second))
	require.Zero(t, up.dropped.Load())
	require.Contains(t, s.stderr.String(), `"msg":"shutting down"`)

	files := s.snapshots(t)
	require.Len(t, files, 1, "one window, written at shutdown")
	for _, b := range files {
		var doc struct{ Requests, Completed, Failed int }
		require.NoError(t, json.Unmarshal(b, &doc))
		require.Equal(t, streams, doc.Requests)
		require.Equal(t, streams, doc.Completed)
	}
}

// TestShutdownDeadlineForcesAbort (G2): streams longer than
// --shutdown-grace are cut when it runs out: the clients see a truncated
// stream (no last chunk), the upstream sees its connections close, and the
// process exits within the grace plus 2 s.
func TestShutdownDeadlineForcesAbort(t *testing.T) {
	const streams = 5
	up, upURL := startTapSim(t, 20) // 200 tokens: 10 s a stream
	s := startProc(t, upURL, "--shutdown-grace", "1s")
	results := startStreams(s.proxyURL, streams, 200)
	require.Eventually(t, func() bool { return up.begun() == streams }, 10*time.Second, 5*time.Millisecond,
		"every stream is past its first events: its client has its 200")
	shortRequest(t, s.proxyURL)
	signalled := s.signal(t)
	s.wait(t, 5*time.Second)
	t.Logf("exited %v after SIGTERM", s.exitedAt.Sub(signalled).Round(time.Millisecond))
	require.Less(t, s.exitedAt.Sub(signalled), 3*time.Second, "exit took longer than grace + 2s")
	require.Greater(t, s.exitedAt.Sub(signalled), 900*time.Millisecond, "the streams got no grace")
	for i := 0; i < streams; i++ {
		r := <-results
		require.Equal(t, 200, r.status, r.id)
		require.ErrorIs(t, r.err, io.ErrUnexpectedEOF, "%s: a cut stream must not look finished", r.id)
		require.True(t, strings.HasPrefix(up.body(r.id), r.body), "%s: altered before the cut", r.id)
	}
	require.Eventually(t, func() bool { return up.dropped.Load() == streams }, 2*time.Second, 10*time.Millisecond,
		"the upstream kept generating for %d streams", streams-int(up.dropped.Load()))
	files := s.snapshots(t)
	require.Len(t, files, 1, "the final snapshot is still written")
	for _, b := range files {
		var doc struct{ Completed int }
		require.NoError(t, json.Unmarshal(b, &doc))
		require.Equal(t, 1, doc.Completed)
	}
}

// TestShutdownAbortedStreamsCounted (M2 with G2): a stream cut by the
// shutdown deadline is a request like any other: it is counted, with its
// outcome, in the final snapshot.
func TestShutdownAbortedStreamsCounted(t *testing.T) {
	up, upURL := startTapSim(t, 20)
	s := startProc(t, upURL, "--shutdown-grace", "500ms")
	results := startStreams(s.proxyURL, 2, 200)
	require.Eventually(t, func() bool { return up.active.Load() == 2 }, 5*time.Second, 5*time.Millisecond)
	shortRequest(t, s.proxyURL)
	s.signal(t)
	s.wait(t, 5*time.Second)
	<-results
	<-results
	files := s.snapshots(t)
	require.Len(t, files, 1)
	for _, b := range files {
		var doc struct{ Requests, Completed, Failed int }
		require.NoError(t, json.Unmarshal(b, &doc))
		require.Equal(t, 1, doc.Completed)
		require.Equal(t, 2, doc.Failed, "the cut streams")
		require.Equal(t, 3, doc.Requests)
	}
	require.Equal(t, 2, strings.Count(s.stderr.String(), `"error":"shutdown"`), "one log line per cut stream")
	require.Contains(t, s.stderr.String(), "shutdown grace expired")
}

// TestSecondSignalExitsAtOnce (G2): a second SIGTERM ends the drain.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	up, upURL := startTapSim(t, 20)
	s := startProc(t, upURL)
	results := startStreams(s.proxyURL, 2, 200)
	require.Eventually(t, func() bool { return up.active.Load() == 2 }, 5*time.Second, 5*time.Millisecond)
	s.signal(t)
	s.waitLog(t, `"msg":"a second signal now exits at once"`) // past the first signal's echo (signalEcho)
	again := s.signal(t)
	require.Equal(t, 1, s.wait(t, 3*time.Second))
	require.Less(t, s.exitedAt.Sub(again), time.Second)
	require.Contains(t, s.stderr.String(), "second signal")
	<-results
	<-results
}

// TestIdleKeepAliveDoesNotBlockShutdown (G3): an idle keep-alive client
// connection does not delay the exit (fasthttp #1190, #1327).
func TestIdleKeepAliveDoesNotBlockShutdown(t *testing.T) {
	_, upURL := startTapSim(t, 1000)
	s := startProc(t, upURL)
	c, err := net.Dial("tcp", strings.TrimPrefix(s.proxyURL, "http://"))
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	require.Equal(t, 200, resp.StatusCode)
	require.False(t, resp.Close, "the connection is kept alive")

	signalled := s.signal(t)
	require.Equal(t, 0, s.wait(t, 3*time.Second))
	require.Less(t, s.exitedAt.Sub(signalled), time.Second, "an idle connection held the shutdown")
}

// hijackUpstream streams SSE events every 50 ms for 10 s to a POST, and
// answers an upgrade with a 101 and a silent tunnel held until the proxy
// closes it.
func hijackUpstream(t *testing.T) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" {
			c, brw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			io.Copy(io.Discard, brw)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 200 && r.Context().Err() == nil; i++ {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// TestShutdownWaitsForHijacked (G4): fasthttp stops counting a connection
// once it is hijacked, so with only HTTP/1.0 streams and WebSocket tunnels
// live the process exited at once on SIGTERM, cut them, logged nothing and
// wrote no snapshot with them. Now it waits for them within the grace and
// then cuts them with a stream's accounting: each logged as a shutdown,
// counted in the final snapshot, and the cut logged.
func TestShutdownWaitsForHijacked(t *testing.T) {
	s := startProc(t, hijackUpstream(t), "--shutdown-grace", "1s")
	addr := strings.TrimPrefix(s.proxyURL, "http://")
	var readers []*bufio.Reader
	for range 2 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
		require.NoError(t, err)
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		require.Contains(t, line, " 200 ")
		readers = append(readers, br)
	}
	for range 2 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: k\r\nSec-WebSocket-Version: 13\r\n\r\n")
		require.NoError(t, err)
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		require.Contains(t, line, " 101 ")
		readers = append(readers, br)
	}
	signalled := s.signal(t)
	s.wait(t, 5*time.Second)
	took := s.exitedAt.Sub(signalled)
	t.Logf("exited %v after SIGTERM", took.Round(time.Millisecond))
	require.Greater(t, took, 900*time.Millisecond, "the hijacked connections got no grace")
	for i, br := range readers {
		_, err := io.Copy(io.Discard, br)
		require.NoError(t, err, "connection %d was not closed", i)
	}
	log := s.stderr.String()
	require.Contains(t, log, "shutdown grace expired")
	require.Contains(t, log, `"cut":4`)
	require.Equal(t, 4, strings.Count(log, `"error":"shutdown"`), "one log line per cut request:\n%s", log)
	files := s.snapshots(t)
	require.Len(t, files, 1, "the final snapshot is written")
	for _, b := range files {
		// The snapshot holds the inference requests: the two streams (the
		// tunnels are in the log and in anvilproxy_requests_total).
		var doc struct{ Requests, Failed int }
		require.NoError(t, json.Unmarshal(b, &doc))
		require.Equal(t, 2, doc.Requests)
		require.Equal(t, 2, doc.Failed)
	}
}
