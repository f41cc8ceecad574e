package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEngineMetricsURL: by default the upstream's root (or path prefix,
// a stray /v1 dropped) + /metrics; "off" is none; a URL is taken as is.
func TestEngineMetricsURL(t *testing.T) {
	for _, tt := range []struct{ flag, upstream, want string }{
		{"", "http://127.0.0.1:8000", "http://127.0.0.1:8000/metrics"},
		{"", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/metrics"},
		{"", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/metrics"},
		{"", "https://gw.example/engine/", "https://gw.example/engine/metrics"},
		{"off", "http://127.0.0.1:8000", ""},
		{"http://10.0.0.5:9090/metrics", "http://127.0.0.1:8000", "http://10.0.0.5:9090/metrics"},
	} {
		got, err := engineMetricsURL(tt.flag, tt.upstream)
		require.NoError(t, err, tt)
		require.Equal(t, tt.want, got, tt)
	}
	_, err := engineMetricsURL("metrics", "http://127.0.0.1:8000")
	require.Error(t, err)
}
