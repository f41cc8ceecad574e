package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
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
