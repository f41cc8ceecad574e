package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// registerProxyStats exports the proxy's connection counters, which belong
// to no single request's Trace: redials by reason, accept errors and
// refused client connections and upstream dials.
func registerProxyStats(reg prometheus.Registerer, st *proxy.Stats) {
	for _, r := range proxy.RedialReasons() {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "anvilproxy_upstream_redials_total",
			Help:        "Upstream connections not reused, or requests sent once more, by reason: idle_timeout, peer_closed and unsolicited are pooled connections closed at reuse (unsolicited also after a response that left bytes behind); reused_failed is a request re-sent on a new connection after its reused one died before any response byte, in a way that shows the engine never read it.",
			ConstLabels: prometheus.Labels{"reason": r.String()},
		}, func() float64 { return float64(st.Redials(r)) }))
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "anvilproxy_accept_errors_total",
			Help: "Failures to accept a client connection (EMFILE, ENFILE, ENOBUFS, …); the proxy backs off and keeps serving.",
		}, func() float64 { return float64(st.AcceptErrors.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "anvilproxy_upstream_dials_total",
			Help: "Upstream connections opened. An idle upstream connection serves only the client connection that used it last, so a client connection's first request dials.",
		}, func() float64 { return float64(st.UpstreamDials.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "anvilproxy_conns_refused_total",
			Help: "Client connections over --max-conns, answered 503 and closed.",
		}, func() float64 { return float64(st.ConnsRefused.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "anvilproxy_conns_idle_closed_total",
			Help: "Client connections waiting for a request (new or idle keep-alive), closed to make room for a new one at --max-conns.",
		}, func() float64 { return float64(st.IdleClosed.Load()) }),
	)
}
