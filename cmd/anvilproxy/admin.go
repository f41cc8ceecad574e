package main

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/anvilproxy/anvilproxy/histo/dashboard"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// The admin listener's bounds. Its clients are scrapers, probes, the
// dashboard and top, a handful at a time: a client that holds a connection
// without using it, or a flood of them, must not take descriptors the data
// listener's streams need.
const (
	adminReadHeaderTimeout = 10 * time.Second
	adminReadTimeout       = 30 * time.Second
	adminWriteTimeout      = time.Minute // /metrics at the label bound is well under a second
	adminIdleTimeout       = time.Minute
	maxAdminConns          = 128
)

// adminMux routes the admin endpoints: the Recorder's (/metrics, /requests,
// /healthz), /snapshot, /status, /readyz, and the dashboard at /. With a
// token, the endpoints that list requests and windows require it.
func adminMux(st *stack, token string) http.Handler {
	mux := http.NewServeMux()
	st.rec.Register(mux)
	mux.Handle("GET /snapshot", st.snaps.Handler())
	mux.Handle("GET /status", st.statusHandler())
	mux.Handle("GET /diff", st.diffHandler())
	mux.Handle("GET /readyz", st.health.readyHandler(token))
	dashboard.Register(mux)
	mis := newMisdirected(st, st.tap.log)
	for _, p := range misdirectedPaths {
		mux.Handle(p, mis)
	}
	if token == "" {
		return mux
	}
	return requireToken(mux, token, "/requests", "/snapshot", "/status", "/diff")
}

// requireToken answers 401 to a request for one of paths that does not
// carry "Authorization: Bearer token" (hasToken). The rest (/metrics for Prometheus, /healthz and
// /readyz for probes, the dashboard's static page) stays open.
func requireToken(next http.Handler, token string, paths ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range paths {
			if r.URL.Path != p {
				continue
			}
			if !hasToken(r, token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="anvilproxy admin"`)
				http.Error(w, "anvilproxy: this admin endpoint needs --admin-token as a bearer token", http.StatusUnauthorized)
				return
			}
			break
		}
		next.ServeHTTP(w, r)
	})
}

// hasToken reports whether r carries "Authorization: Bearer token". The
// comparison takes the same time whatever the guess.
func hasToken(r *http.Request, token string) bool {
	return subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) == 1
}

// adminStats counts the admin listener's accept errors and refusals; they
// are not exported (the data listener's are).
var adminStats proxy.Stats

// startAdmin serves h on its own listener, with timeouts and a connection
// bound, and returns the address it listens on.
func startAdmin(addr string, h http.Handler, log *zap.Logger) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("admin listener: %w", err)
	}
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: adminReadHeaderTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       adminIdleTimeout,
		ErrorLog:          zap.NewStdLog(log.Named("admin")),
		// At the bound, a connection waiting for a request is closed to make
		// room (GuardListener): idle clients cannot lock the probes out.
		ConnState: func(c net.Conn, s http.ConnState) {
			proxy.MarkIdle(c, s == http.StateNew || s == http.StateIdle)
		},
	}
	go func() {
		if err := hs.Serve(proxy.GuardListener(ln, maxAdminConns, &adminStats, log)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener stopped", zap.Error(err))
		}
	}()
	return ln.Addr().String(), func() { hs.Close() }, nil
}

// bearer is the header value top and tests send with a token.
func bearer(token string) string { return "Bearer " + strings.TrimSpace(token) }
