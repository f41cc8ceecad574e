package proxy

import (
	"context"
	"time"

	"github.com/valyala/fasthttp"
)

// Shutdown stops srv, a Server of p, gracefully: no new connections, and
// it returns once every request in flight has recorded its Trace, or with
// ctx's error when ctx ends first (then Abort cuts the rest). fasthttp's
// own Shutdown does not wait for a stream the event loop relays (its
// connection is hijacked), so the wait is on Inflight. A stream that ends
// from now on closes its client connection instead of handing it back.
func (p *Proxy) Shutdown(ctx context.Context, srv *fasthttp.Server) error {
	p.draining.Store(true)
	if err := srv.ShutdownWithContext(ctx); err != nil {
		return err
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for p.Inflight() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// testEventLoop turns Config.EventLoop on in every Proxy: set by the
// package's tests (go test -loop), so that each test runs on either relay.
var testEventLoop bool
