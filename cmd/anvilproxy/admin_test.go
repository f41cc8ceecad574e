package main

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// adminGet fetches an admin path with an optional bearer token and returns
// the status.
func adminGet(t *testing.T, url, token string) int {
	code, _ := adminFetch(t, url, token)
	return code
}

// adminFetch fetches an admin path with an optional bearer token and returns
// the status and the body.
func adminFetch(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestAdminToken (A1): with --admin-token, the endpoints that list requests
// and windows need it as a bearer token; /metrics, /healthz, /readyz and the
// dashboard page stay open for scrapers and probes; top passes it on.
func TestAdminToken(t *testing.T) {
	_, upURL := startTapSim(t, 20)
	s := startProc(t, upURL, "--admin-token", "s3cret")
	for _, path := range []string{"/requests", "/snapshot", "/status"} {
		require.Equal(t, http.StatusUnauthorized, adminGet(t, s.adminURL+path, ""), path)
		require.Equal(t, http.StatusUnauthorized, adminGet(t, s.adminURL+path, "wrong"), path)
		require.Equal(t, http.StatusOK, adminGet(t, s.adminURL+path, "s3cret"), path)
	}
	for _, path := range []string{"/metrics", "/healthz", "/"} {
		require.Equal(t, http.StatusOK, adminGet(t, s.adminURL+path, ""), path)
	}
	// /readyz stays open for probes, but the reason, which names the
	// upstream, is for the token's holder.
	host := strings.TrimPrefix(upURL, "http://")
	require.Eventually(t, func() bool { return adminGet(t, s.adminURL+"/readyz", "") == http.StatusOK }, 5*time.Second, 20*time.Millisecond)
	_, open := adminFetch(t, s.adminURL+"/readyz", "")
	require.Equal(t, "ready (the reason needs --admin-token as a bearer token)\n", open)
	_, full := adminFetch(t, s.adminURL+"/readyz", "s3cret")
	require.Contains(t, full, host)
	var out, errOut bytes.Buffer
	require.Error(t, runTop([]string{"--once", s.adminURL}, &out, &errOut))
	require.NoError(t, runTop([]string{"--once", "--admin-token", "s3cret", s.adminURL}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "requests")
	require.NotContains(t, s.stderr.String(), "s3cret", "the token reached the log")
}

// TestAdminConnectionBound (A1): idle connections to the admin listener
// cannot take more than its bound of descriptors, and cannot lock the
// probes out either: with the bound full of idle ones (half never sent a
// request, half idle between keep-alive requests), /healthz, /readyz and
// /metrics still answer 200, because the connection idle the longest is
// closed to make room. They answered 503, and the manifests point liveness
// and readiness at this port. Connections that are busy are never closed
// for room: past the bound a busy listener refuses with 503.
func TestAdminConnectionBound(t *testing.T) {
	_, upURL := startTapSim(t, 20)
	s := startProc(t, upURL)
	addr := strings.TrimPrefix(s.adminURL, "http://")
	conns := openIdle(t, addr, maxAdminConns/2)
	for range maxAdminConns / 2 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		conns = append(conns, c) // idle keep-alive from now on
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
		resp, err := client.Get(s.adminURL + path)
		require.NoError(t, err, path)
		resp.Body.Close()
		require.NotEqual(t, http.StatusServiceUnavailable, resp.StatusCode, "%s: idle connections locked the probe out", path)
	}
	closed := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	require.GreaterOrEqual(t, closed, 3, "the bound was not kept: no idle connection closed for the probes")
}
