package proxy

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: every
// relay, watcher and upstream client goroutine must have an owner that
// stops it.
//
// -loop runs every test with Config.EventLoop on (go test ./proxy/ -loop).
func TestMain(m *testing.M) {
	loop := flag.Bool("loop", false, "run every test with Config.EventLoop on")
	flag.Parse()
	testEventLoop = *loop
	goleak.VerifyTestMain(m,
		// httptest servers' and net/http clients' idle keep-alive
		// connections outlive a test by design.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		// fasthttp's own housekeepers sleep out their period (10 s) after
		// Shutdown or the last connection closes, then exit.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		// Process-wide singletons started once by fasthttp.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		// The proxy's one client-watch goroutine (watch_linux.go).
		goleak.IgnoreAnyFunction("github.com/anvilproxy/anvilproxy/proxy.(*watchHub).run"),
		// The event loops (loop_linux.go), process-wide like the hub.
		goleak.IgnoreAnyFunction("github.com/anvilproxy/anvilproxy/proxy.(*loop).run"),
		// Idle workers (worker.go) wait out workerIdle, then exit.
		goleak.IgnoreAnyFunction("github.com/anvilproxy/anvilproxy/proxy.(*worker).wait"),
	)
}
