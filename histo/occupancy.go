package histo

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// The occupancy split (queue_source "occupancy", docs/queue-split.md):
// when the proxy is the engine's front door it sees every request arrive
// and end. On an engine that serves at most S requests at once, first come
// first served, a request that arrived with n requests ahead of it began
// prefill at once when n < S, and otherwise when the (n−S+1)-th of them
// ended. S is learned from the same evidence.

// Occupancy parameters.
const (
	// occRing is the number of recent requests kept to place the requests
	// after them; occMaxAhead the most requests ahead of one that are
	// looked at. Beyond either, the split falls back to the rate model.
	occRing     = 4096
	occMaxAhead = 256
	// occSettle bounds how far Record order may lag release order (both
	// happen on the request's goroutine, or, after the event loop, Record
	// on a goroutine the hand-back starts: microseconds apart): the scan for
	// the requests ahead stops at the first one released this long before
	// the request was admitted.
	occSettle = 50 * time.Millisecond
	// endTolerance counts an end that the proxy saw this soon after a
	// request's first output as before it: the engine may send one
	// request's first token before the other's [DONE] is read.
	endTolerance = 5 * time.Millisecond
	// orderWindow: two requests the proxy sent this close together may
	// reach the engine in either order (the engine's goroutines and
	// sockets, not the proxy's stamps, decide); on a one-slot engine the
	// one whose first output came first was ahead.
	orderWindow = 10 * time.Millisecond
	// slotsOrderWindow is orderWindow on an engine of several slots:
	// requests sent within it reach the engine's FIFO in an order of its
	// own (ollama's server handlers race for its semaphore: requests sent
	// within ~1–2 ms were served in no relation to their sending,
	// docs/queue-split.md "Arrival order"), and the order of their first
	// outputs tells it afterwards. It is wider than the engine's own race
	// because the proxy's arrival stamps and the engine's reads are apart
	// by a few milliseconds on a loaded host; wider still, a shorter
	// prefill on another slot would overtake often enough to mislead.
	slotsOrderWindow = 5 * time.Millisecond
	// overlapTolerance: a request counts as running beside another only
	// when it ran on this long past the other's first output, so that a
	// slot handed over while the proxy's reader of the first stream was
	// descheduled (tens of milliseconds on a starved host) never looks
	// like two slots. Real neighbours overlap for whole generations.
	overlapTolerance = 25 * time.Millisecond
	// tailMargin: a request released (its last byte written to its
	// client) this long after another's first output is not looked at as
	// ahead of it. Its slot went with its last token, and the time from
	// there to the client's last byte is the client's: a second covers a
	// slow reader.
	tailMargin = time.Second
	// epochMargin puts the timeline's zero this far before the first
	// request recorded (see rel).
	epochMargin = 24 * time.Hour
	// sweepMax bounds the requests the concurrency sweep looks at.
	sweepMax = 64
	// softMax bounds the soft ends (abandoned prefills) among one
	// request's requests ahead that its own prefill may move.
	softMax = 8
	// A request "waited for another's end" (tight) when it would otherwise
	// have spent at least minWait in the engine before that end, and its
	// first output followed the end within what its prefill can take:
	// prefillSlack × the cold-rate estimate + slackTime, or, without an
	// estimate, within tightGap and a quarter of the wait.
	minWait      = 25 * time.Millisecond
	prefillSlack = 1.5
	slackTime    = 25 * time.Millisecond
	tightGap     = 50 * time.Millisecond
	// With a point estimate of its prefill (pointFits), a request waited
	// for an end when the prefill from that end is within
	// [pointLow, pointHigh] of it and the prefill from the predicted start
	// at least pointApart times it, each ± pointSlack.
	// pointLow is wide: before the cost model is ready the point is the
	// fastest sample's per-token time, which a short prompt's fixed cost
	// inflates.
	pointLow   = 0.5
	pointHigh  = 1.3
	pointApart = 1.5
	pointSlack = 5 * time.Millisecond
)

// occEntry is one recorded request on the engine's timeline, in
// nanoseconds since occupancy.epoch.
type occEntry struct {
	occupies bool  // an inference request: it held a slot (other routes only count in flight)
	admit    int64 // passed the proxy's limiter (t_admit)
	arrive   int64 // its upstream connection was ready (t_admit + connect): its place in the engine's queue
	first    int64 // its first output (-1: none): it held a slot from then on
	end      int64 // the engine let its slot go (t_end, else t_last_token, else t_client_done)
	last     int64 // its last output (t_last_token, else end): it produced output until then
	release  int64 // the proxy stopped counting it in flight (t_client_done, else t_end)
	// admitSeq and releaseSeq are the proxy's numbers of its admission
	// and release (proxy.Trace.AdmitSeq; 0: none): they say exactly
	// whether it was in flight at another's admission, where release, a
	// stamp taken before the proxy's count fell, may not.
	admitSeq, releaseSeq uint64
	// lstart is its slot start under a batch lock (lockedQueue; arrive
	// when it could not be placed) and pend the end of its prefill (its first output; for a prefill whose
	// client left, when the engine finished it; -1 when unknown): while
	// it prefilled, an engine with a batch lock let no other slot start.
	lstart, pend int64
	// pt is its prefill's point estimate (priors.point; 0: none): its
	// first output less pt is when it began, which orders it among the
	// requests sent with it (ahead).
	pt int64
	// nt and ct are its new and cached prompt tokens as its point
	// estimate counted them (promptParts with the proxy's reuse; 0: none):
	// ahead re-estimates its start with the cost model of the request
	// being placed, so that two requests' starts are judged by one model.
	nt, ct float32
	// pb is the point estimate of its prefill's first batch when its new
	// tokens take more than one (priors.batch; 0: one batch, or none):
	// a request that lost the lock to its first batch joined it there
	// (joinedFirstBatch).
	pb int64
	// soft says end is not a stamp but the cost model's estimate of when
	// the engine finished a prefill whose client left (abandonedStart):
	// the request that waited for it knows better (softEnd). held is
	// then the stamp of the client's leaving: the engine was still
	// prefilling it (no first output had come), so it never let the slot
	// go before held.
	soft bool
	held int64
	// exact says pt is the engine's own report of the prefill
	// (priors.exact): it held a slot from first − pt to end, for certain.
	exact bool
}

// placement is where a request stood on the engine's timeline.
type placement struct {
	ok    bool          // every request ahead was seen: the split can rest on occupancy
	ahead int           // requests in the engine when it arrived
	queue time.Duration // engine queue: arrival (after connect) to prefill start
	// streams is a hard lower bound on the engine's slots: the most
	// recorded requests seen producing output at one instant with it,
	// itself included. inEngine counts the requests ahead that had not
	// ended by its first output, and itself, the unrecorded ones
	// included; it can overcount (requests sent together may reach the
	// engine in the other order), so it only ever argues against a hint.
	streams, inEngine int
	tight             bool // its first output came right after another's end
	// unproven is set when the slot count in use is a hint the evidence
	// has not reached yet (more than the most streams seen at once): a
	// queue from it may be a prefill, so the cost model does not learn
	// from it.
	unproven bool
	// inferred is set when the end it waited for was chosen by the cost
	// model's estimate of its prefill (waitedFor): the cost model does not
	// learn from it (its own estimate would come back).
	inferred bool
	// byLoad is set when the queue is the bound the engine's scrapes
	// during the wait gave (waitedBound): more than the timeline found.
	byLoad bool
}

// occupancy is the engine's timeline as the proxy sees it: the recent
// requests, and the slot count learned from them. It is safe for
// concurrent use; its mutex is held for the scan of the requests that
// overlapped one request (a few hundred nanoseconds).
type occupancy struct {
	mu     sync.Mutex
	epoch  time.Time
	set    bool
	ring   [occRing]occEntry // in Record order, newest at next−1
	next   int
	n      int
	ends   [occMaxAhead]int64 // scratch: ends of the requests ahead
	softs  [softMax]int       // scratch: the indices in ends of soft ends (occEntry.soft), in scan order
	helds  [softMax]int64     // scratch: their occEntry.held
	nSoft  int
	runs   [2][sweepMax]int64 // scratch: first outputs and ends of the requests that ran beside one
	nRuns  int
	held   [2][sweepMax]int64 // scratch: the slot starts and ends of those with an exact prefill (occEntry.exact)
	nHeld  int
	pre    [4][sweepMax]int64 // scratch: slot starts, prefill ends, point and first-batch estimates (0: none) of the requests prefilling during one's wait
	nPre   int
	joins  [sweepMax]int64 // scratch: lockEnd's joinedFirstBatch for each of pre (0: none)
	slots  slotLearner
	lock   lockLearner
	live   liveTable      // the requests in flight with their first output seen (lock-free; read under mu)
	liveAt [sweepMax]live // scratch: liveAhead's
	// coStarts are the starts under the lock of the requests in flight
	// whose first output came within endTolerance of the placed one's,
	// before or after it (liveAhead): requests that took their slots with
	// it and shared its batches (sharedStart).
	coStarts [sweepMax]int64
	liveCo   [sweepMax]live
	nCo      int
	// fit and fitReady are the cost model of the request being placed
	// (priors), set by place for ahead's ordering.
	fit      costFit
	fitReady bool
	// preLive marks the entries of pre that are requests in flight, seen
	// by their live first outputs (liveAhead), not recorded ones.
	preLive [sweepMax]bool
}

// rel is t in nanoseconds since the epoch; absent is -1, never a real
// offset: the epoch is a day before the first request recorded, so a
// request received before that one (and still running) has positive
// offsets too.
func (o *occupancy) rel(t time.Time) int64 {
	if t.IsZero() {
		return -1
	}
	return int64(t.Sub(o.epoch))
}

// entryOf is tr on the timeline; ok is false when tr never reached the
// engine.
func (o *occupancy) entryOf(tr *proxy.Trace) (occEntry, bool) {
	if tr.Sent.IsZero() || tr.Admit.IsZero() {
		return occEntry{}, false // it never reached the engine
	}
	// The engine lets a slot go when the stream ends: ollama frees it one
	// decode step after the last content token, with the final chunk
	// (155–240 ms under host load, docs/queue-split.md), so t_end, not
	// t_last_token, is the end a successor waited for. An engine that
	// freed it at the last token is off by the usage and [DONE] writes:
	// microseconds.
	// The queue order is taken from t_admit + connect, not t_sent:
	// t_sent is stamped after the write returns, so a reader descheduled
	// there stamps it late although the engine already has the request
	// (a later request then looks ahead of it); a stamp taken before the
	// write can only be late if the write is late too.
	e := occEntry{occupies: true, admit: o.rel(tr.Admit), arrive: o.rel(tr.Admit.Add(tr.Connect)), first: o.rel(tr.FirstOutput),
		end: o.rel(tr.End), release: o.rel(tr.ClientDone), admitSeq: tr.AdmitSeq, releaseSeq: tr.ReleaseSeq}
	e.lstart, e.pend = e.arrive, e.first
	if e.end < 0 {
		e.end = o.rel(tr.LastToken)
	}
	if e.end < 0 {
		e.end = e.release
	}
	if e.release < 0 {
		e.release = e.end
	}
	// Streams side by side are judged by their output (sweep): a stream's
	// end stamp is later than its last token by the final chunk, and by
	// the proxy's reader when it was descheduled there, which would make
	// a slot handed over look like two.
	if e.last = o.rel(tr.LastToken); e.last < 0 || e.last > e.end {
		e.last = e.end
	}
	return e, e.end >= 0
}

// priors is what the split knows of a request before placing it.
type priors struct {
	est     time.Duration // its cold prefill estimate (an upper bound on its prefill), when haveEst
	haveEst bool
	// point, when positive, is what its prefill should take by the new
	// tokens the evidence gives (reported cached, else the prefix reuse
	// the proxy saw), and floor a lower bound on it (prefillPoint).
	point, floor time.Duration
	// batch, when positive, is the share of point that its first
	// engineBatch new tokens take, when it has more (firstBatch).
	batch time.Duration
	// abandoned, when positive, is how long the engine takes to prefill
	// a request whose client left before its first output, from its
	// start (the slot stays taken until then, and at least until the
	// leaving).
	abandoned time.Duration
	load      engineLoad // the engine's own counts at its arrival, when scraped
	// reported is set when the engine reported its cached tokens (an
	// engine without a batch lock: lockable).
	reported bool
	fresh    bool // its prompt is new to the engine (freshPrompt): no cache hit shortened its prefill
	// exact is set when point is the engine's own report of the prefill
	// (prefillPoint): its start is then known, first output less point.
	exact bool
	// fit and ready are the cost model the point came from; tokens the
	// new and cached prompt tokens its point counted (0: no point from
	// the model).
	fit    costFit
	ready  bool
	tokens [2]float32
}

// place finds tr's queue from the requests ahead of it, learns from it,
// and adds it to the timeline. warn is set when the learned slot count
// began to disagree with the hint.
func (o *occupancy) place(tr *proxy.Trace, pr priors) (p placement, warn bool) {
	est, haveEst, load, abandoned := pr.est, pr.haveEst, pr.load, pr.abandoned
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.set {
		o.epoch, o.set = tr.Recv.Add(-epochMargin), true
	}
	e, onTimeline := o.entryOf(tr)
	if !onTimeline {
		// Admitted but never sent (the dial failed, the client left
		// first): it held no slot, but the proxy counted it in flight at
		// the admissions while it was, and a later request must subtract
		// it from that count, not take it for one ahead in the engine.
		o.pushPassing(tr)
		return placement{}, false
	}
	e.pt, e.pb, e.exact = int64(max(pr.point, 0)), int64(max(pr.batch, 0)), pr.exact
	e.nt, e.ct = pr.tokens[0], pr.tokens[1]
	o.live.done(tr.ID)
	// A request without a first output whose client left in the prefill
	// is scanned to its end; one with none at all (a whole answer) is
	// not scanned past the latest entries (sweepMax): a scan reaches back
	// occSettle, which at a high rate of non-stream requests is hundreds
	// of entries for each (12% of BenchmarkNonStream's CPU).
	until := e.first
	if until < 0 && abandoned > 0 {
		until = e.end
	}
	o.fit, o.fitReady = pr.fit, pr.ready
	m, mAdmit, complete := o.scan(e, until)
	// Requests in flight at admission that are not recorded yet end after
	// this one: they are ahead, and still there, unless their first
	// output, seen live, says the engine served them after it. The live
	// table is read whenever it holds a request: one admitted just after
	// this one may have taken the engine's lock first (its handlers race),
	// and this one, with nobody in flight at its admission, waited for its
	// prefill. Read only when more were in flight at its admission than
	// recorded (until session 9), the holder was not seen, and the waiter
	// was split as unqueued (ollama, 2 slots: the proxy's 2nd request of a
	// burst, 105 and 116 ms of queue read as 0; TestBatchLockHolderAdmittedAfter).
	behind := 0
	if complete && (tr.InflightAtAdmit > mAdmit || o.live.n.Load() > 0) {
		behind = o.liveAhead(e, tr.ID)
	}
	n := m + max(0, tr.InflightAtAdmit-mAdmit-behind)
	ends := o.ends[:m]
	if !complete || e.first < 0 {
		if complete && abandoned > 0 {
			sortEnds(ends)
			// Begun before its client left, it held the slot for its
			// prefill, past the leaving (no first output had come), by
			// what the estimate says is left of it, or by what the
			// request after it says (softEnd): under load the estimate
			// may end before the client left (a 2,000-token prefill of
			// 2,249 ms on ollama estimated 362 ms, left at 600 ms), and
			// the leaving, taken for the end, gave the next request
			// 1.3 ms of queue for 1,659. Still queued then, it left the
			// queue.
			if start := o.abandonedStart(e, ends, n); start < e.end {
				e.held = e.end
				e.end, e.soft = max(e.end, start+int64(abandoned)), true
			}
			e.pend = e.end // the engine prefilled on until it let the slot go
		}
		o.push(e)
		return placement{ahead: m}, false
	}
	soft := o.softEnd(e, ends, pr.point)
	sortEnds(ends)
	defer func() { o.push(e) }() // e as it stands at the return: lockedQueue sets its lstart
	c := 0
	for c < m && ends[c] < e.first+int64(endTolerance) {
		c++
	}
	p = placement{ok: true, ahead: n, inEngine: n - c + 1, streams: max(o.sweep(e), load.running, o.heldAtStart(e))}
	// The evidence is judged against the hint when there is one (it is
	// what may be wrong), else against the count in use.
	hint := o.slots.hint
	if hint == 0 {
		hint = o.slots.effective()
	}
	cw := c
	if pr.exact {
		// Its start is known: an end after it is not the one it waited
		// for (a slot launched long before its prefill began: llama-server
		// fills each batch slot by slot, a prompt behind others' waits in
		// its slot; docs/engines.md).
		for cw > 0 && ends[cw-1] > e.first-int64(pr.point)+int64(pointSlack) {
			cw--
		}
	}
	j, byPoint := waitedFor(e, ends[:cw], n, max(hint, p.streams), est, haveEst, pr.point)
	// A prefill end that explains the first output better than the slot's
	// release is taken only from an engine whose evidence says it has no
	// batch lock (lockable): under ollama's lock the same timeline is a
	// request that waited for a slot, and the lock's rules judge it.
	if j >= 0 && !lockable(o.rel(tr.Headers), ends[j], leastWait(pr.point), e.first, pr.reported) && o.prefillExplains(e, ends[j], pr.point) {
		j, byPoint = -1, false
	}
	p.inferred = byPoint
	own := 0 // the slot count its own start under the lock is best explained by
	if p.tight = j >= 0; p.tight {
		p.inEngine = n - j // it took the slot ends[j] freed: all of them were busy
	} else if k, fits := o.waitedWithLock(e, ends[:c], n, p.streams, pr, o.rel(tr.Headers)); k > 0 {
		p.inferred = true // its start was chosen by its prefill's estimate
		if p.tight = fits; fits {
			p.inEngine = k
		} else {
			own = k
		}
	}
	if (n > 0 || p.streams > 1) && !tr.Failed() { // it had company: evidence either way
		kv := p.tight && o.kvHeld(e, load.hist, kvNeed(tr)) // the KV cache's wait, not a slot's
		warn = o.slots.observe(p.streams, p.inEngine, p.tight, kv)
	}
	s := o.slots.effective()
	waited := p.tight && p.inEngine < s && o.slots.state == SlotsHint
	if !waited && own > 0 && o.slots.state == SlotsHint {
		s, waited = own, true // its own split only: no evidence against the hint
	} else if waited {
		// It waited for an end earlier slots than the hint allows would
		// not have made it wait for: its own evidence against the hint,
		// before the hint is set aside. A learned count is never lowered
		// so: it is what ran at once.
		s = max(p.inEngine, o.slots.learned())
	}
	s = max(s, p.streams) // it ran beside streams−1 others: the engine has at least that many slots
	p.unproven = s > max(o.slots.learned(), p.streams)

	// With s slots it began when the (n−s+1)-th request ahead ended; if
	// fewer than that ended before its first output, fewer were ahead
	// than counted, and the latest end before it is the one it waited for.
	if n >= s && c > 0 {
		floor := pr.floor
		if waited {
			floor = 0 // the end it waited for was chosen by its prefill already
		}
		k0 := min(n-s, c-1)
		k := earliest(e, ends, k0, floor)
		if k == k0 && !waited && pr.fresh && slotShort(e, ends, k, pr.point) {
			k, p.inferred = k-1, true // its own split only: its estimate chose the end
		}
		// Moved earlier by the floor, the prefill it leaves is the
		// measured time from that end: the cost model may learn from it
		// (before the model is ready the floor rests on the fastest
		// sample, which a slow one never moves; after, the fit leaves
		// outliers out).
		if k >= 0 {
			p.queue = max(0, time.Duration(ends[k]-e.arrive))
			// An end moved by its own prefill's estimate: the cost
			// model must not learn that estimate back.
			p.inferred = p.inferred || (soft >= 0 && ends[k] == soft)
		}
	}
	// The engine's scrapes during its wait bound its queue below.
	bound := o.waitedBound(e, ends, n-m, load.hist)
	p.queue = max(p.queue, bound)
	p.queue, e.lstart = o.lockedQueue(e, p.queue, pr, o.rel(tr.Headers))
	p.byLoad = bound > 0 && p.queue == bound
	return p, warn
}

// softEnd moves the soft ends among ends (abandoned prefills, as the cost
// model predicted them) to when e's first output less the point estimate
// of its own prefill says the engine let that slot go, within e's arrival
// and first output, and never before that prefill's client left (the
// engine was prefilling it then). The abandoned prompt is the longer, often longer than
// any the model learned from (an extrapolation, where a context cost the
// fit left out weighs most), e's own the one whose new tokens are known:
// on ollama a 2,000-token abandoned prefill ran 4 × past the model's
// estimate in one run and ended after the next request's first output in
// another (queue 0), while the next request's 600 tokens were within 35%
// of theirs. It returns the value the soft ends were moved to, -1 when
// none was (no soft end ahead, or no point estimate). The caller holds
// o.mu.
func (o *occupancy) softEnd(e occEntry, ends []int64, point time.Duration) int64 {
	if o.nSoft == 0 || point <= 0 {
		return -1
	}
	v := min(max(e.first-int64(point), e.arrive), e.first)
	for k, i := range o.softs[:o.nSoft] {
		ends[i] = max(v, o.helds[k]) // not before its client left: it was prefilling then
	}
	return v
}

// earliest is the end e waited for, k by the slot count, unless that
// leaves e less than floor of prefill: its prompt cannot be prefilled so
// fast (the proxy saw no earlier request send the part that would have to
// be cached), so it began earlier, beside requests the proxy never saw
// produce output together (a long prefill overlaps a short answer's
// decode): the latest earlier end that leaves it floor, or its arrival
// (-1). When even its arrival leaves less than floor, the floor is wrong
// (the engine had the prompt from elsewhere) and k stands.
func earliest(e occEntry, ends []int64, k int, floor time.Duration) int {
	f := int64(floor)
	if floor <= 0 || e.first-ends[k] >= f || e.first-e.arrive < f {
		return k
	}
	for k--; k >= 0 && e.first-ends[k] < f; k-- {
	}
	return k
}

// slotShort reports whether e, a request of a fresh prompt placed at
// ends[k] by the slot count, began one end earlier, at the slot one more
// would have given it: the prefill from there fits its estimate (at most
// pointHigh of it) better than the prefill from ends[k] does (closer).
//
// A burst reaches the engine within a millisecond, so its first S requests
// take the S slots at once and the rest queue, each taking the slot the
// next stream's end frees (ollama lets it go one decode step after the
// last token). The count the split uses is the most streams seen side by
// side, and a burst's S-th stream can have overlapped the others for less
// than overlapTolerance (on 4 slots the 4th stream's output ran 14 ms
// beside the 3 others'; a prefill of 1,700 tokens from the burst's arrival
// had its first output after a neighbour's end): 3 slots learned, or a
// --engine-slots 3 never refuted. Ends of such a burst fall tens of
// milliseconds apart, and the queued requests were placed one end late:
// 26–34 ms too much queue, their prefill 0.58 of the estimate where the
// end before gives 0.98 (TestQueueAccuracySlots, 4 slots: 2–3 of 24
// requests per cell). A fresh prompt (freshPrompt) cannot have been
// shortened by a cache hit the evidence missed, so a prefill that short is
// a start that early. The count is not raised by it: a learned count is
// what was seen at once, and an estimate is no such evidence.
func slotShort(e occEntry, ends []int64, k int, point time.Duration) bool {
	if point <= 0 || k < 0 {
		return false
	}
	at := e.arrive
	if k > 0 {
		at = max(at, ends[k-1])
	}
	from, gap := e.first-at, e.first-ends[k]
	return float64(from) <= pointHigh*float64(point)+float64(pointSlack) && closer(from, gap, point)
}

// pointFits reports whether a prefill of gap fits the point estimate and
// one of from does not: the request's new tokens are known (its prompt is
// not a cache hit the proxy could not know of), so its prefill is close to
// point, and it began at the end gap before its first output, not at the
// start from before it that the slot count predicts.
func pointFits(gap, from int64, point time.Duration) bool {
	p, slack := float64(point), float64(pointSlack)
	return float64(from) >= pointApart*p+slack && float64(gap) >= pointLow*p-slack && float64(gap) <= pointHigh*p+slack
}

// waitedFor is the index in ends (the ends of the requests ahead of e
// before its first output, ascending; n ahead in all) of an end that e
// waited for although with slots slots it would have begun earlier, or -1.
// With slots slots e began at its arrival (n < slots) or at the
// (n−slots+1)-th end; if its first output came longer after that than its
// prefill can take, and right after a later end (within what its prefill
// can take, having been in the engine at least minWait before it), it
// took the slot that later end freed: the engine has fewer slots. Cache
// hits only make prefill shorter, so an estimate from the cold rate bounds
// it from above. A correct slot count never gives one: a request that
// began at the end it should have may see the others ahead end during its
// prefill, but it is judged from its predicted start, not from them.
func waitedFor(e occEntry, ends []int64, n, slots int, est time.Duration, haveEst bool, point time.Duration) (j int, byPoint bool) {
	j = waitedForEnd(e, ends, n, slots, est, haveEst, point)
	if j < 0 || point <= 0 {
		return j, false
	}
	return j, pointFits(max(e.first-ends[j], 0), e.first-predictedStart(e, ends, n, slots), point)
}

// prefillExplains reports whether the end of a prefill that was in
// progress during e's wait explains e's first output (its point estimate
// later, within 1/explainBand–explainBand of it) where the end found,
// one a slot came free at, does not: e took no slot that end freed, it
// prefilled beside that prefill (an engine without a lock whose
// concurrent prefills share its compute in arrival order gives it its
// first output that prefill's end plus its own prefill later) or waited
// for its batch (lockedQueue judges that). Not told so, one request of
// two 1 ms apart, 6,000 tokens each, 300 ms alone, on two slots given as
// --engine-slots 2, was read as waiting for the other's slot to come free
// with its stream's end, a first output 199 ms after it (0.66 of the
// estimate, within pointFits' band): 299 ms of queue, where the other's
// prefill end explains it to a millisecond
// (TestBatchLockNotFromSharedPrefill). The caller holds o.mu.
func (o *occupancy) prefillExplains(e occEntry, end int64, point time.Duration) bool {
	if point <= 0 || within(e.first-end, point) {
		return false
	}
	for i := range o.nPre {
		if f := o.pre[1][i]; f > e.arrive && f < end && within(e.first-f, point) {
			return true
		}
	}
	return false
}

// explainBand bounds prefillExplains' fit: a prefill of d fits point when
// d/point is within 1/explainBand–explainBand.
const explainBand = 1.25

// within reports whether a prefill of d fits point within explainBand.
func within(d int64, point time.Duration) bool {
	r := float64(d) / float64(point)
	return r >= 1/explainBand && r <= explainBand
}

// predictedStart is when e began with slots slots: at its arrival, or at
// the (n−slots+1)-th end (ends ascending).
func predictedStart(e occEntry, ends []int64, n, slots int) int64 {
	if k := n - slots; k >= 0 && k < len(ends) {
		return max(e.arrive, ends[k])
	}
	return e.arrive
}

// waitedForEnd is waitedFor's index.
func waitedForEnd(e occEntry, ends []int64, n, slots int, est time.Duration, haveEst bool, point time.Duration) int {
	if k := n - slots; k >= len(ends) {
		return -1 // it began after its first output: fewer were ahead than counted
	}
	start := predictedStart(e, ends, n, slots)
	j := len(ends) - 1
	if j < 0 || ends[j] <= start {
		return -1 // no end after its predicted start
	}
	from := e.first - start
	if point > 0 {
		// Its prefill is known: the end it waited for is the one its
		// prefill fits, not necessarily the latest (others ahead of it may
		// end during its prefill).
		for i := j; i >= 0 && ends[i] > start && ends[i]-e.arrive >= int64(minWait); i-- {
			if pointFits(max(e.first-ends[i], 0), from, point) {
				return i
			}
		}
	}
	wait, gap := ends[j]-start, max(e.first-ends[j], 0)
	if ends[j]-e.arrive < int64(minWait) {
		return -1
	}
	if haveEst {
		bound := int64(prefillSlack*float64(est)) + int64(slackTime)
		if from > bound && gap <= bound {
			return j
		}
		return -1
	}
	if gap <= int64(tightGap) && 4*gap <= wait {
		return j
	}
	return -1
}

// abandonedStart is when e, a request whose client left before its first
// output, began its prefill: at its arrival or at the end it waited for
// (with the slots in use). The engine then prefilled on past the client's
// leaving (ollama and llama.cpp notice only at the first output), so it
// let the slot go the prefill estimate after this, when that is later
// than e.end. It is e.end when the end it waited for came after its
// client left. The caller holds o.mu.
func (o *occupancy) abandonedStart(e occEntry, ends []int64, n int) int64 {
	start := e.arrive
	if k := n - o.slots.effective(); k >= 0 {
		if k >= len(ends) {
			return e.end // the end it waited for came after it left: it never began
		}
		start = max(start, ends[k])
	}
	return start
}

// sweep is the most requests seen producing output at one instant of e's
// own output, e included: at e's first output and at each later first
// output of a request that ran beside it. It reads the entries the last
// scan collected. The caller holds o.mu.
func (o *occupancy) sweep(e occEntry) int {
	firsts, ends := o.runs[0][:o.nRuns], o.runs[1][:o.nRuns]
	insertionSort(firsts)
	insertionSort(ends)
	running, i, j := 0, 0, 0
	for i < len(firsts) && firsts[i] <= e.first {
		i++
		running++
	}
	for j < len(ends) && ends[j] <= e.first+int64(overlapTolerance) {
		j++
		running--
	}
	best := running
	for ; i < len(firsts); i++ {
		t := firsts[i]
		for j < len(ends) && ends[j] <= t+int64(overlapTolerance) {
			j++
			running--
		}
		running++
		best = max(best, running)
	}
	return best + 1
}

// passing puts a request of a route without generation (/v1/models …) on
// the timeline: it held no slot, but the proxy's in-flight count at a
// later request's admission included it.
func (o *occupancy) passing(tr *proxy.Trace) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.set {
		o.epoch, o.set = tr.Recv.Add(-epochMargin), true
	}
	o.pushPassing(tr)
}

// pushPassing puts tr on the timeline as a request that held no slot but
// was counted in flight from its admission to its release. The caller
// holds o.mu.
func (o *occupancy) pushPassing(tr *proxy.Trace) {
	if tr.Admit.IsZero() {
		return // refused before admission: never counted in flight
	}
	e := occEntry{admit: o.rel(tr.Admit), first: -1, release: o.rel(tr.ClientDone), admitSeq: tr.AdmitSeq, releaseSeq: tr.ReleaseSeq}
	if e.release < 0 {
		e.release = o.rel(tr.End)
	}
	if e.release < 0 {
		e.release = e.admit // no stamp after its admission: in flight for an instant
	}
	e.arrive, e.end, e.last = e.admit, e.release, e.release
	o.push(e)
}

// scan collects the ends of the recorded requests ahead of e into o.ends
// and counts those in flight when e was admitted; it also collects the
// requests that produced output while e did, for sweep. until is e's first
// output, or its end for an abandoned prefill (-1: none). complete is false
// when the timeline may have lost one of the requests ahead. The caller
// holds o.mu.
//
// The ring is in Record order, which follows release order within
// occSettle. Requests released tailMargin after until can be neither
// ahead-and-ended-before-it nor, for the accounting, different from a
// request not recorded yet (both are in flight at e's admission and still
// there at its first output), so a binary search skips them: a long
// generation during which thousands of others finished costs a few steps,
// not a scan of them all. Only the newest sweepMax of them are looked at,
// as evidence of slots side by side.
func (o *occupancy) scan(e occEntry, until int64) (m, mAdmit int, complete bool) {
	o.nRuns, o.nSoft, o.nHeld = 0, 0, 0
	if o.n == occRing && o.at(o.n-1).release >= e.admit-int64(occSettle) {
		return 0, 0, false // the timeline does not reach back to e's admission
	}
	oneSlot := o.slots.effective() == 1
	o.nPre, o.nCo = 0, 0
	later := sort.Search(o.n, func(i int) bool { return o.at(i).release <= until+int64(tailMargin) })
	for i := range min(later, sweepMax) {
		o.overlap(o.at(i), &e)
		o.prefilling(o.at(i), &e)
	}
	for i := later; i < o.n; i++ {
		x := o.at(i)
		if x.release < e.admit-int64(occSettle) {
			return m, mAdmit, true // older ones were released before e was admitted
		}
		if inFlightAt(x, &e) {
			mAdmit++
		}
		if !x.occupies {
			continue
		}
		if o.ahead(x, &e, oneSlot) {
			if m == occMaxAhead {
				return m, mAdmit, false
			}
			o.ends[m] = x.end
			if x.soft && o.nSoft < softMax {
				o.softs[o.nSoft], o.helds[o.nSoft] = m, x.held
				o.nSoft++
			}
			m++
		}
		o.overlap(x, &e)
		o.prefilling(x, &e)
	}
	// Entries skipped as later are in flight at e's admission exactly
	// when they would have counted in mAdmit: leaving both out keeps n.
	return m, mAdmit, true
}

// inFlightAt reports whether x was among the requests the proxy counted
// in flight at e's admission: by the proxy's numbers when both have them,
// else by the stamps.
func inFlightAt(x, e *occEntry) bool {
	if x.admitSeq != 0 && x.releaseSeq != 0 && e.admitSeq != 0 {
		return x.admitSeq < e.admitSeq && x.releaseSeq > e.admitSeq
	}
	return x.admit < e.admit && x.release > e.admit
}

// at is the i-th newest entry. The caller holds o.mu.
func (o *occupancy) at(i int) *occEntry { return &o.ring[(o.next-1-i+occRing)%occRing] }

// heldAtStart is how many requests held a slot when e's prefill began,
// e included, by the engine's own reports of their prefills: each of them
// held its slot from its first output less its reported prefill to its
// end (or longer: a llama-server slot is taken at launch, before its
// prefill begins), so the count is a lower bound on the slots, as streams
// side by side are. It counts where no output overlaps (llama-server's
// answers on the tiny model end within milliseconds of seconds-long
// prefills, so --engine-slots 1 on two slots stood). 0 when e's prefill is
// not the engine's report. It reads the entries the last scan collected.
// The caller holds o.mu.
func (o *occupancy) heldAtStart(e occEntry) int {
	if !e.exact || e.first < 0 {
		return 0
	}
	start, tol := e.first-e.pt, int64(endTolerance)
	n := 1
	for i := range o.nHeld {
		if o.held[0][i] < start-tol && o.held[1][i] > start+tol {
			n++
		}
	}
	return n
}

// overlap collects x for sweep when it produced output while e did, and
// for heldAtStart when its slot's time is known.
func (o *occupancy) overlap(x, e *occEntry) {
	if x.occupies && x.exact && x.first >= 0 && o.nHeld < sweepMax {
		o.held[0][o.nHeld], o.held[1][o.nHeld] = x.first-x.pt, x.end
		o.nHeld++
	}
	if x.occupies && x.first >= 0 && e.first >= 0 && x.first <= e.last && x.last > e.first+int64(overlapTolerance) && o.nRuns < sweepMax {
		o.runs[0][o.nRuns], o.runs[1][o.nRuns] = x.first, x.last
		o.nRuns++
	}
}

// ahead reports whether x was ahead of e in the engine's queue and still
// there when e arrived: sent first, or, on a one-slot engine, sent within
// orderWindow of e with its first output first (one slot serves in
// order, so the first output tells the order; with more slots a shorter
// prefill can overtake, and the proxy's send order is the better guess).
func (o *occupancy) ahead(x, e *occEntry, oneSlot bool) bool {
	if x.end <= e.arrive && !x.outran() {
		return false
	}
	w := int64(slotsOrderWindow)
	if oneSlot {
		w = int64(orderWindow)
	}
	if d := x.arrive - e.arrive; d > -w && d < w && x.first >= 0 && e.first >= 0 {
		if oneSlot {
			return x.first < e.first
		}
		// With several slots a shorter prefill overtakes: the one that
		// began first, its first output less its prefill, was served first.
		return x.first-o.prefillOf(x) < e.first-o.prefillOf(e)
	}
	return x.arrive < e.arrive
}

// prefillOf is x's prefill estimate for ordering it against the request
// being placed: by that request's cost model when it is ready and x's
// tokens are known (a point kept from x's own placement was made by an
// earlier model: on ollama, before the model learned the prefills that
// shared a batch, 139-182 ms where the request placed now had 470, and
// three requests the engine served first were ordered after it), else the
// point kept. The caller holds o.mu.
func (o *occupancy) prefillOf(x *occEntry) int64 {
	if !o.fitReady || x.nt <= 0 {
		return x.pt
	}
	return int64(seconds(o.fit.cost(float64(x.nt), float64(x.ct))))
}

// outran reports whether x is an abandoned prefill that outran its
// estimate: the estimate ended before the client left, while the engine
// was still prefilling (no first output had come). Its end is then only a
// lower bound, and it may still have held the slot when a request that
// arrived after its client left did: that request's own prefill tells
// (softEnd). The scan reaches it only within occSettle of its leaving.
func (x *occEntry) outran() bool { return x.soft && x.end == x.held }

// push adds e to the timeline. The caller holds o.mu.
func (o *occupancy) push(e occEntry) {
	o.ring[o.next] = e
	o.next = (o.next + 1) % occRing
	o.n = min(o.n+1, occRing)
}

// Slots returns the engine's slot count as the split uses it and how it
// was reached. Safe for concurrent use.
func (r *Recorder) Slots() SlotsSection {
	r.occ.mu.Lock()
	s := r.occ.slots.section()
	r.occ.mu.Unlock()
	s.ResponseHead = r.head.current()
	return s
}

// sortEnds sorts the ends of the requests ahead ascending. They were found
// newest first, so nearly descending: reversed first, insertion sort is
// then nearly linear.
func sortEnds(ends []int64) {
	slices.Reverse(ends)
	insertionSort(ends)
}

// insertionSort sorts a few values ascending without the overhead of a
// general sort.
func insertionSort(a []int64) {
	for i := 1; i < len(a); i++ {
		x, j := a[i], i
		for ; j > 0 && a[j-1] > x; j-- {
			a[j] = a[j-1]
		}
		a[j] = x
	}
}

// waitedWithLock is the slot count, fewer than an unproven hint's and not
// fewer than the engine was seen running, that e's own timeline says it
// waited with when the hint's does not explain it, and whether that count
// is evidence against the hint (fits); 0 when there is none. On an engine
// with a batch lock (ollama) a request that took its slot at an end waits
// on for the prefills in progress there, so its first output comes its
// prefill after its start under the lock, not after the slot's end, and
// waitedFor, which looks at the ends, does not see it wait: behind a too
// large hint (2 slots given 4) it was placed at an earlier start under the
// lock, 113–576 ms early (10 of 192 requests). So each count from the
// hint's down is judged as the split would place e with it (startWith):
// when e's prefill from the hint's start is too long to be its own and
// from a count's start that the lock moved it fits its estimate
// (pointFits), e waited with that many slots (a start the lock did not
// move is a slot's end, waitedFor's to judge). Only on the lock's evidence
// (lockStart's other): on an engine that reports its cached tokens or
// sends its head early a prefill end explains such a first output as
// well, and a request that had a slot at once took 299 ms of queue
// (TestBatchLockNotFromSharedPrefill). When no count fits, e may have
// shared its batches: requests that took their slots at the same ends
// share llamarunner's batches and each prefill takes about the sum of
// theirs (2–7 × its own). Such a prefill fits no estimate, and a right
// hint's would look the same, so it argues nothing against the hint; but
// the count whose start leaves the prefill closest to e's estimate (by
// more than the relay's jitter, pointSlack) is the better account of e
// itself, and e is split with it (4 slots given 6: 14 of 320 requests off
// by 32–965 ms). A count never starts e before the hint does: fewer slots
// free no slot sooner. The caller holds o.mu.
func (o *occupancy) waitedWithLock(e occEntry, ends []int64, n, streams int, pr priors, head int64) (slots int, fits bool) {
	hint, lrn, point := o.slots.hint, o.slots.learned(), pr.point
	if point <= 0 || o.slots.state != SlotsHint || hint <= max(lrn, streams) {
		return 0, false
	}
	hintAt, _, other := o.startWith(e, ends, n, hint, pr, head)
	from := e.first - hintAt
	if other || float64(from) < pointApart*float64(point)+float64(pointSlack) {
		return 0, false // another engine's evidence, or the hint explains it
	}
	best, bestGap := 0, from
	// More slots than n start e at its arrival, as the hint does.
	for k := min(hint-1, n); k >= max(lrn, streams, 1) && n-k < len(ends); k-- {
		at, moved, _ := o.startWith(e, ends, n, k, pr, head)
		gap := e.first - at
		switch {
		case at <= hintAt:
		case moved && pointFits(max(gap, 0), from, point):
			return k, true
		case closer(gap, bestGap, point) && gap < bestGap-int64(pointSlack):
			best, bestGap = k, gap
		}
	}
	return best, false
}
