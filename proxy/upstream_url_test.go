package proxy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseUpstream: the one parser of the upstream URL gives the dial
// address with the scheme's port, the Host header as written, the TLS
// server name and the path prefix; credentials are refused without being
// echoed.
func TestParseUpstream(t *testing.T) {
	for raw, want := range map[string]Upstream{
		"http://gpu-box:8000":         {Addr: "gpu-box:8000", Host: "gpu-box:8000", Hostname: "gpu-box"},
		"https://gpu-box/engine/v1/":  {Addr: "gpu-box:443", Host: "gpu-box", Hostname: "gpu-box", TLS: true, Prefix: "/engine/v1"},
		"http://[::1]/":               {Addr: "[::1]:80", Host: "[::1]", Hostname: "::1"},
		"http://127.0.0.1:8000/a%2Fb": {Addr: "127.0.0.1:8000", Host: "127.0.0.1:8000", Hostname: "127.0.0.1", Prefix: "/a%2Fb"},
	} {
		got, err := ParseUpstream(raw)
		require.NoError(t, err, raw)
		require.Equal(t, want, got, raw)
	}
	for raw, msg := range map[string]string{
		"":                      "no upstream configured",
		"127.0.0.1:8000":        "did you mean --upstream http://127.0.0.1:8000 ?",
		"ftp://gpu-box":         "the scheme must be http or https",
		"http://":               "no host",
		"http://u:s3cret@gpu:1": "credentials in the upstream URL are not supported",
	} {
		_, err := ParseUpstream(raw)
		require.ErrorContains(t, err, msg, raw)
		require.NotContains(t, err.Error(), "s3cret", raw)
	}
}
