package proxy

import (
	"bytes"
	"net"

	"github.com/valyala/fasthttp"
)

// hopHeaders are removed in both directions: they describe one connection,
// not the message (RFC 9110 §7.6.1; the same list as Go's httputil.ReverseProxy).
var hopHeaders = [...]string{
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

// altSvcBit is hopBit's bit for Alt-Svc, which only the response loses
// (stripResponseHops); bit i is hopHeaders[i], and allHops all of them.
const (
	altSvcBit = 1 << len(hopHeaders)
	allHops   = altSvcBit - 1
)

// hopBit returns k's bit when k names one of hopHeaders or Alt-Svc, in any
// case, else 0.
func hopBit(k []byte) uint16 {
	if len(k) < len("Te") || len(k) > len("Proxy-Authorization") {
		return 0
	}
	for i, name := range hopHeaders {
		if len(k) == len(name) && bytes.EqualFold(k, []byte(name)) {
			return 1 << i
		}
	}
	if bytes.EqualFold(k, []byte("Alt-Svc")) {
		return altSvcBit
	}
	return 0
}

// header is what fasthttp's RequestHeader and ResponseHeader share.
type header interface {
	PeekAll(key string) [][]byte
	Del(key string)
	DelBytes(key []byte)
}

// connBuf is the stack space for the Connection header's values that
// stripFound deletes: a copy, as the values alias storage that Del
// rearranges. Longer lists spill to the heap (an allocation, rare).
type connBuf [256]byte

// appendConnection appends a Connection header's value v to named, the
// values seen so far, comma-separated: every Connection field counts
// (RFC 9110 §7.6.1), as in Go's httputil.ReverseProxy.
func appendConnection(named, v []byte) []byte {
	if len(named) > 0 {
		named = append(named, ',')
	}
	return append(named, v...)
}

// connectionNames reports whether k is one of named, the comma-separated
// values of Connection headers (appendConnection), in any case.
func connectionNames(named, k []byte) bool {
	for len(named) > 0 {
		var tok []byte
		tok, named, _ = bytes.Cut(named, []byte(","))
		if bytes.EqualFold(bytes.TrimSpace(tok), k) {
			return true
		}
	}
	return false
}

// stripHops removes hop-by-hop headers, including every header any
// Connection header names (RFC 9110 §7.6.1), by deleting every name whether
// it is there or not: for a header whose names cannot be listed without
// side effects (see stripRequestHops). PeekAll("Connection") has none.
func stripHops(h header) {
	var buf connBuf
	named := buf[:0]
	for _, v := range h.PeekAll("Connection") {
		named = appendConnection(named, v)
	}
	stripFound(h, allHops, named)
}

// stripFound deletes the hop-by-hop headers whose bits are in found, and
// every header named, the comma-separated values of every Connection
// header, copied out of h by the caller. A fasthttp Del costs a
// normalization of its key and a scan of the headers whether the name is
// there or not (about 50 ns each), so only the names found are deleted.
// Deleting a name that is not there has no effect on what fasthttp writes,
// with one exception the callers handle: a request's or response's
// Connection: close is a flag that only Del("Connection") clears, and it
// is counted as found.
func stripFound(h header, found uint16, named []byte) {
	for len(named) > 0 {
		var tok []byte
		tok, named, _ = bytes.Cut(named, []byte(","))
		if tok = bytes.TrimSpace(tok); len(tok) > 0 {
			delBytes(h, tok)
		}
	}
	for i, name := range hopHeaders {
		if found&(1<<i) != 0 {
			h.Del(name)
		}
	}
}

// delBytes deletes the header named key through the concrete type: the
// interface call would make key, and so stripFound's stack buffer, escape
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

// stripRequestHops is stripHops for the upstream request, copied from the
// client's: it deletes only the hop-by-hop names the client sent. fasthttp
// v1.78 has no iteration over a request's headers without side effects
// (RequestHeader.All collects the cookies, and the Cookie header is then
// written again as "a=1; b=2"; AllInOrder normalizes the raw headers in
// place), so the names are read from the header block as it came off the
// wire (RawHeaders, which CopyTo copies). Where that block cannot be read
// with certainty (none kept, a folded line, a line without a colon) or a
// trailer is announced (Del of a trailer name edits the trailer fields),
// every name is deleted, as before.
func stripRequestHops(h *fasthttp.RequestHeader) {
	var buf connBuf
	found, named, ok := rawHopBits(h.RawHeaders(), buf[:0])
	if !ok || len(h.PeekTrailerKeys()) > 0 {
		stripHops(h)
		return
	}
	if h.ConnectionClose() { // HTTP/1.0 without keep-alive, or a close
		found |= 1
	}
	stripFound(h, found&^altSvcBit, named)
}

// rawHopBits returns the hopBits of the header names in raw, a header
// block as it came off the wire, and named with the value of every
// Connection line appended (appendConnection); ok is false when raw is
// empty or a line is not a plain "name: value".
func rawHopBits(raw, named []byte) (found uint16, _ []byte, ok bool) {
	if len(raw) == 0 {
		return 0, named, false
	}
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			break // the end of the block
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || line[0] == ' ' || line[0] == '\t' {
			return 0, named, false
		}
		bit := hopBit(bytes.TrimRight(line[:colon], " \t"))
		if bit == 1 { // Connection
			named = appendConnection(named, line[colon+1:])
		}
		found |= bit
	}
	return found, named, true
}

// stripResponseHops is stripHops for the client's response, plus Alt-Svc,
// as Caddy removes it: it would point the client around the proxy. One pass
// over the headers (ResponseHeader.All, which has no side effects without
// trailers, and yields Connection: close when that flag is set) finds the
// names to delete; a response that announces trailers has every name
// deleted, as Del of a trailer name edits the trailer fields.
func stripResponseHops(h *fasthttp.ResponseHeader) {
	if len(h.PeekTrailerKeys()) > 0 {
		stripHops(h)
		h.Del("Alt-Svc")
		return
	}
	var found uint16
	var buf connBuf
	named := buf[:0]
	for k, v := range h.All() {
		bit := hopBit(k)
		if bit == 1 { // Connection, each of them, copied before any Del
			named = appendConnection(named, v)
		}
		found |= bit
	}
	stripFound(h, found, named)
	if found&altSvcBit != 0 {
		h.Del("Alt-Svc")
	}
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
