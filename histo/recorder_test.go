package histo

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/retry"
)

func TestRecordPhases(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	tr := chat()
	r.Record(&tr)
	got := r.Recent(1)
	require.Len(t, got, 1)
	rq := got[0]

	require.Equal(t, Stamps{
		Admit: 0, Sent: Span(ms2d(2)), Headers: Span(ms2d(50)), FirstEvent: Span(ms2d(60)),
		FirstOutput: Span(ms2d(300)), FirstContent: Span(ms2d(1300)), LastToken: Span(ms2d(2290)),
		End: Span(ms2d(2300)), ClientDone: Span(ms2d(2301)),
	}, rq.Stamps)
	phases := []struct {
		name string
		got  Span
		want time.Duration
	}{
		{"proxy_queue", rq.ProxyQueue, 0},
		{"connect", rq.Connect, ms2d(1.5)},
		{"ttfo", rq.TTFO, ms2d(300)},
		{"ttft", rq.TTFT, ms2d(1300)},
		{"reasoning", rq.Reasoning, ms2d(1000)},
		{"generation", rq.Generation, ms2d(2000)},
		{"tpot", rq.TPOT, ms2d(10)}, // 2000 ms / (201 − 1)
		{"e2e", rq.E2E, ms2d(2300)},
		{"tail", rq.Tail, ms2d(1)},
	}
	for _, p := range phases {
		require.Equal(t, Span(p.want), p.got, p.name)
	}
	require.Less(t, rq.TTFO, rq.TTFT, "reasoning came first")
	require.Equal(t, Float(100), rq.DecodeRate)                  // 200 tokens / 2 s
	require.InDelta(t, 10000/0.3, float64(rq.PrefillRate), 1e-9) // prompt / TTFO
	// No server timing, no limiter: the timeline says nothing was ahead of
	// it in the engine, so it queued 0 and TTFO − connect was prefill.
	require.Equal(t, SourceOccupancy, rq.QueueSource)
	require.Equal(t, Span(0), rq.Queue)
	require.Equal(t, Span(ms2d(298.5)), rq.Prefill)
	require.Equal(t, Count(-1), rq.CacheInferredTokens, "no cold rate learned yet")
	require.Equal(t, Count(201), rq.OutputTokens)
	require.Equal(t, "usage", rq.OutputTokenSource)
	require.Equal(t, Count(2000), rq.CachedTokens)
	require.Equal(t, "chat", rq.Route)
	require.True(t, rq.Good)

	w := r.Current()
	wantHDR := map[Metric]int64{
		MetricTTFO: 300_000, MetricTTFT: 1_300_000, MetricReasoning: 1_000_000, MetricGeneration: 2_000_000,
		MetricTPOT: 10_000, MetricE2E: 2_300_000, MetricConnect: 1500, MetricDecodeRate: 100_000,
		MetricPromptTokens: 10000, MetricCompletionTokens: 201,
	}
	for m, v := range wantHDR {
		h := w.Hist[m]
		require.Equal(t, int64(1), h.TotalCount(), m.String())
		require.True(t, h.ValuesAreEquivalent(v, h.Max()), "%s: %d vs %d", m, v, h.Max())
	}
	require.Equal(t, int64(1), w.Hist[MetricQueue].TotalCount())
}

func TestReasoningOnlyAndNonStream(t *testing.T) {
	r, _, _ := newTest(t, Config{})
	tr := chat()
	tr.FirstContent = time.Time{} // reasoning only
	tr.ContentEvents = 0
	r.Record(&tr)
	rq := r.Recent(1)[0]
	require.False(t, rq.TTFT.Known())
	require.Equal(t, Span(ms2d(1990)), rq.Reasoning) // first output → last token

	tr = chat()
	tr.Stream = false
	tr.FirstEvent, tr.FirstOutput, tr.FirstContent, tr.LastToken = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	r.Record(&tr)
	rq = r.Recent(1)[0]
	require.False(t, rq.TTFO.Known())
	require.False(t, rq.Generation.Known())
	require.Equal(t, Span(ms2d(2300)), rq.E2E)
}

func TestNonInferenceRoutesOnlyCountedAndListed(t *testing.T) {
	r, reg, _ := newTest(t, Config{})
	tr := chat()
	tr.Route = proxy.RouteModels
	r.Record(&tr)
	recent := r.Recent(10)
	require.Len(t, recent, 1) // listed in /requests (requests_other.go) ...
	require.Equal(t, -1, recent[0].Index)
	require.Zero(t, r.Current().Hist[MetricE2E].TotalCount()) // ... but in no window
	require.Zero(t, r.Current().Requests.Len())
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP anvilproxy_requests_total Requests finished, by route, model and status code sent to the client (0: none sent).
# TYPE anvilproxy_requests_total counter
anvilproxy_requests_total{code="200",model="qwen",route="models"} 1
`), "anvilproxy_requests_total"))
}

func TestFailedExcludedFromDistributions(t *testing.T) {
	r, reg, _ := newTest(t, Config{})
	tr := chat()
	tr.ErrSide, tr.ErrKind, tr.Truncated = proxy.SideUpstream, proxy.ErrUpstreamBroken, true
	r.Record(&tr)
	rq := r.Recent(1)[0]
	require.True(t, rq.Failed)
	require.Equal(t, "upstream", rq.ErrSide)
	require.Equal(t, "upstream_broken", rq.ErrKind)
	require.Zero(t, r.Current().Hist[MetricTTFT].TotalCount())
	require.Zero(t, histCount(t, reg, "anvilproxy_time_to_first_token_seconds"))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP anvilproxy_errors_total Requests that ended in an error, by the side it came from and its kind (truncated: a stream that ended without its end marker, status 200 notwithstanding).
# TYPE anvilproxy_errors_total counter
anvilproxy_errors_total{kind="bad_request",side="client"} 0
anvilproxy_errors_total{kind="body_too_large",side="client"} 0
anvilproxy_errors_total{kind="client_gone",side="client"} 0
anvilproxy_errors_total{kind="connect",side="upstream"} 0
anvilproxy_errors_total{kind="internal",side="proxy"} 0
anvilproxy_errors_total{kind="limited",side="proxy"} 0
anvilproxy_errors_total{kind="overloaded",side="proxy"} 0
anvilproxy_errors_total{kind="pool_exhausted",side="proxy"} 0
anvilproxy_errors_total{kind="pool_exhausted",side="upstream"} 0
anvilproxy_errors_total{kind="shutdown",side="proxy"} 0
anvilproxy_errors_total{kind="truncated",side="upstream"} 0
anvilproxy_errors_total{kind="upstream_broken",side="upstream"} 1
anvilproxy_errors_total{kind="upstream_timeout",side="upstream"} 0
# HELP anvilproxy_completion_tokens_total Output tokens of finished inference requests (usage, else output events).
# TYPE anvilproxy_completion_tokens_total counter
anvilproxy_completion_tokens_total 201
`), "anvilproxy_errors_total", "anvilproxy_completion_tokens_total"))
}

// histCount returns the sample count of histogram name, summed over its
// series.
func histCount(t *testing.T, reg prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func TestMetricsGolden(t *testing.T) {
	r, reg, _ := newTest(t, Config{})
	tr := chat()
	tr.Cold, tr.Connect = true, ms2d(3)
	r.Record(&tr)
	tr = chat()
	tr.Status = 503
	r.Record(&tr)
	tr = chat()
	tr.UsageSeen, tr.CompletionTokens = false, -1 // falls back to counting events: 100
	r.Record(&tr)

	const want = `
# HELP anvilproxy_requests_total Requests finished, by route, model and status code sent to the client (0: none sent).
# TYPE anvilproxy_requests_total counter
anvilproxy_requests_total{code="200",model="qwen",route="chat"} 2
anvilproxy_requests_total{code="503",model="qwen",route="chat"} 1
# HELP anvilproxy_prompt_tokens_total Prompt tokens of finished inference requests.
# TYPE anvilproxy_prompt_tokens_total counter
anvilproxy_prompt_tokens_total 30000
# HELP anvilproxy_completion_tokens_total Output tokens of finished inference requests (usage, else output events).
# TYPE anvilproxy_completion_tokens_total counter
anvilproxy_completion_tokens_total 502
# HELP anvilproxy_output_tokens_source_total Finished inference requests by where their output token count came from.
# TYPE anvilproxy_output_tokens_source_total counter
anvilproxy_output_tokens_source_total{source="chunks"} 1
anvilproxy_output_tokens_source_total{source="usage"} 2
# HELP anvilproxy_upstream_connect_seconds Time acquiring an upstream connection; cold=true when one was dialled. Successful inference requests only.
# TYPE anvilproxy_upstream_connect_seconds histogram
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.0001"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.00025"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.0005"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.001"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.0025"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.005"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.01"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.025"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.05"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.1"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.25"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="0.5"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="1"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="2.5"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="5"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="10"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="false",model="qwen",route="chat",le="+Inf"} 1
anvilproxy_upstream_connect_seconds_sum{cold="false",model="qwen",route="chat"} 0.0015
anvilproxy_upstream_connect_seconds_count{cold="false",model="qwen",route="chat"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.0001"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.00025"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.0005"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.001"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.0025"} 0
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.005"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.01"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.025"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.05"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.1"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.25"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="0.5"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="1"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="2.5"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="5"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="10"} 1
anvilproxy_upstream_connect_seconds_bucket{cold="true",model="qwen",route="chat",le="+Inf"} 1
anvilproxy_upstream_connect_seconds_sum{cold="true",model="qwen",route="chat"} 0.003
anvilproxy_upstream_connect_seconds_count{cold="true",model="qwen",route="chat"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"anvilproxy_requests_total", "anvilproxy_prompt_tokens_total", "anvilproxy_completion_tokens_total",
		"anvilproxy_output_tokens_source_total", "anvilproxy_upstream_connect_seconds"))
}

func TestMetricNamesAndTypes(t *testing.T) {
	var inflight int64 = 3
	r, reg, _ := newTest(t, Config{
		SLOs:       []SLO{{"ttft", 2 * time.Second}, {"tpot", 50 * time.Millisecond}},
		Inflight:   func() int64 { return inflight },
		RetryStats: func() retry.Stats { return retry.Stats{Amplification: 1.5} },
	})
	tr := chat()
	r.Record(&tr) // so that the histograms, whose children appear with data, appear
	tr.ErrSide, tr.ErrKind = proxy.SideClient, proxy.ErrClientGone
	r.Record(&tr)
	r.ObserveGap(time.Millisecond)
	r.ObserveRelay(time.Microsecond)

	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]dto.MetricType{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetType()
	}
	H, C, G := dto.MetricType_HISTOGRAM, dto.MetricType_COUNTER, dto.MetricType_GAUGE
	want := map[string]dto.MetricType{
		"anvilproxy_requests_total":                        C,
		"anvilproxy_time_to_first_output_seconds":          H,
		"anvilproxy_time_to_first_token_seconds":           H,
		"anvilproxy_queue_seconds":                         H,
		"anvilproxy_prefill_seconds":                       H,
		"anvilproxy_reasoning_seconds":                     H,
		"anvilproxy_generation_seconds":                    H,
		"anvilproxy_time_per_output_token_seconds":         H,
		"anvilproxy_inter_event_seconds":                   H,
		"anvilproxy_request_duration_seconds":              H,
		"anvilproxy_proxy_overhead_seconds":                H,
		"anvilproxy_upstream_connect_seconds":              H,
		"anvilproxy_decode_tokens_per_second":              H,
		"anvilproxy_prefill_tokens_per_second":             H,
		"anvilproxy_prompt_tokens_total":                   C,
		"anvilproxy_completion_tokens_total":               C,
		"anvilproxy_cached_prompt_tokens_total":            C,
		"anvilproxy_cache_reported_prompt_tokens_total":    C,
		"anvilproxy_cache_inferred_prompt_tokens_total":    C,
		"anvilproxy_cache_inferable_prompt_tokens_total":   C,
		"anvilproxy_reasoning_tokens_total":                C,
		"anvilproxy_inflight_requests":                     G,
		"anvilproxy_goodput_ratio":                         G,
		"anvilproxy_histo_clamped_total":                   C,
		"anvilproxy_histo_records_dropped_total":           C,
		"anvilproxy_output_tokens_source_total":            C,
		"anvilproxy_errors_total":                          C,
		"anvilproxy_client_attempts_total":                 C,
		"anvilproxy_client_logical_requests_total":         C,
		"anvilproxy_retry_total":                           C,
		"anvilproxy_retry_gap_seconds":                     H,
		"anvilproxy_wasted_tokens_total":                   C,
		"anvilproxy_retry_amplification":                   G,
		"anvilproxy_prefix_reuse_ratio":                    H,
		"anvilproxy_prefix_drift_total":                    C,
		"anvilproxy_prefix_cache_miss_despite_reuse_total": C,
		"anvilproxy_prefix_untracked_total":                C,
		"anvilproxy_prompt_share_ratio":                    H,
		"anvilproxy_prompt_bytes_total":                    C,
		"anvilproxy_agent_gap_seconds":                     H,
		"anvilproxy_conversation_seconds_total":            C,
		"anvilproxy_self_timer_overshoot_seconds":          H,
		"anvilproxy_host_pressure_ratio":                   G,
	}
	require.Equal(t, want, got)

	var slos []string
	for _, mf := range mfs {
		if mf.GetName() == "anvilproxy_goodput_ratio" {
			for _, m := range mf.GetMetric() {
				slos = append(slos, m.GetLabel()[0].GetValue())
			}
		}
		if mf.GetName() == "anvilproxy_inflight_requests" {
			require.Equal(t, 3.0, mf.GetMetric()[0].GetGauge().GetValue())
		}
		if mf.GetName() == "anvilproxy_request_duration_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			require.Equal(t, int32(3), h.GetSchema(), "native buckets with factor 1.1")
			require.NotEmpty(t, h.GetBucket(), "classic buckets alongside")
		}
	}
	sort.Strings(slos)
	require.Equal(t, []string{"all", "tpot", "ttft"}, slos)
}

func TestInflightGaugeOptional(t *testing.T) {
	_, reg, _ := newTest(t, Config{})
	n, err := testutil.GatherAndCount(reg, "anvilproxy_inflight_requests")
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestClamping(t *testing.T) {
	r, reg, _ := newTest(t, Config{})
	r.ObserveGap(2 * time.Hour) // beyond the 1 h range
	r.ObserveGap(-time.Millisecond)
	r.ObserveGap(time.Millisecond)
	tr := chat()
	tr.End = tr.Recv.Add(3 * time.Hour)
	r.Record(&tr)

	w := r.Rotate()
	require.Equal(t, int64(3), w.Hist[MetricInterEvent].TotalCount(), "clamped values are recorded, not dropped")
	require.Equal(t, int64(2), w.Clamped[MetricInterEvent])
	require.True(t, w.Hist[MetricInterEvent].ValuesAreEquivalent(w.Hist[MetricInterEvent].Max(), int64(time.Hour/time.Microsecond)))
	require.Equal(t, int64(0), w.Hist[MetricInterEvent].Min())
	require.Equal(t, int64(2), w.Clamped[MetricE2E]+w.Clamped[MetricGeneration])
	require.Equal(t, int64(1), w.Clamped[MetricE2E])

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP anvilproxy_histo_clamped_total Values outside an HDR histogram's range, recorded at the nearest end of the range.
# TYPE anvilproxy_histo_clamped_total counter
anvilproxy_histo_clamped_total{metric="completion_tokens"} 0
anvilproxy_histo_clamped_total{metric="connect"} 0
anvilproxy_histo_clamped_total{metric="decode_tok_s"} 0
anvilproxy_histo_clamped_total{metric="e2e"} 1
anvilproxy_histo_clamped_total{metric="effective_prefill_tok_s"} 0
anvilproxy_histo_clamped_total{metric="generation"} 1
anvilproxy_histo_clamped_total{metric="inter_event"} 2
anvilproxy_histo_clamped_total{metric="prefill"} 0
anvilproxy_histo_clamped_total{metric="prompt_tokens"} 0
anvilproxy_histo_clamped_total{metric="proxy_overhead"} 0
anvilproxy_histo_clamped_total{metric="queue"} 0
anvilproxy_histo_clamped_total{metric="reasoning"} 0
anvilproxy_histo_clamped_total{metric="time_to_first_output"} 0
anvilproxy_histo_clamped_total{metric="tpot"} 0
anvilproxy_histo_clamped_total{metric="ttft"} 0
`), "anvilproxy_histo_clamped_total"))
}

func TestConcurrentRecordRotateScrape(t *testing.T) {
	r, _, _ := newTest(t, Config{SLOs: []SLO{{"ttft", 2 * time.Second}}, Now: time.Now})
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()

	const writers, perWriter = 8, 300
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
	)
	stop := make(chan struct{})
	for i := range writers {
		wg.Go(func() {
			for j := range perWriter {
				tr := idle(int64(1000+j), 8000)
				tr.InflightAtAdmit = (i + j) % 8
				r.Record(&tr)
				r.ObserveGap(time.Duration(j) * time.Microsecond)
				r.ObserveRelay(time.Duration(j) * time.Nanosecond)
			}
		})
	}
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			w := r.Rotate()
			mu.Lock()
			total += int64(w.Requests.Len())
			mu.Unlock()
			if n := w.Hist[MetricE2E].TotalCount(); n != int64(w.Requests.Len()) {
				t.Errorf("window has %d records but %d e2e values", w.Requests.Len(), n)
			}
			_ = r.Current()
			_ = r.cumulative()
		}
	})
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, path := range []string{"/metrics", "/requests?limit=5"} {
				resp, err := http.Get(srv.URL + path)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%s: %s", path, resp.Status)
				}
			}
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	total += int64(r.Rotate().Requests.Len())
	require.Equal(t, int64(writers*perWriter), total)
	_, cum := r.Goodput()
	require.Equal(t, int64(writers*perWriter), cum.Requests)
	require.Equal(t, int64(writers*perWriter), r.cumulative().Hist[MetricInterEvent].TotalCount())
}
