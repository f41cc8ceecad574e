package proxy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRoutesGenerate: the routes that generate are exactly the five
// protocols' seven routes, and every route is found again by its name, so
// that status and the recorder (which ask Generates and RouteNamed) agree
// with the route table.
func TestRoutesGenerate(t *testing.T) {
	var generating []string
	for _, r := range Routes {
		back, ok := RouteNamed(r.String())
		require.True(t, ok, r.String())
		require.Equal(t, r, back)
		if r.Generates() {
			generating = append(generating, r.String())
		}
	}
	require.Equal(t, []string{"chat", "completions", "responses", "messages", "llama_completion", "ollama_generate", "ollama_chat"}, generating)
	_, ok := RouteNamed("nonsense")
	require.False(t, ok)
}
