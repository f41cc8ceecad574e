package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLoopEmptyLengthBody: an engine's head that says text/event-stream
// with Content-Length: 0 is a complete, empty answer. On both relays the
// client gets the head and the end of an empty body at once (the loop
// waited for body bytes that never come), the Trace is the engine's
// answer, and the client's next request on the same connection is served,
// over the same upstream connection.
func TestLoopEmptyLengthBody(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n"
	for _, mode := range relayModes {
		t.Run(mode.name, func(t *testing.T) {
			up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
				if _, _, err := u.readRequest(br); err != nil {
					return
				}
				// The head in small pieces, as a slow engine's writes come:
				// the proxy's head read returns before the last of it.
				for i := 0; i < len(head); i += 7 {
					if _, err := io.WriteString(c, head[i:min(i+7, len(head))]); err != nil {
						return
					}
					time.Sleep(200 * time.Microsecond)
				}
				if _, _, err := u.readRequest(br); err != nil {
					return
				}
				ev, done := scriptedEvent(0), "data: [DONE]\n\n"
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
					"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", len(ev), ev, len(done), done)
				_, _ = br.ReadByte() // until the proxy closes the connection
			})
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up.URL(), EventLoop: mode.loop}, log)
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			require.NoError(t, err)
			defer c.Close()
			// A hang (the body waited for) fails here, not at the
			// upstream read timeout.
			require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
			br := bufio.NewReader(c)
			req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"stream\":true}"

			_, err = io.WriteString(c, req)
			require.NoError(t, err)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err, "the empty body ends at once")
			require.Empty(t, body)
			require.False(t, resp.Close, "the connection stays open")
			tr := log.next(t)
			require.Equal(t, http.StatusOK, tr.Status)
			require.False(t, tr.Headers.IsZero(), "the engine's answer, not the proxy's")
			require.True(t, tr.Stream)
			require.Zero(t, tr.Events)
			require.Zero(t, tr.RespBytes)
			require.False(t, tr.End.IsZero(), "the body's end is stamped")
			require.False(t, tr.ClientDone.IsZero())
			require.Equal(t, SideUpstream, tr.ErrSide, "an OpenAI stream without [DONE]")
			require.Equal(t, ErrTruncated, tr.ErrKind)

			_, err = io.WriteString(c, req)
			require.NoError(t, err)
			resp, err = http.ReadResponse(br, nil)
			require.NoError(t, err)
			body, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, scriptedEvent(0)+"data: [DONE]\n\n", string(body))
			tr = log.next(t)
			require.Equal(t, ErrNone, tr.ErrKind)
			require.Equal(t, 2, tr.Events)
			require.Equal(t, int32(1), up.accepted.Load(), "the upstream connection was reused")
		})
	}
}
