package proxy

import (
	"bytes"
	"net"

	"github.com/valyala/fasthttp"
)

// hopHeaders are removed in both directions: they describe one connection,
// not the message (RFC 9110 §7.6.1; the same list as Go's httputil.ReverseProxy).
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection", // non-standard, sent by old clients
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// isHopHeader reports whether k is one of hopHeaders.
func isHopHeader(k []byte) bool {
	for _, name := range hopHeaders {
		if bytes.EqualFold(k, []byte(name)) {
			return true
		}
	}
	return false
}

// header is what fasthttp's RequestHeader and ResponseHeader share.
type header interface {
	Peek(key string) []byte
	Del(key string)
	DelBytes(key []byte)
}

// stripHops removes hop-by-hop headers, including every header the Connection
// header names (RFC 9110 §7.6.1).
func stripHops(h header) {
	// Copy first: the Peek result aliases storage that Del rearranges.
	var buf [256]byte
	named := append(buf[:0], h.Peek("Connection")...)
	for len(named) > 0 {
		var tok []byte
		tok, named, _ = bytes.Cut(named, []byte(","))
		if tok = bytes.TrimSpace(tok); len(tok) > 0 {
			delBytes(h, tok)
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// delBytes deletes the header named key through the concrete type: the
// interface call would make key, and so stripHops's stack buffer, escape
// (an allocation of 256 B twice per request).
func delBytes(h header, key []byte) {
	switch h := h.(type) {
	case *fasthttp.RequestHeader:
		h.DelBytes(key)
	case *fasthttp.ResponseHeader:
		h.DelBytes(key)
	default: // none but the two: a copy, so that key does not escape
		h.DelBytes(append([]byte(nil), key...))
	}
}

// stripResponseHops also removes Alt-Svc, as Caddy does: it would point the
// client around the proxy.
func stripResponseHops(h *fasthttp.ResponseHeader) {
	stripHops(h)
	h.Del("Alt-Svc")
}

// appendForwardedFor appends the client's address to X-Forwarded-For, like
// Go's ReverseProxy Director and HAProxy's "option forwardfor".
func appendForwardedFor(h *fasthttp.RequestHeader, ip net.IP) {
	if ip == nil {
		return
	}
	var buf [128]byte
	v := buf[:0]
	if prior := h.Peek("X-Forwarded-For"); len(prior) > 0 {
		v = append(v, prior...)
		v = append(v, ", "...)
	}
	v, _ = ip.AppendText(v)
	h.SetBytesV("X-Forwarded-For", v)
}

// announceTrailers declares to the client the trailer fields the engine
// declared (the Trailer header is hop-by-hop, so stripResponseHops removed
// it), for a client that accepts trailers.
func announceTrailers(dst, src *fasthttp.ResponseHeader) {
	for _, k := range src.PeekTrailerKeys() {
		_ = dst.AddTrailerBytes(k)
	}
}

// copyTrailers copies the trailer values the engine sent after its body,
// which fasthttp writes after the client's last chunk.
func copyTrailers(dst, src *fasthttp.ResponseHeader) {
	for _, k := range src.PeekTrailerKeys() {
		if v := src.PeekBytes(k); len(v) > 0 {
			dst.SetBytesKV(k, v)
		}
	}
}
