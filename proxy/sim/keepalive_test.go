package sim

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// rawConn is a client connection that speaks HTTP/1.1 by hand, so the test
// sees exactly when the server closes it.
type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

// roundTrip sends one keep-alive request and reads its whole response.
func (r *rawConn) roundTrip(t *testing.T, method, path, body string) *http.Response {
	t.Helper()
	req := method + " " + path + " HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
	if body != "" {
		req += "Content-Length: " + strconv.Itoa(len(body)) + "\r\n"
	}
	_, err := io.WriteString(r.c, req+"\r\n"+body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(r.br, nil)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.False(t, resp.Close, "the server keeps the connection alive")
	return resp
}

// closedAfter waits up to limit for the server to close the idle
// connection and returns how long that took; it fails if it stays open.
func (r *rawConn) closedAfter(t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	idle := time.Now()
	require.NoError(t, r.c.SetReadDeadline(idle.Add(limit)))
	_, err := r.br.ReadByte()
	took := time.Since(idle)
	require.ErrorIs(t, err, io.EOF, "the server closed the idle connection cleanly, sending nothing")
	return took
}

func keepAliveSim(t *testing.T, d time.Duration) *virtualSim {
	t.Helper()
	cfg := fast()
	cfg.KeepAliveTimeout = d
	return startVirtual(t, cfg)
}

const streamBody = `{"stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`

// The keep-alive tests run the sim's own http.Server over net.Pipe in a
// synctest bubble: the idle timeout is a read deadline, which is a timer,
// so time is virtual and the close comes exactly when it is due.

func TestKeepAliveIdleClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := keepAliveSim(t, 300*time.Millisecond).dialRaw(t)
		c.roundTrip(t, "POST", "/v1/chat/completions", streamBody)
		// Used again within the timeout, the connection is still good.
		time.Sleep(299 * time.Millisecond)
		c.roundTrip(t, "POST", "/v1/chat/completions", streamBody)
		took := c.closedAfter(t, 5*time.Second)
		require.Equal(t, 300*time.Millisecond, took, "closed after %v idle (KeepAliveTimeout 300ms)", took)
	})
}

// TestKeepAliveDefault: uvicorn's 5 s.
func TestKeepAliveDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := keepAliveSim(t, 0).dialRaw(t)
		c.roundTrip(t, "GET", "/health", "")
		took := c.closedAfter(t, 15*time.Second)
		require.Equal(t, 5*time.Second, took, "closed after %v idle (default)", took)
	})
}

func TestKeepAliveNever(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := keepAliveSim(t, -1).dialRaw(t)
		c.roundTrip(t, "GET", "/health", "")
		require.NoError(t, c.c.SetReadDeadline(time.Now().Add(time.Hour)))
		_, err := c.br.ReadByte()
		require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "still open after an hour: %v", err)
		require.NoError(t, c.c.SetReadDeadline(time.Time{}))
		c.roundTrip(t, "POST", "/v1/chat/completions", streamBody)
	})
}

func TestHTTPServerConfig(t *testing.T) {
	s, err := New(Config{})
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, s.HTTPServer().IdleTimeout)
	require.Equal(t, http.Handler(s), s.HTTPServer().Handler)
	s, err = New(Config{KeepAliveTimeout: -1})
	require.NoError(t, err)
	require.Negative(t, s.HTTPServer().IdleTimeout)
}
