package histo

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// QueueSource says where a request's queue/prefill split came from
// (docs/design.md "Queue vs prefill"), best first.
type QueueSource string

// Queue sources.
const (
	SourceServer    QueueSource = "server"    // the engine reported its queue time
	SourceLimiter   QueueSource = "limiter"   // the proxy's limiter held the request; the engine queue is ~0
	SourceOccupancy QueueSource = "occupancy" // from the engine's slots as the proxy saw them fill and free
	SourceModel     QueueSource = "model"     // estimated from the learned cold prefill rate
	SourceNone      QueueSource = "none"      // not enough data: queue and prefill are unknown
)

// sources lists the sources in a fixed order, for arrays indexed by source.
var sources = [...]QueueSource{SourceServer, SourceLimiter, SourceOccupancy, SourceModel, SourceNone}

// QueueSources returns every queue source, best first.
func QueueSources() []QueueSource { return append([]QueueSource(nil), sources[:]...) }

func (s QueueSource) index() int {
	for i, x := range sources {
		if x == s {
			return i
		}
	}
	return len(sources) - 1
}

// Split is a request's time to first output divided into waiting and
// prefill. Queue is all the waiting before prefill began: the proxy's own
// limiter wait (ProxyQueue) plus the engine's queue, so that
// Queue + Connect + Prefill ≈ TTFO. Without a limiter ProxyQueue is 0 and
// Queue is the engine's queue alone. When OK is false (Source is
// SourceNone) both are unknown and must be reported as null, never 0.
type Split struct {
	Queue   time.Duration
	Prefill time.Duration
	Source  QueueSource
	OK      bool
}

var noSplit = Split{Source: SourceNone}

// Split returns tr's queue/prefill split from the engine's report, the
// limiter or the learned prefill rate: the sources that need no timeline.
// Record also places tr among the requests around it (SourceOccupancy),
// which Split does not. It reads the learned rate but does not learn from
// tr. It is safe for concurrent use.
func (r *Recorder) Split(tr *proxy.Trace) Split {
	if sp, done := reportedSplit(tr); done {
		return sp
	}
	return modelSplit(tr, r.model.read())
}

// reportedSplit is the split when the engine reported its queue or the
// limiter held tr; done is false when neither did.
func reportedSplit(tr *proxy.Trace) (Split, bool) {
	pq, _ := tr.ProxyQueue()
	ttfo, ok := tr.TTFO()
	// base is the time from the upstream connection being ready to the first
	// output: engine queue + prefill + the first token.
	base := ttfo - pq - tr.Connect
	switch {
	case tr.ServerQueue >= 0:
		if tr.ServerPrefill >= 0 {
			return Split{Queue: pq + tr.ServerQueue, Prefill: tr.ServerPrefill, Source: SourceServer, OK: true}, true
		}
		if !ok {
			return noSplit, true
		}
		return Split{Queue: pq + tr.ServerQueue, Prefill: max(0, base-tr.ServerQueue), Source: SourceServer, OK: true}, true
	case tr.Limited:
		if !ok {
			return noSplit, true
		}
		return Split{Queue: pq, Prefill: max(0, base), Source: SourceLimiter, OK: true}, true
	}
	if !ok {
		return noSplit, true
	}
	return Split{}, false
}

// engineSplit is tr's split given its engine queue from source.
func engineSplit(tr *proxy.Trace, engineQueue time.Duration, source QueueSource) Split {
	pq, _ := tr.ProxyQueue()
	ttfo, _ := tr.TTFO()
	base := ttfo - pq - tr.Connect
	engineQueue = min(max(0, engineQueue), max(0, base))
	return Split{Queue: pq + engineQueue, Prefill: max(0, base-engineQueue), Source: source, OK: true}
}

// modelSplit is the fallback: the engine queue is what the cold prefill
// rate leaves of the time to first output.
func modelSplit(tr *proxy.Trace, rs rates) Split {
	if _, ok := tr.TTFO(); !ok {
		return noSplit
	}
	est, ok := estimate(tr, rs, true)
	if !ok {
		return noSplit
	}
	pq, _ := tr.ProxyQueue()
	ttfo, _ := tr.TTFO()
	return engineSplit(tr, ttfo-pq-tr.Connect-est, SourceModel)
}

// split is Record's split: the engine's report or the limiter, else the
// occupancy of the engine's slots, else the rate model. It places tr on
// the timeline (whatever its source, so that the requests after it see
// it) and returns where it stood.
func (r *Recorder) split(tr *proxy.Trace, rs rates) (Split, placement) {
	est, haveEst := estimate(tr, rs, false)
	p, warn := r.occ.place(tr, est, haveEst)
	if warn {
		r.warnSlots()
	}
	if sp, done := reportedSplit(tr); done {
		return sp, p
	}
	if p.ok {
		return engineSplit(tr, p.queue, SourceOccupancy), p
	}
	return modelSplit(tr, rs), p
}

// uncachedTokens is the prompt tokens the engine had to prefill.
func uncachedTokens(tr *proxy.Trace) (int64, bool) {
	if tr.PromptTokens < 0 {
		return 0, false
	}
	return max(0, tr.PromptTokens-max(tr.CachedTokens, 0)), true
}

// Model parameters. The median of the last 64 samples follows a change of
// model or engine within a few minutes of traffic. Prompts under 64
// uncached tokens are not learned from: their TTFO is dominated by the first
// decode step, not by prefill, and would drag the rate down. A sample more
// than hitFactor times the rate so far, or from a prompt whose prefix an
// earlier request had sent for at least hitReuse of it, is a cache hit the
// engine did not report, and is left out: agents resend a growing prompt
// every turn, and learning from those turns as if the whole prompt had
// been prefilled makes the rate absurd (docs/queue-split.md). But
// modelMinSamples left out in a row that agree within hitFactor are the
// engine's rate, not hits, and replace the samples (rateModel.refuse).
const (
	modelSamples    = 64
	modelMinSamples = 8
	modelMinTokens  = 64
	hitFactor       = 2.0
	hitReuse        = 0.5
)

// rateModel learns the engine's cold prefill rate (uncached prompt tokens
// per second) online. It is safe for concurrent use.
type rateModel struct {
	mu     sync.Mutex
	ring   [modelSamples]float64 // samples in arrival order, oldest at next once full
	sorted [modelSamples]float64 // the same samples, ascending
	next   int
	n      int
	run    [modelMinSamples]float64 // samples refused as hits since the last one learned
	runN   int
}

// learn adds tr's prefill rate, judged against the rates rs read before
// tr was split, when tr found the engine idle (nothing
// ahead of it: prefill began at once, so TTFO − proxy queue − connect is
// prefill plus one decode step) and its prompt was not served from cache.
func (m *rateModel) learn(tr *proxy.Trace, idle bool, rs rates) {
	if !idle || tr.Failed() || !tr.UsageSeen {
		return
	}
	if tr.Prefix.Tracked && tr.Prefix.Reuse >= hitReuse {
		return
	}
	uncached, ok := uncachedTokens(tr)
	ttfo, have := tr.TTFO()
	if !ok || !have || uncached < modelMinTokens {
		return
	}
	pq, _ := tr.ProxyQueue()
	base := ttfo - pq - tr.Connect
	if base <= 0 {
		return
	}
	x := float64(uncached) / base.Seconds()
	if rs.any && x > hitFactor*rs.reference {
		m.refuse(x)
		return
	}
	m.add(x)
}

// refuse notes x, a sample left out as a cache hit. Unreported hits save
// different shares of their prompts, so their rates scatter; a run of
// modelMinSamples refused in a row that agree within hitFactor is instead
// the engine's cold rate, and the samples it was judged against were the
// outliers: a stall (ollama loads the model on its first request, which is
// then the slowest sample by far, and before the model is ready the
// slowest is the reference) or an engine that got faster. The run then
// replaces the samples, which would otherwise never move again.
func (m *rateModel) refuse(x float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.run[m.runN] = x
	if m.runN++; m.runN < len(m.run) {
		return
	}
	m.runN = 0
	if slices.Max(m.run[:]) > hitFactor*slices.Min(m.run[:]) {
		return // hits of different sizes: go on refusing
	}
	m.n, m.next = 0, 0
	for _, v := range m.run {
		m.addLocked(v)
	}
}

// rates is the model read once per Record: the median (ok once ready)
// and the reference rate a new sample is judged against (ok with any
// sample).
type rates struct {
	median, reference float64
	ready, any        bool
}

// read takes the model's rates under one lock.
func (m *rateModel) read() rates {
	m.mu.Lock()
	defer m.mu.Unlock()
	var r rates
	if m.n >= modelMinSamples {
		r.median, r.ready = m.medianLocked(), true
		r.reference, r.any = r.median, true
	} else if m.n > 0 {
		r.reference, r.any = m.sorted[0], true
	}
	return r
}

// estimate is the time tr's uncached prompt takes to prefill cold at the
// model's rates rs. With ready, only a ready model answers (the split's
// fallback); otherwise any sample does, the slowest standing for the rate
// until there are enough (the occupancy split's bound on prefill).
func estimate(tr *proxy.Trace, rs rates, ready bool) (time.Duration, bool) {
	uncached, known := uncachedTokens(tr)
	if !known {
		return 0, false
	}
	rate, ok := rs.median, rs.ready
	if !ready && !ok {
		rate, ok = rs.reference, rs.any
	}
	if !ok || (!ready && uncached < modelMinTokens) {
		return 0, false
	}
	return time.Duration(float64(uncached) / rate * float64(time.Second)), true
}

// add learns x.
func (m *rateModel) add(x float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runN = 0 // a sample learned ends a run of refused ones
	m.addLocked(x)
}

// addLocked inserts x, evicting the oldest sample once full; the caller
// holds m.mu. Both arrays are small enough that the copies cost less than
// sorting on every read.
func (m *rateModel) addLocked(x float64) {
	if m.n == modelSamples {
		old := m.ring[m.next]
		i := sort.SearchFloat64s(m.sorted[:m.n], old)
		copy(m.sorted[i:], m.sorted[i+1:m.n])
		m.n--
	}
	m.ring[m.next] = x
	m.next = (m.next + 1) % modelSamples
	i := sort.SearchFloat64s(m.sorted[:m.n], x)
	copy(m.sorted[i+1:m.n+1], m.sorted[i:m.n])
	m.sorted[i] = x
	m.n++
}

// rate returns the median sample, or false with fewer than modelMinSamples.
func (m *rateModel) rate() (float64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n < modelMinSamples {
		return 0, false
	}
	return m.medianLocked(), true
}

// medianLocked is the median of at least one sample; the caller holds m.mu.
func (m *rateModel) medianLocked() float64 {
	n := m.n
	if n%2 == 1 {
		return m.sorted[n/2]
	}
	return (m.sorted[n/2-1] + m.sorted[n/2]) / 2
}

// samples returns the number of samples held.
func (m *rateModel) samples() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// PrefillRate returns the learned cold prefill rate in uncached prompt
// tokens per second and the number of samples it rests on; ok is false
// until there are enough samples for SourceModel and inferred cache hits.
// Safe for concurrent use.
func (r *Recorder) PrefillRate() (rate float64, samples int, ok bool) {
	rate, ok = r.model.rate()
	return rate, r.model.samples(), ok
}

// inferCached estimates, at the model's rates rs, the prompt tokens tr had from the engine's prefix
// cache: the prompt minus what the cold rate prefills in the measured
// prefill time. -1 when it cannot be estimated (no split, no prompt size,
// too short a prompt, or too few cold samples). The first decode step is
// in the prefill time, so the estimate errs toward "not cached".
func inferCached(tr *proxy.Trace, sp Split, rs rates) int64 {
	if !sp.OK || sp.Source == SourceModel || tr.PromptTokens < modelMinTokens || !rs.ready {
		return -1 // the model split assumes a cold prompt: it cannot also say what was cached
	}
	prefilled := int64(sp.Prefill.Seconds()*rs.median + 0.5)
	return min(max(tr.PromptTokens-prefilled, 0), tr.PromptTokens)
}
