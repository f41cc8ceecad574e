package proxy

// Drain marks the proxy as shutting down, before the server's Shutdown:
// a stream the event loop ends from then on closes its client connection
// instead of handing it back to the server, which would serve it again
// after its Shutdown returned. The wait for the streams themselves is on
// Inflight (they count there until their Trace is recorded).
func (p *Proxy) Drain() { p.draining.Store(true) }

// testEventLoop turns Config.EventLoop on in every Proxy: set by the
// package's tests (go test -loop), so that each test runs on either relay.
var testEventLoop bool
