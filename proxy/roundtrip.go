package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// maxInterim bounds the 1xx responses accepted before the final one.
const maxInterim = 16

var (
	// errAmbiguousResponse is an upstream head framed two ways (both
	// Content-Length and Transfer-Encoding): nginx answers 502 and closes,
	// since either reading could be the one a smuggler counted on.
	errAmbiguousResponse = errors.New("upstream response has both Content-Length and Transfer-Encoding")
	errTooManyInterim    = errors.New("upstream sent too many 1xx responses")
	errHeadTooLarge      = errors.New("upstream response head larger than the read buffer")
)

// resetWindow bounds how long after its request was written a reset
// still proves that the request met a socket the engine had closed
// (mayResend). The RST such a request draws comes back within one round
// trip; the rest is room for this process to be scheduled on a loaded
// machine. An engine that read a request and then aborted its connection
// with a reset within it would be asked twice; engines close with a FIN
// when they fail or exit, and a FIN alone is never taken as proof.
const resetWindow = 100 * time.Millisecond

// roundTrip sends the request upstream and reads the final response head
// into r.resp, forwarding interim (1xx) responses to the client on the way.
// It takes connections from the pool, bound to the client connection
// (bindKey), and leaves the one in use in r.up.
//
// A request that fails on a reused connection before a single response
// byte arrived may be sent once more, on a new connection, when the
// failure shows that the engine cannot have begun working on it
// (mayResend). It is never sent a third time, and never again once any
// response byte was read.
func (p *Proxy) roundTrip(ctx *fasthttp.RequestCtx, r *relay) error {
	client := bindKey(ctx)
	for resent := false; ; resent = true {
		// The resend dials: another idle connection may have died in the
		// same instant as the first (an engine's idle timer fires for
		// every connection the burst before left).
		c, reused, err := p.pool.get(client, resent)
		if err != nil {
			return err
		}
		c.begin()
		r.up.Store(c)
		if r.hasLeft() { // the watcher may have looked before the store
			return net.ErrClosed
		}
		if hook := testHookReused.Load(); reused && hook != nil {
			(*hook)()
		}
		err = p.exchange(ctx, r, c)
		if err == nil || resent || !reused || c.read > 0 || r.hasLeft() || !mayResend(&r.req.Header, c, err) {
			connFacts(c, reused, &r.tr)
			return err
		}
		r.up.Store(nil)
		p.pool.discard(c)
		p.stats.redial(RedialReusedFailed)
		r.tr.Redialed = true
	}
}

// testHookReused, when set by a test, runs after a reused connection passed
// its checks and before the request is written on it.
var testHookReused atomic.Pointer[func()]

// bindKey is the client connection a request's upstream connection is
// bound to (see pool), or nil when the client connection ends with this
// response, so that its upstream connection is never kept: a client that
// asked for the close, and an HTTP/1.0 client, whose streamed responses
// are delimited by the close (closeDelimited).
func bindKey(ctx *fasthttp.RequestCtx) net.Conn {
	h := &ctx.Request.Header
	if !h.IsHTTP11() || h.ConnectionClose() {
		return nil
	}
	return ctx.Conn()
}

// mayResend decides whether a request that failed on a reused connection
// before any response byte may be sent again (RFC 9110 §9.2.2: a
// non-idempotent request only with "some means to detect that the original
// request was never applied"). It may when:
//
//   - its method is idempotent (GET, HEAD, OPTIONS, TRACE) or it carries an
//     Idempotency-Key, and the connection was found closed or reset, as Go's
//     Transport resends (shouldRetryRequest: isReplayable, then
//     errServerClosedIdle or a read error before the first byte);
//   - writing it failed with a reset or a broken pipe and no early answer
//     was waiting (exchange): the engine's socket refused part of it, so
//     the engine never read it whole, and no engine starts on a request it
//     has not read to its end;
//   - a reset came back within resetWindow of the write, with or after the
//     engine's FIN: the request reached a socket the engine had closed, or
//     one it closed with the request unread (uvicorn's idle timer firing as
//     the request crossed). An engine that read the request whole and then
//     closed, at once or after working on it, sends a FIN and nothing more,
//     since nothing it left unread draws a reset.
//
// So a POST the engine read and worked on is never run twice; Go's
// Transport never resends a written POST at all (only a nothingWrittenError
// passes isReplayable), nor does nginx once a request was sent
// (proxy_next_upstream non_idempotent, off by default, cached keepalive
// connections included: nginx-tests proxy_non_idempotent.t). A timeout is
// never resent: the engine may be working.
func mayResend(h *fasthttp.RequestHeader, c *upConn, err error) bool {
	var wf *writeFailure
	if errors.As(err, &wf) {
		return connBroken(wf.err)
	}
	if !connBroken(c.cause(err)) {
		return false
	}
	if idempotent(h) {
		return true
	}
	return c.resetSince(c.lastWrite.Add(resetWindow))
}

// connBroken reports an error that means the connection is gone: an EOF,
// a reset, or a broken pipe; not a timeout or a malformed response.
func connBroken(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// idempotent reports a request that may be repeated automatically, as Go's
// Request.isReplayable decides: the methods RFC 9110 §9.2.2 calls
// idempotent and safe, or an Idempotency-Key.
func idempotent(h *fasthttp.RequestHeader) bool {
	switch string(h.Method()) {
	case fasthttp.MethodGet, fasthttp.MethodHead, fasthttp.MethodOptions, fasthttp.MethodTrace:
		return true
	}
	return len(h.Peek("Idempotency-Key")) > 0 || len(h.Peek("X-Idempotency-Key")) > 0
}

// writeFailure is an error writing the request upstream, after which no
// response could be read.
type writeFailure struct{ err error }

func (e *writeFailure) Error() string { return "writing upstream: " + e.err.Error() }
func (e *writeFailure) Unwrap() error { return e.err }

// writers are the buffers requests are written upstream through: a
// connection needs one only while it writes a request, not for the whole
// generation it then streams (3.5 KiB less per held stream, measured).
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, upstreamBufSize) }}

// exchange writes the request to c and reads the response head. An engine
// may answer before it has read the whole body (401, or 413 over its own
// limit) and close: the write then fails with a reset or a broken pipe
// while the answer waits in the socket. It is read and relayed, as Go's
// Transport reads a response while it writes the body "in case the server
// decides to reply before reading our full request body" (transport.go;
// TestTransportPrefersResponseOverWriteError); the connection is not
// reused.
func (p *Proxy) exchange(ctx *fasthttp.RequestCtx, r *relay, c *upConn) error {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c)
	err := r.req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	c.lastWrite = time.Now()
	if err == nil {
		return p.readHead(ctx, r, c)
	}
	c.spent = true
	if !connBroken(err) {
		return err // a timeout: the socket is alive, and nothing may come
	}
	if herr := p.readHead(ctx, r, c); herr == nil || c.read > 0 {
		return herr // the engine's early answer, or its broken start
	}
	return &writeFailure{err}
}

// readHead reads response heads until the final one. A 101 is returned as
// it is, for the caller to tunnel or refuse; any other response gets its
// body stream, unless its status or the request's method forbids a body.
func (p *Proxy) readHead(ctx *fasthttp.RequestCtx, r *relay, c *upConn) error {
	resp := &r.resp
	for n := 0; ; n++ {
		if err := checkHead(c.br); err != nil {
			return err
		}
		if err := resp.Header.Read(c.br); err != nil {
			return err
		}
		code := resp.StatusCode()
		if code >= 200 || code == fasthttp.StatusSwitchingProtocols {
			break
		}
		if n == maxInterim {
			return errTooManyInterim
		}
		if code != fasthttp.StatusContinue { // the client had its 100 from the server (see Server)
			p.forwardInterim(ctx, &resp.Header)
		}
	}
	if code := resp.StatusCode(); code == fasthttp.StatusSwitchingProtocols || noBody(ctx, code) {
		return nil
	}
	resp.StreamBody = true
	return resp.ReadBody(c.br, 0)
}

// noBody reports a response that has no body whatever its head says
// (RFC 9112 §6.3): to a HEAD, and 1xx, 204 and 304.
func noBody(ctx *fasthttp.RequestCtx, code int) bool {
	return ctx.IsHead() || code < 200 || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified
}

// checkHead looks at the raw response head waiting in br, before fasthttp
// parses it, for what its parser forgives: Content-Length together with
// Transfer-Encoding (fasthttp drops the Content-Length and reads on).
func checkHead(br *bufio.Reader) error {
	if _, err := br.Peek(1); err != nil {
		return nil // fasthttp's parser reports it
	}
	var head []byte
	for {
		b, _ := br.Peek(br.Buffered())
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			head = b[:i]
			break
		}
		if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
			head = b[:i]
			break
		}
		if br.Buffered() == br.Size() {
			return errHeadTooLarge
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return nil // cut short: fasthttp's parser reports it
		}
	}
	var cl, te bool
	for len(head) > 0 {
		var line []byte
		line, head, _ = bytes.Cut(head, []byte("\n"))
		cl = cl || hasHeaderName(line, "content-length:")
		te = te || hasHeaderName(line, "transfer-encoding:")
	}
	if cl && te {
		return errAmbiguousResponse
	}
	return nil
}

// forwardInterim relays a 1xx response (103 Early Hints, 102) to an
// HTTP/1.1 client as it came, minus hop-by-hop headers (RFC 9110 §15.2: a
// proxy must forward them). It is written on the client connection before
// the final response, which fasthttp writes when the handler returns, as
// fasthttp's own RequestCtx.EarlyHints does. That is in order only because
// every earlier response on the connection has left fasthttp's writer
// (flushEachResponse). The write is under a deadline of ClientWriteTimeout,
// set through the request so that fasthttp clears it once the final
// response is out (a client that stops reading is cut here too); the final
// response's own deadline (Handle) replaces it.
func (p *Proxy) forwardInterim(ctx *fasthttp.RequestCtx, h *fasthttp.ResponseHeader) {
	if !ctx.Request.Header.IsHTTP11() {
		return // HTTP/1.0 has no interim responses
	}
	b := append(appendHead(make([]byte, 0, 256), h, false), "\r\n"...)
	if ctx.SetWriteDeadline(time.Now().Add(p.cfg.ClientWriteTimeout)) != nil {
		return // the connection is gone: the final response fails the same way
	}
	_, _ = ctx.Conn().Write(b)
}

// flushEachResponse puts a response the relay does not write (204, 304,
// HEAD, a refusal) under a write deadline of ClientWriteTimeout, and has
// fasthttp send it before it reads the next pipelined request instead of
// holding it in its writer to batch it with the next one. The deadline:
// fasthttp has no WriteTimeout here (Server), and a client that pipelines
// and never reads would otherwise hold its connection, busy and so never
// evicted as idle, forever. The flush: a 1xx that forwardInterim writes for
// the next request must not overtake it, or land inside it. fasthttp
// flushes after a response whose handler set a write deadline (serveConn),
// and clears the deadline after the flush. A body the relay writes sets
// its first idle deadline through the request instead
// (relay.firstWriteDeadline).
func (p *Proxy) flushEachResponse(ctx *fasthttp.RequestCtx) {
	_ = ctx.SetWriteDeadline(time.Now().Add(p.cfg.ClientWriteTimeout))
}
