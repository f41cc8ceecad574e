package histo

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/retry"
)

// retryMetrics are the client retry exports of docs/design.md "Retries", counted from
// each inference Trace's retry.Result. The rolling amplification gauge
// reads the tracker itself (Config.RetryStats): it counts a logical
// request in the window of its latest attempt, which a per-trace count
// cannot.
type retryMetrics struct {
	attempts, logical prometheus.Counter
	retries           [retry.NumEndings]prometheus.Counter
	gap               prometheus.Histogram
	wastedPrompt      prometheus.Counter
	wastedCompletion  prometheus.Counter
}

func newRetryMetrics() (*retryMetrics, []prometheus.Collector) {
	m := &retryMetrics{
		attempts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_client_attempts_total",
			Help: "Inference requests received from clients, retries included.",
		}),
		logical: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_client_logical_requests_total",
			Help: "Distinct logical requests: first attempts, plus retries whose earlier attempts were never seen.",
		}),
		gap: prometheus.NewHistogram(dist.PromHistogram("anvilproxy_retry_gap_seconds",
			"Time from the end of the previous attempt to a retry's start: the client's backoff sleep.",
			prometheus.ExponentialBucketsRange(0.01, 600, 20))),
	}
	byOutcome := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "anvilproxy_retry_total",
		Help: "Client retries by what ended the previous attempt (429, 5xx, upstream_timeout, client_abort_before_first_token, client_abort_mid_stream, success, in_flight, other_4xx, unknown).",
	}, []string{"previous_outcome"})
	for e := retry.Ending(1); e < retry.NumEndings; e++ {
		m.retries[e] = byOutcome.WithLabelValues(e.String())
	}
	wasted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "anvilproxy_wasted_tokens_total",
		Help: "Engine tokens spent on responses no client read: abandoned attempts that were retried, and duplicates.",
	}, []string{"kind"})
	m.wastedPrompt, m.wastedCompletion = wasted.WithLabelValues("prompt"), wasted.WithLabelValues("completion")
	return m, []prometheus.Collector{m.attempts, m.logical, byOutcome, m.gap, wasted}
}

// observe counts one inference attempt.
func (m *retryMetrics) observe(tr *proxy.Trace) {
	res := &tr.Retry
	m.attempts.Inc()
	if !res.Retry || res.PrevOutcome == retry.EndingUnknown {
		m.logical.Inc()
	}
	if res.Retry {
		m.retries[res.PrevOutcome].Inc()
		if res.Gap >= 0 {
			m.gap.Observe(res.Gap.Seconds())
		}
	}
	// Most attempts waste nothing: no atomic add of 0.
	if res.WastedPrompt > 0 {
		m.wastedPrompt.Add(float64(res.WastedPrompt))
	}
	if res.WastedCompletion > 0 {
		m.wastedCompletion.Add(float64(res.WastedCompletion))
	}
}

// amplificationGauge reads the tracker's rolling amplification.
func amplificationGauge(stats func() retry.Stats) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "anvilproxy_retry_amplification",
		Help: "Client attempts per logical request over the retry window (1: no retries; 0: no traffic).",
	}, func() float64 { return stats().Amplification })
}

// Bounds of a window's retry tally: clients beyond maxRetryClients are
// counted in the totals only; gaps beyond maxRetryGaps are not sampled.
const (
	maxRetryClients = 4096
	maxRetryGaps    = 4096
	topRetryClients = 10
)

// RetrySection is a window's client retry figures: the snapshot's
// anvilproxy.retry object. Clients appear only by their keyed hash.
type RetrySection struct {
	Attempts               int64            `json:"attempts"`
	LogicalRequests        int64            `json:"logical_requests"`
	Amplification          Float            `json:"amplification"` // attempts / logical requests; null without traffic
	Retries                int64            `json:"retries"`
	RetriesByHeader        int64            `json:"retries_by_header"`
	RetriesByPrevOutcome   map[string]int64 `json:"retries_by_previous_outcome"`
	WastedPromptTokens     int64            `json:"wasted_prompt_tokens"`
	WastedCompletionTokens int64            `json:"wasted_completion_tokens"`
	GapMs                  GapSummary       `json:"backoff_gap_ms"`
	TopClients             []ClientRetries  `json:"top_clients"` // by amplification, then attempts
	ClientsOverflow        int64            `json:"clients_not_itemized"`
}

// GapSummary describes the retry gaps (client backoff) of a window.
type GapSummary struct {
	Count int64 `json:"count"`
	P50   Float `json:"p50"`
	P90   Float `json:"p90"`
	Max   Float `json:"max"`
}

// ClientRetries is one client's retry figures in a window.
type ClientRetries struct {
	Client          retry.ClientID `json:"client"`
	Attempts        int64          `json:"attempts"`
	LogicalRequests int64          `json:"logical_requests"`
	Retries         int64          `json:"retries"`
	Amplification   Float          `json:"amplification"`
}

// retryTally accumulates a window's retry figures; guarded by Recorder.mu.
type retryTally struct {
	attempts, logical, retries, byHeader int64
	byOutcome                            [retry.NumEndings]int64
	wastedPrompt, wastedCompletion       int64
	gaps                                 []time.Duration
	gapCount                             int64
	clients                              map[retry.ClientID]*ClientRetries
	overflow                             int64
}

func (t *retryTally) add(tr *proxy.Trace) {
	res := &tr.Retry
	newLogical := !res.Retry || res.PrevOutcome == retry.EndingUnknown
	t.attempts++
	if newLogical {
		t.logical++
	}
	if res.Retry {
		t.retries++
		t.byOutcome[res.PrevOutcome]++
		if res.ByHeader {
			t.byHeader++
		}
		if res.Gap >= 0 {
			t.gapCount++
			if len(t.gaps) < maxRetryGaps {
				t.gaps = append(t.gaps, res.Gap)
			}
		}
	}
	t.wastedPrompt += max(res.WastedPrompt, 0)
	t.wastedCompletion += max(res.WastedCompletion, 0)
	c := t.clients[res.ClientID]
	if c == nil {
		if len(t.clients) >= maxRetryClients {
			t.overflow++
			return
		}
		if t.clients == nil {
			t.clients = make(map[retry.ClientID]*ClientRetries)
		}
		c = &ClientRetries{Client: res.ClientID}
		t.clients[res.ClientID] = c
	}
	c.Attempts++
	if newLogical {
		c.LogicalRequests++
	}
	if res.Retry {
		c.Retries++
	}
}

// section summarizes the tally; it does not modify it.
func (t *retryTally) section() *RetrySection {
	s := &RetrySection{
		Attempts: t.attempts, LogicalRequests: t.logical, Amplification: ratio(t.attempts, t.logical),
		Retries: t.retries, RetriesByHeader: t.byHeader,
		RetriesByPrevOutcome: make(map[string]int64),
		WastedPromptTokens:   t.wastedPrompt, WastedCompletionTokens: t.wastedCompletion,
		GapMs:           gapSummary(t.gaps, t.gapCount),
		TopClients:      []ClientRetries{},
		ClientsOverflow: t.overflow,
	}
	for e := retry.Ending(1); e < retry.NumEndings; e++ {
		if n := t.byOutcome[e]; n > 0 {
			s.RetriesByPrevOutcome[e.String()] = n
		}
	}
	for _, c := range t.clients {
		cc := *c
		cc.Amplification = ratio(cc.Attempts, cc.LogicalRequests)
		s.TopClients = append(s.TopClients, cc)
	}
	slices.SortFunc(s.TopClients, func(a, b ClientRetries) int {
		if d := cmp.Compare(float64(b.Amplification), float64(a.Amplification)); d != 0 {
			return d
		}
		return cmp.Compare(b.Attempts, a.Attempts)
	})
	if len(s.TopClients) > topRetryClients {
		s.TopClients = s.TopClients[:topRetryClients]
	}
	return s
}

// clone copies the tally for Current, which must not share it.
func (t *retryTally) clone() retryTally {
	c := *t
	c.gaps = slices.Clone(t.gaps)
	c.clients = make(map[retry.ClientID]*ClientRetries, len(t.clients))
	for k, v := range t.clients {
		vv := *v
		c.clients[k] = &vv
	}
	return c
}

func gapSummary(gaps []time.Duration, n int64) GapSummary {
	g := GapSummary{Count: n, P50: Float(math.NaN()), P90: Float(math.NaN()), Max: Float(math.NaN())}
	if len(gaps) == 0 {
		return g
	}
	sorted := slices.Clone(gaps)
	slices.Sort(sorted)
	g.P50, g.P90 = dist.Millis(dist.NearestRank(sorted, 50)), dist.Millis(dist.NearestRank(sorted, 90))
	g.Max = dist.Millis(sorted[len(sorted)-1])
	return g
}

// MergeRetry combines the retry sections of several windows (nil ones are
// skipped; nil when all are). Counts add up exactly; clients are merged by
// id among those each window itemized; gap percentiles cannot be merged
// from summaries, so a merged section keeps only the count and the max.
func MergeRetry(sections ...*RetrySection) *RetrySection {
	return dist.MergeSections(sections, mergeRetry)
}

// mergeRetry combines two or more sections.
func mergeRetry(in []*RetrySection) *RetrySection {
	out := &RetrySection{RetriesByPrevOutcome: make(map[string]int64), TopClients: []ClientRetries{}}
	out.GapMs = GapSummary{P50: Float(math.NaN()), P90: Float(math.NaN()), Max: Float(math.NaN())}
	clients := make(map[retry.ClientID]*ClientRetries)
	for _, s := range in {
		out.Attempts += s.Attempts
		out.LogicalRequests += s.LogicalRequests
		out.Retries += s.Retries
		out.RetriesByHeader += s.RetriesByHeader
		out.WastedPromptTokens += s.WastedPromptTokens
		out.WastedCompletionTokens += s.WastedCompletionTokens
		out.ClientsOverflow += s.ClientsOverflow
		dist.AddCounts(out.RetriesByPrevOutcome, s.RetriesByPrevOutcome)
		out.GapMs.Count += s.GapMs.Count
		out.GapMs.Max = dist.Max(out.GapMs.Max, s.GapMs.Max)
		for _, c := range s.TopClients {
			m := clients[c.Client]
			if m == nil {
				m = &ClientRetries{Client: c.Client}
				clients[c.Client] = m
			}
			m.Attempts += c.Attempts
			m.LogicalRequests += c.LogicalRequests
			m.Retries += c.Retries
		}
	}
	out.Amplification = ratio(out.Attempts, out.LogicalRequests)
	t := retryTally{clients: clients}
	out.TopClients = t.section().TopClients
	return out
}
