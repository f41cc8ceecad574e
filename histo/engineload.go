package histo

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/anvilproxy/anvilproxy/histo/engine"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// EngineLoad is the engine's own view of its load, scraped from its
// /metrics (package histo/engine): vLLM's num_requests_running and
// num_requests_waiting, llama.cpp's requests_processing and
// requests_deferred, SGLang's and TGI's equivalents. It is evidence the
// proxy's own timeline cannot give: the engine counts the requests that
// reached it by other ways too (other replicas of the proxy, other
// clients).
//
// LoadAt returns the counts as last scraped at or before t; ok is false
// when nothing was scraped by then (or the scrape is too old to stand for
// t: the implementation decides). It must be safe for concurrent use and
// cheap: Record calls it once per inference request.
type EngineLoad interface {
	LoadAt(t time.Time) (running, waiting int, ok bool)
}

// SetEngineLoad gives the Recorder the engine's load (nil takes it away).
// The split then uses it as evidence (docs/queue-split.md "The engine's
// load"). Safe for concurrent use with Record.
func (r *Recorder) SetEngineLoad(l EngineLoad) {
	if l == nil {
		r.load.Store(nil)
		return
	}
	h, _ := l.(loadHistory)
	r.load.Store(&engineLoadBox{l, h})
}

// loadHistory is an EngineLoad that also gives each scrape with the time
// it was taken (histo/engine.Scraper), so that the split can read back
// what the engine said during a request's wait, not only at its arrival.
// It must be safe for concurrent use and cheap (a binary search).
type loadHistory interface {
	// SampleBefore returns the latest scrape taken before t (a count the
	// engine does not export is NaN); ok is false when none was kept.
	SampleBefore(t time.Time) (engine.Sample, bool)
}

// engineLoadBox holds an EngineLoad for atomic.Pointer, and its history
// when it keeps one (asserted once, at SetEngineLoad).
type engineLoadBox struct {
	EngineLoad
	hist loadHistory
}

// engineLoadRef is the Recorder's EngineLoad, swapped atomically.
type engineLoadRef = atomic.Pointer[engineLoadBox]

// engineLoad is the engine's load at one request's arrival, and the
// scrapes after it when the EngineLoad keeps them (nil otherwise).
type engineLoad struct {
	running, waiting int
	ok               bool
	hist             loadHistory
}

// loadAt reads the engine's load at tr's arrival (t_admit + connect).
func (r *Recorder) loadAt(tr *proxy.Trace) engineLoad {
	b := r.load.Load()
	if b == nil || tr.Admit.IsZero() {
		return engineLoad{}
	}
	running, waiting, ok := b.LoadAt(tr.Admit.Add(tr.Connect))
	if !ok {
		return engineLoad{hist: b.hist} // the scrapes during its wait may still tell
	}
	return engineLoad{running: max(running, 0), waiting: max(waiting, 0), ok: true, hist: b.hist}
}

// hidden reports whether the engine had requests waiting at the
// request's arrival that the proxy's timeline cannot account for: more in
// the engine than the proxy had ahead of the request (p.ahead), some of
// them waiting. Other front doors' traffic is then queueing the request,
// and the occupancy split, which sees only the proxy's, would read it as
// prefill.
func (l engineLoad) hidden(p placement) bool {
	return l.ok && l.waiting > 0 && l.running+l.waiting > p.ahead
}

// SharedPromptRatio is the engine's prompt tokens per prompt token this
// proxy relayed (engine.Agreement's PromptRatio) above which others are
// taken to share the engine: other front doors or clients. One proxy
// alone reads 1 (the counts agree exactly against vLLM, llama.cpp and the
// sim); two replicas evenly loaded read about 2.
const SharedPromptRatio = 1.2

// sharedUnaccounted is the most of this proxy's requests whose prompt
// tokens it does not know (failed, or streamed without usage:
// engine.Agreement's UnaccountedShare) for the prompt ratio to say that
// others share the engine: the engine counts theirs, so a proxy alone
// whose clients leave early or ask no usage would read above
// SharedPromptRatio by itself.
const sharedUnaccounted = 0.05

// sharedEngine reports whether the engine's /metrics counted clearly more
// prompt tokens than this proxy relayed. The occupancy split then sees
// only this proxy's share of the requests ahead, and a burst's load at
// admission is the last scrape's, taken before the other front doors'
// requests arrived (docs/engines.md "Behind several proxies": 4 of 16
// behind two replicas on a vLLM-like engine), so the split takes the cold
// prefill's account of the wait as it does for waiting it can see
// (hidden). Safe for concurrent use.
func (r *Recorder) sharedEngine() bool {
	rep, ok := r.reporter()
	if !ok {
		return false
	}
	g, ok := rep.Agreement()
	return ok && sharesEngine(g) == SharedYes
}

// Whether others share the engine, as the agreement tells it: the one
// reading of it, for the split (sharedEngine) and the snapshot's engine
// section (EngineSection.Shared).
const (
	SharedNo      = "no"      // the prompt ratio is at most SharedPromptRatio, or unknown
	SharedYes     = "yes"     // above it, and the proxy knows the prompt tokens of nearly all its requests
	SharedUnknown = "unknown" // above it, but too many of the proxy's requests have prompt tokens it does not know
)

// sharesEngine reads an agreement: SharedYes, SharedNo or SharedUnknown.
func sharesEngine(g engine.Agreement) string {
	switch {
	case !(g.PromptRatio > SharedPromptRatio): // NaN: no traffic, or no counter
		return SharedNo
	case g.UnaccountedShare <= sharedUnaccounted:
		return SharedYes
	default:
		return SharedUnknown
	}
}

// boundSamples caps the scrapes waitedBound reads back per request: at the
// default 1 s interval 256 s of wait, at 5 ms 1.3 s (the latest are read
// first; an earlier scrape only matters when no later one showed the
// wait).
const boundSamples = 256

// waitedBound is what the engine's own counts say of e's queue: a lower
// bound, 0 when they say nothing. An engine that serves first come first
// served runs the oldest requests it holds, so a scrape taken after e's
// arrival and before its first output that counted fewer requests
// running than the engine held from e back (e, and the requests ahead of
// it not ended by then) was taken while e still waited; its queue is at
// least the latest such scrape less its arrival. The slot count does not
// enter: a continuous-batching engine short of KV cache holds requests
// back with sequence slots free (vLLM's max_num_seqs and block budget),
// which no slot count describes (histo/accuracy_kv_test.go). Its
// resolution is the scrape interval. Traffic the proxy does not see only
// weakens it (requests ahead it did not count make the engine's running
// count larger than the proxy's); a request the engine preempted back to
// its waiting queue makes it read a running request as waiting.
//
// ends are the sorted ends of the recorded requests ahead of e, unrec the
// number ahead not recorded yet (they end after e). The caller holds
// o.mu.
func (o *occupancy) waitedBound(e occEntry, ends []int64, unrec int, h loadHistory) time.Duration {
	var bound time.Duration
	o.scrapesDuring(e, h, func(rel int64, r engine.Reading) bool {
		if math.IsNaN(r.Running) {
			return true // no running count: nothing to bound with
		}
		// The requests from e back still in the engine at the scrape.
		held := unrec + 1
		for i := len(ends) - 1; i >= 0 && ends[i] > rel; i-- {
			held++
		}
		if int(r.Running) < held {
			bound = time.Duration(rel - e.arrive)
			return true
		}
		return false
	})
	return bound
}

// kvFull is the KV-cache use (vLLM kv_cache_usage_perc, llama.cpp
// kv_cache_usage_ratio, SGLang token_usage) at which the engine's cache,
// not its sequence slots, is taken to hold its waiting requests back when
// its size is unknown. In TestQueueAccuracyKVPressure the sim's cache read
// 0.95 whenever the two uniform prompts it holds ran, 0.99 at the mixed
// burst's fullest; with no KV pressure the sim's reads 0.00 (1M tokens),
// a GPU's a few percent.
const kvFull = 0.9

// kvHeld reports whether the engine's scrapes during e's wait (its
// arrival to its first output) show its KV cache holding requests back:
// one with requests waiting and either at least kvFull of the cache in
// use, or, where the engine gives the cache's size (vLLM's
// cache_config_info), less of it free than need, the tokens e's prompt
// had to place (its prompt less what the cache held; 0: unknown). Such a
// wait is the KV cache's, whatever the running count: a
// continuous-batching engine admits a request only when its prompt fits
// (vLLM's block budget), so a right --engine-slots (max_num_seqs) sees
// requests wait with sequence slots free. Without the size, a large
// prompt waiting behind a half-used cache is not recognized; without
// /metrics no wait is. The caller holds o.mu.
func (o *occupancy) kvHeld(e occEntry, h loadHistory, need int64) bool {
	held := false
	o.scrapesDuring(e, h, func(_ int64, r engine.Reading) bool {
		free := (1 - r.KVCacheUsage) * r.KVCapacity
		held = r.Waiting > 0 && (r.KVCacheUsage >= kvFull || float64(need) > free) // NaN compares false
		return held
	})
	return held
}

// kvNeed is the tokens tr's prompt had to place in the engine's KV cache:
// its prompt tokens less those the engine reported cached; 0 when its
// usage is unknown.
func kvNeed(tr *proxy.Trace) int64 {
	if tr.PromptTokens <= 0 {
		return 0
	}
	return tr.PromptTokens - max(tr.CachedTokens, 0)
}

// scrapesDuring calls f with each scrape taken during e's wait, after its
// arrival and before its first output, the latest first (at most
// boundSamples), with its time relative to o.epoch, until f returns true.
// The caller holds o.mu.
func (o *occupancy) scrapesDuring(e occEntry, h loadHistory, f func(rel int64, r engine.Reading) bool) {
	if h == nil || e.first <= e.arrive {
		return
	}
	t := o.epoch.Add(time.Duration(e.first))
	for range boundSamples {
		smp, ok := h.SampleBefore(t)
		rel := o.rel(smp.At)
		if !ok || rel <= e.arrive || f(rel, smp.Read) {
			return
		}
		t = smp.At
	}
}
