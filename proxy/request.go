// The request side: the framing checks a request must pass, the upstream
// request built from the client's, and the model it names.

package proxy

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/anvilproxy/anvilproxy/sse"
)

// badFraming reports a request head the proxy refuses to forward, before
// anything reaches the upstream:
//   - both Transfer-Encoding and Content-Length. fasthttp lets
//     Transfer-Encoding win and closes the connection afterwards (RFC 9112
//     §6.3 allows that), but a request framed two ways is a smuggling
//     shape, and Envoy and Go reject it;
//   - a Transfer-Encoding other than chunked (identity): fasthttp reads it
//     as "no body" and would parse the body as the next request;
//   - a header name that is not a token ("Transfer Encoding: chunked"):
//     fasthttp keeps it, and an upstream that reads it as a framing header
//     would frame the body differently (RFC 9112 §5.1; Go answers 400).
func badFraming(h *fasthttp.RequestHeader) bool {
	chunked := h.ContentLength() == -1
	raw := h.RawHeaders()
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte("\n"))
		if len(bytes.TrimRight(line, "\r")) == 0 {
			continue
		}
		name, _, ok := bytes.Cut(line, []byte(":"))
		if !ok || !isToken(name) {
			return true
		}
		if chunked && hasHeaderName(line, "content-length:") {
			return true
		}
		if !chunked && hasHeaderName(line, "transfer-encoding:") {
			return true
		}
	}
	return false
}

// isToken reports whether b is a non-empty RFC 9110 §5.6.2 token.
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c >= 0x80 || !tokenChars[c] {
			return false
		}
	}
	return true
}

var tokenChars = func() (t [128]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func hasHeaderName(line []byte, name string) bool {
	return len(line) > len(name) && bytes.EqualFold(line[:len(name)], []byte(name))
}

// buildRequest copies the client's request into the upstream request: every
// method, path, query, header and body byte, minus hop-by-hop headers, with
// X-Forwarded-For appended and the upstream's Host. It returns a non-zero
// status when the request must be refused.
func (p *Proxy) buildRequest(ctx *fasthttp.RequestCtx, r *relay) refusal {
	req := &r.req
	ctx.Request.Header.CopyTo(&req.Header)
	req.Header.SetNoDefaultContentType(true)
	uri := ctx.Request.Header.RequestURI()
	if p.up.Prefix != "" {
		joined := make([]byte, 0, len(p.up.Prefix)+len(uri))
		uri = append(append(joined, p.up.Prefix...), uri...)
	}
	req.SetRequestURIBytes(uri)
	req.URI().DisablePathNormalizing = true
	// An absolute-form target names its own scheme; the upstream's wins, as
	// its host does (the HostClient refuses a scheme other than its own).
	if p.up.TLS {
		req.URI().SetScheme("https")
	} else {
		req.URI().SetScheme("http")
	}
	stripRequestHops(&req.Header)
	// The body is read whole before it is sent: the client had its 100
	// Continue from fasthttp, and the engine must not send another.
	req.Header.Del("Expect")
	// Trailers are asked for only on behalf of a client that takes them
	// (TE is hop-by-hop), as Go's ReverseProxy does.
	if r.trailers = hasToken(ctx.Request.Header.Peek("TE"), "trailers"); r.trailers {
		req.Header.Set("TE", "trailers")
	}
	if r.upgrade = wantsUpgrade(&ctx.Request.Header); r.upgrade {
		req.Header.SetBytesV("Upgrade", ctx.Request.Header.Peek("Upgrade"))
		req.Header.Set("Connection", "Upgrade")
	}
	if !p.cfg.NoForwardedFor {
		appendForwardedFor(&req.Header, ctx.RemoteIP())
	}
	if p.cfg.PreserveHost {
		// The client's Host, even if its Connection header named it (the
		// strip deleted it then; Go's ReverseProxy keeps req.Host too).
		req.Header.SetHostBytes(ctx.Request.Header.Host())
		req.UseHostHeader = true
	} else {
		req.Header.SetHost(p.up.Host)
	}
	req.URI().SetHost(p.up.Host)
	return p.readBody(ctx, r)
}

// requestModel returns the "model" of a JSON request body, or nil. It
// scans the top level for the key instead of decoding the body, which for
// an agent's 100 KB prompt is the difference between microseconds and a
// millisecond; only a value with escapes, or a body the scan cannot read
// with certainty, is decoded.
func requestModel(body []byte) []byte {
	if len(body) == 0 || body[0] != '{' {
		return nil
	}
	raw, res := sse.TopLevelString(body, "model")
	switch res {
	case sse.KeyAbsent:
		return nil
	case sse.KeyFound:
		if plainString(raw) {
			return raw
		}
		var s string
		if json.Unmarshal(quotedAgain(raw), &s) != nil {
			return nil
		}
		return []byte(s)
	}
	return decodeModel(body)
}

// plainString reports whether the raw contents of a JSON string are its
// value: no escape, no control byte, valid UTF-8 (encoding/json replaces
// an invalid sequence, and refuses a control byte).
func plainString(raw []byte) bool {
	ascii := true
	for _, c := range raw {
		if c == '\\' || c < 0x20 {
			return false
		}
		ascii = ascii && c < 0x80
	}
	return ascii || utf8.Valid(raw)
}

// quotedAgain puts the quotes back around a string's raw contents.
func quotedAgain(raw []byte) []byte {
	b := make([]byte, 0, len(raw)+2)
	return append(append(append(b, '"'), raw...), '"')
}

// decodeModel is requestModel by decoding the whole body, for what the
// scan leaves uncertain: keys compared exactly, the last of a repeated
// key winning, as the scan does.
func decodeModel(body []byte) []byte {
	var v map[string]json.RawMessage
	if json.Unmarshal(body, &v) != nil {
		return nil
	}
	m := v["model"]
	if len(m) < 2 || m[0] != '"' {
		return nil
	}
	var s string
	if json.Unmarshal(m, &s) != nil {
		return nil
	}
	return []byte(s)
}
