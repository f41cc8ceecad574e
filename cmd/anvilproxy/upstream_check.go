package main

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// checkUpstream parses an --upstream URL with proxy.ParseUpstream, the one
// parser of it, and names the flag in its error.
func checkUpstream(raw string) (proxy.Upstream, error) {
	up, err := proxy.ParseUpstream(raw)
	if err != nil {
		return up, fmt.Errorf("--upstream %w", err)
	}
	return up, nil
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
