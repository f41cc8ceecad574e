package bench

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const exposition = `# HELP anvilproxy_proxy_overhead_seconds Proxy residency per relayed upstream read.
# TYPE anvilproxy_proxy_overhead_seconds histogram
anvilproxy_proxy_overhead_seconds_bucket{le="1e-06"} 0
anvilproxy_proxy_overhead_seconds_bucket{le="5e-06"} 50
anvilproxy_proxy_overhead_seconds_bucket{le="1e-05"} 90
anvilproxy_proxy_overhead_seconds_bucket{le="+Inf"} 100
anvilproxy_proxy_overhead_seconds_sum 0.0007
anvilproxy_proxy_overhead_seconds_count 100
anvilproxy_other_seconds_bucket{le="1"} 7
`

func TestParseBuckets(t *testing.T) {
	b, err := parseBuckets(strings.NewReader(exposition), residencyMetric)
	require.NoError(t, err)
	require.Equal(t, buckets{1e-6: 0, 5e-6: 50, 1e-5: 90, math.Inf(1): 100}, b)

	_, err = parseBuckets(strings.NewReader("nothing here\n"), residencyMetric)
	require.Error(t, err)
}

func TestBucketQuantile(t *testing.T) {
	b := buckets{1e-6: 0, 5e-6: 50, 1e-5: 90, math.Inf(1): 100}
	require.InDelta(t, 5e-6, b.quantile(0.5), 1e-12, "the top of the bucket holding rank 50")
	require.InDelta(t, 3e-6, b.quantile(0.25), 1e-12, "half way through 1..5 µs")
	require.InDelta(t, 7.5e-6, b.quantile(0.7), 1e-12)
	require.InDelta(t, 1e-5, b.quantile(0.99), 1e-12, "in +Inf: the highest finite bound")
	require.True(t, math.IsNaN(buckets{math.Inf(1): 0}.quantile(0.5)))

	earlier := buckets{1e-6: 0, 5e-6: 40, 1e-5: 40, math.Inf(1): 40}
	d := b.since(earlier)
	require.Equal(t, buckets{1e-6: 0, 5e-6: 10, 1e-5: 50, math.Inf(1): 60}, d)
	q := d.residency()
	require.Equal(t, int64(60), q.N)
	require.InDelta(t, 7.5, float64(q.P50), 1e-9) // rank 30 of 10..50 in 5..10 µs
}
