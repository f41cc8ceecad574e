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

// upstreamFailure maps an error from the upstream round trip (before any
// response byte reached the client) to the status the client gets. This is
// the one place where errors become statuses, like Caddy's statusError:
// 502 when the upstream is unreachable or answers badly, 504 when it is
// silent past the read timeout.
func upstreamFailure(err error) (int, ErrKind) {
	var de *dialError
	switch {
	case errors.As(err, &de):
		return fasthttp.StatusBadGateway, ErrConnect
	case isTimeout(err):
		return fasthttp.StatusGatewayTimeout, ErrUpstreamTimeout
	}
	return fasthttp.StatusBadGateway, ErrUpstreamBroken
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
// It names the upstream (operator configuration) and the kind of failure,
// never anything taken from the request, so no prompt or key can leak.
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
