package main

import (
	"testing"

	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/sse"
)

// TestInferenceRoutes: status's list of inference routes is the routes the
// proxy parses (those with a protocol, proxy.Route.Protocol), so that a
// new protocol's route (ollama_generate, ollama_chat) is not left out.
func TestInferenceRoutes(t *testing.T) {
	for _, r := range proxy.Routes {
		if got, want := inferenceRoute(r.String()), r.Protocol() != sse.ProtocolUnknown; got != want {
			t.Errorf("inferenceRoute(%q) = %v, want %v", r, got, want)
		}
	}
}
