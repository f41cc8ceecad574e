package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests of this file hold the proxy to one reading of every message:
// what it forwards is framed once, the way it was framed, and what it
// cannot frame it refuses and stops reading (RELIABILITY.md §6.1–6.2).

// TestAbsoluteFormAndHostCannotRedirectUpstream (H4): an absolute-form
// request-target, a Host naming another server and CONNECT reach the
// configured upstream and nothing else: the proxy dials no address taken
// from a request (it is no open proxy: RELIABILITY.md H4), and it
// never becomes a tunnel.
func TestAbsoluteFormAndHostCannotRedirectUpstream(t *testing.T) {
	elsewhere := startRawUpstream(t, func(*rawUpstream, net.Conn, *bufio.Reader) {})
	other := elsewhere.ln.Addr().String()
	seen := make(chan string, 10)
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		for {
			req, _, err := u.readRequest(br)
			if err != nil {
				return
			}
			seen <- req.Method + " " + req.RequestURI + " host=" + req.Host
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	upHost := up.ln.Addr().String()
	log := newTraceLog()
	base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
	tests := []struct {
		name, raw string
		want      string // what the upstream sees
	}{
		{"absolute-form", "GET http://" + other + "/v1/models HTTP/1.1\r\nHost: " + other + "\r\n\r\n", "GET /v1/models host=" + upHost},
		{"absolute-form https", "GET https://" + other + "/v1/models?x=1 HTTP/1.1\r\nHost: " + other + "\r\n\r\n", "GET /v1/models?x=1 host=" + upHost},
		{"conflicting host", "GET /v1/models HTTP/1.1\r\nHost: " + other + "\r\n\r\n", "GET /v1/models host=" + upHost},
		// Go reports a CONNECT's authority as its Host; what counts is that
		// it reached the configured upstream as a plain request.
		{"connect", "CONNECT " + other + " HTTP/1.1\r\nHost: " + other + "\r\n\r\n", "CONNECT " + other + " host=" + other},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br, c := rawDial(t, base, tt.raw)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, tt.want, <-seen)
			log.next(t)
			// Whatever the upstream answered, the connection is still HTTP:
			// bytes that would cross a tunnel are a bad request.
			_, err = c.Write([]byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"))
			require.NoError(t, err)
			resp, err = http.ReadResponse(br, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode)
			log.next(t)
		})
	}
	require.Zero(t, elsewhere.accepted.Load(), "the proxy dialled an address taken from the request")
	require.Equal(t, int32(len(tests)), up.accepted.Load(), "one upstream connection per client connection, to the configured upstream")
	select {
	case got := <-seen:
		t.Fatalf("the upstream got %q", got)
	default:
	}
}

// TestPipelinedAfterRejectNotServed (S5): once a request is rejected for
// its framing, nothing after it on the connection is parsed or reaches the
// upstream, and the connection is closed.
func TestPipelinedAfterRejectNotServed(t *testing.T) {
	var hits atomic.Int32
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	base, _ := startProxy(t, Config{Upstream: up.URL, MaxBodyBytes: 1 << 10, MaxHeaderBytes: 8 << 10}, newTraceLog())
	const smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	tests := []struct {
		name, raw string
		want      int
	}{
		{"content-length and transfer-encoding", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"duplicate content-length", "POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", 400},
		{"unsupported transfer-encoding", "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 400},
		{"bad chunk size", "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", 400},
		{"bare LF in chunk extension", "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;a\nb\r\nab\r\n0\r\n\r\n", 400},
		{"headers over the limit", "GET /v1/x HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 9000) + "\r\n\r\n", 431},
		{"transfer-encoding on HTTP/1.0", "POST /v1/x HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br, _ := rawDial(t, base, tt.raw+smuggled)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			require.Equal(t, tt.want, resp.StatusCode)
			rest, err := io.ReadAll(br)
			if !errors.Is(err, syscall.ECONNRESET) { // closed with the smuggled bytes unread
				require.NoError(t, err, "the connection must be closed after the rejection")
			}
			require.Empty(t, string(rest), "a second response: the pipelined request was served")
		})
	}
	require.Zero(t, hits.Load(), "bytes after a rejected request reached the upstream")
}

// TestBodyTooLargeClosesConnection (L2, "413 + close"): after refusing an
// oversized body the proxy closes the connection instead of reading the
// rest of the body and serving what follows, and it closes so that the
// client still reads the 413 (nginx's lingering close).
func TestBodyTooLargeClosesConnection(t *testing.T) {
	t.Run("closes", func(t *testing.T) {
		var hits atomic.Int32
		up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
		base, _ := startProxy(t, Config{Upstream: up.URL, MaxBodyBytes: 1 << 10}, newTraceLog())
		for name, raw := range map[string]string{
			"chunked":        "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + strings.Repeat("a", 0x800) + "\r\n0\r\n\r\n",
			"content-length": "POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\n\r\n" + strings.Repeat("a", 2048),
		} {
			br, _ := rawDial(t, base, raw+"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, name)
			require.True(t, resp.Close, "%s: no Connection: close", name)
			rest, err := io.ReadAll(br)
			if !errors.Is(err, syscall.ECONNRESET) {
				require.NoError(t, err, "%s: the connection stayed open", name)
			}
			require.Empty(t, string(rest), name)
		}
		require.Zero(t, hits.Load())
	})
	t.Run("the client reads the 413", func(t *testing.T) {
		// A body far over the limit is refused on its Content-Length, before
		// a byte of it is read; the lingering close lets the client read
		// the 413 instead of a reset (it once lost 77 of 100).
		up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {})
		base, _ := startProxy(t, Config{Upstream: up.URL, MaxBodyBytes: 64 << 10}, newTraceLog())
		for i := 0; i < 20; i++ {
			resp, err := (&http.Client{Transport: &http.Transport{}}).Post(base+"/v1/chat/completions", "application/json",
				strings.NewReader(strings.Repeat("a", 1<<20)))
			require.NoError(t, err, "attempt %d: no answer", i)
			resp.Body.Close()
			require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		}
	})
}

// TestRequestTransferEncodingVariants (S3, S4): every Transfer-Encoding
// other than a lone chunked, and every malformed chunk, gets 400 and a
// closed connection, and nothing reaches the upstream; a tab as whitespace
// is read the one way net/http reads it, and an obs-fold (RFC 9112 §5.2
// allows rejecting it) is refused.
func TestRequestTransferEncodingVariants(t *testing.T) {
	bodies := make(chan string, 10)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- string(b)
	})
	base, _ := startProxy(t, Config{Upstream: up.URL}, newTraceLog())
	const head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
	tests := []struct {
		name, raw string
		want      int
		body      string // forwarded, when want is 200
	}{
		{"chunked, chunked", head + "Transfer-Encoding: chunked, chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n", 400, ""},
		{"gzip, chunked", head + "Transfer-Encoding: gzip, chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n", 400, ""},
		{"xchunked", head + "Transfer-Encoding: xchunked\r\n\r\n2\r\nab\r\n0\r\n\r\n", 400, ""},
		{"space before the colon", head + "Transfer-Encoding : chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n", 400, ""},
		{"identity", head + "Transfer-Encoding: identity\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n", 400, ""},
		{"negative chunk size", head + "Transfer-Encoding: chunked\r\n\r\n-2\r\nab\r\n0\r\n\r\n", 400, ""},
		{"chunk size overflow", head + "Transfer-Encoding: chunked\r\n\r\nffffffffffffffff1\r\nab\r\n0\r\n\r\n", 400, ""},
		{"chunk without its CRLF", head + "Transfer-Encoding: chunked\r\n\r\n2\r\nabc0\r\n\r\n", 400, ""},
		{"bare LF in a chunk extension", head + "Transfer-Encoding: chunked\r\n\r\n2;a\nb\r\nab\r\n0\r\n\r\n", 400, ""},
		{"tab before the value", head + "Transfer-Encoding:\tchunked\r\n\r\n2\r\nab\r\n0\r\n\r\n", 200, "ab"},
		// RFC 9112 §5.2 lets a server reject obs-fold with 400 or unfold it;
		// rejecting leaves no line for an upstream to read as a header.
		{"obs-fold", head + "X-A: b\r\n Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nab", 400, ""},
		{"space in a name", head + "Transfer Encoding: chunked\r\nContent-Length: 2\r\n\r\nab", 400, ""},
		{"space in Content-Length's name", head + "Content Length: 2\r\n\r\nab", 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br, _ := rawDial(t, base, tt.raw)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			require.Equal(t, tt.want, resp.StatusCode)
			if tt.want == 200 {
				require.Equal(t, tt.body, <-bodies)
				return
			}
			require.True(t, resp.Close, "no Connection: close")
			rest, err := io.ReadAll(br)
			if !errors.Is(err, syscall.ECONNRESET) {
				require.NoError(t, err)
			}
			require.Empty(t, rest)
			select {
			case b := <-bodies:
				t.Fatalf("the upstream got a request, body %q", b)
			default:
			}
		})
	}
}

// TestHopByHopEdgeCases (H1, H2): the hop-by-hop headers the main test
// leaves out, seen as raw bytes on both sides: an empty Connection,
// Proxy-Connection, Trailer, TE, Upgrade (also on a 200 response), and
// exactly one framing header towards the client.
func TestHopByHopEdgeCases(t *testing.T) {
	heads := make(chan []byte, 1)
	up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
		head, err := peekHead(br)
		if err != nil {
			return
		}
		u.readRequest(br)
		heads <- head
		io.WriteString(c, "HTTP/1.1 200 OK\r\nUpgrade: h2c\r\nConnection: Upgrade, X-Hop\r\nX-Hop: 1\r\n"+
			"Proxy-Connection: keep-alive\r\nTrailer: X-T\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\nok")
	})
	base, _ := startProxy(t, Config{Upstream: up.URL()}, newTraceLog())
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(3*time.Second)))
	_, err = io.WriteString(c, "POST /v1/models HTTP/1.1\r\nHost: x\r\nConnection:\r\nProxy-Connection: keep-alive\r\n"+
		"Trailer: X-T\r\nTE: trailers\r\nUpgrade: h2c\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\n{}")
	require.NoError(t, err)
	got := bytes.ToLower(<-heads)
	for _, h := range []string{"connection:", "proxy-connection:", "trailer:", "upgrade:"} {
		require.NotContains(t, string(got), "\n"+h, "request header %s crossed the proxy", h)
	}
	require.Contains(t, string(got), "\nte: trailers\r\n", "TE: trailers is asked for on the client's behalf")
	require.Contains(t, string(got), "\nx-kept: yes")

	br := bufio.NewReader(c)
	head, err := peekHead(br)
	require.NoError(t, err)
	lower := strings.ToLower(string(head))
	for _, h := range []string{"upgrade:", "x-hop:", "proxy-connection:", "trailer:"} {
		require.NotContains(t, lower, "\n"+h, "response header %s crossed the proxy", h)
	}
	require.Contains(t, lower, "\nx-kept: yes")
	require.Equal(t, 1, strings.Count(lower, "\ncontent-length:")+strings.Count(lower, "\ntransfer-encoding:"), "one framing header")
}

// TestUpstreamResponseMalformedFraming (S6): an upstream response framed
// two ways, or with a coding the proxy cannot read, gets the client a 502
// (or, past the headers, a visibly truncated body), and the connection
// that carried it is not used again (nginx proxy_duplicate_headers.t).
func TestUpstreamResponseMalformedFraming(t *testing.T) {
	tests := []struct {
		name, raw string
		want      int // 200 means headers relayed, then a truncated body
	}{
		{"content-length and transfer-encoding", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n", 502},
		{"transfer-encoding and content-length", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n2\r\nab\r\n0\r\n\r\n", 502},
		{"duplicate content-length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab", 502},
		{"negative content-length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nab", 502},
		{"unknown transfer-encoding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc", 502},
		{"chunked, chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n", 502},
		{"bad chunk mid-body", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\nzz\r\nab\r\n0\r\n\r\n", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var first atomic.Bool
			up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
				for {
					if _, _, err := u.readRequest(br); err != nil {
						return
					}
					if first.CompareAndSwap(false, true) {
						io.WriteString(c, tt.raw)
						continue
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext")
				}
			})
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
			got := post(t, base+"/v1/chat/completions", `{}`)
			require.Equal(t, tt.want, got.status)
			if tt.want == 200 {
				require.ErrorIs(t, got.readErr, io.ErrUnexpectedEOF)
				require.Equal(t, "ab", string(got.body))
			}
			require.Equal(t, ErrUpstreamBroken, log.next(t).ErrKind)
			next := post(t, base+"/v1/chat/completions", `{}`)
			require.Equal(t, "next", string(next.body))
			require.Equal(t, int32(2), up.accepted.Load(), "the connection that carried the bad response was used again")
		})
	}
}

// TestUpstreamExtraAndShortData (S7): an upstream body shorter than its
// Content-Length reaches the client visibly truncated, never padded or
// complete; bytes beyond a body are not forwarded and never answer the
// next request (nginx proxy_extra_data.t discards them and the connection).
func TestUpstreamExtraAndShortData(t *testing.T) {
	t.Run("short", func(t *testing.T) {
		for _, rst := range []bool{false, true} {
			up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
				u.readRequest(br)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"+strings.Repeat("a", 50))
				time.Sleep(20 * time.Millisecond)
				if rst {
					reset(c)
				}
			})
			log := newTraceLog()
			base, _ := startProxy(t, Config{Upstream: up.URL()}, log)
			got := post(t, base+"/v1/chat/completions", `{}`)
			require.Equal(t, 200, got.status)
			require.ErrorIs(t, got.readErr, io.ErrUnexpectedEOF, "a short body must not look complete (rst=%v)", rst)
			// fasthttp holds a Content-Length body in its write buffer, so the
			// client may get fewer of the 50 bytes, never more.
			require.True(t, strings.HasPrefix(strings.Repeat("a", 50), string(got.body)), "padded: %q", got.body)
			tr := log.next(t)
			require.Equal(t, ErrUpstreamBroken, tr.ErrKind)
		}
	})
	for name, late := range map[string]bool{"extra in the same segment": false, "extra after a pause": true} {
		t.Run(name, func(t *testing.T) {
			var n atomic.Int32
			firstRead, extraSent := make(chan struct{}), make(chan struct{})
			up := startRawUpstream(t, func(u *rawUpstream, c net.Conn, br *bufio.Reader) {
				for {
					if _, _, err := u.readRequest(br); err != nil {
						return
					}
					if n.Add(1) > 1 {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
						continue
					}
					const first, extra = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
					if !late {
						io.WriteString(c, first+extra) // one write, one segment
						continue
					}
					io.WriteString(c, first)
					<-firstRead // the proxy has read the response and pooled the connection
					io.WriteString(c, extra)
					close(extraSent)
				}
			})
			base, p := startProxy(t, Config{Upstream: up.URL()}, newTraceLog())
			client := keepAliveClient(t) // the extra bytes could only ever reach this client
			first := postOn(t, client, base+"/v1/models", "")
			require.NoError(t, first.readErr)
			require.Equal(t, "hello", string(first.body), "bytes beyond Content-Length were forwarded")
			if late {
				close(firstRead)
				<-extraSent // the extra bytes wait on the idle connection
			}
			second := postOn(t, client, base+"/v1/models", "")
			require.NoError(t, second.readErr)
			require.Equal(t, "second", string(second.body), "the previous response's extra bytes answered the next request")
			require.Equal(t, int32(2), up.accepted.Load(), "the connection with extra bytes was used again")
			// Found after the response (put) or readable at reuse (stale).
			require.Equal(t, uint64(1), p.Stats().Redials(RedialUnsolicited))
		})
	}
}
