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
//
// The bound counts memory held, as it is taken: a body's buffer grows as
// its bytes arrive, and each growth is reserved before it is allocated.
// The declared Content-Length only caps the growth (and is refused at once
// when over --max-body-bytes); it reserves nothing. A client that declares
// 64 MiB and sends 9 KB holds its buffer's first step, 256 KiB, not 64 MiB:
// to keep honest clients out, it must really send the bytes it holds, and
// hold them no longer than --read-timeout. Reserving the declared length
// let 16 such liars keep every POST at 503 for the whole read timeout.
//
// Growth is geometric from bodyStepMin: ×4 towards a declared length (the
// last step is exact, and the garbage left by the steps is a third of the
// body), ×2 for a chunked body (whose last step can overshoot). A step
// reserves what it adds; the buffer it replaces is garbage the moment it
// is copied, and the transient is inside the RSS margin the bound is
// measured against (1.25 × the budget + 150 MiB, TestBodyBudgetBoundsMemory),
// so that sixteen 64 MB bodies fit the default 1 GiB.

// errOverBudget is a body that would take the bodies in flight past
// MaxInflightBodyBytes.
var errOverBudget = errors.New("request bodies in flight over the memory bound")

// bodyStepMin is a streamed body's first buffer; bodies that fasthttp read
// whole (up to its 8 KiB pre-read) use its pooled buffer.
const bodyStepMin = 256 << 10

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
	b, err := r.readBodyStream(ctx.RequestBodyStream(), cl, limit)
	if err != nil {
		return bodyFailure(err)
	}
	r.req.SetBodyRaw(b)
	return 0
}

// readBodyStream reads a streamed body of declared length cl (-1: chunked)
// and at most limit bytes into a buffer that grows as bytes arrive, each
// growth reserved first (see above).
func (r *relay) readBodyStream(src io.Reader, cl, limit int) ([]byte, error) {
	var b []byte
	for {
		if len(b) == cap(b) {
			if cl >= 0 && len(b) >= cl {
				// Full: only the end (or a body longer than declared,
				// which fasthttp's stream does not return) is left.
				var one [1]byte
				if n, err := src.Read(one[:]); n == 0 && errors.Is(err, io.EOF) {
					return b, nil
				} else if err != nil && !errors.Is(err, io.EOF) {
					return nil, fmt.Errorf("reading client body: %w", err)
				}
				return nil, fasthttp.ErrBodyTooLarge
			}
			if len(b) >= limit {
				return nil, fasthttp.ErrBodyTooLarge
			}
			nb, err := r.grow(b, cl, limit)
			if err != nil {
				return nil, err
			}
			b = nb
		}
		n, err := src.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, fasthttp.ErrBodyTooLarge) {
				return nil, err
			}
			return nil, fmt.Errorf("reading client body: %w", err)
		}
	}
	if cl >= 0 && len(b) < cl {
		// fasthttp's server body stream ends a body cut short by the
		// client's FIN with io.EOF: a body shorter than its Content-Length
		// is a client that left, never a whole request.
		return nil, io.ErrUnexpectedEOF
	}
	return b, nil
}

// grow returns a larger buffer holding b, its added capacity reserved
// against the bound: ×4 towards a declared length cl, ×2 towards limit for
// a chunked body (cl < 0), from bodyStepMin.
func (r *relay) grow(b []byte, cl, limit int) ([]byte, error) {
	next, most := 2*cap(b), limit
	if cl >= 0 {
		next, most = 4*cap(b), cl
	}
	next = min(max(next, bodyStepMin), most)
	if !r.reserve(int64(next - cap(b))) {
		return nil, errOverBudget
	}
	nb := make([]byte, len(b), next)
	copy(nb, b)
	return nb, nil
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
		// Bounded like every write to a client: one that pipelined
		// responses it never reads would otherwise hold this one forever.
		_ = c.SetWriteDeadline(time.Now().Add(lingerIdle))
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
