package sim

import (
	"net/http"
	"time"
)

// DefaultKeepAliveTimeout is how long the simulator keeps an idle
// keep-alive connection open: uvicorn's default (--timeout-keep-alive 5),
// in front of vLLM and SGLang. A pooled client connection idle for longer
// is closed by the engine, which is what agents pausing between turns to run
// tools meet in production.
const DefaultKeepAliveTimeout = 5 * time.Second

// readHeaderTimeout bounds a client that opens a connection and sends no
// request; it never limits a generation.
const readHeaderTimeout = 10 * time.Second

// HTTPServer returns a new http.Server that serves s with the engine's
// connection behaviour: idle keep-alive connections are closed after
// Config.KeepAliveTimeout (never when it is negative). Serve s through it —
// a bare httptest.NewServer(s) or &http.Server{Handler: s} keeps idle
// connections forever, as no engine behind uvicorn does. For httptest:
//
//	ts := httptest.NewUnstartedServer(s)
//	ts.Config = s.HTTPServer()
//	ts.Start()
//
// The caller owns the returned server (Serve, Close, Shutdown).
func (s *Server) HTTPServer() *http.Server {
	hs := &http.Server{Handler: s, ReadHeaderTimeout: readHeaderTimeout}
	if d := s.cfg.KeepAliveTimeout; d > 0 {
		hs.IdleTimeout = d
	} else {
		hs.IdleTimeout = -1 // no idle timeout (a zero IdleTimeout would fall back to ReadTimeout)
	}
	return hs
}
