package histo

import (
	"math"
	"time"
)

// The batch lock (docs/queue-split.md "The batch lock"): some engines let
// no slot start while a prefill batch computes. ollama's llamarunner
// holds its runner mutex for the llama_decode of a batch (≤ 512 tokens)
// and a request needs that mutex to take its slot, so on a multi-slot
// ollama a request arriving during another's prefill waits for it,
// though a slot is free. Whether the engine does is learned from the
// traffic, as the head mode is: a request that arrived during another's
// prefill and whose first output came too soon to have waited for it
// says "free"; one whose first output came its prefill after that
// prefill's end, and too late to have begun at once, says "held".

// Lock learning parameters: the votes of the last lockWindow requests
// that arrived during another's prefill decide; "held" needs lockMin votes
// and lockRatio times the "free" ones. lockMin is 3 so that a fresh proxy
// learns it in its first bursts (against ollama with P=4 a burst of 4
// then 8: 4 needed most of the second burst, 7 of 24 within the bar; 2:
// 10–14 of 24); 2 took a lock from the made-up timeline of the snapshot
// report's golden test (TestReportBeyondGolden). The ratio keeps an
// engine without a lock, whose short prompts overtake long ones, from
// taking it.
const (
	lockWindow = 256
	lockMin    = 3
	lockRatio  = 4
)

// Lock votes.
const (
	lockNone uint8 = iota
	lockFree       // its first output came before it could have waited
	lockHeld       // it waited for the prefill in progress
)

// lockLearner learns whether the engine holds a batch lock. It is guarded
// by occupancy.mu.
type lockLearner struct {
	votes  [lockWindow]uint8
	next   int
	counts [lockHeld + 1]int
}

func (l *lockLearner) observe(v uint8) {
	if v == lockNone {
		return
	}
	l.counts[l.votes[l.next]]--
	l.votes[l.next] = v
	l.counts[v]++
	l.next = (l.next + 1) % lockWindow
}

// free reports whether the engine is learned not to hold one: more
// "free" votes than "held" ones.
func (l *lockLearner) free() bool { return l.counts[lockFree] > l.counts[lockHeld] }

// held reports whether the engine is learned to hold a batch lock.
func (l *lockLearner) held() bool {
	return l.counts[lockHeld] >= lockMin && l.counts[lockHeld] >= lockRatio*l.counts[lockFree]
}

// prefilling collects x for lockedQueue when x was prefilling after e's
// arrival and before e's first output. The caller holds o.mu.
func (o *occupancy) prefilling(x, e *occEntry) {
	if x.occupies && x.pend > e.arrive && e.first >= 0 && x.lstart < e.first && x.pend > x.lstart && o.nPre < sweepMax {
		o.pre[0][o.nPre], o.pre[1][o.nPre], o.pre[2][o.nPre], o.pre[3][o.nPre] = x.lstart, x.pend, x.pt, x.pb
		o.preLive[o.nPre] = false
		o.nPre++
	}
}

// lockEnd is when e's slot could start under a batch lock, given the
// start start without one: after the prefills in progress then, and
// after those in progress at that end, and so on (a prefill that began
// with it, at the same placed start, shares its batch: ollama's waiting
// requests take their slots together when the batch ends, though a
// request that arrives a millisecond after another's slot start waits;
// unless that prefill ran alone at its speed and e's own from there is
// too long for e alone, or fits e's estimate better from its end: e
// waited for it; or, when the group that prefill
// began with was slowed by a joiner, e joined at its first batch's end:
// joinedFirstBatch). Only prefills that ended at
// least least before e's first output are waited for or joined, but for
// a one-batch joiner done in the holder's last batch (lastBatchJoin) and a
// two-batch one done its tail after it (tailBatchJoin). solo reports
// whether every prefill it waited for ran alone (soloPrefill). point is
// e's prefill estimate (0: none). It reads the entries the last scan
// collected. The caller holds o.mu.
func (o *occupancy) lockEnd(e occEntry, start, least int64, point time.Duration) (end int64, solo bool) {
	solo = true
	for i := range o.nPre {
		o.joins[i] = 0
		if b, ok := o.joinedFirstBatch(i, start); ok {
			o.joins[i] = b
		}
	}
	for range o.nPre {
		moved := false
		for i := range o.nPre {
			s0, f, pt := o.pre[0][i], o.pre[1][i], o.pre[2][i]
			if b := o.joins[i]; b > 0 {
				if start < b && (f < e.first-least || lastBatchJoin(e, f, b, least, point) || tailBatchJoin(e, f, point)) {
					start, moved, solo = b, true, false
				}
				continue
			}
			if start >= f || f >= e.first-least {
				continue
			}
			alone := soloPrefill(s0, f, pt)
			// slow: e's prefill from start as it stands at this step is
			// too long for e alone, or fits its estimate better from f.
			// Judged once from the first start, a second prefill begun at
			// the first one's end was waited for on the first's evidence.
			slow := point > 0 && (float64(e.first-start) >= pointApart*float64(point)+float64(pointSlack) ||
				closer(e.first-f, e.first-start, point))
			if startedFirst(s0, f, start, e.first) || s0 == start && (alone && slow || behindBatch(e, f, point)) {
				start, moved, solo = f, true, solo && alone
			}
		}
		if !moved {
			break
		}
	}
	return start, solo
}

// joinedFirstBatch is the end of the first batch of the i-th prefill
// collected for lockEnd, and whether a request whose start without the
// lock was start0 took its slot there rather than waiting for that
// prefill's end or sharing its batches from the first. llamarunner takes
// up to engineBatch prompt tokens of every prefilling slot into one batch
// and holds its mutex for the batch; a request whose slot came free as
// that prefill began (start0 within slotsOrderWindow of its start) and
// lost the mutex to the run loop waits for the batch, then takes its
// slot, and the later batches carry its tokens too. Which batch end it
// gets in at is the mutex's race (Go's mutex favours the running run loop
// until a waiter has waited 1 ms); what tells it afterwards is the group
// that began together: had nobody joined, they would have finished within
// their solo time, the sum of their point estimates (shared batches run
// on one thread), as soloPrefill judges one. So when that group ran past
// it and the i-th has a first batch short of its end, the request joined
// there: at the group's start plus its first batch, each member's first
// engineBatch tokens (ollama P=4: a 695-token prefill, 96 ms to its first
// batch's end and 436 ms in all against 140 alone, three waiters starting
// at that batch's end; two 750–850-token prefills begun together and
// done within their summed estimates, the two requests that came with
// them starting at their end). A prefill that ended more than endTolerance
// after the i-th is no member though its start is within the window: it
// is a waiter not yet moved from its arrival (members share every batch
// till the shorter one's end, the pair above 1 ms apart; a longer member
// that ran on alone is judged as the holder in its own turn), and counting it
// made a joined group look solo or put its first batch's end a member's
// batch late (loaded ollama P=4: TestJoinedFirstBatch "waiter in the start
// window"). A recorded member without an estimate leaves the group
// unjudged; one in flight whose first output carried none (its prompt not
// sized yet) is left out of it, as it cannot be told from a waiter. The
// caller holds o.mu.
func (o *occupancy) joinedFirstBatch(i int, start0 int64) (int64, bool) {
	s0, f, pb := o.pre[0][i], o.pre[1][i], o.pre[3][i]
	if pb <= 0 || start0-s0 >= int64(slotsOrderWindow) || s0-start0 >= int64(slotsOrderWindow) {
		return 0, false
	}
	var sum, batch int64
	for k := range o.nPre {
		if d := o.pre[0][k] - s0; d <= -int64(slotsOrderWindow) || d >= int64(slotsOrderWindow) {
			continue
		}
		if o.pre[1][k] > f+int64(endTolerance) {
			continue // ended after the holder: a waiter that joined it, not one that began with it
		}
		pt, kb := o.pre[2][k], o.pre[3][k]
		if pt <= 0 {
			if o.preLive[k] {
				continue
			}
			return 0, false
		}
		sum += pt
		if kb <= 0 {
			kb = pt // a one-batch prefill is all in the first batch
		}
		batch += kb
	}
	end := s0 + batch
	return end, end < f && !soloPrefill(s0, f, sum)
}

// lastBatchJoin reports whether e, whose first output came with the
// holder's, f, joined it at its first batch's end b, though a prefill that
// ended so close to e's first output was not waited for: a prompt of one
// batch (e.pb 0) that joined at b is done in the holder's last batch, its
// first output with the holder's (loaded ollama P=4 hint 4, run 3: a
// 516-token joiner 0.3 ms before its 563-token holder), where one that
// began with the holder is done in the first batch, before the holder's
// end. A prompt of two batches gives the same first outputs either way
// (docs/queue-split.md "The batch lock"), so it is not judged here (one
// whose first output trails the holder's by its tail is: tailBatchJoin);
// nor is a b that leaves e less than least for its prefill.
func lastBatchJoin(e occEntry, f, b, least int64, point time.Duration) bool {
	together := f-e.first <= int64(endTolerance) && e.first-f <= int64(endTolerance)
	return together && e.pb == 0 && point > 0 && b < e.first-least
}

// tailBatchJoin reports whether e, whose first output came after the
// holder's, f, by less than its least wait, joined the holder at its first
// batch's end though a prefill that ended so close to e's first output was
// not waited for: a prompt of two batches by its estimate (e.pb > 0) that
// joined there has its first engineBatch tokens in the holder's last
// batch and the rest in batches of its own after the holder's end, so its
// first output trails the holder's by its own tail (its point less its
// first batch), at least the band's lower end (1/pointHigh of it), where
// one that began with the holder shares every batch to the holder's end
// and has its first output with it (within endTolerance; members share
// every batch till the shorter one's end, joinedFirstBatch), or, had it a
// third batch, that batch after it, short of its tail (quiet ollama P=2
// hint s8run01, request 8: 612 prompt tokens, 27 ms after its holder for
// a 15.5 ms tail, placed at the holder's start, 100 ms short, where the
// engine's slot came 9.5 ms after the first batch's end; hint runs 4 and
// 5, request 5). A gap of least or more takes the join
// without it. The band has no pointSlack: hint run 4's request 5 trails its
// holder by 12.5 ms for a 14.4 ms tail (1/pointHigh of it 11.1), and with
// the slack it is placed at the holder's start, 151 ms short
// (docs/queue-split.md "Session 11").
func tailBatchJoin(e occEntry, f int64, point time.Duration) bool {
	gap := e.first - f
	return point > 0 && e.pb > 0 && gap > int64(endTolerance) && float64(gap) >= float64(int64(point)-e.pb)/pointHigh
}

// behindBatch reports whether e, placed at the same start as a prefill
// that ended at f, waited for that prefill's batches rather than sharing
// them: e's prompt is one batch by its estimate point (e.pb 0), and its
// first output came after f by a whole prefill of its own, at least its
// estimate's lower band (1/pointHigh of it) and pointSlack, the relay's
// jitter, as every band here.
// llamarunner puts up to engineBatch tokens of every prefilling slot into
// each batch and samples a prompt's first token after the batch that ends
// it, so a one-batch prompt that shared another's first batch has its
// first output at that batch's end, no later than the other's; one that
// came a whole prefill after did not begin with it (ollama P=4, agents:
// four slots freed within 1 ms, two one-batch prompts taking the lock
// together, the two others starting at their end, 144 ms later, and split
// as if they had shared it; agents-p4-s8run06, requests 6 and 7). The
// band keeps what else comes a little after f unmoved: the tail of a
// prompt the estimate puts in one batch but that had two (its tokens
// cached by the proxy's reckoning, not in the engine's slot; loaded
// agents-p4-s8full request 24: 98 ms after its partner for a 200 ms
// estimate), and on an engine whose shared prefills end in their order of
// size (the simulator's SharedPrefill, each taking Σ min(w, its w)) the
// longer of two that began together (TestBatchLockAccuracy under load:
// 0.46 and 0.72 of its estimate after the shorter's first output, placed
// 65 ms late with the prefill floor, 0.6 of it less 5 ms, for the bound).
func behindBatch(e occEntry, f int64, point time.Duration) bool {
	return point > 0 && e.pb == 0 && float64(e.first-f) >= float64(point)/pointHigh+float64(pointSlack)
}

// soloPrefill reports whether a prefill from s0 to f, pt its point
// estimate (0: none), had the engine to itself: it took less than
// pointApart times its estimate (the proxy's prefill includes the
// engine's own work before the slot, 18 ms of a 261 ms one). llamarunner decodes every slot's prompt chunk in one
// batch on one thread, so prefills that share batches are each slowed by
// the others' tokens (P=4, three requests sharing: 320 ms each where one
// alone took 121 ms). A request that was in the engine during a solo
// prefill was not prefilling: it waited for that batch, though it took its
// slot at the same moment (ollama v0.17.4, P=4: four slots freed within
// 4 ms, one request's 100 ms prefill alone, the three others starting when
// it ended; docs/queue-split.md "The batch lock").
func soloPrefill(s0, f, pt int64) bool {
	return pt > 0 && float64(f-s0) < pointApart*float64(pt)+float64(pointSlack)
}

// lockedQueue learns from e, whose queue without a batch lock is queue,
// and returns its queue with the lock when the engine is learned to hold
// one, or when e's own vote says it waited for one and the engine is not
// learned to hold none (as one request that waited for an end takes its
// queue from it before the slot hint is set aside): a fresh proxy's first
// burst has too few votes to learn from, and every request of it that
// waited was split as unqueued (ollama P=4: three of four). pr holds its
// prefill estimates (priors) and whether the engine reported its cached
// tokens; head is its response head (-1: none). The caller holds o.mu.
//
// lstart is its start under the lock, learned or not: the requests after
// it judge the lock by it (a start placed before the lock was learned
// would make its prefill seem to cover theirs).
func (o *occupancy) lockedQueue(e occEntry, queue time.Duration, pr priors, head int64) (q time.Duration, lstart int64) {
	start := e.arrive + int64(queue)
	end, v, other := o.lockStart(e, start, pr, head)
	o.lock.observe(v)
	if other {
		return queue, start // no lock: later requests judge it from its own start
	}
	if end == start || !o.lockApplies(v) {
		return queue, end
	}
	return time.Duration(end - e.arrive), end
}

// lockStart is e's start under a batch lock given its start without one
// (lockEnd), its vote, and whether its evidence is of an engine without
// the lock (lockable; the vote is then none). The caller holds o.mu.
func (o *occupancy) lockStart(e occEntry, start int64, pr priors, head int64) (end int64, v uint8, other bool) {
	least := leastWait(pr.point)
	end, solo := o.lockEnd(e, start, least, pr.point)
	v = lockVote(o, e, start, end, solo, pr.point, pr.est, pr.haveEst)
	other = !lockable(head, end, least, e.first, pr.reported)
	if other && v == lockHeld {
		v = lockNone // its evidence is of an engine without the lock
	}
	return end, v, other
}

// lockApplies reports whether a request whose vote is v takes its start
// under the lock: the engine is learned to hold one, or its own vote says
// it waited for one and the engine is not learned to hold none.
func (o *occupancy) lockApplies(v uint8) bool {
	return o.lock.held() || v == lockHeld && !o.lock.free()
}

// startWith is when e began with slots slots, as the split places it: at
// the start the slot count predicts (predictedStart), or, when the lock
// applies to it there (lockApplies, its vote not yet counted), at its
// start under the lock (moved). other says its evidence is of an engine
// without the lock (lockStart). The caller holds o.mu.
func (o *occupancy) startWith(e occEntry, ends []int64, n, slots int, pr priors, head int64) (at int64, moved, other bool) {
	start := predictedStart(e, ends, n, slots)
	end, v, other := o.lockStart(e, start, pr, head)
	if other || end == start || !o.lockApplies(v) {
		return start, false, other
	}
	return end, true, false
}

// leastWait is how long before the first output of a request of prefill
// estimate point a prefill it waited for ended at least: one that ended
// less than half its estimate (less the slack) before was not waited for,
// as requests that shared their batches have their first outputs within
// milliseconds of each other.
func leastWait(point time.Duration) int64 {
	return max(int64(pointLow*float64(point))-int64(pointSlack), int64(endTolerance))
}

// lockable reports whether a request whose start under a batch lock is
// end can have waited for one, by the engine's evidence other than the
// timing: the timing cannot tell. On an engine without a lock whose
// concurrent prefills share its compute in arrival order (llama.cpp fills
// each batch from its slots in order, vLLM's chunked prefill schedules
// the running requests' chunks first; both give a batch's leftover tokens
// to the next prompt), a request that arrived during
// another's prefill gets its first output that prefill's end plus its own
// prefill later, exactly when it would have under the lock
// (TestBatchLockNotFromSharedPrefill: one request's own vote put 199 ms
// of queue on a request that had a slot at once). The lock is ollama's
// llamarunner's, behind ollama's OpenAI routes, which send the response
// head with the first output and report no cached tokens
// (docs/engines.md). So a head that left before end (the engine answered
// it, at its admission or its slot start, before the lock would have let
// it start) or a reported cached count says the engine is another, and
// the request neither votes "held" nor moves. The head must have left at
// least least before end: on a loaded host ollama's head leaves up to
// ~150 ms before the first output it goes with (10 of 1,906 loaded
// captures more than 10 ms), and end can be as little as least before
// that first output. For the same reason a head that left more than
// headWithFirst before the request's own first output is not ollama's: a
// continuous-batching engine's (vLLM's, at admission) passed the first
// test whenever the prefill it seemed to wait for was short (a review's
// case: 49 ms of queue invented on a request admitted at once,
// TestBatchLockNotFromAdmissionHead).
func lockable(head, end, least, first int64, reported bool) bool {
	return slotSerial(head, first, reported) && (head < 0 || head >= end-least)
}

// slotSerial reports whether a request's evidence is of an engine that
// prefills a slot at a time (ollama's runner): no reported cached count,
// and no head that left more than headWithFirst before its first output
// (vLLM's, at admission). Such an engine shares no compute between the
// prefills of two slots that the proxy could mistake for a wait.
func slotSerial(head, first int64, reported bool) bool {
	return !reported && (head < 0 || head >= first-int64(headWithFirst))
}

// headWithFirst is how long before its first output ollama's head may
// leave: up to ~150 ms on a loaded host, with a margin.
const headWithFirst = 250 * time.Millisecond

// lockVote is e's evidence: it started at start without a lock, at end
// with one.
func lockVote(o *occupancy, e occEntry, start, end int64, solo bool, point, est time.Duration, haveEst bool) uint8 {
	gap, from := e.first-end, e.first-start
	switch {
	case end > start && point > 0 && pointFits(gap, from, point):
		return lockHeld
	case end > start && o.joinedAt(end):
		// It took its slot at a first batch's end of a group that ran
		// past its solo time: its prefill from there, shared, fits no
		// estimate, but the join is the lock's (a fresh proxy's first
		// burst split such requests as unqueued).
		return lockHeld
	case end > start && point > 0 && solo && float64(from) >= pointApart*float64(point)+float64(pointSlack) &&
		float64(gap) >= pointLow*float64(point)-float64(pointSlack):
		// The prefills it would have waited for ran at their own speed
		// (soloPrefill): it did not share their batches, and its prefill
		// from its start without the lock is too long to be its own.
		return lockHeld
	case end > start && point > 0 && float64(from) >= pointApart*float64(point)+float64(pointSlack) &&
		float64(gap) >= pointLow*float64(point)-float64(pointSlack) && o.sharedStart(end):
		// It took its slot with others when that prefill ended: they
		// share their batches (ollama decodes one batch of all their
		// prompts' chunks on one thread), so its prefill from there is
		// longer than its own estimate (P=4, three requests waiting for
		// a 611-token prefill: 1.99 s each from there, against ~0.6 s
		// alone), and none of them could have begun sooner.
		return lockHeld
	case end > start && point <= 0 && haveEst:
		bound := int64(prefillSlack*float64(est)) + int64(slackTime)
		if from > bound && gap <= bound {
			return lockHeld
		}
	}
	for i := range o.nPre {
		s0, f := o.pre[0][i], o.pre[1][i]
		if startedFirst(s0, f, start, e.first) && start < f && f >= e.first+int64(endTolerance) {
			return lockFree // its first output came during a prefill in progress at its start
		}
	}
	switch {
	case end == start:
	case point > 0 && float64(gap) < pointLow*float64(point)-float64(pointSlack):
		return lockFree // too soon after that prefill's end to have begun at it
	}
	return lockNone
}

// joinedAt reports whether end is a first-batch join (joinedFirstBatch)
// of a prefill e was placed at. The caller holds o.mu.
func (o *occupancy) joinedAt(end int64) bool {
	for i := range o.nPre {
		if o.joins[i] > 0 && o.joins[i] == end {
			return true
		}
	}
	return false
}

// sharedStart reports whether a request prefilling during e's wait took
// its slot at start too (its start under the lock), or one in flight whose
// first output came with e's (liveAhead's coStarts: recorded after e, it
// is seen only live, and on a fresh proxy's first burst the waiter that
// shared its batches with it voted none and was split as unqueued; ollama
// P=4, no hint: 0 ms for 275, TestBatchLockSharedWithLive; the partners
// admitted after it, agents-p4-s8run02 and -s9run01/-02 request 2:
// TestBatchLockSharedWithLiveAdmittedLater). The caller holds o.mu.
func (o *occupancy) sharedStart(start int64) bool {
	for i := range o.nPre {
		if o.pre[0][i] == start {
			return true
		}
	}
	for i := range o.nCo {
		if o.coStarts[i] == start {
			return true
		}
	}
	return false
}

// startedFirst reports whether a request whose slot started at s0 (under
// the lock) and whose prefill ended at f took the engine's lock before a
// request starting at start with its first output at first. Requests the
// proxy sent within slotsOrderWindow of each other reached the engine in
// an order of its own: the one whose prefill ended first was served
// first. Equal starts are requests that took their slots together when
// the same prefill ended: neither waits for the other.
func startedFirst(s0, f, start, first int64) bool {
	switch d := s0 - start; {
	case d == 0:
		return false
	case d > -int64(slotsOrderWindow) && d < int64(slotsOrderWindow):
		return f < first
	}
	return s0 < start
}

// closer reports whether a prefill of gap fits point better than one of
// from (by their ratios to it), gap being at least pointLow of it.
func closer(gap, from int64, point time.Duration) bool {
	p := float64(point)
	if float64(gap) < pointLow*p-float64(pointSlack) {
		return false
	}
	return math.Abs(math.Log(float64(gap)/p)) < math.Abs(math.Log(float64(from)/p))
}
