package histo

import (
	"sort"
	"sync"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// QueueSource says where a request's queue/prefill split came from
// (DESIGN.md §3 "Queue vs prefill"), best first.
type QueueSource string

// Queue sources.
const (
	SourceServer  QueueSource = "server"  // the engine reported its queue time
	SourceLimiter QueueSource = "limiter" // the proxy's limiter held the request; the engine queue is ~0
	SourceModel   QueueSource = "model"   // estimated from the learned prefill rate
	SourceNone    QueueSource = "none"    // not enough data: queue and prefill are unknown
)

// sources lists the sources in a fixed order, for arrays indexed by source.
var sources = [...]QueueSource{SourceServer, SourceLimiter, SourceModel, SourceNone}

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

// Split returns tr's queue/prefill split from the best source available.
// It reads the learned prefill rate but does not learn from tr; Record does
// that. It is safe for concurrent use.
func (r *Recorder) Split(tr *proxy.Trace) Split {
	pq, _ := tr.ProxyQueue()
	ttfo, ok := tr.TTFO()
	// base is the time from the upstream connection being ready to the first
	// output: engine queue + prefill + the first token.
	base := ttfo - pq - tr.Connect
	switch {
	case tr.ServerQueue >= 0:
		if tr.ServerPrefill >= 0 {
			return Split{Queue: pq + tr.ServerQueue, Prefill: tr.ServerPrefill, Source: SourceServer, OK: true}
		}
		if !ok {
			return noSplit
		}
		return Split{Queue: pq + tr.ServerQueue, Prefill: max(0, base-tr.ServerQueue), Source: SourceServer, OK: true}
	case tr.Limited:
		if !ok {
			return noSplit
		}
		return Split{Queue: pq, Prefill: max(0, base), Source: SourceLimiter, OK: true}
	}
	uncached, known := uncachedTokens(tr)
	rate, learned := r.model.rate()
	if !ok || !known || !learned {
		return noSplit
	}
	est := time.Duration(float64(uncached) / rate * float64(time.Second))
	engineQueue := max(0, base-est)
	return Split{Queue: pq + engineQueue, Prefill: max(0, base-engineQueue), Source: SourceModel, OK: true}
}

// uncachedTokens is the prompt tokens the engine had to prefill.
func uncachedTokens(tr *proxy.Trace) (int64, bool) {
	if tr.PromptTokens < 0 {
		return 0, false
	}
	return max(0, tr.PromptTokens-max(tr.CachedTokens, 0)), true
}

// Model parameters. The median of the last 64 samples follows a change of
// model or engine within a few minutes of traffic and ignores the odd
// request that queued behind traffic the proxy cannot see. Prompts under 64
// uncached tokens are not learned from: their TTFO is dominated by the first
// decode step, not by prefill, and would drag the rate down.
const (
	modelSamples    = 64
	modelMinSamples = 8
	modelMinTokens  = 64
)

// rateModel learns the engine's prefill rate (uncached prompt tokens per
// second) online. It is safe for concurrent use.
type rateModel struct {
	mu     sync.Mutex
	ring   [modelSamples]float64 // samples in arrival order, oldest at next once full
	sorted [modelSamples]float64 // the same samples, ascending
	next   int
	n      int
}

// learn adds tr's prefill rate when tr started on an idle engine: with a
// free slot the engine began prefill at once, so TTFO − proxy queue −
// connect is prefill plus one decode step.
func (m *rateModel) learn(tr *proxy.Trace, slots int) {
	if tr.Failed() || !tr.UsageSeen || tr.InflightAtAdmit >= slots {
		return
	}
	uncached, ok := uncachedTokens(tr)
	ttfo, have := tr.TTFO()
	if !ok || !have || uncached < modelMinTokens {
		return
	}
	pq, _ := tr.ProxyQueue()
	if base := ttfo - pq - tr.Connect; base > 0 {
		m.add(float64(uncached) / base.Seconds())
	}
}

// add inserts x, evicting the oldest sample once full. Both arrays are
// small enough that the copies cost less than sorting on every read.
func (m *rateModel) add(x float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
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
	n := m.n
	if n < modelMinSamples {
		return 0, false
	}
	if n%2 == 1 {
		return m.sorted[n/2], true
	}
	return (m.sorted[n/2-1] + m.sorted[n/2]) / 2, true
}

// samples returns the number of samples held.
func (m *rateModel) samples() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// PrefillRate returns the learned prefill rate in uncached prompt tokens
// per second and the number of samples it rests on; ok is false until
// there are enough samples for SourceModel. Safe for concurrent use.
func (r *Recorder) PrefillRate() (rate float64, samples int, ok bool) {
	rate, ok = r.model.rate()
	return rate, r.model.samples(), ok
}
