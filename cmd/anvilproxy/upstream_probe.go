package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Upstream reachability, for /readyz and the logs. Evidence comes from two
// places: a TCP connect to the upstream every --upstream-probe-interval
// (cheap: no request, nothing in the engine's access log), and the traffic
// itself (tap.go: a response from the upstream proves it reachable, a
// failed dial proves it not). The newest evidence wins. /healthz stays the
// liveness check: the process answers; /readyz says whether it can serve.

// upstreamHealth is the newest evidence of the upstream's reachability. It
// is safe for concurrent use.
type upstreamHealth struct {
	upstream string
	every    time.Duration // the probe interval; 0: no probe, no staleness
	log      *zap.Logger
	now      func() time.Time

	// okAt (unix ns of the newest success while reachable; 0 otherwise)
	// lets ok skip the lock for the traffic's evidence: a busy proxy
	// proves the upstream reachable thousands of times a second.
	okAt atomic.Int64

	mu      sync.Mutex
	lastOK  time.Time
	lastBad time.Time
	why     string // the newest failure
	since   time.Time
	state   int8 // 0 unknown, 1 reachable, -1 unreachable: logs transitions
}

func newUpstreamHealth(upstream string, every time.Duration, log *zap.Logger) *upstreamHealth {
	return &upstreamHealth{upstream: upstream, every: every, log: log, now: time.Now}
}

// okCoalesce is how close to the newest success another may be and be
// skipped: far below any probe interval.
const okCoalesce = 50 * time.Millisecond

// ok records evidence that the upstream answered at t.
func (h *upstreamHealth) ok(t time.Time) {
	if at := h.okAt.Load(); at != 0 && t.UnixNano()-at < int64(okCoalesce) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t.After(h.lastOK) {
		h.lastOK = t
	}
	if h.lastOK.After(h.lastBad) && h.state != 1 {
		if h.state == -1 {
			h.log.Info("upstream reachable again", zap.String("upstream", h.upstream), zap.Duration("unreachable_for", t.Sub(h.since).Round(time.Millisecond)))
		}
		h.state, h.since = 1, t
	}
	if h.state == 1 {
		h.okAt.Store(h.lastOK.UnixNano())
	}
}

// bad records evidence that the upstream could not be reached at t.
func (h *upstreamHealth) bad(t time.Time, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t.After(h.lastBad) {
		h.lastBad, h.why = t, why
	}
	h.okAt.Store(0)
	if !h.lastOK.After(h.lastBad) && h.state != -1 {
		h.log.Error("upstream unreachable: requests get 502 and /readyz 503 until it answers",
			zap.String("upstream", h.upstream), zap.String("error", why))
		h.state, h.since = -1, t
	}
}

// readiness is /readyz's verdict.
type readiness struct {
	Ready    bool      `json:"ready"`
	Upstream string    `json:"upstream"`
	Reason   string    `json:"reason"`
	LastOK   time.Time `json:"last_ok,omitzero"`
}

// ready judges the evidence: ready when the newest is a success and, with
// a probe running, no older than three probe intervals.
func (h *upstreamHealth) ready() readiness {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	r := readiness{Upstream: h.upstream, LastOK: h.lastOK}
	switch {
	case h.lastOK.IsZero() && h.lastBad.IsZero():
		r.Reason = "no evidence yet: the first probe of the upstream has not finished"
	case !h.lastOK.After(h.lastBad):
		r.Reason = fmt.Sprintf("upstream unreachable for %s: %s", now.Sub(h.since).Round(time.Second), h.why)
	case h.every > 0 && now.Sub(h.lastOK) > 3*h.every:
		r.Reason = fmt.Sprintf("no evidence for %s that the upstream answers (probe every %s)", now.Sub(h.lastOK).Round(time.Second), h.every)
	default:
		r.Ready = true
		r.Reason = fmt.Sprintf("upstream reachable %s ago", now.Sub(h.lastOK).Round(100*time.Millisecond))
	}
	return r
}

// readyHandler serves /readyz: 200 when ready, else 503, with the reason
// as one line of text. With an admin token, the reason and the upstream's
// address (a failure's text names it too) are for a request that carries the
// token; a probe without it gets the verdict alone, since /readyz stays open.
func (h *upstreamHealth) readyHandler(token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r := h.ready()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		word := "ready"
		if !r.Ready {
			word = "not ready"
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		if token != "" && !hasToken(req, token) {
			fmt.Fprintf(w, "%s (the reason needs --admin-token as a bearer token)\n", word)
			return
		}
		fmt.Fprintf(w, "%s: %s (%s)\n", word, r.Reason, r.Upstream)
	})
}

// probeLoop dials addr every h.every until ctx ends, recording each result.
func (h *upstreamHealth) probeLoop(ctx context.Context, addr string, timeout time.Duration) {
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.dial(ctx, addr, timeout)
	}
}

// dial makes one TCP connection to addr and closes it.
func (h *upstreamHealth) dial(ctx context.Context, addr string, timeout time.Duration) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		h.bad(h.now(), err.Error())
		return
	}
	c.Close()
	h.ok(h.now())
}

// startProbe is the probe at start: one HTTP request, GET <upstream>/v1/models
// (every OpenAI-compatible engine has it, and it costs the engine nothing),
// so that the log says at once whether the upstream answers, and whether it
// answers 404 to the path the agents will use. Any HTTP response, 401
// included, proves it reachable. It logs its finding and returns the status
// (0 when none came).
func (h *upstreamHealth) startProbe(ctx context.Context, upstream string, prefix string, timeout time.Duration, insecure bool) int {
	url := upstream + "/v1/models"
	// A Transport of its own: no HTTP_PROXY from the environment (the
	// proxy dials the engine directly, so must its probe).
	cl := &http.Client{Timeout: timeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: insecure}, //nolint:gosec // --insecure-skip-verify
	}}
	defer cl.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		h.bad(h.now(), err.Error())
		return 0
	}
	resp, err := cl.Do(req)
	if ctx.Err() != nil {
		// The stack is stopping (a listener failed to bind, or shutdown):
		// a canceled probe says nothing about the upstream.
		if resp != nil {
			resp.Body.Close()
		}
		return 0
	}
	if err != nil {
		h.bad(h.now(), err.Error())
		return 0
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	h.ok(h.now())
	fields := []zap.Field{zap.String("upstream", h.upstream), zap.String("probe", "GET "+prefix+"/v1/models"), zap.Int("status", resp.StatusCode)}
	switch {
	case resp.StatusCode == http.StatusNotFound && endsInV1(prefix):
		h.log.Warn("upstream answered 404 to the probe: "+v1Hint(h.upstream), fields...)
	case resp.StatusCode == http.StatusNotFound:
		h.log.Warn("upstream reachable, but it answered 404 to GET /v1/models: is it an OpenAI-compatible engine, and is the path prefix right?", fields...)
	default:
		h.log.Info("upstream reachable", fields...)
	}
	return resp.StatusCode
}
