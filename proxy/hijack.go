package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
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
// two connections are joined until either side closes.
func (p *Proxy) switchProtocols(ctx *fasthttp.RequestCtx, r *relay) {
	tr := &r.tr
	tr.Status = fasthttp.StatusSwitchingProtocols
	if !r.upgrade || !bytes.EqualFold(bytes.TrimSpace(r.resp.Header.Peek("Upgrade")), bytes.TrimSpace(ctx.Request.Header.Peek("Upgrade"))) {
		r.upgraded = true // never pooled: the connection left HTTP
		r.fail(SideUpstream, ErrUpstreamBroken)
		p.answerError(ctx, r, fasthttp.StatusBadGateway)
		return
	}
	r.endWatch() // the tunnel reads the client from now on
	head := switchHead(&r.resp.Header)
	r.upgraded = true
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(cc net.Conn) { p.tunnel(r, cc, head) })
}

// switchHead is the 101 as the client gets it: the upstream's headers minus
// hop-by-hop ones, with the Upgrade and Connection that make the switch.
func switchHead(h *fasthttp.ResponseHeader) []byte {
	b := appendHead(nil, h, false)
	b = append(append(append(b, "Upgrade: "...), bytes.TrimSpace(h.Peek("Upgrade"))...), "\r\nConnection: Upgrade\r\n\r\n"...)
	return b
}

// tunnel copies bytes both ways between the client and the upstream until
// either side closes or fails, then closes both, as Go's ReverseProxy does
// for upgraded connections. It runs on the goroutine fasthttp starts for
// the hijacked connection, and ends the request's Trace.
func (p *Proxy) tunnel(r *relay, cc net.Conn, head []byte) {
	c := r.up.Load()
	_ = cc.SetDeadline(time.Time{})
	if _, err := cc.Write(head); err != nil {
		r.fail(SideClient, ErrClientGone)
		p.endTunnel(r, c)
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // client → upstream
		defer wg.Done()
		r.tr.TunnelUp, _ = io.Copy(c.Conn, cc)
		_ = c.Close()
		_ = cc.Close()
	}()
	// upstream → client: what fasthttp's reader already holds comes first.
	var err error
	r.tr.TunnelDown, err = io.CopyBuffer(cc, c.br, r.buf)
	_ = cc.Close()
	_ = c.Close()
	wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		r.fail(SideUpstream, ErrUpstreamBroken)
	}
	p.endTunnel(r, c)
}

func (p *Proxy) endTunnel(r *relay, c *upConn) {
	_ = c.Close()
	now := time.Now()
	r.tr.Upgraded = true
	r.tr.End, r.tr.ClientDone = now, now
	r.atEOF = true
	p.finish(r)
}

// closeDelimited hands an HTTP/1.0 client's response to the raw
// connection: the head (no Content-Length, no Transfer-Encoding,
// Connection: close), then the body as it streams, then the close.
func (p *Proxy) closeDelimited(ctx *fasthttp.RequestCtx, r *relay) {
	head := append(appendHead(nil, &ctx.Response.Header, true), "Connection: close\r\n\r\n"...)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(cc net.Conn) {
		r.conn = cc
		_, err := cc.Write(head)
		if err == nil {
			_, err = r.WriteTo(cc)
		}
		_ = r.CloseWithError(err)
		_ = cc.Close() // the close delimits the body (and the server may keep hijacked connections)
	})
}

// appendHead appends a response's status line and its end-to-end header
// lines (hop-by-hop ones dropped, and Content-Length when unframed), but
// not the blank line that ends the head.
func appendHead(b []byte, h *fasthttp.ResponseHeader, unframed bool) []byte {
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
		if isHopHeader(k) || (unframed && bytes.EqualFold(k, []byte("Content-Length"))) {
			continue
		}
		b = append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
	}
	return b
}
