package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readHead reads one response head (status line and header lines).
func readHead(t *testing.T, br *bufio.Reader) (string, textproto.MIMEHeader) {
	t.Helper()
	tp := textproto.NewReader(br)
	line, err := tp.ReadLine()
	require.NoError(t, err)
	h, err := tp.ReadMIMEHeader()
	require.NoError(t, err)
	return line, h
}

// TestInterimResponsesForwarded (P1, RFC 9110 §15.2): a 103 Early Hints
// from the engine reaches the client before the final response, with its
// headers; a client that sent Expect: 100-continue gets exactly one 100
// Continue, and the engine's own 100 is not passed on twice.
func TestInterimResponsesForwarded(t *testing.T) {
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			req, _, err := u.readRequest(br)
			if err != nil {
				return
			}
			if req.Header.Get("Expect") != "" {
				io.WriteString(c, "HTTP/1.1 500 Expect reached the engine\r\nContent-Length: 0\r\n\r\n")
				continue
			}
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n"+
				"Connection: X-Hint-Hop\r\nX-Hint-Hop: 1\r\nconnection: x-hint-b\r\nX-Hint-B: 2\r\nKeep-Alive: timeout=5\r\n\r\n")
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	base, _ := startProxy(t, Config{Upstream: up.URL()}, newTraceLog())

	br, _ := rawDial(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	line, h := readHead(t, br)
	require.Equal(t, "HTTP/1.1 103 Early Hints", line)
	require.Equal(t, "</style.css>; rel=preload", h.Get("Link"))
	for _, k := range []string{"Connection", "X-Hint-Hop", "X-Hint-B", "Keep-Alive"} {
		require.Empty(t, h.Get(k), "the 103's hop-by-hop %s reached the client", k)
	}
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "ok", string(body))

	br, c := rawDial(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	line, _ = readHead(t, br)
	require.Equal(t, "HTTP/1.1 100 Continue", line)
	_, err = io.WriteString(c, "{}")
	require.NoError(t, err)
	line, _ = readHead(t, br)
	require.Equal(t, "HTTP/1.1 103 Early Hints", line, "a second 100, or the 100 the engine sent, reached the client")
	resp, err = http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
}

// TestResponseHeadersUntouched (P2): the engine's Date is kept, and the
// proxy adds no Server and no Content-Type the engine did not send.
func TestResponseHeadersUntouched(t *testing.T) {
	const date = "Mon, 02 Jan 2006 15:04:05 GMT"
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			if _, _, err := u.readRequest(br); err != nil {
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nDate: %s\r\nContent-Length: 2\r\n\r\nok", date)
		}
	})
	base, _ := startProxy(t, Config{Upstream: up.URL()}, newTraceLog())
	for _, method := range []string{"GET", "POST"} {
		br, _ := rawDial(t, base, method+" /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
		line, h := readHead(t, br)
		require.Equal(t, "HTTP/1.1 200 OK", line)
		require.Equal(t, date, h.Get("Date"))
		require.Empty(t, h.Values("Server"))
		require.Empty(t, h.Values("Content-Type"))
	}
}

// TestHTTP10ClientGetsCloseDelimitedStream (F3, RFC 9112 §6.1): a streamed
// response to an HTTP/1.0 client is not chunked; it ends with the close.
func TestHTTP10ClientGetsCloseDelimitedStream(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL}, log)
	br, _ := rawDial(t, base, "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	line, h := readHead(t, br)
	require.Equal(t, "HTTP/1.1 200 OK", line)
	require.Empty(t, h.Get("Transfer-Encoding"))
	require.Empty(t, h.Get("Content-Length"))
	require.Equal(t, "close", h.Get("Connection"))
	rest, err := io.ReadAll(br)
	require.NoError(t, err, "the body ends with the close")
	require.Equal(t, "data: {\"n\":0}\n\ndata: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n", string(rest))
	tr := log.next(t)
	require.Equal(t, ErrNone, tr.ErrKind)
	require.Equal(t, 4, tr.Events)
}

// TestHugeContentLengthRefusedAtOnce (L2): a declared Content-Length over
// --max-body-bytes gets 413 without the body being read: at once for a
// client that waits for 100 Continue, after the first bytes otherwise; the
// upstream is not contacted.
func TestHugeContentLengthRefusedAtOnce(t *testing.T) {
	up := startRawUpstream(t, func(*rawUpstream, net.Conn, *bufio.Reader) {})
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
	const head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n"
	for name, raw := range map[string]string{
		"expect":      head + "Expect: 100-continue\r\n\r\n",
		"first bytes": head + "\r\n" + strings.Repeat("a", 10<<10),
	} {
		br, _ := rawDial(t, base, raw)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "%s: no answer until the body came", name)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, name)
		require.True(t, resp.Close, name)
	}
	require.Zero(t, up.accepted.Load())
	require.Equal(t, ErrBodyTooLarge, log.next(t).ErrKind) // the one that reached the handler
}
