package histo

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func get(t *testing.T, h http.Handler, target string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestRequestsEndpoint(t *testing.T) {
	r, _, _ := newTest(t, Config{RecentRequests: 3})
	for id := range uint64(5) {
		tr := chat()
		tr.ID = id
		r.Record(&tr)
	}
	h := r.Handler()

	rec := get(t, h, "/requests")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var body struct {
		Requests []map[string]any `json:"requests"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Len(t, body.Requests, 3, "the ring keeps RecentRequests")
	first := body.Requests[0]
	require.Equal(t, 4.0, first["id"], "newest first")
	require.Equal(t, 1300.0, first["ttft_ms"])
	require.Equal(t, 300.0, first["time_to_first_output_ms"])
	require.Equal(t, 0.0, first["proxy_queue_ms"])
	require.Equal(t, 0.0, first["queue_ms"], "nothing was ahead of it")
	require.Equal(t, 298.5, first["prefill_ms"])
	require.Equal(t, "occupancy", first["queue_source"])
	require.Nil(t, first["cache_inferred_tokens"], "unknown is null, not 0")
	require.Equal(t, 2000.0, first["cached_tokens"])
	require.Equal(t, "chat", first["route"])
	require.Equal(t, "qwen", first["model"])
	require.Equal(t, 200.0, first["status"])
	require.Equal(t, map[string]any{
		"admit": 0.0, "sent": 2.0, "headers": 50.0, "first_event": 60.0, "first_output": 300.0,
		"first_content": 1300.0, "last_token": 2290.0, "end": 2300.0, "client_done": 2301.0,
	}, first["stamps_ms"])

	rec = get(t, h, "/requests?limit=1")
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Len(t, body.Requests, 1)
	require.Equal(t, http.StatusBadRequest, get(t, h, "/requests?limit=x").Code)
}

func TestRequestJSONRoundTrip(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	tr := chat()
	tr.PromptTokens = -1
	r.Record(&tr)
	want := r.Recent(1)[0]
	b, err := json.Marshal(want)
	require.NoError(t, err)
	require.Contains(t, string(b), `"prompt_tokens":null`)
	require.Contains(t, string(b), `"effective_prefill_tok_s":null`)
	var got Request
	require.NoError(t, json.Unmarshal(b, &got))
	require.True(t, math.IsNaN(float64(got.PrefillRate)))
	got.PrefillRate, want.PrefillRate = 0, 0 // NaN != NaN
	got.PrefixReuse, want.PrefixReuse = 0, 0
	require.Equal(t, want, got)
}

func TestSpanJSON(t *testing.T) {
	tests := []struct {
		in   Span
		want string
	}{
		{noSpan, "null"},
		{0, "0"},
		{Span(1500 * time.Microsecond), "1.5"},
		{Span(1418298300 * time.Nanosecond), "1418.2983"},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.in)
		require.NoError(t, err)
		require.Equal(t, tt.want, string(b))
		var back Span
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, tt.in, back)
	}
}

func TestAdminEndpoints(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	tr := chat()
	r.Record(&tr)
	h := r.Handler()

	rec := get(t, h, "/healthz")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "ok\n", rec.Body.String())

	rec = get(t, h, "/metrics")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), `anvilproxy_requests_total{code="200",model="qwen",route="chat"} 1`)

	rec = get(t, h, "/metrics", "Accept", "application/openmetrics-text; version=1.0.0")
	require.True(t, strings.HasPrefix(rec.Header().Get("Content-Type"), "application/openmetrics-text"))
	body, _ := io.ReadAll(rec.Body)
	require.True(t, strings.HasSuffix(string(body), "# EOF\n"))

	// Protobuf is negotiated for native histograms.
	rec = get(t, h, "/metrics", "Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited")
	require.Contains(t, rec.Header().Get("Content-Type"), "application/vnd.google.protobuf")

	require.Equal(t, http.StatusNotFound, get(t, h, "/snapshot").Code, "added by the caller")

	// The caller extends the same mux.
	mux := http.NewServeMux()
	r.Register(mux)
	mux.HandleFunc("GET /snapshot", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) })
	require.Equal(t, http.StatusOK, get(t, mux, "/snapshot").Code)
	require.Equal(t, http.StatusOK, get(t, mux, "/healthz").Code)
}
