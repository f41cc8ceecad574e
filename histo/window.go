package histo

import (
	"iter"
	"slices"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/histo/selfcheck"
)

// Window is what the Recorder measured over one interval: exact HDR
// histograms of every Metric and one Request record per finished inference
// request. It is what the snapshot writer turns into an
// anvil-serving.benchmark/v1 file. A Window returned by Rotate, Current or
// cumulative belongs to the caller; the Recorder never changes it again
// (Current's Requests share storage with the window in progress, but
// Record only appends beyond them).
type Window struct {
	Start, End time.Time

	// Hist holds one histogram per Metric, indexed by Metric; values are
	// in Metric.Unit (Metric.Float converts to the v1 unit). Failed
	// requests are not recorded in the per-request histograms, as in the v1
	// schema's performance distributions.
	Hist [NumMetrics]*hdrhistogram.Histogram
	// Clamped counts, per Metric, the values recorded at the end of the
	// histogram's range because they fell outside it.
	Clamped [NumMetrics]int64

	// Requests are the window's inference requests in the order they
	// finished, failed ones included (Request.Failed). Empty for cumulative.
	Requests Records
	// Dropped counts requests beyond Config.MaxWindowRequests: they are in
	// Hist and Goodput but have no record.
	Dropped int64

	// Goodput counts every inference request of the window, dropped or not.
	Goodput Goodput
	// QueueSources counts the requests whose queue/prefill split came from
	// each source, dropped records included.
	QueueSources map[QueueSource]int64

	// Retry is the window's client retry figures (docs/design.md "Retries") and Prefix
	// its prompt-prefix figures (docs/design.md "Prefix drift"); Conversations its agent-side time,
	// Ledger its prompt composition, Concurrency its requests by engine
	// load and Quality its measurement quality. All nil for cumulative.
	Retry         *RetrySection
	Prefix        *PrefixSection
	Conversations *ConversationsSection
	Ledger        *LedgerSection
	Concurrency   *ConcurrencySection
	Quality       *selfcheck.Section
	// Cache is the window's prefix-cache figures, engine-reported and
	// inferred side by side; Slots the engine's slot count as the
	// occupancy split used it when the window ended. Nil for cumulative.
	Cache *CacheSection
	Slots *SlotsSection
	// Engine is the engine's /metrics as last scraped when the window
	// ended (engine.go); nil without a scraper.
	Engine *EngineSection
}

// chunkSize is the number of records per allocation: appending to one
// growing slice would copy up to MaxWindowRequests records under the lock.
const chunkSize = 1024

// Records are a window's request records in the order they finished: the
// chunks the window recorded them into, not a copy (a loaded window's
// records are megabytes, and copying them was a third of its rotation). A
// record, once added, is never modified, and a Records value never sees
// later additions: Rotate's window is never added to again, and Current's
// Records end at the chunk lengths taken under the Recorder's lock, beyond
// which Record appends. So Records are safe for concurrent reads, and
// read-only: their records may be shared with the window in progress and
// with other Windows. The zero value is empty.
type Records struct {
	chunks [][]Request // each of capacity chunkSize; every one but the last is full
}

// Len returns the number of records.
func (rs Records) Len() int {
	if len(rs.chunks) == 0 {
		return 0
	}
	return (len(rs.chunks)-1)*chunkSize + len(rs.chunks[len(rs.chunks)-1])
}

// At returns the i-th record, to read; it panics unless 0 <= i < Len.
func (rs Records) At(i int) *Request {
	return &rs.chunks[i/chunkSize][i%chunkSize]
}

// All yields every record in order, to read.
func (rs Records) All() iter.Seq[*Request] {
	return func(yield func(*Request) bool) {
		for _, c := range rs.chunks {
			for i := range c {
				if !yield(&c[i]) {
					return
				}
			}
		}
	}
}

// add appends a copy of rq, in a new chunk when the last is full. Not
// safe for concurrent use: the window's owner (Recorder.mu) serializes it.
func (rs *Records) add(rq *Request) {
	if len(rs.chunks) == 0 || len(rs.chunks[len(rs.chunks)-1]) == chunkSize {
		rs.chunks = append(rs.chunks, make([]Request, 0, chunkSize))
	}
	last := &rs.chunks[len(rs.chunks)-1]
	*last = append(*last, *rq)
}

// view returns Records that keep what rs holds now: the chunk headers are
// copied, so rs's later additions (appends beyond those lengths, new
// chunks) are not seen. Called under the lock that guards rs.
func (rs Records) view() Records {
	v := Records{chunks: slices.Clone(rs.chunks)}
	if n := len(v.chunks); n > 0 {
		last := v.chunks[n-1]
		v.chunks[n-1] = last[:len(last):len(last)] // no spare capacity: an add to the view cannot write into rs
	}
	return v
}

// window is the current window's state apart from its histograms, which
// live in the Recorder's pairs. It is guarded by Recorder.mu; once swapped
// out by Rotate it belongs to the rotating goroutine.
type window struct {
	start   time.Time
	records Records
	dropped int64
	tally   tally
	sources [len(sources)]int64
	tallies // per concern, fed by Recorder.add
}

// newWindow returns the window starting at start, the gen-th since New,
// with its histograms allocated (outside the Recorder's lock; a
// concurrency level's come with its first request).
func newWindow(start time.Time, gen uint64) *window {
	w := &window{start: start}
	w.conv.gen = gen
	w.conv.gaps, w.conv.engineTurn = dist.NewRec(dist.Ms), dist.NewRec(dist.Ms)
	for p := range w.ledger.share {
		w.ledger.share[p] = dist.NewRec(dist.Share)
	}
	return w
}

// add appends a copy of rq unless the window holds limit records already;
// it reports whether rq was kept.
func (w *window) add(rq *Request, limit int) bool {
	w.sources[rq.QueueSource.index()]++
	if w.records.Len() >= limit {
		w.dropped++
		return false
	}
	w.records.add(rq)
	return true
}

func (w *window) queueSources() map[QueueSource]int64 {
	out := make(map[QueueSource]int64, len(sources))
	for i, s := range sources {
		out[s] = w.sources[i]
	}
	return out
}

// Rotate ends the current window and starts a new one. It returns the
// finished window, which belongs to the caller. The per-request histograms,
// records and goodput of the new window start together, so a request is
// wholly in one window; the per-event histograms swap a moment later.
// Safe for concurrent use with everything else.
func (r *Recorder) Rotate() *Window {
	var fresh [NumMetrics]*hdrhistogram.Histogram
	for m := range fresh {
		fresh[m] = NewHistogram(Metric(m)) // allocate outside the lock
	}
	now := r.cfg.Now()
	out := &Window{End: now}
	next := newWindow(now, 0)

	r.totalMu.Lock()
	r.mu.Lock()
	old := r.cur
	next.conv.gen = old.conv.gen + 1
	r.cur = next
	old.conv.sealed = r.convs.seal(old.conv.gen)
	for m := range numRequestMetrics {
		out.Hist[m], out.Clamped[m] = r.hist[m].swap(fresh[m])
	}
	r.total.merge(&old.tally)
	r.prev = old.tally
	r.mu.Unlock()
	for m := range numRequestMetrics { // Record goes on meanwhile
		r.hist[m].fold(out.Hist[m], out.Clamped[m])
	}
	r.totalMu.Unlock()

	out.Hist[MetricInterEvent], out.Clamped[MetricInterEvent] = r.gap.swap(fresh[MetricInterEvent])
	out.Hist[MetricOverhead], out.Clamped[MetricOverhead] = r.relay.swap(fresh[MetricOverhead])
	r.fill(out, old, r.self.Rotate())
	return out
}

// Current returns a copy of the window in progress, without ending it (for
// /snapshot and the dashboard). It copies every histogram under the
// Recorder's lock, which holds Record up for about half a millisecond: fine
// per scrape or snapshot request, not for a hot path. The records are not
// copied: the copy's Requests are a view of the window's chunks as they
// are now (Records). Safe for concurrent use.
func (r *Recorder) Current() *Window {
	out := &Window{End: r.cfg.Now()}
	r.mu.Lock()
	cur := *r.cur
	cur.records = cur.records.view()
	cur.tallies = r.cur.tallies.clone()
	cur.conv.sealed = r.convs.seal(cur.conv.gen)
	for m := range numRequestMetrics {
		out.Hist[m], out.Clamped[m] = r.hist[m].window.Clone(), r.hist[m].clamped
	}
	r.mu.Unlock()

	out.Hist[MetricInterEvent], out.Clamped[MetricInterEvent] = r.gap.cloneWindow()
	out.Hist[MetricOverhead], out.Clamped[MetricOverhead] = r.relay.cloneWindow()
	r.fill(out, &cur, r.self.Current())
	return out
}

// fill completes out, whose histograms are set, from w: a window that no
// longer changes (swapped out by Rotate, or Current's copy), read without
// the Recorder's lock.
func (r *Recorder) fill(out *Window, w *window, quality *selfcheck.Section) {
	out.Start = w.start
	out.stampHist()
	out.Requests = w.records
	out.Dropped = w.dropped
	out.Goodput = w.tally.goodput(r.cfg.SLOs)
	out.QueueSources = w.queueSources()
	w.tallies.put(out)
	slots := r.Slots()
	out.Slots = &slots
	out.Engine = r.engineSection()
	out.Quality = quality
}

// cumulative returns the histograms, clamp counts and goodput since New,
// without per-request records or queue sources. Safe for concurrent use.
func (r *Recorder) cumulative() *Window {
	out := &Window{Start: r.start, End: r.cfg.Now()}
	var windows [numRequestMetrics]*hdrhistogram.Histogram
	var clamped [numRequestMetrics]int64
	r.totalMu.Lock()
	r.mu.Lock()
	t := r.total
	t.merge(&r.cur.tally)
	for m := range numRequestMetrics {
		windows[m], clamped[m] = r.hist[m].window.Clone(), r.hist[m].clamped
	}
	r.mu.Unlock()
	for m := range numRequestMetrics {
		out.Hist[m], out.Clamped[m] = r.hist[m].cumulative(windows[m], clamped[m])
	}
	r.totalMu.Unlock()

	out.Hist[MetricInterEvent], out.Clamped[MetricInterEvent] = r.gap.cloneTotal()
	out.Hist[MetricOverhead], out.Clamped[MetricOverhead] = r.relay.cloneTotal()
	out.Goodput = t.goodput(r.cfg.SLOs)
	out.stampHist()
	return out
}

// stampHist sets the histograms' start and end times, which the
// HdrHistogram interval-log writer (hdrhistogram.NewHistogramLogWriter) uses.
func (w *Window) stampHist() {
	for _, h := range w.Hist {
		h.SetStartTimeMs(w.Start.UnixMilli())
		h.SetEndTimeMs(w.End.UnixMilli())
	}
}

// WindowStart is when the window in progress began (the live views say
// which window they show). Safe for concurrent use.
func (r *Recorder) WindowStart() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur.start
}
