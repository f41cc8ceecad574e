package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// forwarded is one request as the upstream received it.
type forwarded struct {
	method  string
	body    []byte
	framing int // Content-Length and Transfer-Encoding lines in its head
}

// framingUpstream parses everything it receives with net/http, keeps each
// request, and answers each with a tiny 200. Anything it cannot parse is
// a finding.
type framingUpstream struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	got    []forwarded
	errs   []string
	open   []net.Conn
	closed bool
}

func (u *framingUpstream) serve() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			c.Close()
			return
		}
		u.open = append(u.open, c)
		u.wg.Add(1)
		u.mu.Unlock()
		go u.conn(c)
	}
}

var errHeadTooLong = errors.New("request head longer than the read buffer")

// peekHead returns the next request's head, up to its blank line, without
// consuming it.
func peekHead(br *bufio.Reader) ([]byte, error) {
	for n := 1; ; {
		if _, err := br.Peek(n); err != nil {
			return nil, err
		}
		b, _ := br.Peek(br.Buffered())
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			return bytes.Clone(b[:i+4]), nil
		}
		if len(b) >= br.Size() {
			return nil, errHeadTooLong
		}
		n = len(b) + 1
	}
}

// plainTarget replaces the request-target on the first line of b with
// "/". The target is not framing: one net/http rejects (a bad %-escape)
// is forwarded byte for byte, as H5 wants, and must not hide the framing
// checks.
func plainTarget(b []byte) []byte {
	line, rest, _ := bytes.Cut(b, []byte("\n"))
	parts := bytes.SplitN(line, []byte(" "), 3)
	if len(parts) < 3 {
		return b
	}
	out := append(append(append([]byte{}, parts[0]...), " / "...), parts[2]...)
	return append(append(out, '\n'), rest...)
}

// readForwarded reads one request the proxy sent: the head with
// http.ReadRequest, the body by the framing that head declares.
func readForwarded(br *bufio.Reader) (forwarded, []byte, error) {
	head, err := peekHead(br)
	if err != nil {
		return forwarded{}, nil, err
	}
	br.Discard(len(head))
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(plainTarget(head))))
	if err != nil {
		return forwarded{}, head, fmt.Errorf("net/http cannot parse the head the proxy sent: %w", err)
	}
	fw := forwarded{method: req.Method, body: []byte{}}
	switch {
	case len(req.TransferEncoding) > 0:
		if fw.body, err = io.ReadAll(httputil.NewChunkedReader(br)); err == nil {
			_, err = textproto.NewReader(br).ReadMIMEHeader() // the trailer section
		}
	case req.ContentLength > 0:
		fw.body = make([]byte, req.ContentLength)
		_, err = io.ReadFull(br, fw.body)
	}
	if err != nil {
		return forwarded{}, head, fmt.Errorf("reading the body the proxy sent: %w", err)
	}
	for _, line := range bytes.Split(head, []byte("\r\n")) {
		l := bytes.ToLower(line)
		if bytes.HasPrefix(l, []byte("content-length:")) || bytes.HasPrefix(l, []byte("transfer-encoding:")) {
			fw.framing++
		}
	}
	return fw, head, nil
}

func (u *framingUpstream) conn(c net.Conn) {
	defer u.wg.Done()
	defer c.Close()
	br := bufio.NewReaderSize(c, 128<<10)
	for {
		fw, head, err := readForwarded(br)
		if err != nil {
			if head != nil || (!errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed)) {
				u.fail("%v\n%q", err, head)
			}
			return
		}
		u.mu.Lock()
		u.got = append(u.got, fw)
		u.mu.Unlock()
		resp := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		if fw.method == http.MethodHead {
			resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
		}
		if _, err := io.WriteString(c, resp); err != nil {
			return
		}
	}
}

func (u *framingUpstream) fail(format string, args ...any) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.errs = append(u.errs, fmt.Sprintf(format, args...))
}

// take returns and forgets what was received so far.
func (u *framingUpstream) take() ([]forwarded, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	got, errs := u.got, u.errs
	u.got, u.errs = nil, nil
	return got, errs
}

func (u *framingUpstream) close() {
	u.ln.Close()
	u.mu.Lock()
	u.closed = true
	for _, c := range u.open {
		c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

// reference parses in as a sequence of pipelined requests with net/http,
// the way a strict server would, up to the first it rejects or the first
// that closes the connection. Empty lines before a request line are
// skipped, as RFC 9112 §2.2 lets a server do and fasthttp does, and a
// request-target net/http rejects is taken as "/" (see plainTarget).
func reference(in []byte) []forwarded {
	var reqs []forwarded
	patched := false
	for {
		in = bytes.TrimLeft(in, "\r\n")
		rd := bytes.NewReader(in)
		br := bufio.NewReader(rd)
		req, err := http.ReadRequest(br)
		var ue *url.Error
		if errors.As(err, &ue) && !patched {
			in, patched = plainTarget(in), true
			continue
		}
		if err != nil {
			return reqs
		}
		patched = false
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return reqs
		}
		reqs = append(reqs, forwarded{method: req.Method, body: body})
		if req.Close {
			return reqs
		}
		in = in[len(in)-rd.Len()-br.Buffered():]
	}
}

// wellFormed are ordinary requests, alone and pipelined; the smuggling
// shapes of RELIABILITY.md §6.2 (S1–S5) are the seed corpus in
// testdata/fuzz/FuzzProxyRequestFraming, with what the fuzzer found.
var wellFormed = []string{
	"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
	"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
	"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nzGET /c HTTP/1.1\r\nHost: x\r\n\r\n",
}

// framingHarness is a proxy in front of a framingUpstream, with short
// timeouts so that every fuzz connection ends quickly.
type framingHarness struct {
	p  *Proxy
	up *framingUpstream
	ln net.Listener
}

func newFramingHarness(tb testing.TB) *framingHarness {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	up := &framingUpstream{ln: ln}
	up.wg.Add(1)
	go up.serve()
	tb.Cleanup(up.close)
	p, err := New(Config{
		Upstream:       "http://" + ln.Addr().String(),
		ReadTimeout:    100 * time.Millisecond,
		MaxBodyBytes:   64 << 10,
		MaxHeaderBytes: 8 << 10,
	}, zap.NewNop(), NopRecorder{})
	require.NoError(tb, err)
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	srv := p.Server()
	srv.IdleTimeout = 100 * time.Millisecond // close kept-alive fuzz connections fast
	go srv.Serve(p.Listener(pln))            //nolint:errcheck // ends at Shutdown; as serve does
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return &framingHarness{p: p, up: up, ln: pln}
}

// send writes in on a new connection, reads until the proxy closes it, and
// returns what the upstream received meanwhile.
func (h *framingHarness) send(t *testing.T, in []byte) ([]forwarded, []string) {
	c, err := net.Dial("tcp", h.ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	if _, err := c.Write(in); err == nil {
		_, err = io.Copy(io.Discard, c)
		if !errors.Is(err, syscall.ECONNRESET) {
			require.NoError(t, err, "the proxy kept the connection open")
		}
	}
	require.Eventually(t, func() bool { return h.p.Inflight() == 0 }, 5*time.Second, time.Millisecond)
	return h.up.take()
}

// FuzzProxyRequestFraming (Q2) writes raw bytes to the proxy's socket.
// Everything the upstream receives must parse with net/http, carry at most
// one framing header (exactly one when it has a body), and be, request by
// request, what a strict parser reads from the input: the same method and
// the same body, so that no upstream request holds bytes from after a
// request's declared end. Run it long with
// go test -run '^$' -fuzz FuzzProxyRequestFraming -fuzztime 5m ./proxy/
func FuzzProxyRequestFraming(f *testing.F) {
	for _, s := range wellFormed {
		f.Add([]byte(s))
	}
	h := newFramingHarness(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 16<<10 {
			return
		}
		got, errs := h.send(t, in)
		require.Empty(t, errs)
		want := reference(in)
		require.LessOrEqual(t, len(got), len(want), "the upstream got a request a strict parser does not see in %q", in)
		for i, fw := range got {
			require.LessOrEqual(t, fw.framing, 1, "request %d framed twice", i)
			if len(fw.body) > 0 {
				require.Equal(t, 1, fw.framing, "request %d has a body and no framing", i)
			}
			require.Equal(t, want[i].method, fw.method, "request %d", i)
			require.Equal(t, string(want[i].body), string(fw.body), "request %d: the body crosses its declared end", i)
		}
	})
}

// TestFramingHarnessForwards checks the fuzzer's harness: well-formed
// input does reach the upstream, request by request, so an empty upstream
// log in the fuzzer means the proxy refused.
func TestFramingHarnessForwards(t *testing.T) {
	h := newFramingHarness(t)
	for _, s := range wellFormed {
		got, errs := h.send(t, []byte(s))
		require.Empty(t, errs)
		require.Len(t, got, len(reference([]byte(s))), strings.SplitN(s, "\r\n", 2)[0])
	}
	got, _ := h.send(t, []byte(wellFormed[3]))
	require.Equal(t, []forwarded{{method: "GET", body: []byte{}}, {method: "POST", body: []byte("z"), framing: 1}, {method: "GET", body: []byte{}}}, got)
}
