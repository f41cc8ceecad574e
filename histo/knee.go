package histo

import (
	"fmt"
	"strconv"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/proxy"
)

// The queue knee: requests bucketed by the engine's load when they were
// admitted (proxy.Trace.InflightAtAdmit), with each level's queue and
// service times, so that a user sees from which load on requests wait for a
// slot as long as they are served, and where their traffic sits.

// maxLevel is the highest level kept apart; higher loads share "64+".
const maxLevel = 64

// kneeShare places the knee: the lowest level whose queue p95 reaches this
// share of its service p50. At the slot count a new request waits for the
// first of the running ones to finish: about half a service time at p95
// when they started at random times (the minimum of the slots' remaining
// times), a whole one only when they all started together. Half puts the
// knee at the slot count for steady traffic; a whole service time would put
// it near twice the slot count.
const kneeShare = 0.5

// kneeRule states kneeShare in the section, for readers of the file.
var kneeRule = fmt.Sprintf("lowest level where queue p95 >= %g x service p50", kneeShare)

// Readings of the concurrency section, from the levels observed.
const (
	ReadingUnknown    = "unknown"     // no admitted request with a known queue and service
	ReadingHeadroom   = "headroom"    // the typical level is below the knee, or no level reached it
	ReadingAtKnee     = "at_knee"     // the typical level is the knee
	ReadingQueueBound = "queue_bound" // the typical level is above the knee: most requests queue
	ReadingRejecting  = "rejecting"   // a noticeable share of the most loaded requests got 429 or 503
)

// rejectingShare is the share of 429/503 answers among the requests at the
// top decile of load (limiter refusals included) that makes the reading
// "rejecting": one in twenty is more than transient back-pressure.
const rejectingShare = 0.05

// ConcurrencySection is a window's requests by engine load: the snapshot's
// anvilproxy.concurrency object.
type ConcurrencySection struct {
	// Levels are the admission levels that saw requests, ascending: the
	// number of other requests in flight upstream when each was admitted.
	Levels []ConcurrencyLevel `json:"levels"`
	// Knee is the lowest level where queue p95 reaches KneeRule's share of
	// service p50; null when no level did.
	Knee     Count  `json:"knee"`
	KneeRule string `json:"knee_rule"`
	// Typical is the median level of the admitted requests; null without
	// any.
	Typical Count `json:"typical_level"`
	// LimiterRejected counts requests the proxy's own limiter refused
	// (--max-inflight): they were never admitted, so they have no level,
	// and count as rejections at the top level for the reading.
	LimiterRejected int64 `json:"limiter_rejected"`
	// Reading is "headroom", "at_knee", "queue_bound", "rejecting" or
	// "unknown" (see the Reading constants).
	Reading string `json:"reading"`
}

// ConcurrencyLevel is the requests admitted at one level. Queue is the
// wait before prefill (proxy limiter and engine queue; see Split); Service
// is prefill + generation. Both cover the successful requests whose split
// is known; Requests and Rejected count every admitted request.
type ConcurrencyLevel struct {
	Level     string    `json:"level"`    // "0" … "63", "64+"
	Inflight  int       `json:"inflight"` // the level as a number; 64 for "64+"
	Requests  int64     `json:"requests"`
	Rejected  int64     `json:"rejected"` // answered 429 or 503
	QueueMs   dist.Dist `json:"queue_ms"`
	ServiceMs dist.Dist `json:"service_ms"`
}

// kneeLevel is one level's tally.
type kneeLevel struct {
	requests, rejected int64
	queue, service     dist.Rec
}

// kneeTally accumulates a window's levels; guarded by Recorder.mu.
type kneeTally struct {
	levels  [maxLevel + 1]*kneeLevel // allocated on a level's first request
	limited int64
}

// admittedLevel is the level tr was admitted at, or false when it never
// was: refused by the limiter, unreadable, or abandoned by its client
// before reaching the upstream (InflightAtAdmit is 0 for all of these).
func admittedLevel(tr *proxy.Trace) (int, bool) {
	switch tr.ErrKind {
	case proxy.ErrLimited, proxy.ErrBadRequest, proxy.ErrBodyTooLarge:
		return 0, false
	case proxy.ErrClientGone:
		if tr.Sent.IsZero() && tr.Connect == 0 {
			return 0, false
		}
	}
	return min(max(tr.InflightAtAdmit, 0), maxLevel), true
}

func rejection(status int) bool { return status == 429 || status == 503 }

func (t *kneeTally) add(rq *Request, tr *proxy.Trace) {
	if tr.ErrKind == proxy.ErrLimited {
		t.limited++
		return
	}
	lv, ok := admittedLevel(tr)
	if !ok {
		return
	}
	l := t.levels[lv]
	if l == nil {
		l = &kneeLevel{}
		t.levels[lv] = l
	}
	l.requests++
	if rejection(rq.Status) {
		l.rejected++
	}
	if rq.Failed || !rq.Queue.Known() || !rq.Prefill.Known() || !rq.Generation.Known() {
		return
	}
	l.queue.Record(dist.Ms, rq.Queue.Millis())
	l.service.Record(dist.Ms, (rq.Prefill + rq.Generation).Millis())
}

func (t *kneeTally) clone() kneeTally {
	c := *t
	for i, l := range t.levels {
		if l != nil {
			ll := *l
			ll.queue, ll.service = l.queue.Clone(), l.service.Clone()
			c.levels[i] = &ll
		}
	}
	return c
}

// section summarizes the tally; it does not modify it.
func (t *kneeTally) section() *ConcurrencySection {
	s := &ConcurrencySection{Levels: []ConcurrencyLevel{}, LimiterRejected: t.limited}
	for i, l := range t.levels {
		if l != nil {
			s.Levels = append(s.Levels, ConcurrencyLevel{
				Level: levelName(i), Inflight: i, Requests: l.requests, Rejected: l.rejected,
				QueueMs: l.queue.Dist(dist.Ms), ServiceMs: l.service.Dist(dist.Ms),
			})
		}
	}
	s.read()
	return s
}

func levelName(i int) string {
	if i >= maxLevel {
		return strconv.Itoa(maxLevel) + "+"
	}
	return strconv.Itoa(i)
}

// read sets the knee, the typical level and the reading from the levels.
func (s *ConcurrencySection) read() {
	s.KneeRule, s.Knee, s.Typical, s.Reading = kneeRule, -1, -1, ReadingUnknown
	var total int64
	for _, l := range s.Levels {
		total += l.Requests
		if s.Knee < 0 && l.QueueMs.P95.Known() && l.ServiceMs.P50.Known() && l.QueueMs.P95 >= kneeShare*l.ServiceMs.P50 {
			s.Knee = Count(l.Inflight)
		}
	}
	if total == 0 {
		if s.LimiterRejected > 0 {
			s.Reading = ReadingRejecting
		}
		return
	}
	s.Typical = Count(s.levelAt(total, 50))
	// The top decile of load: the levels at or above its nearest-rank p90.
	top := s.levelAt(total, 90)
	topRequests, topRejected := s.LimiterRejected, s.LimiterRejected
	measured := false
	for _, l := range s.Levels {
		if l.Inflight >= top {
			topRequests += l.Requests
			topRejected += l.Rejected
		}
		measured = measured || l.QueueMs.Count > 0
	}
	switch {
	case topRejected > 0 && float64(topRejected) >= rejectingShare*float64(topRequests):
		s.Reading = ReadingRejecting
	case !measured:
	case s.Knee < 0 || s.Typical < s.Knee:
		s.Reading = ReadingHeadroom
	case s.Typical == s.Knee:
		s.Reading = ReadingAtKnee
	default:
		s.Reading = ReadingQueueBound
	}
}

// levelAt is the nearest-rank p-th percentile of the admitted requests'
// levels.
func (s *ConcurrencySection) levelAt(total, p int64) int {
	want := dist.Rank(p, total)
	var seen int64
	for _, l := range s.Levels {
		seen += l.Requests
		if seen >= want {
			return l.Inflight
		}
	}
	return s.Levels[len(s.Levels)-1].Inflight
}

// MergeConcurrency combines the concurrency sections of several windows
// (nil ones are skipped; nil when all are): counts add up, each level's
// distributions merge exactly, and the knee and reading are taken again
// from the merged levels.
func MergeConcurrency(sections ...*ConcurrencySection) *ConcurrencySection {
	return dist.MergeSections(sections, mergeConcurrency)
}

// mergeConcurrency combines two or more sections.
func mergeConcurrency(in []*ConcurrencySection) *ConcurrencySection {
	var levels [maxLevel + 1]*ConcurrencyLevel
	var queues, services [maxLevel + 1][]dist.Dist
	out := &ConcurrencySection{Levels: []ConcurrencyLevel{}}
	for _, s := range in {
		out.LimiterRejected += s.LimiterRejected
		for _, l := range s.Levels {
			i := min(max(l.Inflight, 0), maxLevel)
			if levels[i] == nil {
				levels[i] = &ConcurrencyLevel{Level: levelName(i), Inflight: i}
			}
			levels[i].Requests += l.Requests
			levels[i].Rejected += l.Rejected
			queues[i] = append(queues[i], l.QueueMs)
			services[i] = append(services[i], l.ServiceMs)
		}
	}
	for i, l := range levels {
		if l != nil {
			l.QueueMs, l.ServiceMs = dist.Merge(dist.Ms, queues[i]...), dist.Merge(dist.Ms, services[i]...)
			out.Levels = append(out.Levels, *l)
		}
	}
	out.read()
	return out
}
