package bench

import (
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// RunHTTPFloor is the floor of an HTTP proxy on fasthttp on this machine:
// fasthttp's Server in front, its HostClient behind (keep-alive, up to
// maxConns connections, the response streamed: a chunked body goes out
// chunk by chunk, each flushed), and nothing else: no recording, no
// checks, no logging. It is what the non-stream path's fasthttp and
// runtime work costs, beside the floor relay (bytes only, no HTTP). It
// runs until ln is closed, and is a benchmark target only (anvilproxy
// bench --targets floor-http), never a product.
func RunHTTPFloor(ln net.Listener, upstream string, maxConns int) error {
	// A request over maxConns waits for a connection, as anvilproxy's pool
	// does, rather than failing at once (ErrNoFreeConns: lost events).
	hc := &fasthttp.HostClient{Addr: upstream, MaxConns: maxConns, MaxConnWaitTimeout: time.Minute, StreamResponseBody: true}
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			}
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
	}
	return s.Serve(ln)
}
