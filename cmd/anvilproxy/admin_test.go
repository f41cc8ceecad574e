package main

import (
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
// cannot take more than its bound of descriptors: one past it gets 503 and
// is closed, and once they go the listener serves again.
func TestAdminConnectionBound(t *testing.T) {
	_, upURL := startTapSim(t, 20)
	s := startProc(t, upURL)
	addr := strings.TrimPrefix(s.adminURL, "http://")
	conns := openIdle(t, addr, maxAdminConns)
	extra, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer extra.Close()
	require.NoError(t, extra.SetDeadline(time.Now().Add(5*time.Second)))
	require.Equal(t, http.StatusServiceUnavailable, statusOf(extra), "the connection past the bound was served")
	for _, c := range conns {
		c.Close()
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.adminURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 5*time.Second, 20*time.Millisecond)
}
