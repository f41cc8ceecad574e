package histo

import (
	"sync/atomic"
	"time"

	"github.com/anvilproxy/anvilproxy/proxy"
)

// The live first outputs (docs/queue-split.md "Live first outputs"): the
// proxy tells the Recorder when each request's first output arrives
// (proxy.FirstOutputObserver), long before the request ends and is
// recorded. The occupancy split, made at Record, sees the requests still
// in flight only through them: a prefill in progress on another slot
// that made this request wait under a batch lock (its holder, with a
// longer answer, ends later), and, on one slot, which of two requests
// sent together the engine served first.

// liveRing is the number of requests in flight whose first output is
// kept, by request ID; with more in flight the oldest are overwritten
// (their evidence is lost, nothing else).
const liveRing = 256

// liveSlot is one request in flight with its first output seen. Its
// writer is the request's relay goroutine, its readers Record's placing
// of other requests. A writer claims the slot by swapping id to
// liveWriting, stores the stamps, then stores id; a reader loads id
// before and after the stamps, so it takes the stamps of one request or
// skips the slot. Two writers never share a slot: the one that finds it
// claimed drops its evidence, as when the ring wraps.
type liveSlot struct {
	id            atomic.Uint64 // the request's ID + 1; 0: empty or recorded; liveWriting: being written
	admit, arrive atomic.Int64  // t_admit and t_admit + connect, ns since liveTable.base
	first         atomic.Int64  // its first output, ns since liveTable.base
	admitSeq      atomic.Uint64 // proxy.Trace.AdmitSeq (0: none)
	pt, pb        atomic.Int64  // its prefill's point estimate and first batch's share, ns (0: none; liveEstimate)
}

// liveWriting marks a slot a writer has claimed (no request's ID + 1).
const liveWriting = ^uint64(0)

// liveTable holds the requests in flight whose first output was seen.
// put and done are lock-free; read runs under occupancy.mu.
type liveTable struct {
	base  time.Time
	n     atomic.Int64 // occupied slots: a reader stops once it has seen them
	slots [liveRing]liveSlot
}

// live is one entry read back, on the occupancy timeline.
type live struct {
	admit, arrive, first int64
	admitSeq             uint64 // the proxy's number of its admission (0: none)
	pt, pb               int64  // as occEntry's: the estimates when it put its first output (0: none)
}

// admittedAfter reports whether x was admitted upstream after e: by the
// proxy's numbers of their admissions when both have them (exact), else by
// the stamps (t_admit is taken before the number, so two requests
// admitted microseconds apart may have their stamps in the other order).
func (x live) admittedAfter(e *occEntry) bool {
	if x.admitSeq != 0 && e.admitSeq != 0 {
		return x.admitSeq > e.admitSeq
	}
	return x.admit >= e.admit
}

// before orders two live requests by their admission: the numbers when
// both have them, else their arrival stamps.
func (x live) before(y live) bool {
	if x.admitSeq != 0 && y.admitSeq != 0 {
		return x.admitSeq < y.admitSeq
	}
	return x.arrive < y.arrive
}

// put notes tr's first output, with its prefill's estimates pt and pb.
// It does not allocate.
func (l *liveTable) put(tr *proxy.Trace, pt, pb int64) {
	s := &l.slots[tr.ID%liveRing]
	old := s.id.Load()
	for old == liveWriting || !s.id.CompareAndSwap(old, liveWriting) {
		if old == liveWriting {
			return // another request's first output is being written here
		}
		old = s.id.Load()
	}
	if old == 0 {
		l.n.Add(1) // an occupied slot overwritten keeps the count
	}
	s.admit.Store(int64(tr.Admit.Sub(l.base)))
	s.arrive.Store(int64(tr.Admit.Add(tr.Connect).Sub(l.base)))
	s.first.Store(int64(tr.FirstOutput.Sub(l.base)))
	s.admitSeq.Store(tr.AdmitSeq)
	s.pt.Store(pt)
	s.pb.Store(pb)
	s.id.Store(tr.ID + 1)
}

// done drops the request id (it is being recorded: the timeline has it
// from now on).
func (l *liveTable) done(id uint64) {
	if l.slots[id%liveRing].id.CompareAndSwap(id+1, 0) {
		l.n.Add(-1)
	}
}

// read returns slot i's request on the timeline whose epoch is epoch;
// occupied is false when the slot is empty or being written, ok also when
// it holds request self.
func (l *liveTable) read(i int, epoch time.Time, self uint64) (x live, occupied, ok bool) {
	s := &l.slots[i]
	id := s.id.Load()
	switch id {
	case 0:
		return live{}, false, false
	case liveWriting, self + 1:
		return live{}, true, false
	}
	x = live{admit: s.admit.Load(), arrive: s.arrive.Load(), first: s.first.Load(), admitSeq: s.admitSeq.Load(), pt: s.pt.Load(), pb: s.pb.Load()}
	if s.id.Load() != id {
		return live{}, false, false
	}
	off := int64(l.base.Sub(epoch))
	x.admit, x.arrive, x.first = x.admit+off, x.arrive+off, x.first+off
	return x, true, true
}

// FirstOutput implements proxy.FirstOutputObserver: it notes an inference
// request's first output for the split of the requests recorded while it
// is still in flight. Safe for concurrent use; it does not block or
// allocate.
func (r *Recorder) FirstOutput(tr *proxy.Trace) {
	if !tr.Route.Generates() || tr.Admit.IsZero() || tr.FirstOutput.IsZero() {
		return
	}
	pt, pb := r.liveEstimate(tr)
	r.occ.live.put(tr, int64(pt), int64(pb))
}

// liveEstimate is the point estimate of tr's prefill and its first batch's
// share as the split makes them at Record (prefillPoint, firstBatch), from
// the cost model as it stands: its prompt sized from its body at the
// learned tokens per byte, its usage not known yet (it comes at the
// stream's end). Without them a prefill in flight could not be judged with
// the others of its group (joinedFirstBatch).
func (r *Recorder) liveEstimate(tr *proxy.Trace) (pt, pb time.Duration) {
	rs := r.model.read()
	if tr.PromptTokens >= 0 {
		pt, _, _ = prefillPoint(tr, rs)
		return pt, firstBatch(tr, rs, pt)
	}
	if rs.perByte <= 0 || tr.ReqBytes <= 0 {
		return 0, 0
	}
	t := *tr
	t.PromptTokens = int64(float64(tr.ReqBytes) * rs.perByte)
	pt, _, _ = prefillPoint(&t, rs)
	return pt, firstBatch(&t, rs, pt)
}

// liveAhead adds to the scan's collections what the requests in flight
// and not recorded tell of e: those that prefilled while e waited (o.pre,
// for the batch lock), and the number of them the proxy counted in flight
// at e's admission that were served after e on a one-slot engine (their
// first output after e's: sent together, they reached it in the other
// order), which the caller takes off the requests ahead; and the starts
// under the lock of those whose first output came within endTolerance of
// e's, before or after it, whenever they were admitted (o.coStarts: they
// took their slots with e and shared its batches, sharedStart; a first
// burst's partners were admitted 6–55 ms after the waiter, and before any
// evidence the slot count is 1, though two requests whose first outputs
// came together, one still running, held two slots; not on an engine
// declared one slot). A request that prefilled during e's wait did so up
// to its first output from its own start under the lock, found as e's is
// (lockEnd, oldest first): requests that waited for the same prefill took
// their slots together and do not wait for each other.
// The caller holds o.mu.
func (o *occupancy) liveAhead(e occEntry, self uint64) (behind int) {
	if e.first < 0 {
		return 0
	}
	oneSlot := o.slots.effective() == 1
	// On an engine declared one slot, first outputs together are two
	// one-token answers, not a shared batch.
	declaredOne := o.slots.hint == 1
	n, nc := 0, 0
	o.nCo = 0
	// Newest first from e's own slot, stopping once every occupied slot
	// was seen (the count may lag a writer: a first output arriving now
	// came after e's and is behind it anyway).
	left := o.live.n.Load()
	for k := 1; k <= liveRing && left > 0; k++ {
		x, occupied, ok := o.live.read(int((self+liveRing-uint64(k))%liveRing), o.epoch, self)
		if occupied {
			left--
		}
		if !ok || x.first < 0 {
			continue
		}
		if !declaredOne && x.first >= e.first-int64(endTolerance) && x.first <= e.first+int64(endTolerance) && nc < len(o.coStarts) {
			o.liveCo[nc] = x // its start under the lock once the prefills are collected
			nc++
		}
		after := x.admittedAfter(&e)
		if after && x.admit >= e.admit+int64(slotsOrderWindow) {
			continue // admitted after e: not ahead, not counted in flight
		}
		if after {
			// Admitted just after e, it may have reached the engine
			// first (the engine's handlers race): not counted in flight
			// at e's admission, but a prefill e may have waited for
			// (ollama, P=2: a request admitted 2.4 ms after another took
			// the slot first, and the other waited 450 ms for its
			// prefill).
			if x.first > e.arrive && x.first < e.first && n < len(o.liveAt) {
				o.liveAt[n] = x
				n++
			}
			continue
		}
		if oneSlot && x.first > e.first {
			behind++
			continue
		}
		if x.first > e.arrive && x.first < e.first && x.arrive < e.arrive+int64(slotsOrderWindow) && n < len(o.liveAt) {
			o.liveAt[n] = x
			n++
		}
	}
	// Oldest first, so that each start under the lock sees the prefills
	// before it.
	for i := 1; i < n; i++ {
		x, j := o.liveAt[i], i
		for ; j > 0 && x.before(o.liveAt[j-1]); j-- {
			o.liveAt[j] = o.liveAt[j-1]
		}
		o.liveAt[j] = x
	}
	for _, x := range o.liveAt[:n] {
		if o.nPre == sweepMax {
			break
		}
		start := o.liveStart(x)
		o.pre[0][o.nPre], o.pre[1][o.nPre], o.pre[2][o.nPre], o.pre[3][o.nPre] = start, x.first, x.pt, x.pb
		o.preLive[o.nPre] = true
		o.nPre++
	}
	for i, x := range o.liveCo[:nc] {
		o.coStarts[i] = o.liveStart(x)
	}
	o.nCo = nc
	return behind
}

// liveStart is x's start under the lock, found from its arrival as a
// recorded request's is (lockEnd). The caller holds o.mu.
func (o *occupancy) liveStart(x live) int64 {
	start, _ := o.lockEnd(occEntry{arrive: x.arrive, first: x.first, pt: x.pt, pb: x.pb}, x.arrive, leastWait(time.Duration(x.pt)), time.Duration(x.pt))
	return start
}
