package histo

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// scrapeAtBound returns a Recorder with every latency series at the label
// bound: 16 models on each of the 4 inference routes, each with traffic
// (and every error kind at 0).
func scrapeAtBound(b *testing.B) *Recorder {
	r, _, _ := newTest(b, Config{Now: time.Now})
	routes := []proxy.Route{proxy.RouteChat, proxy.RouteCompletions, proxy.RouteResponses, proxy.RouteMessages}
	for m := range proxy.DefaultMaxModels {
		for _, rt := range routes {
			tr := monotonic(chat())
			tr.Route, tr.Model = rt, fmt.Sprintf("model-%02d", m)
			r.Record(&tr)
		}
	}
	return r
}

// BenchmarkScrape is one /metrics scrape at the label bound, in the text
// format and in the protobuf format native histograms need; it reports the
// body size.
func BenchmarkScrape(b *testing.B) {
	formats := []struct{ name, accept string }{
		{"text", "text/plain;version=0.0.4"},
		{"openmetrics", "application/openmetrics-text;version=1.0.0"},
		{"protobuf", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"},
	}
	r := scrapeAtBound(b)
	h := r.metricsHandler()
	for _, f := range formats {
		b.Run(f.name, func(b *testing.B) {
			var size int
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				req.Header.Set("Accept", f.accept)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatal(w.Code)
				}
				size = w.Body.Len()
				_, _ = io.Discard.Write(w.Body.Bytes())
			}
			b.ReportMetric(float64(size), "bytes/scrape")
		})
	}
}
