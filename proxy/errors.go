package proxy

import (
	"errors"
	"net"
	"os"
	"strconv"

	"github.com/valyala/fasthttp"
)

// StatusClientClosed is recorded for a request whose client went away
// before the response began (nginx's 499); the client never sees it.
const StatusClientClosed = 499

// refusal is why the proxy answered a request itself instead of relaying
// the engine's answer. refusals is the one table where a refusal becomes
// what the client gets (its status, and whether the connection can carry
// another request) and what the Trace records (side and kind), like
// Caddy's statusError: every path that refuses goes through Proxy.refuse.
type refusal uint8

// Refusals.
const (
	refuseFraming           refusal = iota + 1 // a request framed two ways, or with a name that is not a token
	refuseBadRequest                           // a request fasthttp or the proxy could not read
	refuseReadTimeout                          // the request was not read within --read-timeout
	refuseHeadersTooLarge                      // request headers over --max-header-bytes
	refuseBodyTooLarge                         // a body over --max-body-bytes
	refuseClientGone                           // the client left before an answer
	refuseOverloaded                           // request bodies in flight over --max-inflight-body-bytes
	refusePoolExhausted                        // no upstream connection free within --max-conn-wait
	refuseQueueFull                            // the limiter's queue is full
	refuseQueueWait                            // the limiter's wait exceeded --max-queue-wait
	refuseConnect                              // dialing the upstream failed
	refuseUpstreamTimeout                      // the upstream was silent past --upstream-read-timeout before its head
	refuseUpstreamBroken                       // the upstream closed, reset or answered malformed before its head
	refuseUnsolicitedSwitch                    // the upstream answered 101 to a request that asked for no such upgrade
	refuseInternal                             // a bug: the handler panicked
	refuseVersion                              // a request line naming an HTTP version other than 1.0 or 1.1
)

// after says what becomes of the client connection after a refusal.
type after uint8

const (
	keepAlive   after = iota // the request was read whole: the next one may follow
	closeConn                // where the next request starts is unknown: close
	lingerAfter              // close, but drain the unread body first (lingerClose)
)

var refusals = [...]struct {
	status int
	side   Side
	kind   ErrKind
	after  after
}{
	refuseFraming:         {fasthttp.StatusBadRequest, SideClient, ErrBadRequest, closeConn},
	refuseBadRequest:      {fasthttp.StatusBadRequest, SideClient, ErrBadRequest, lingerAfter},
	refuseReadTimeout:     {fasthttp.StatusRequestTimeout, SideClient, ErrBadRequest, lingerAfter},
	refuseHeadersTooLarge: {fasthttp.StatusRequestHeaderFieldsTooLarge, SideClient, ErrBadRequest, closeConn},
	refuseBodyTooLarge:    {fasthttp.StatusRequestEntityTooLarge, SideClient, ErrBodyTooLarge, lingerAfter},
	refuseClientGone:      {StatusClientClosed, SideClient, ErrClientGone, lingerAfter},
	refuseOverloaded:      {fasthttp.StatusServiceUnavailable, SideProxy, ErrOverloaded, lingerAfter},
	refusePoolExhausted:   {fasthttp.StatusServiceUnavailable, SideProxy, ErrPoolExhausted, keepAlive},
	refuseQueueFull:       {fasthttp.StatusTooManyRequests, SideProxy, ErrLimited, keepAlive},
	refuseQueueWait:       {fasthttp.StatusServiceUnavailable, SideProxy, ErrLimited, keepAlive},
	refuseConnect:         {fasthttp.StatusBadGateway, SideUpstream, ErrConnect, keepAlive},
	refuseUpstreamTimeout: {fasthttp.StatusGatewayTimeout, SideUpstream, ErrUpstreamTimeout, keepAlive},
	refuseUpstreamBroken:  {fasthttp.StatusBadGateway, SideUpstream, ErrUpstreamBroken, keepAlive},
	// The client's request was read whole; only the upstream connection,
	// now speaking who knows what, is lost (never pooled: relay.upgraded).
	refuseUnsolicitedSwitch: {fasthttp.StatusBadGateway, SideUpstream, ErrUpstreamBroken, keepAlive},
	refuseInternal:          {fasthttp.StatusInternalServerError, SideProxy, ErrInternal, closeConn},
	refuseVersion:           {fasthttp.StatusHTTPVersionNotSupported, SideClient, ErrBadRequest, closeConn},
}

// upstreamFailure maps an error from the upstream round trip (before any
// response byte reached the client): unreachable, silent, or broken.
func upstreamFailure(err error) refusal {
	var de *dialError
	switch {
	case errors.As(err, &de):
		return refuseConnect
	case isTimeout(err):
		return refuseUpstreamTimeout
	}
	return refuseUpstreamBroken
}

// streamFailure classifies an error reading the upstream body mid-response.
func streamFailure(err error) ErrKind {
	if isTimeout(err) {
		return ErrUpstreamTimeout
	}
	return ErrUpstreamBroken
}

func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

var errMessages = [...]string{
	ErrNone:            "error",
	ErrConnect:         "upstream unreachable",
	ErrUpstreamTimeout: "upstream timed out",
	ErrUpstreamBroken:  "upstream sent an invalid or incomplete response",
	ErrClientGone:      "client went away",
	ErrBodyTooLarge:    "request body too large",
	ErrBadRequest:      "bad request",
	ErrPoolExhausted:   "no free upstream connection",
	ErrLimited:         "too many requests waiting for the upstream",
	ErrShutdown:        "proxy shutting down",
	ErrOverloaded:      "too many request bytes in flight, retry later",
	ErrInternal:        "internal error",
}

// writeError answers with a small OpenAI-style JSON error that SDKs parse.
// It names the kind of failure and, for a failure on the upstream's side
// (upstreamHost is then non-empty), the upstream (operator configuration):
// never anything taken from the request, so no prompt or key can leak. A
// refusal of the client's own request names no upstream: the engine was
// never involved.
func writeError(ctx *fasthttp.RequestCtx, status int, kind ErrKind, upstreamHost string) {
	msg := "error"
	if int(kind) < len(errMessages) {
		msg = errMessages[kind]
	}
	b := make([]byte, 0, 160)
	b = append(b, `{"error":{"message":"anvilproxy: `...)
	b = append(b, msg...)
	if upstreamHost != "" {
		b = append(b, " ("...)
		b = appendJSONSafe(b, upstreamHost)
		b = append(b, ')')
	}
	b = append(b, `","type":"`...)
	b = append(b, kind.String()...)
	b = append(b, `","code":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, "}}\n"...)
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	if kind == ErrOverloaded {
		ctx.Response.Header.Set("Retry-After", "1") // a memory bound passes in moments, not minutes
	}
	ctx.SetBody(b)
}

// appendJSONSafe appends s keeping only bytes that need no JSON escaping.
func appendJSONSafe(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x20 && c != '"' && c != '\\' && c < 0x7f {
			b = append(b, c)
		}
	}
	return b
}
