package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Request bodies are read whole before anything is sent upstream (the
// retry and prefix trackers read them, and a request that fails on a dead
// pooled connection is sent again). Each body is held once, in the upstream
// request, and all bodies in flight together are bounded by
// MaxInflightBodyBytes: one that would cross the bound is refused with 503
// and Retry-After, the way a full queue is, instead of growing the heap
// until the process dies.

// errOverBudget is a body that would take the bodies in flight past
// MaxInflightBodyBytes.
var errOverBudget = errors.New("request bodies in flight over the memory bound")

// exactBodyMin is the Content-Length from which a body is read into a
// buffer of exactly its size; smaller ones use fasthttp's pooled buffers.
const exactBodyMin = 64 << 10

// readBody reads the client's body into r.req. A declared Content-Length
// over the limit is refused before a byte of the body is read.
func (p *Proxy) readBody(ctx *fasthttp.RequestCtx, r *relay) refusal {
	limit := p.cfg.MaxBodyBytes
	cl := ctx.Request.Header.ContentLength()
	if cl > limit || bodyOverLimit(&ctx.Request.Header) {
		return refuseBodyTooLarge
	}
	if !ctx.Request.IsBodyStream() {
		body := ctx.Request.Body()
		if !r.reserve(int64(len(body))) {
			return bodyFailure(errOverBudget)
		}
		r.req.SetBody(body)
		return 0
	}
	if cl >= exactBodyMin {
		if !r.reserve(int64(cl)) {
			return bodyFailure(errOverBudget)
		}
		b := make([]byte, cl)
		n, err := io.ReadFull(ctx.RequestBodyStream(), b)
		if err != nil {
			// fasthttp's server body stream ends a body cut short by the
			// client's FIN with io.EOF: a body shorter than its
			// Content-Length is a client that left, never a whole request.
			if n < cl && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
				err = io.ErrUnexpectedEOF
			}
			return bodyFailure(fmt.Errorf("reading client body: %w", err))
		}
		r.req.SetBodyRaw(b)
		return 0
	}
	return bodyFailure(p.readBodyChunks(ctx, r, limit))
}

// readBodyChunks reads a body of unknown or small length piece by piece,
// reserving each piece against the bound before it is kept.
func (p *Proxy) readBodyChunks(ctx *fasthttp.RequestCtx, r *relay, limit int) error {
	src := ctx.RequestBodyStream()
	w := r.req.BodyWriter()
	total := 0
	for {
		n, err := src.Read(r.buf)
		if n > 0 {
			total += n
			if total > limit {
				return fasthttp.ErrBodyTooLarge
			}
			if !r.reserve(int64(n)) {
				return errOverBudget
			}
			_, _ = w.Write(r.buf[:n])
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, fasthttp.ErrBodyTooLarge) {
				return err
			}
			return fmt.Errorf("reading client body: %w", err)
		}
	}
	if cl := ctx.Request.Header.ContentLength(); cl >= 0 && total < cl {
		return io.ErrUnexpectedEOF // cut short by the client's FIN (see readBody)
	}
	return nil
}

// reserve counts n more body bytes against MaxInflightBodyBytes; false
// means they would cross it. What a request reserved is given back by
// unreserve when it ends.
func (r *relay) reserve(n int64) bool {
	if n == 0 {
		return true
	}
	if r.p.bodyBytes.Add(n) > r.p.cfg.MaxInflightBodyBytes {
		r.p.bodyBytes.Add(-n)
		return false
	}
	r.reserved += n
	return true
}

func (r *relay) unreserve() {
	if r.reserved != 0 {
		r.p.bodyBytes.Add(-r.reserved)
		r.reserved = 0
	}
}

// bodyFailure maps an error reading a request (its body, or as fasthttp
// reports it, the whole request) to a refusal: over the limit, over the
// memory bound, the read timeout, the client gone mid-upload (not its
// fault as a malformed request: it is gone), headers too large, or a bad
// request. nil is no failure.
func bodyFailure(err error) refusal {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return refuseBodyTooLarge
	case errors.Is(err, errOverBudget):
		return refuseOverloaded
	case isTimeout(err):
		return refuseReadTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return refuseClientGone
	}
	if small := (*fasthttp.ErrSmallBuffer)(nil); errors.As(err, &small) {
		return refuseHeadersTooLarge
	}
	return refuseBadRequest
}

// Lingering close bounds, nginx's: an unread body is drained after an error
// response for at most lingerTime in all and lingerIdle between reads, so
// that the client reads the response instead of a reset. A reset discards
// what the client has received but not yet read, so closing while it still
// sends loses the response (nginx lingering_time 30 s, lingering_timeout 5 s).
const (
	lingerTime = 30 * time.Second
	lingerIdle = 5 * time.Second
)

// linger shuts c's write side and reads until the client closes or the
// bounds above run out.
func linger(c net.Conn) {
	if tc, ok := unwrapTCP(c); ok {
		_ = tc.CloseWrite()
	}
	end := time.Now().Add(lingerTime)
	var buf [16 << 10]byte
	for {
		next := time.Now().Add(lingerIdle)
		if next.After(end) {
			next = end
		}
		_ = c.SetReadDeadline(next)
		if _, err := c.Read(buf[:]); err != nil {
			return
		}
	}
}

// lingerClose ends the connection after the error response while the
// request body is still unread. Closing with unread bytes in the receive
// buffer sends a reset, which can destroy the response before the client
// reads it (RFC 9112 §9.6): so the write side is shut first, and the rest
// of the body drained (linger).
func lingerClose(ctx *fasthttp.RequestCtx) {
	// fasthttp would close at once after writing a Connection: close
	// response; so the proxy writes it itself, on the hijacked connection.
	ctx.Response.Header.SetConnectionClose()
	var resp bytes.Buffer
	_, _ = ctx.Response.WriteTo(&resp)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		if _, err := c.Write(resp.Bytes()); err == nil {
			linger(c)
		}
	})
}

// unwrapTCP finds the TCP connection under fasthttp's hijacked-connection
// wrapper.
func unwrapTCP(c net.Conn) (*net.TCPConn, bool) {
	for {
		switch v := c.(type) {
		case *net.TCPConn:
			return v, true
		case interface{ UnsafeConn() net.Conn }: // fasthttp's hijacked connection
			c = v.UnsafeConn()
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil, false
		}
	}
}
