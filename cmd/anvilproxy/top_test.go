package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRequestsThroughTheProxy: /requests lists a probe the engine answered
// 404 with its route, method, path (no query string) and status, and an
// inference request with its conversation and turn.
func TestRequestsThroughTheProxy(t *testing.T) {
	st, _ := startStackFor(t, "sim")
	st.chat(t)
	code, _ := get(t, st.proxyURL+"/v1/no/such/thing?api_key=SECRET-IN-QUERY#frag")
	require.Equal(t, http.StatusNotFound, code)

	var body string
	require.Eventually(t, func() bool {
		_, body = get(t, st.adminURL+"/requests")
		return strings.Count(body, `"id":`) == 2
	}, 5*time.Second, 20*time.Millisecond)
	require.NotContains(t, body, "SECRET-IN-QUERY")
	require.NotContains(t, body, "frag")
	var got struct{ Requests []map[string]any }
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	probe, turn := got.Requests[0], got.Requests[1] // newest first
	require.Equal(t, "other", probe["route"])
	require.Equal(t, "GET", probe["method"])
	require.Equal(t, "/v1/no/such/thing", probe["path"])
	require.EqualValues(t, 404, probe["status"])
	require.Nil(t, probe["conversation"])
	require.Nil(t, probe["turn"])

	require.Equal(t, "chat", turn["route"])
	require.Equal(t, "/v1/chat/completions", turn["path"])
	require.Regexp(t, `^[0-9a-f]{16}$`, turn["conversation"])
	require.EqualValues(t, 0, turn["turn"])
}

// TestTopAgainstARunningProxy drives "anvilproxy top" non-interactively
// against a serving stack: one table, a fixed number of plain lines, and
// the error for an address where nothing listens.
func TestTopAgainstARunningProxy(t *testing.T) {
	st, _ := startStackFor(t, "sim")
	for range 3 {
		st.chat(t)
	}
	get(t, st.proxyURL+"/v1/models") // not inference: not counted as a request

	require.Eventually(t, func() bool {
		_, out, _ := runCmd("top", "--once", st.adminURL)
		return strings.Contains(out, "upstream  ready")
	}, 5*time.Second, 50*time.Millisecond)
	code, out, errOut := runCmd("top", "--once", st.adminURL)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Len(t, lines, 7, out)
	// Three identical bodies from one client: the retry tracker takes the
	// second and third for retries of the first.
	require.Regexp(t, `^  up 0:\d\d   since start: 3 requests, 0 failed, 2 retries   0 in flight$`, lines[0])
	require.Regexp(t, `^  last \d+s +queue   prefill      ttfo      ttft      tpot$`, lines[1])
	require.Regexp(t, `^  p50 ms  `, lines[2])
	require.Regexp(t, `^  p99 ms  `, lines[3])
	require.Regexp(t, `^  last \d+s +\d+\.\d req/s   cache hit \S+ of prompt tokens, inferred \S+$`, lines[4])
	require.Regexp(t, `^  since start  goodput 100\.0% \(no SLO: requests that did not fail\)   retry amplification 3\.00x$`, lines[5])
	require.Regexp(t, `^  upstream  ready: upstream reachable \S+ ago  \(http://127\.0\.0\.1:\d+\)$`, lines[6])

	// host:port works as well as a URL; --count prints that many lines.
	code, out, errOut = runCmd("top", "--count", "2", "--plain", "--interval", "50ms", strings.TrimPrefix(st.adminURL, "http://"))
	require.Equal(t, 0, code, errOut)
	lines = strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Len(t, lines, 2, out)
	for _, l := range lines {
		require.Regexp(t, `^  up 0:\d\d  since start: 3 requests, 0 failed, 2 retries  0 in flight \| last \d+s p50/p99 ms  queue `, l)
	}

	code, _, errOut = runCmd("top", "--once", "http://"+freeAddr(t))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "/status: ")
	require.Contains(t, errOut, "connection refused (is anvilproxy serving there? --admin-listen sets the address)")
}
