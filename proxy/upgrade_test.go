package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echoUpgradeUpstream answers a request carrying Upgrade with a 101 and then
// echoes every byte back upper-cased; a request without one gets a 101
// anyway when unsolicited is set, and a 200 otherwise.
func echoUpgradeUpstream(t *testing.T, unsolicited bool) (*rawUpstream, chan http.Header) {
	seen := make(chan http.Header, 4)
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		req, _, err := u.readRequest(br)
		if err != nil {
			return
		}
		seen <- req.Header.Clone()
		if req.Header.Get("Upgrade") == "" && !unsolicited {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: abc\r\n\r\n")
		buf := make([]byte, 1024)
		for {
			n, err := br.Read(buf)
			if err != nil {
				return
			}
			b := buf[:n]
			for i, ch := range b {
				if 'a' <= ch && ch <= 'z' {
					b[i] = ch - 32
				}
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	})
	return up, seen
}

// TestWebSocketUpgradeTunnelled (U5): a client's WebSocket upgrade reaches
// the engine with its Upgrade and Connection headers; the 101 comes back
// with its headers, and bytes then flow both ways until the client closes;
// the Trace says upgraded, with the bytes each way.
func TestWebSocketUpgradeTunnelled(t *testing.T) {
	up, seen := echoUpgradeUpstream(t, false)
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up.URL()}, log)
	br, c := rawDial(t, base, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: k\r\nSec-WebSocket-Version: 13\r\n\r\n")
	line, h := readHead(t, br)
	require.Equal(t, "HTTP/1.1 101 Switching Protocols", line)
	require.Equal(t, "websocket", h.Get("Upgrade"))
	require.Equal(t, "Upgrade", h.Get("Connection"))
	require.Equal(t, "abc", h.Get("Sec-Websocket-Accept"))
	got := <-seen
	require.Equal(t, "websocket", got.Get("Upgrade"))
	require.Equal(t, "Upgrade", got.Get("Connection"))

	for _, msg := range []string{"hello", "second frame"} {
		_, err := io.WriteString(c, msg)
		require.NoError(t, err)
		buf := make([]byte, len(msg))
		_, err = io.ReadFull(br, buf)
		require.NoError(t, err)
		require.Equal(t, strings.ToUpper(msg), string(buf))
	}
	c.Close()
	tr := log.next(t)
	require.True(t, tr.Upgraded)
	require.Equal(t, 101, tr.Status)
	require.Equal(t, int64(len("hello")+len("second frame")), tr.TunnelUp)
	require.Equal(t, int64(len("hello")+len("second frame")), tr.TunnelDown)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.Eventually(t, func() bool { return upstreamConns(p) == 0 && p.Inflight() == 0 }, 5*time.Second, 10*time.Millisecond)
}

// TestUnsolicitedSwitchingProtocolsIs502 (U5): a 101 the client did not ask
// for is a broken upstream: the client gets 502 and the connection, which
// left HTTP, is never used again. h2c is not tunnelled: its Upgrade is
// stripped, so the engine sees a plain request.
func TestUnsolicitedSwitchingProtocolsIs502(t *testing.T) {
	up, seen := echoUpgradeUpstream(t, true)
	log := newTraceLog()
	base, p := startProxy(t, Config{Upstream: up.URL()}, log)
	for _, raw := range []string{
		"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
	} {
		br, _ := rawDial(t, base, raw)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusBadGateway, resp.StatusCode)
		require.Empty(t, (<-seen).Get("Upgrade"), "h2c reached the engine")
		tr := log.next(t)
		require.Equal(t, ErrUpstreamBroken, tr.ErrKind)
		require.False(t, tr.Upgraded)
	}
	require.Equal(t, int32(2), up.accepted.Load(), "a connection that switched protocols was used again")
	require.Eventually(t, func() bool { return upstreamConns(p) == 0 }, 5*time.Second, 10*time.Millisecond)
}
