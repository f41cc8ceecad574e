package main

import (
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/anvilproxy/anvilproxy/proxy/sim"
)

// startStackFor starts serve's wiring in front of upstream with a fast
// probe, logging into the returned buffer.
func startStackFor(t *testing.T, upstream string, opts ...func(*serveFlags)) (*stack, *lockedBuffer) {
	t.Helper()
	var f serveFlags
	f.register(flag.NewFlagSet("serve", flag.ContinueOnError))
	f.listen, f.adminListen = "127.0.0.1:0", "127.0.0.1:0"
	f.upstream, f.probeEvery = upstream, 100*time.Millisecond
	f.sim = sim.Config{PrefillTokensPerSec: 1e6, DecodeTokensPerSec: 5000}
	f.cfg.DialTimeout = time.Second
	for _, o := range opts {
		o(&f)
	}
	logs := &lockedBuffer{}
	log, err := newLogger(logs, "info")
	require.NoError(t, err)
	st, err := startStack(&f, log)
	require.NoError(t, err)
	logListeners(log, st)
	srv := st.proxy.Server()
	go srv.Serve(st.ln) //nolint:errcheck // ends at Shutdown
	t.Cleanup(func() {
		_ = srv.Shutdown()
		_ = st.close()
	})
	return st, logs
}

// get returns the status and body of a GET.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// freeAddr returns a loopback address nothing listens on (for now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestDeadUpstreamNotReady: against an upstream nobody listens on, the
// start says so, /readyz is 503 while /healthz stays 200; once the engine
// starts, /readyz turns 200 and the log says it is back.
func TestDeadUpstreamNotReady(t *testing.T) {
	addr := freeAddr(t)
	st, logs := startStackFor(t, "http://"+addr)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "upstream unreachable") }, 10*time.Second, 20*time.Millisecond)
	code, body := get(t, st.adminURL+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "not ready: upstream unreachable for ")
	require.Contains(t, body, "connection refused")
	code, body = get(t, st.adminURL+"/healthz")
	require.Equal(t, http.StatusOK, code, "liveness does not depend on the upstream")
	require.Equal(t, "ok\n", body)

	// The engine comes up on that port.
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	s, err := sim.New(sim.Config{})
	require.NoError(t, err)
	hs := &http.Server{Handler: s, ReadHeaderTimeout: time.Second}
	go hs.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { hs.Close() })
	require.Eventually(t, func() bool {
		code, _ := get(t, st.adminURL+"/readyz")
		return code == http.StatusOK
	}, 10*time.Second, 50*time.Millisecond)
	_, body = get(t, st.adminURL+"/readyz")
	require.Regexp(t, `^ready: upstream reachable \S+ ago \(http://127\.0\.0\.1:\d+\)\n$`, body)
	require.Contains(t, logs.String(), "upstream reachable again")
	require.Equal(t, 1, strings.Count(logs.String(), "upstream unreachable"), "a transition is logged once:\n%s", logs)
}

// TestProxy502IsNotTheEngines: the proxy's own 502 for a request to a
// dead engine is no evidence that the engine answers: /readyz stays 503
// and the log never says the upstream is reachable again (issue 27, 1).
// Without the probe, the traffic is the only evidence after the start.
func TestProxy502IsNotTheEngines(t *testing.T) {
	st, logs := startStackFor(t, "http://"+freeAddr(t), func(f *serveFlags) { f.probeEvery = 0 })
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "upstream unreachable") }, 10*time.Second, 20*time.Millisecond)
	for range 3 {
		resp, err := http.Post(st.proxyURL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	}
	require.Eventually(t, func() bool { return st.tap.outcomes.requests.Load() == 3 }, 5*time.Second, 10*time.Millisecond)
	code, body := get(t, st.adminURL+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "not ready: upstream unreachable")
	require.NotContains(t, logs.String(), "reachable again")
}

// TestReadinessGoesStale: with a probe interval, evidence older than three
// intervals is not enough; a failed dial in traffic wins over an older
// success.
func TestReadinessGoesStale(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newUpstreamHealth("http://e", time.Second, zap.NewNop())
	h.now = func() time.Time { return now }
	require.False(t, h.ready().Ready)
	require.Contains(t, h.ready().Reason, "no evidence yet")
	h.ok(now)
	require.True(t, h.ready().Ready)
	now = now.Add(3500 * time.Millisecond)
	require.False(t, h.ready().Ready)
	require.Contains(t, h.ready().Reason, "no evidence for 4s")
	h.ok(now)
	h.bad(now.Add(time.Millisecond), "a request's dial failed")
	require.False(t, h.ready().Ready)
	h.ok(now.Add(-time.Second)) // older evidence does not override newer
	require.False(t, h.ready().Ready)
	h.ok(now.Add(2 * time.Millisecond))
	require.True(t, h.ready().Ready)
}

// TestUpstreamEndingInV1: the start warns, the start probe explains its
// 404, and a 404 in traffic is explained in the log with the doubled path.
func TestUpstreamEndingInV1(t *testing.T) {
	simAddr, stop, err := startEmbeddedSim(sim.Config{})
	require.NoError(t, err)
	t.Cleanup(stop)
	st, logs := startStackFor(t, "http://"+simAddr+"/v1")
	require.Contains(t, logs.String(), "the upstream URL ends in /v1")
	require.Contains(t, logs.String(), "Give the engine's root instead: --upstream http://"+simAddr+" ")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "upstream answered 404 to the probe") }, 10*time.Second, 20*time.Millisecond)
	code, _ := get(t, st.proxyURL+"/v1/models")
	require.Equal(t, http.StatusNotFound, code)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"upstream_path":"/v1/v1/models"`) }, 5*time.Second, 20*time.Millisecond)
	for range 3 {
		get(t, st.proxyURL+"/v1/models")
	}
	require.Equal(t, 1, strings.Count(logs.String(), `"upstream_path"`), "the hint is rate-limited")
	code, _ = get(t, st.adminURL+"/readyz")
	require.Equal(t, http.StatusOK, code, "a 404 is an answer: the upstream is reachable")
}

// TestListenersLogged: the start says where each listener is bound and
// what it exposes.
func TestListenersLogged(t *testing.T) {
	st, logs := startStackFor(t, "sim")
	out := logs.String()
	require.Contains(t, out, `"listener":"proxy","addr":"`+st.ln.Addr().String()+`","exposes":"the upstream's API`)
	require.Contains(t, out, `"listener":"admin","addr":"`+st.adminAddr+`","exposes":"dashboard /, /metrics, /requests, /snapshot, /status, /healthz (liveness), /readyz`)
	require.NotContains(t, out, "every interface", "loopback only here")
	require.True(t, allInterfaces(":9464"))
	require.True(t, allInterfaces("[::]:9464"))
	require.True(t, allInterfaces("0.0.0.0:9464"))
	require.False(t, allInterfaces("127.0.0.1:9464"))
	require.Equal(t, "http://localhost:8080", localURL("[::]:8080"))
}

// TestKubernetesProbesServed: the Deployment's readiness probe follows the
// upstream and its liveness probe does not, on a running stack.
func TestKubernetesProbesServed(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(configsDir, "kubernetes", "deployment.yaml"))
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	c := doc["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	path := func(probe string) string {
		g := c[probe].(map[string]any)["httpGet"].(map[string]any)
		require.Equal(t, "admin", g["port"])
		return g["path"].(string)
	}
	ready, live := path("readinessProbe"), path("livenessProbe")
	require.Equal(t, "/readyz", ready)
	require.Equal(t, "/healthz", live)

	up, _ := startStackFor(t, "sim")
	require.Eventually(t, func() bool { code, _ := get(t, up.adminURL+ready); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	code, _ := get(t, up.adminURL+live)
	require.Equal(t, http.StatusOK, code)

	down, logs := startStackFor(t, "http://"+freeAddr(t))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "upstream unreachable") }, 10*time.Second, 20*time.Millisecond)
	code, _ = get(t, down.adminURL+ready)
	require.Equal(t, http.StatusServiceUnavailable, code)
	code, _ = get(t, down.adminURL+live)
	require.Equal(t, http.StatusOK, code)
}
