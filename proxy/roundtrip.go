package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
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

// roundTrip sends the request upstream and reads the final response head
// into r.resp, forwarding interim (1xx) responses to the client on the way.
// It takes connections from the pool and leaves the one in use in r.up.
//
// A request that fails on a reused connection before a single response
// byte arrived is sent once more on a new connection: the engine most
// likely closed the connection as the request crossed (uvicorn's idle
// timeout), and the body is still in r.req. It is never sent a third time,
// and never again once any response byte was read, so a request the engine
// may have answered is never repeated. Go's Transport retries the same case
// (errServerClosedIdle).
func (p *Proxy) roundTrip(ctx *fasthttp.RequestCtx, r *relay) error {
	for resent := false; ; resent = true {
		// The resend dials: another idle connection may have died in the
		// same instant as the first (an engine's idle timer fires for
		// every connection the burst before left).
		c, reused, err := p.pool.get(resent)
		if err != nil {
			return err
		}
		c.uses++
		c.read, c.readErr = 0, nil
		r.up.Store(c)
		if r.hasLeft() { // the watcher may have looked before the store
			return net.ErrClosed
		}
		err = p.exchange(ctx, r, c)
		if err == nil || resent || !reused || c.read > 0 || !resendable(c.cause(err)) || r.hasLeft() {
			connFacts(c, reused, &r.tr)
			return err
		}
		r.up.Store(nil)
		p.pool.discard(c)
		p.stats.redial(RedialReusedFailed)
		r.tr.Redialed = true
	}
}

// resendable reports an error on a reused connection, before any response
// byte, that means the connection was most likely dead before it carried
// the request: an EOF, a reset or a broken pipe is the engine closing an
// idle connection as the request crossed it (Go's Transport resends a POST
// in the same case, errServerClosedIdle). From outside, an engine that read
// the request and then closed without a byte looks the same; that rare
// request is asked twice, which is what the client's own retry would do.
// A timeout never is: the engine may be working on the request.
func resendable(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// writers are the buffers requests are written upstream through: a
// connection needs one only while it writes a request, not for the whole
// generation it then streams (3.5 KiB less per held stream, measured).
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, upstreamBufSize) }}

// exchange writes the request to c and reads the response head.
func (p *Proxy) exchange(ctx *fasthttp.RequestCtx, r *relay, c *upConn) error {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c)
	err := r.req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	if err != nil {
		return err
	}
	c.lastWrite = time.Now()
	return p.readHead(ctx, r, c)
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
			forwardInterim(ctx, &resp.Header)
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
// fasthttp's own RequestCtx.EarlyHints does.
func forwardInterim(ctx *fasthttp.RequestCtx, h *fasthttp.ResponseHeader) {
	if !ctx.Request.Header.IsHTTP11() {
		return // HTTP/1.0 has no interim responses
	}
	b := append(appendHead(make([]byte, 0, 256), h, false), "\r\n"...)
	_, _ = ctx.Conn().Write(b)
}
