package main

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// checkUpstream validates an --upstream URL before the proxy parses it, so
// that the usual mistakes get an answer that says what to type: a bare
// host:port (url.Parse reads "127.0.0.1:8000" as a path with a colon and
// "localhost:8000" as scheme "localhost") and a scheme other than http(s).
// It returns the dial address (host:port) and the path prefix.
func checkUpstream(raw string) (addr, prefix string, err error) {
	suggest := func(why string) error {
		bare := strings.TrimPrefix(raw, "//")
		if i := strings.Index(bare, "://"); i >= 0 {
			bare = bare[i+3:]
		}
		return fmt.Errorf("--upstream %q: %s; did you mean --upstream http://%s ?", raw, why, bare)
	}
	if !strings.Contains(raw, "://") {
		return "", "", suggest("not a URL (no http:// or https://)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", suggest("not a URL")
	}
	port := "80"
	switch u.Scheme {
	case "http":
	case "https":
		port = "443"
	default:
		return "", "", suggest("the scheme must be http or https")
	}
	if u.Host == "" {
		return "", "", suggest("no host")
	}
	addr = u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	return addr, strings.TrimSuffix(u.EscapedPath(), "/"), nil
}

// redacted is raw with any password replaced by "xxxxx", for /readyz,
// /status and the logs: the admin listener may be reachable by others.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}

// endsInV1 reports whether an upstream path prefix ends in /v1: the
// OpenAI base URL of an engine, where anvilproxy wants the engine's root.
func endsInV1(prefix string) bool { return strings.HasSuffix(prefix, "/v1") }

// v1Hint explains the doubled path of an upstream that ends in /v1.
func v1Hint(upstream string) string {
	root := strings.TrimSuffix(strings.TrimSuffix(upstream, "/"), "/v1")
	return fmt.Sprintf("the upstream URL ends in /v1, and the proxy appends the client's whole path: "+
		"a client's /v1/chat/completions goes to /v1/v1/chat/completions, which engines answer 404. "+
		"Give the engine's root instead: --upstream %s (the agents keep .../v1 in their base URL)", root)
}
