package conformance

import "testing"

// foreignHost is a name ollama does not serve: its allowed-hosts check
// answers 403 with an empty body to a loopback request naming it.
const foreignHost = "agents.anvil.example"

// TestUpstreamHostSent: a client that names the proxy by a host ollama
// does not know still gets a 200, because the proxy sends the upstream's
// own host; the same request sent straight to ollama gets 403.
func TestUpstreamHostSent(t *testing.T) {
	st := newStack(t)
	rt := routes[0]
	direct := do(t, st.engine, rt.path, rt.body(plainModel, ""), foreignHost, 0)
	if direct.status != 403 || len(direct.body) != 0 {
		t.Fatalf("direct with Host %s: status %d, %d body bytes; want ollama's 403 with an empty body", foreignHost, direct.status, len(direct.body))
	}
	proxied := do(t, st.proxyURL, rt.path, rt.body(plainModel, ""), foreignHost, 0)
	if proxied.status != 200 || !proxied.observe(t, rt.path).done {
		t.Fatalf("proxied with Host %s: status %d; want a whole 200 stream", foreignHost, proxied.status)
	}
}
