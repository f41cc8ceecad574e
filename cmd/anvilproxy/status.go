package main

import (
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/proxy"

	"github.com/anvilproxy/anvilproxy/histo/dist"
)

// liveStatus is the figures of the live table, as the demo prints them and
// "anvilproxy top" fetches them from a running proxy's /status: counts
// since start in the words of histo/failures.go, and percentiles over the
// requests that finished in the last liveWindow. It holds numbers and
// addresses only.
type liveStatus struct {
	Started   time.Time `json:"started"`
	UptimeSec float64   `json:"uptime_s"`

	Requests  int64 `json:"requests"` // inference requests (attempts) since start
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
	Abandoned int64 `json:"abandoned"` // of Failed: the client went away first
	Refused   int64 `json:"refused"`   // of Failed: answered 429 or 503
	Errors    int64 `json:"errors"`    // of Failed: the rest
	Retries   int64 `json:"retries"`   // requests that repeated an earlier one
	Inflight  int64 `json:"inflight"`

	Amplification histo.Float `json:"retry_amplification"` // attempts per logical request since start; null without traffic
	Goodput       histo.Float `json:"goodput"`             // since start; null without requests
	SLOs          string      `json:"slos"`

	// SnapshotWindow is the snapshot window in progress, which /snapshot
	// and the dashboard's goodput, cache, retry and drift panels cover:
	// its start and its length (--snapshot-interval). The live table's
	// counts are since start, its percentiles over Recent.
	SnapshotWindow snapshotWindow `json:"snapshot_window"`

	Recent recentStats `json:"last"`

	Upstream  readiness `json:"upstream"`
	Listeners listeners `json:"listeners"`
}

// recentStats covers the inference requests that finished in the last
// Seconds (at most the newest 512: Truncated says the window held more).
type recentStats struct {
	Seconds   float64      `json:"seconds"`
	Requests  int          `json:"requests"` // completed ones: the percentiles' population
	Truncated bool         `json:"truncated"`
	Rate      histo.Float  `json:"rate"` // completed requests per second
	Phases    []phaseStats `json:"phases"`
	CacheHit  histo.Float  `json:"cache_hit"` // cached / prompt tokens, token-weighted; null when no engine reported
	// CacheHitInferred is the proxy's own estimate from prefill times
	// (histo's cache_inferred_tokens over the prompt tokens of the requests
	// that have one), never mixed with CacheHit; null before the cold
	// prefill rate is learned.
	CacheHitInferred histo.Float `json:"cache_hit_inferred"`
}

type phaseStats struct {
	Name string      `json:"name"`
	P50  histo.Float `json:"p50_ms"`
	P99  histo.Float `json:"p99_ms"`
}

// snapshotWindow is the measurement window in progress.
type snapshotWindow struct {
	Start   time.Time `json:"start"`
	Seconds float64   `json:"seconds"`   // its full length, --snapshot-interval
	Elapsed float64   `json:"elapsed_s"` // how much of it has passed
}

// listeners says where the proxy listens and what each listener exposes.
type listeners struct {
	Proxy string `json:"proxy"`
	Admin string `json:"admin"`
}

// liveWindow is the span of recent requests the live table's percentiles
// and cache hit rate cover.
const liveWindow = 15 * time.Second

// recentLimit is how many of the newest records the live table reads.
const recentLimit = 512

// livePhases are the phase-table rows of the live table, in its order.
var livePhases = [...]histo.Metric{histo.MetricQueue, histo.MetricPrefill, histo.MetricTTFO, histo.MetricTTFT, histo.MetricTPOT}

// status reads the stack's figures now. Safe for concurrent use.
func (st *stack) status(now time.Time) liveStatus {
	o := &st.tap.outcomes
	s := liveStatus{
		Started: st.started.UTC(), UptimeSec: now.Sub(st.started).Seconds(),
		Requests: o.requests.Load(), Failed: o.failed.Load(), Abandoned: o.abandoned.Load(),
		Refused: o.refused.Load(), Errors: o.errors.Load(), Retries: o.retries.Load(),
		Inflight: st.proxy.Inflight(), SLOs: st.slos,
		Amplification: histo.Float(math.NaN()), Goodput: histo.Float(math.NaN()),
		Upstream:  st.health.ready(),
		Listeners: listeners{Proxy: st.proxyURL, Admin: st.adminURL},
	}
	s.Completed = s.Requests - s.Failed
	// Since start, as the counts beside it: the tracker's own
	// Amplification covers only its last --retry-window.
	if rs := st.proxy.Retries().Stats(); rs.Logical > 0 {
		s.Amplification = histo.Float(float64(rs.Attempts) / float64(rs.Logical))
	}
	if start := st.rec.WindowStart(); !start.IsZero() {
		s.SnapshotWindow = snapshotWindow{Start: start.UTC(), Seconds: st.snapEvery.Seconds(), Elapsed: now.Sub(start).Seconds()}
	}
	if _, total := st.rec.Goodput(); total.Requests > 0 {
		s.Goodput = histo.Float(total.Ratio)
	}
	// The window is the last liveWindow, or the uptime when shorter, but at
	// least a second: a rate over the first milliseconds means nothing.
	s.Recent = recentOf(st.rec.Recent(recentLimit), now, max(time.Second, min(liveWindow, now.Sub(st.started))))
	return s
}

// recentOf computes the window's figures from the newest records.
func recentOf(recs []histo.Request, now time.Time, span time.Duration) recentStats {
	r := recentStats{Seconds: span.Seconds(), Truncated: len(recs) == recentLimit}
	var vals [len(livePhases)][]float64
	var cached, prompt, inferred, inferable int64
	for _, rq := range recs {
		end := rq.Start
		if rq.E2E.Known() {
			end = end.Add(time.Duration(rq.E2E))
		}
		if now.Sub(end) > liveWindow {
			r.Truncated = false // the ring reaches back beyond the window
			continue
		}
		if !inferenceRoute(rq.Route) || rq.Failed || !rq.E2E.Known() {
			continue
		}
		r.Requests++
		for i, m := range livePhases {
			if v := m.Value(&rq); v == v {
				vals[i] = append(vals[i], v)
			}
		}
		if rq.PromptTokens > 0 && rq.CachedTokens >= 0 {
			cached += int64(rq.CachedTokens)
			prompt += int64(rq.PromptTokens)
		}
		if rq.PromptTokens > 0 && rq.CacheInferredTokens >= 0 {
			inferred += int64(rq.CacheInferredTokens)
			inferable += int64(rq.PromptTokens)
		}
	}
	r.Rate = histo.Float(math.NaN())
	if span > 0 {
		r.Rate = histo.Float(float64(r.Requests) / span.Seconds())
	}
	for i, v := range vals {
		r.Phases = append(r.Phases, phaseStats{Name: livePhases[i].Phase().ShortName(), P50: histo.Float(nearestRank(v, 50)), P99: histo.Float(nearestRank(v, 99))})
	}
	r.CacheHit, r.CacheHitInferred = ratio(cached, prompt), ratio(inferred, inferable)
	return r
}

// ratio is part/whole, NaN (null) without a whole.
func ratio(part, whole int64) histo.Float {
	if whole <= 0 {
		return histo.Float(math.NaN())
	}
	return histo.Float(float64(part) / float64(whole))
}

// inferenceRoute reports whether a /requests record is of a route that
// generates (proxy.Route.Generates); the others (models, other, …) have no
// phases.
func inferenceRoute(route string) bool {
	r, ok := proxy.RouteNamed(route)
	return ok && r.Generates()
}

// nearestRank is the p-th percentile of v by nearest rank (dist.Rank, as
// the v1 schema); NaN without values. It sorts v.
func nearestRank(v []float64, p int64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	return dist.NearestRank(v, p)
}

// statusHandler serves the stack's liveStatus as JSON.
func (st *stack) statusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		histo.ServeJSON(w, st.status(time.Now()), false)
	})
}
