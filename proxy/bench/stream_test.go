package bench

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// body returns the events a stream carries, in the given order, followed
// by the finish chunk and [DONE]; each sent at 1,000 ns times its seq.
func body(size int, seqs ...uint64) []byte {
	var out []byte
	for _, s := range seqs {
		ev := eventTemplate(size)
		stampEvent(ev, s, int64(s)*1000)
		out = append(out, ev...)
	}
	return appendFinish(out, len(seqs))
}

// TestScannerSplitAnywhere feeds a stream cut at every pair of offsets: a
// proxy may re-chunk the stream anywhere, and no event may be lost or
// mismeasured for it.
func TestScannerSplitAnywhere(t *testing.T) {
	const size = 210
	in := body(size, 0, 1, 2)
	s := newEventScanner(size)
	for i := 0; i <= len(in); i += 7 {
		for j := i; j <= len(in); j += 11 {
			s.reset(3)
			s.feed(in[:i], 10_000)
			s.feed(in[i:j], 20_000)
			s.feed(in[j:], 30_000)
			tally := s.finish(nil)
			require.True(t, tally.ok(), "cut at %d,%d: %+v", i, j, tally)
			require.Equal(t, int64(3), tally.Events)
			require.Len(t, s.lat, 3)
			end := []int{size, 2 * size, 3 * size} // offset just past each event
			for k, e := range end {
				at := int64(30_000)
				switch {
				case e <= i:
					at = 10_000
				case e <= j:
					at = 20_000
				}
				require.Equal(t, at-int64(k)*1000, s.lat[k], "cut at %d,%d, event %d", i, j, k)
			}
		}
	}
}

func TestScannerTally(t *testing.T) {
	const size = 256
	cases := []struct {
		name string
		in   []byte
		want int
		err  error
		exp  streamTally
	}{
		{"intact", body(size, 0, 1, 2), 3, nil, streamTally{Streams: 1, Events: 3}},
		{"lost", body(size, 0, 2), 3, nil, streamTally{Streams: 1, Events: 2, Lost: 1}},
		{"reordered and repeated", body(size, 0, 2, 1, 1), 3, nil, streamTally{Streams: 1, Events: 3, Reordered: 2}},
		{"beyond the stream", body(size, 0, 1, 7), 2, nil, streamTally{Streams: 1, Events: 2, Corrupt: 1}},
		{"no done", body(size, 0, 1)[:2*size], 2, nil, streamTally{Streams: 1, Events: 2, Failed: 1}},
		{"cut", body(size, 0, 1)[:size+10], 2, net.ErrClosed, streamTally{Streams: 1, Events: 1, Lost: 1, Failed: 1}},
		{"garbage event", append([]byte("data: hello\n\n"), body(size, 0)...), 1, nil, streamTally{Streams: 1, Events: 1, Corrupt: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newEventScanner(size)
			s.reset(c.want)
			s.feed(c.in, 1)
			got := s.finish(c.err)
			got.done = false
			require.Equal(t, c.exp, got)
		})
	}
}

// serveOnce answers one request on a loopback listener with raw bytes,
// written in the given pieces.
func serveOnce(t *testing.T, pieces ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		_, _ = c.Read(buf) // the request, in one read on loopback
		for _, p := range pieces {
			if _, err := c.Write([]byte(p)); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return ln.Addr().String()
}

func TestClientFramings(t *testing.T) {
	const size = 256
	stream := string(body(size, 0, 1))
	chunk := func(s string) string { return fmt.Sprintf("%x;ext=1\r\n%s\r\n", len(s), s) }
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
	cases := map[string][]string{
		"chunked, one event a chunk": {head + "Transfer-Encoding: chunked\r\n\r\n", chunk(stream[:size]), chunk(stream[size : 2*size]), chunk(stream[2*size:]), "0\r\n\r\n"},
		"chunked, split mid-line":    {head + "Transfer-Encoding: chunked\r\n\r\n" + chunk(stream[:100])[:3], chunk(stream[:100])[3:] + chunk(stream[100:]), "0\r\nX-Trailer: 1\r\n\r\n"},
		"content-length":             {head + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(stream)), stream[:300], stream[300:]},
		"until close":                {head + "Connection: close\r\n\r\n", stream},
	}
	for name, pieces := range cases {
		t.Run(name, func(t *testing.T) {
			addr := serveOnce(t, pieces...)
			cc, err := dialClient(addr, 64) // a small buffer: lines and events cross reads
			require.NoError(t, err)
			defer cc.Close()
			tally, ttfb, err := runStream(cc, addr, newEventScanner(size), []byte("{}"), 2)
			require.NoError(t, err)
			require.True(t, tally.ok(), "%+v", tally)
			require.Equal(t, int64(2), tally.Events)
			require.Positive(t, ttfb)
		})
	}
}

func TestClientRejects(t *testing.T) {
	cases := map[string]string{
		"status":     "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
		"bad chunk":  "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"not http":   "SSH-2.0-OpenSSH\r\n\r\n",
		"bad length": "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
	}
	for name, resp := range cases {
		t.Run(name, func(t *testing.T) {
			addr := serveOnce(t, resp)
			cc, err := dialClient(addr, clientBufSize)
			require.NoError(t, err)
			defer cc.Close()
			tally, _, err := runStream(cc, addr, newEventScanner(0), []byte("{}"), 1)
			require.Error(t, err)
			require.Equal(t, int64(1), tally.Failed)
			require.True(t, cc.broken)
		})
	}
}

// TestEmitterDirect runs the emitter and the client together, as the
// direct target does.
func TestEmitterDirect(t *testing.T) {
	e, err := NewEmitter(300)
	require.NoError(t, err)
	defer e.Close()
	cc, err := dialClient(e.Addr(), clientBufSize)
	require.NoError(t, err)
	defer cc.Close()

	d, err := runSmall(cc, e.Addr(), appendSmallRequest(nil, 0, 0))
	require.NoError(t, err)
	require.Positive(t, d)

	s := newEventScanner(300)
	for k := range 3 { // on one keep-alive connection
		start := time.Now()
		tally, ttfb, err := runStream(cc, e.Addr(), s, appendStreamRequest(nil, 5, 2*time.Millisecond, 0, k), 5)
		require.NoError(t, err)
		require.True(t, tally.ok(), "%+v", tally)
		require.Equal(t, int64(5), tally.Events)
		require.Positive(t, ttfb)
		require.GreaterOrEqual(t, time.Since(start), 8*time.Millisecond, "events are paced")
		require.Len(t, s.lat, 5)
		for _, l := range s.lat {
			require.Positive(t, l)
			require.Less(t, l, int64(time.Second))
		}
	}
	n, _ := e.Cut(e.Addr())
	require.Zero(t, n)

	bad, err := dialClient(e.Addr(), clientBufSize)
	require.NoError(t, err)
	defer bad.Close()
	_, _, err = runStream(bad, e.Addr(), s, []byte(`{"stream":true}`), 1)
	require.ErrorIs(t, err, errStatus)
}

func TestEmitterEventSize(t *testing.T) {
	e, err := NewEmitter(0)
	require.NoError(t, err)
	defer e.Close()
	cc, err := dialClient(e.Addr(), clientBufSize)
	require.NoError(t, err)
	defer cc.Close()
	_, err = cc.send(e.Addr(), appendStreamRequest(nil, 2, time.Millisecond, 0, 0), true)
	require.NoError(t, err)
	fr, _, err := cc.readHead()
	require.NoError(t, err)
	var raw bytes.Buffer
	require.NoError(t, cc.readBody(fr, func(b []byte, _ int64) { raw.Write(b) }))
	events := strings.SplitAfter(raw.String(), "\n\n")
	require.Len(t, events[0], MinEventBytes)
	require.Len(t, events[1], MinEventBytes)
}
