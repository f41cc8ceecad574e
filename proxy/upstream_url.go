package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Upstream is a parsed upstream URL: everything the proxy, its probes and
// its hints need of it. ParseUpstream is the one place that reads the URL;
// every caller (the proxy, serve's probes and hints, top) uses its result.
type Upstream struct {
	Addr     string // host:port to dial, with the scheme's port when the URL has none
	Host     string // the Host header value, as the URL gives it
	Hostname string // the host without its port: the TLS server name
	TLS      bool   // https
	Prefix   string // the escaped path prefix, without a trailing slash
}

// ErrUpstreamUserinfo is the answer to credentials in the upstream URL.
// Go's net/http would turn them into an Authorization: Basic header on the
// proxy's own requests (the start-up check), while the relay forwards the
// client's Authorization unchanged: two credentials for one engine, one of
// them silent. Agents send their own key; the proxy adds none.
var ErrUpstreamUserinfo = errors.New("credentials in the upstream URL are not supported: the proxy forwards each client's Authorization header unchanged and adds none")

// ParseUpstream parses an upstream URL: http or https, a host, an optional
// port and path prefix, no credentials. Its errors say what to type for the
// usual mistakes: a bare host:port (url.Parse reads "127.0.0.1:8000" as a
// path and "localhost:8000" as scheme "localhost") and another scheme.
func ParseUpstream(raw string) (Upstream, error) {
	suggest := func(why string) error {
		bare := strings.TrimPrefix(raw, "//")
		if i := strings.Index(bare, "://"); i >= 0 {
			bare = bare[i+3:]
		}
		return fmt.Errorf("%q: %s; did you mean --upstream http://%s ?", raw, why, bare)
	}
	if raw == "" {
		return Upstream{}, errors.New("no upstream configured")
	}
	if !strings.Contains(raw, "://") {
		return Upstream{}, suggest("not a URL (no http:// or https://)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Upstream{}, suggest("not a URL")
	}
	up := Upstream{Host: u.Host, Hostname: u.Hostname(), Addr: u.Host}
	port := "80"
	switch u.Scheme {
	case "http":
	case "https":
		up.TLS, port = true, "443"
	default:
		return Upstream{}, suggest("the scheme must be http or https")
	}
	if u.Host == "" {
		return Upstream{}, suggest("no host")
	}
	if u.User != nil {
		return Upstream{}, fmt.Errorf("%q: %w", u.Redacted(), ErrUpstreamUserinfo)
	}
	if u.Port() == "" {
		up.Addr = net.JoinHostPort(up.Hostname, port)
	}
	up.Prefix = strings.TrimSuffix(u.EscapedPath(), "/")
	return up, nil
}
