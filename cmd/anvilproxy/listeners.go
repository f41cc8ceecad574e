package main

import (
	"net"

	"go.uber.org/zap"
)

// What each listener exposes, said at start (and in the README's
// "Listeners"): the proxy listener relays the upstream's whole API and
// adds nothing of its own; the admin listener serves the proxy's own
// endpoints, which carry timings, counts, routes, paths and model names,
// never a prompt, a completion or a header value.
const (
	proxyExposes = "the upstream's API, every path relayed unchanged; nothing of the proxy's own"
	adminExposes = "dashboard /, /metrics, /requests, /snapshot, /status, /healthz (liveness), /readyz (upstream reachable), /diff (with --baseline): timings and counts, never content"
)

// logListeners logs each listener's bound address, what it exposes and,
// for an address on every interface, that anyone who can reach the host
// can read it.
func logListeners(log *zap.Logger, st *stack) {
	listener := func(name, addr, exposes, url string) {
		fields := []zap.Field{zap.String("listener", name), zap.String("addr", addr), zap.String("exposes", exposes), zap.String("url", url)}
		if allInterfaces(addr) {
			log.Info("listening on every interface", fields...)
			return
		}
		log.Info("listening", fields...)
	}
	listener("proxy", st.ln.Addr().String(), proxyExposes, localURL(st.ln.Addr().String())+"/v1 (the agents' OpenAI base URL; Anthropic clients: without /v1)")
	if st.adminAddr == "" {
		log.Info("no admin listener (--admin-listen is empty): no dashboard, /metrics or /readyz")
		return
	}
	listener("admin", st.adminAddr, adminExposes, localURL(st.adminAddr)+"/")
	if allInterfaces(st.adminAddr) {
		log.Warn("the admin listener is on every interface: anyone who can reach this port reads the per-request timings, routes and paths; --admin-listen 127.0.0.1:9464 keeps it local",
			zap.String("addr", st.adminAddr))
	}
}

// allInterfaces reports whether addr is bound to the unspecified address.
func allInterfaces(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// localURL is the URL of addr from this host: localhost for an address on
// every interface.
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if allInterfaces(addr) {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}
