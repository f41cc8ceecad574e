package histo

import (
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// QueueSource says where a request's queue/prefill split came from
// (docs/design.md "Queue vs prefill"), best first.
type QueueSource string

// Queue sources.
//
// The one list of them, with when each applies, is docs/queue-split.md
// "Sources, best first".
const (
	SourceServer        QueueSource = "server"         // the engine reported its queue time
	SourceHeaders       QueueSource = "headers"        // the engine sends its response head at slot start (learned): head − arrival
	SourceServerPrefill QueueSource = "server_prefill" // the engine reported its prefill time: queue is the rest of TTFO
	SourceLimiter       QueueSource = "limiter"        // the proxy's limiter held the request; the engine queue is ~0
	SourceEngineLoad    QueueSource = "engine_load"    // the engine's /metrics showed waiting the timeline could not: requests it could not see (TTFO − cold prefill estimate), or the request still waiting at a scrape
	SourceOccupancy     QueueSource = "occupancy"      // from the engine's slots as the proxy saw them fill and free
	SourceModel         QueueSource = "model"          // estimated from the learned cold prefill rate
	SourceNone          QueueSource = "none"           // not enough data: queue and prefill are unknown
)

// sources lists the sources in a fixed order, for arrays indexed by source.
var sources = [...]QueueSource{SourceServer, SourceHeaders, SourceServerPrefill, SourceLimiter, SourceEngineLoad,
	SourceOccupancy, SourceModel, SourceNone}

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

// split is a request's time to first output divided into waiting and
// prefill. Queue is all the waiting before prefill began: the proxy's own
// limiter wait (ProxyQueue) plus the engine's queue, so that
// Queue + Connect + Prefill ≈ TTFO. Without a limiter ProxyQueue is 0 and
// Queue is the engine's queue alone. When OK is false (Source is
// SourceNone) both are unknown and must be reported as null, never 0.
type split struct {
	Queue   time.Duration
	Prefill time.Duration
	Source  QueueSource
	OK      bool
}

var noSplit = split{Source: SourceNone}

// splitOf returns tr's queue/prefill split from the engine's evidence (its
// reported timings, its response head once learned), the limiter or the
// learned prefill rate: the sources that need no timeline. Record also
// places tr among the requests around it (SourceOccupancy) and reads the
// engine's load, which splitOf does not. It reads what was learned but does
// not learn from tr. It is safe for concurrent use.
func (r *Recorder) splitOf(tr *proxy.Trace) split {
	if sp, done := evidenceSplit(tr, r.head.slotStart()); done {
		return sp
	}
	return modelSplit(tr, r.model.read())
}

// evidenceSplit is the split when the engine reported its queue or its
// prefill, when its response head is its slot start (headSlotStart, as
// learned), or when the limiter held tr; done is false when none did.
func evidenceSplit(tr *proxy.Trace, headSlotStart bool) (split, bool) {
	pq, _ := tr.ProxyQueue()
	ttfo, ok := tr.TTFO()
	// base is the time from the upstream connection being ready to the first
	// output: engine queue + prefill + the first token.
	base := ttfo - pq - tr.Connect
	switch {
	case tr.ServerQueue >= 0:
		if tr.ServerPrefill >= 0 {
			return split{Queue: pq + tr.ServerQueue, Prefill: tr.ServerPrefill, Source: SourceServer, OK: true}, true
		}
		if !ok {
			return noSplit, true
		}
		return split{Queue: pq + tr.ServerQueue, Prefill: max(0, base-tr.ServerQueue), Source: SourceServer, OK: true}, true
	case !ok:
		if sp, whole := wholeSplit(tr); whole {
			return sp, true
		}
		return noSplit, true
	}
	if headSlotStart {
		// The head left when the slot started: before it was queue, after
		// it the engine's work for this request (llama.cpp's prompt-cache
		// restore on a slot switch, then the prefill). It beats the
		// engine's prompt_ms, whose rest of the time to first output would
		// count that restore as queue.
		if head, _, have := headTimes(tr); have {
			return engineSplit(tr, head, SourceHeaders), true
		}
	}
	if tr.ServerPrefill >= 0 {
		// llama.cpp's timings.prompt_ms: the engine's own prefill; what
		// else of the upstream time to first output was waiting (the
		// first token is sampled from the prompt's last batch: no decode
		// step to take off).
		return engineSplit(tr, base-tr.ServerPrefill, SourceServerPrefill), true
	}
	if tr.Limited {
		return split{Queue: pq, Prefill: max(0, base), Source: SourceLimiter, OK: true}, true
	}
	return split{}, false
}

// engineSplit is tr's split given its engine queue from source.
func engineSplit(tr *proxy.Trace, engineQueue time.Duration, source QueueSource) split {
	pq, _ := tr.ProxyQueue()
	ttfo, _ := tr.TTFO()
	base := ttfo - pq - tr.Connect
	engineQueue = min(max(0, engineQueue), max(0, base))
	return split{Queue: pq + engineQueue, Prefill: max(0, base-engineQueue), Source: source, OK: true}
}

// modelSplit is the fallback: the engine queue is what the cold prefill
// rate leaves of the time to first output.
func modelSplit(tr *proxy.Trace, rs rates) split {
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

// split is Record's split, evidence first and inference last
// (docs/queue-split.md "Sources, best first"): the engine's report, its
// response head, or the limiter; else the engine's load when it shows
// waiting the proxy could not see; else the occupancy of the engine's
// slots; else the rate model. It places tr on the timeline (whatever its
// source, so that the requests after it see it), learns the head mode from
// it, and returns where it stood.
func (r *Recorder) split(tr *proxy.Trace, rs rates) (split, placement) {
	pr := priors{abandoned: r.abandonedPrefill(tr, rs), load: r.loadAt(tr), reported: tr.CachedTokens >= 0}
	pr.point, pr.floor, pr.exact = prefillPoint(tr, rs)
	pr.fit, pr.ready = rs.fit, rs.ready
	if n, cached, _ := promptParts(tr, true); pr.point > 0 && !pr.exact { // the tokens the model's point counted
		pr.tokens = [2]float32{float32(n), float32(cached)}
	}
	pr.fresh = freshPrompt(tr)
	pr.batch = firstBatch(tr, rs, pr.point)
	pr.est, pr.haveEst = estimate(tr, rs, false)
	load := pr.load
	p, warn := r.occ.place(tr, pr)
	if warn {
		r.warnSlots()
	}
	sp, done := evidenceSplit(tr, r.head.slotStart())
	occQueue, ahead := time.Duration(-1), -1
	if p.ok {
		occQueue, ahead = p.queue, p.ahead
	}
	r.head.observe(tr, occQueue, ahead)
	switch {
	case done:
	case p.ok && (load.hidden(p) || r.sharedEngine()):
		// Waiting the proxy could not see, at its admission or because
		// others share the engine: what the cold prefill leaves of the
		// time to first output, at least what occupancy found.
		sp = engineSplit(tr, p.queue, SourceOccupancy)
		if msp := modelSplit(tr, rs); msp.OK {
			pq, _ := tr.ProxyQueue()
			sp = engineSplit(tr, max(p.queue, msp.Queue-pq), SourceEngineLoad)
		}
	case p.ok && p.byLoad:
		// The engine's scrapes showed it waiting longer than the
		// timeline found (a KV cache short for the traffic).
		sp = engineSplit(tr, p.queue, SourceEngineLoad)
	case p.ok:
		sp = engineSplit(tr, p.queue, SourceOccupancy)
	default:
		sp = modelSplit(tr, rs)
	}
	return sp, p
}

// engineBatch is the most prompt tokens of one slot that llamarunner
// decodes in one batch (its n_batch, 512; a batch carries that many of
// every prefilling slot's).
const engineBatch = 512

// firstBatch is the share of tr's prefill point estimate that its first
// engineBatch new tokens take, when it has more new tokens than that;
// else 0. The cost model's fit weighs the share when it is ready, the
// token count before.
func firstBatch(tr *proxy.Trace, rs rates, point time.Duration) time.Duration {
	if point <= 0 {
		return 0
	}
	n, cached, ok := promptParts(tr, true)
	if !ok || n <= engineBatch {
		return 0
	}
	share := engineBatch / n
	if all := rs.fit.cost(n, cached); rs.ready && all > 0 {
		share = rs.fit.cost(engineBatch, cached) / all
	}
	return time.Duration(share * float64(point))
}
