package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// The proxy measures itself too: anvilproxy_proxy_overhead_seconds is its
// residency per relayed read, from the upstream read returning to the client
// write and flush returning (BENCHMARKS.md "Method"). The bench
// reads it from the child's /metrics before and after a level, next to what
// the clients measure (kind C), so that the table shows how much of the
// added latency is the proxy's own work and how much is the extra hop.

const residencyMetric = "anvilproxy_proxy_overhead_seconds"

// buckets is a classic Prometheus histogram: cumulative counts by upper
// bound, in seconds, +Inf included.
type buckets map[float64]float64

// scrapeBuckets reads metric's classic buckets from a /metrics URL.
func scrapeBuckets(url, metric string) (buckets, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseBuckets(resp.Body, metric)
}

// scrapeValue reads one unlabelled metric's value from a /metrics URL.
func scrapeValue(url, metric string) (float64, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseValue(resp.Body, metric)
}

// parseValue finds "metric value" in the text exposition format.
func parseValue(r io.Reader, metric string) (float64, error) {
	prefix := []byte(metric + " ")
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := bytes.CutPrefix(sc.Bytes(), prefix); ok {
			return strconv.ParseFloat(string(bytes.TrimSpace(rest)), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s", metric)
}

// parseBuckets reads metric_bucket{le="..."} lines of the text exposition
// format.
func parseBuckets(r io.Reader, metric string) (buckets, error) {
	prefix := []byte(metric + `_bucket{le="`)
	out := buckets{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), prefix)
		if !ok {
			continue
		}
		le, val, ok := bytes.Cut(rest, []byte(`"} `))
		if !ok {
			return nil, fmt.Errorf("%s: bucket line %q", metric, sc.Text())
		}
		bound, err := strconv.ParseFloat(string(le), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: bucket bound %q", metric, le)
		}
		n, err := strconv.ParseFloat(string(bytes.Fields(val)[0]), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: bucket count %q", metric, val)
		}
		out[bound] = n
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s buckets", metric)
	}
	return out, nil
}

// since returns the observations between an earlier scrape and b.
func (b buckets) since(earlier buckets) buckets {
	out := buckets{}
	for le, n := range b {
		out[le] = n - earlier[le]
	}
	return out
}

// quantile interpolates the q-quantile (0..1) linearly inside its bucket,
// as PromQL's histogram_quantile does; past the highest finite bound it is
// that bound. NaN when empty.
func (b buckets) quantile(q float64) float64 {
	bounds := make([]float64, 0, len(b))
	for le := range b {
		bounds = append(bounds, le)
	}
	slices.Sort(bounds)
	total := b[math.Inf(1)]
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, le := range bounds {
		n := b[le]
		if n >= rank {
			if math.IsInf(le, 1) {
				return lower
			}
			if n == below {
				return le
			}
			return lower + (le-lower)*(rank-below)/(n-below)
		}
		lower, below = le, n
	}
	return lower
}

// residency summarizes the observations as Quantiles in µs. Bucket bounds
// are 1, 2.5, 5, 10, 25, 50, 100 µs...: the figures are interpolations,
// good to the bucket.
func (b buckets) residency() *Quantiles {
	us := func(q float64) Num { return Num(b.quantile(q) * 1e6) }
	return &Quantiles{N: int64(b[math.Inf(1)]), P50: us(0.5), P99: us(0.99), P999: us(0.999), Max: unknown}
}
