package histo

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// TestRequestCounterChildren: the cached child of a route, model and
// status is the vector's child of their labels, every status beyond the
// code table is the one "other" child, and a route or model apart is a
// child apart.
func TestRequestCounterChildren(t *testing.T) {
	m := newMetrics()
	inc := func(route proxy.Route, model string, status int) { m.requestCounter(route, model, status).Inc() }
	inc(proxy.RouteChat, "a", 200)
	inc(proxy.RouteChat, "a", 200)
	inc(proxy.RouteChat, "b", 200)
	inc(proxy.RouteChat, "a", 0)
	inc(proxy.RouteChat, "a", 999)
	inc(proxy.RouteChat, "a", -5)
	inc(proxy.RouteOther, "a", 200)
	count := func(route proxy.Route, model, code string) float64 {
		return testutil.ToFloat64(m.requests.WithLabelValues(route.String(), model, code))
	}
	require.Equal(t, 2.0, count(proxy.RouteChat, "a", "200"))
	require.Equal(t, 1.0, count(proxy.RouteChat, "b", "200"))
	require.Equal(t, 1.0, count(proxy.RouteChat, "a", "0"))
	require.Equal(t, 2.0, count(proxy.RouteChat, "a", "other"))
	require.Equal(t, 1.0, count(proxy.RouteOther, "a", "200"))
	require.Equal(t, 5, testutil.CollectAndCount(m.requests))
}
