package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// This file holds the responses the proxy writes on the client's raw
// connection instead of through fasthttp's response writer: a protocol
// switch (WebSocket), which becomes a byte tunnel, and a streamed body to
// an HTTP/1.0 client, which must be delimited by closing the connection
// (RFC 9112 §6.1: no chunked coding to an HTTP/1.0 recipient). fasthttp
// hands the connection over once the handler returns (RequestCtx.Hijack).

// wantsUpgrade reports a client request to switch protocols that the proxy
// tunnels: an Upgrade naming anything but h2c, with Connection: upgrade.
// h2c is refused, as Go's ReverseProxy and nginx do: the proxy speaks
// HTTP/1.1 to the engine.
func wantsUpgrade(h *fasthttp.RequestHeader) bool {
	up := h.Peek("Upgrade")
	return len(up) > 0 && !bytes.EqualFold(bytes.TrimSpace(up), []byte("h2c")) &&
		hasToken(h.Peek("Connection"), "upgrade")
}

// hasToken reports whether a comma-separated header value lists tok.
func hasToken(v []byte, tok string) bool {
	for len(v) > 0 {
		var t []byte
		t, v, _ = bytes.Cut(v, []byte(","))
		if bytes.EqualFold(bytes.TrimSpace(t), []byte(tok)) {
			return true
		}
	}
	return false
}

// switchProtocols handles an upstream 101. One the client did not ask for,
// or that names a protocol other than the one asked for, is a broken
// upstream: 502, and the connection, now speaking who knows what, is
// closed. Otherwise the 101 goes to the client with its headers and the
// two connections are joined until both sides end or the tunnel idles out.
func (p *Proxy) switchProtocols(ctx *fasthttp.RequestCtx, r *relay) {
	tr := &r.tr
	tr.Status = fasthttp.StatusSwitchingProtocols
	if !r.upgrade || !bytes.EqualFold(bytes.TrimSpace(r.resp.Header.Peek("Upgrade")), bytes.TrimSpace(ctx.Request.Header.Peek("Upgrade"))) {
		r.upgraded = true // never pooled: the connection left HTTP
		p.refuse(ctx, r, refuseUnsolicitedSwitch)
		return
	}
	r.endWatch() // the tunnel reads the client from now on
	head := switchHead(&r.resp.Header)
	r.upgraded = true
	p.hijack(ctx, func(cc net.Conn) { p.tunnel(r, cc, head) }, func() {
		r.fail(SideClient, ErrClientGone)
		p.endTunnel(r)
	})
}

// switchHead is the 101 as the client gets it: the upstream's headers minus
// hop-by-hop ones, with the Upgrade and Connection that make the switch.
func switchHead(h *fasthttp.ResponseHeader) []byte {
	b := appendHead(nil, h, false)
	b = append(append(append(b, "Upgrade: "...), bytes.TrimSpace(h.Peek("Upgrade"))...), "\r\nConnection: Upgrade\r\n\r\n"...)
	return b
}

// tunnelBufSize is the client → engine copy's buffer; the other way uses
// the relay's.
const tunnelBufSize = 16 << 10

// tunnel copies bytes both ways between the client and the upstream. It
// runs on the goroutine fasthttp starts for the hijacked connection, plus
// one for the client → engine copy, and ends the request's Trace when both
// are done.
//
// The tunnel's one idle timeout is --upstream-read-timeout, renewed by a
// byte in either direction (as nginx's proxy_read_timeout for WebSockets):
// a read that times out while the other direction moved bytes within it
// goes on. Each write has its side's idle deadline (--client-write-timeout
// to the client; the upstream connection renews its own). At the first
// EOF the other side is half-closed (CloseWrite), as Go's ReverseProxy
// does; both are closed fully when both directions ended, on any error,
// or on the idle timeout. fasthttp's hijacked connection ignores Close, so
// the client's socket is closed under it (closeClient).
func (p *Proxy) tunnel(r *relay, cc net.Conn, head []byte) {
	c := r.up.Load()
	t := &tunnelState{idle: p.cfg.UpstreamReadTimeout, writeIdle: p.cfg.ClientWriteTimeout}
	t.touch()
	_ = cc.SetDeadline(time.Now().Add(t.writeIdle))
	if _, err := cc.Write(head); err != nil {
		r.fail(SideClient, ErrClientGone)
		closeClient(cc)
		p.endTunnel(r)
		return
	}
	_ = cc.SetDeadline(time.Time{})
	closeAll := sync.OnceFunc(func() { closeClient(cc); _ = c.Close() })
	var up tunnelEnd
	done := make(chan struct{})
	go func() { // client → upstream
		defer close(done)
		up = t.copy(c, cc, cc, nil, make([]byte, tunnelBufSize))
		if up.readErr == io.EOF && up.writeErr == nil {
			_ = closeWrite(c.Conn)
		} else {
			closeAll()
		}
	}()
	// upstream → client: what the connection's reader already holds comes
	// first; the upstream connection renews its own read deadline.
	r.takeBuf()
	down := t.copy(cc, c.br, nil, cc, r.buf)
	if down.readErr == io.EOF && down.writeErr == nil {
		_ = closeWrite(cc)
	} else {
		closeAll()
	}
	<-done
	closeAll()
	r.tr.TunnelUp, r.tr.TunnelDown = up.n, down.n
	r.failTunnel(up, down)
	p.endTunnel(r)
}

// failTunnel records why a tunnel ended, the first cause first: an idle
// timeout is the upstream's silence (the client of a tunnel keeps it alive
// with its pings); an error reading or writing a side is that side's. A
// read error that closeAll caused (net.ErrClosed) is a consequence.
func (r *relay) failTunnel(up, down tunnelEnd) {
	if r.p.aborting.Load() {
		r.fail(SideUpstream, ErrUpstreamBroken) // recorded as the shutdown's
	}
	if up.timedOut || down.timedOut {
		r.fail(SideUpstream, ErrUpstreamTimeout)
	}
	for _, e := range [...]struct {
		err  error
		side Side
	}{{down.readErr, SideUpstream}, {down.writeErr, SideClient}, {up.readErr, SideClient}, {up.writeErr, SideUpstream}} {
		if e.err == nil || e.err == io.EOF || errors.Is(e.err, net.ErrClosed) || isTimeout(e.err) {
			continue
		}
		if e.side == SideClient {
			r.fail(SideClient, ErrClientGone)
		} else {
			r.fail(SideUpstream, ErrUpstreamBroken)
		}
	}
}

// tunnelState is what a tunnel's two copies share: when a byte last moved
// either way, which renews both directions' idle timeout.
type tunnelState struct {
	idle      time.Duration
	writeIdle time.Duration
	last      atomic.Int64 // unix nanoseconds
}

func (t *tunnelState) touch() { t.last.Store(time.Now().UnixNano()) }

// quiet reports whether nothing moved either way for the idle timeout.
func (t *tunnelState) quiet() bool {
	return time.Since(time.Unix(0, t.last.Load())) >= t.idle
}

// tunnelEnd is how one direction of a tunnel ended.
type tunnelEnd struct {
	n        int64
	readErr  error // io.EOF: the source ended cleanly
	writeErr error
	timedOut bool // the tunnel idled out
}

// copy moves src to dst until src ends or fails, dst fails, or the tunnel
// is quiet for the idle timeout. srcDL is src's connection when copy sets
// its read deadlines (the upstream connection sets its own); dstDL is dst's
// when copy sets its write deadlines.
func (t *tunnelState) copy(dst io.Writer, src io.Reader, srcDL, dstDL net.Conn, buf []byte) tunnelEnd {
	var e tunnelEnd
	var rdl, wdl idleDeadline
	for {
		if srcDL != nil {
			if dl, ok := rdl.next(time.Now(), t.idle); ok {
				_ = srcDL.SetReadDeadline(dl)
			}
		}
		n, err := src.Read(buf)
		if n > 0 {
			t.touch()
			if dstDL != nil {
				if dl, ok := wdl.next(time.Now(), t.writeIdle); ok {
					_ = dstDL.SetWriteDeadline(dl)
				}
			}
			w, werr := dst.Write(buf[:n])
			e.n += int64(w)
			if werr != nil {
				e.writeErr = werr
				return e
			}
			t.touch()
		}
		if err == nil {
			continue
		}
		if isTimeout(err) {
			if !t.quiet() {
				rdl.clear() // the other direction is alive: wait again
				continue
			}
			e.timedOut = true
		}
		e.readErr = err
		return e
	}
}

// closeWrite half-closes c (a TCP or TLS connection, or fasthttp's
// hijacked wrapper of one): the peer reads EOF, and c can still be read.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	if tc, ok := unwrapTCP(c); ok {
		return tc.CloseWrite()
	}
	return c.Close()
}

// closeClient closes a hijacked client connection for real: fasthttp's
// wrapper ignores Close (it closes the connection only once the hijack
// handler returns), so a copy blocked reading it would never end.
func closeClient(cc net.Conn) {
	if u, ok := cc.(interface{ UnsafeConn() net.Conn }); ok {
		cc = u.UnsafeConn()
	}
	_ = cc.Close()
}

// closeDelimited hands an HTTP/1.0 client's response to the raw
// connection: the head (no Content-Length, no Transfer-Encoding,
// Connection: close), then the body as it streams, then the close.
func (p *Proxy) closeDelimited(ctx *fasthttp.RequestCtx, r *relay) {
	head := append(appendHead(nil, &ctx.Response.Header, true), "Connection: close\r\n\r\n"...)
	p.hijack(ctx, func(cc net.Conn) {
		r.conn = cc
		err := r.write(cc, head, time.Now()) // under the relay's first idle deadline
		if err == nil {
			_, err = r.WriteTo(cc)
		}
		_ = r.CloseWithError(err)
		closeClient(cc) // the close delimits the body (and the server may keep hijacked connections: Config.EventLoop)
	}, func() { _ = r.CloseWithError(errHijackLost) })
}

// errHijackLost is why a response handed to the raw connection never
// started: fasthttp could not flush what it held for the connection (the
// client reset it), so it closed it without running the hijack.
var errHijackLost = errors.New("the client connection closed before it was handed over")

// hijacks holds the client connections whose response the proxy writes
// itself (a tunnel, an HTTP/1.0 stream) from the handler's Hijack until
// the hijack handler starts. fasthttp runs that handler only after it
// flushed what it holds for the connection; when the flush fails (a
// client that pipelined a request before the upgrade and reset), it closes
// the connection without running it, and the connection's StateClosed is
// the only sign. Each entry is taken exactly once: by the hijack handler,
// or by connState, which then runs its abandon function so that the
// request's resources are released and its Trace recorded. It also counts
// the hijacked connections being served, which fasthttp no longer counts,
// for shutdown. Safe for concurrent use.
type hijacks struct {
	pending sync.Map     // net.Conn (ctx.Conn()) → func() (abandon)
	running atomic.Int64 // hijack handlers registered and not returned
}

// hijack hands ctx's connection to run once the handler has returned, or,
// if fasthttp closes it instead, calls abandon on the connection's
// goroutine. run and abandon own the request from then on.
func (p *Proxy) hijack(ctx *fasthttp.RequestCtx, run func(net.Conn), abandon func()) {
	key := ctx.Conn()
	p.hj.running.Add(1)
	p.hj.pending.Store(key, abandon)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(cc net.Conn) {
		defer p.hj.running.Add(-1)
		if _, ok := p.hj.pending.LoadAndDelete(key); !ok {
			return // abandoned already; cannot happen, but run must not follow abandon
		}
		run(cc)
	})
}

// abandonHijack runs the abandon function of a hijack that never started
// on c, which fasthttp has just closed.
func (p *Proxy) abandonHijack(c net.Conn) {
	if v, ok := p.hj.pending.LoadAndDelete(c); ok {
		defer p.hj.running.Add(-1)
		v.(func())()
	}
}

// Hijacked returns the number of client connections the proxy serves
// itself (tunnels, HTTP/1.0 streams): fasthttp's Shutdown does not wait
// for them, and Inflight counts their requests until their Traces are in.
func (p *Proxy) Hijacked() int64 { return p.hj.running.Load() }

// appendHead appends a response's status line and its end-to-end header
// lines (hop-by-hop ones dropped, those any Connection header names too, as
// stripHops; and Content-Length when unframed), but not the blank line that
// ends the head. h is not changed: a forwarded 1xx's header is the one the
// final response is read into next.
func appendHead(b []byte, h *fasthttp.ResponseHeader, unframed bool) []byte {
	var buf connBuf
	named := buf[:0]
	for _, v := range h.PeekAll("Connection") { // no side effects for this name
		named = appendConnection(named, v)
	}
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(h.StatusCode()), 10)
	b = append(b, ' ')
	if msg := h.StatusMessage(); len(msg) > 0 {
		b = append(b, msg...)
	} else {
		b = append(b, fasthttp.StatusMessage(h.StatusCode())...)
	}
	b = append(b, "\r\n"...)
	for k, v := range h.All() {
		if isHopHeader(k) || hopBit(k) == altSvcBit || connectionNames(named, k) || (unframed && bytes.EqualFold(k, []byte("Content-Length"))) {
			continue
		}
		b = append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
	}
	return b
}
