package dashboard

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// TestInferenceRoutesAreTheProxys: the dashboard's INFERENCE set (the
// /requests records it draws phases for) is the routes that generate
// (proxy.Route.Generates), so that a new protocol's route is drawn too.
func TestInferenceRoutesAreTheProxys(t *testing.T) {
	js, err := assets.ReadFile("assets/dashboard.js")
	require.NoError(t, err)
	m := regexp.MustCompile(`const INFERENCE = new Set\(\[([^\]]*)\]\)`).FindSubmatch(js)
	require.NotNil(t, m, "dashboard.js declares INFERENCE")
	var got []string
	for _, s := range strings.Split(string(m[1]), ",") {
		got = append(got, strings.Trim(strings.TrimSpace(s), `"`))
	}
	var want []string
	for _, r := range proxy.Routes {
		if r.Generates() {
			want = append(want, r.String())
		}
	}
	require.ElementsMatch(t, want, got)
}
