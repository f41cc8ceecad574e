package histo

import (
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// driftMetrics are the prompt-prefix exports of docs/design.md "Prefix drift", counted from
// each inference Trace's prefix.Result.
type driftMetrics struct {
	reuse     prometheus.Histogram
	drifts    [prefix.NumSegmentKinds][prefix.NumClasses]prometheus.Counter
	missed    prometheus.Counter
	untracked [prefix.NumUntrackedReasons]prometheus.Counter
}

func newDriftMetrics() (*driftMetrics, []prometheus.Collector) {
	m := &driftMetrics{
		reuse: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "anvilproxy_prefix_reuse_ratio",
			Help:    "Share of each tracked prompt's bytes that an earlier request had sent as the same prefix.",
			Buckets: prometheus.LinearBuckets(0.1, 0.1, 10),
		}),
		missed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "anvilproxy_prefix_cache_miss_despite_reuse_total",
			Help: "Requests whose prefix was stable but the engine cached far fewer tokens than it could have (eviction, block granularity).",
		}),
	}
	drift := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "anvilproxy_prefix_drift_total",
		Help: "Requests that continued a conversation but changed its earlier prompt, by segment and kind of change.",
	}, []string{"segment", "class"})
	for k := prefix.SegmentKind(1); k < prefix.NumSegmentKinds; k++ {
		for c := prefix.Class(1); c < prefix.NumClasses; c++ {
			m.drifts[k][c] = drift.WithLabelValues(k.String(), c.String())
		}
	}
	untracked := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "anvilproxy_prefix_untracked_total",
		Help: "Inference requests whose prompt could not be tracked, by reason (not_json, unknown_shape, too_large, stateful).",
	}, []string{"reason"})
	for r := prefix.UntrackedReason(1); r < prefix.NumUntrackedReasons; r++ {
		m.untracked[r] = untracked.WithLabelValues(r.String())
	}
	return m, []prometheus.Collector{m.reuse, drift, m.missed, untracked}
}

func (m *driftMetrics) observe(res *prefix.Result) {
	if !res.Tracked {
		if int(res.Untracked) < len(m.untracked) && m.untracked[res.Untracked] != nil {
			m.untracked[res.Untracked].Inc()
		}
		return
	}
	if res.Reuse >= 0 {
		m.reuse.Observe(res.Reuse)
	}
	if d := &res.Drift; d.Happened && d.Segment < prefix.NumSegmentKinds && d.Class < prefix.NumClasses && m.drifts[d.Segment][d.Class] != nil {
		m.drifts[d.Segment][d.Class].Inc()
	}
	if res.MissDespiteReuse {
		m.missed.Inc()
	}
}

// Bounds of a window's prefix tally.
const (
	maxReuseSamples = 8192
	maxWindowDrifts = 50
)

// PrefixSection is a window's prompt-prefix figures: the snapshot's
// anvilproxy.prefix object. It holds counts, ratios and offsets, never text.
type PrefixSection struct {
	Tracked              int64            `json:"tracked"`
	Untracked            map[string]int64 `json:"untracked"`
	Reuse                ReuseSummary     `json:"reuse"`
	Drifts               int64            `json:"drifts"`
	DriftsBy             map[string]int64 `json:"drifts_by_segment_class"` // "system/digits"
	MaskedDrifts         int64            `json:"masked_drifts"`
	CacheChecked         int64            `json:"cache_checked"`
	MissDespiteReuse     int64            `json:"cache_miss_despite_reuse"`
	ExpectedCachedTokens int64            `json:"expected_cached_tokens"`
	EngineCachedTokens   int64            `json:"engine_cached_tokens"`
	RecentDrifts         []DriftRecord    `json:"recent_drifts"` // newest last, at most 50
}

// ReuseSummary describes the prefix reuse ratios of a window.
type ReuseSummary struct {
	Samples int64 `json:"samples"`
	Mean    Float `json:"mean"`
	P50     Float `json:"p50"`
	P90     Float `json:"p90"`
	Min     Float `json:"min"`
}

// DriftRecord is one drift event, located but without content.
type DriftRecord struct {
	At           time.Time `json:"at"`
	Conversation string    `json:"conversation"` // keyed hash, hex
	Turn         int       `json:"turn"`
	Segment      string    `json:"segment"`
	MessageIndex int       `json:"message_index"`
	Role         string    `json:"role"`
	Offset       int64     `json:"offset"`
	Exact        bool      `json:"offset_exact"`
	Class        string    `json:"class"`
	LostBytes    int64     `json:"lost_bytes"`
}

// prefixTally accumulates a window's prefix figures; guarded by Recorder.mu.
type prefixTally struct {
	tracked, drifts, masked, checked, missed int64
	expected, engine                         int64
	untracked                                [prefix.NumUntrackedReasons]int64
	by                                       [prefix.NumSegmentKinds][prefix.NumClasses]int64
	reuseSum                                 float64
	reuseN                                   int64
	reuse                                    []float64
	recent                                   []DriftRecord
}

func (t *prefixTally) add(tr *proxy.Trace) {
	res := &tr.Prefix
	if !res.Tracked {
		if int(res.Untracked) < len(t.untracked) {
			t.untracked[res.Untracked]++
		}
		return
	}
	t.tracked++
	if res.Reuse >= 0 {
		t.reuseSum += res.Reuse
		t.reuseN++
		if len(t.reuse) < maxReuseSamples {
			t.reuse = append(t.reuse, res.Reuse)
		}
	}
	if res.Masked {
		t.masked++
	}
	if res.CacheChecked {
		t.checked++
		t.expected += res.ExpectedCachedTokens
		t.engine += max(tr.CachedTokens, 0)
	}
	if res.MissDespiteReuse {
		t.missed++
	}
	d := &res.Drift
	if !d.Happened || d.Segment >= prefix.NumSegmentKinds || d.Class >= prefix.NumClasses {
		return
	}
	t.drifts++
	t.by[d.Segment][d.Class]++
	if len(t.recent) == maxWindowDrifts {
		t.recent = append(t.recent[:0], t.recent[1:]...)
	}
	t.recent = append(t.recent, DriftRecord{
		At: tr.Recv.Round(0).UTC(), Conversation: fmt.Sprintf("%016x", res.ConversationID), Turn: res.Turn,
		Segment: d.Segment.String(), MessageIndex: d.MessageIndex, Role: d.Role.String(),
		Offset: d.Offset, Exact: d.Exact, Class: d.Class.String(), LostBytes: d.LostBytes,
	})
}

func (t *prefixTally) clone() prefixTally {
	c := *t
	c.reuse = slices.Clone(t.reuse)
	c.recent = slices.Clone(t.recent)
	return c
}

// section summarizes the tally; it does not modify it.
func (t *prefixTally) section() *PrefixSection {
	s := &PrefixSection{
		Tracked: t.tracked, Untracked: map[string]int64{}, Drifts: t.drifts, DriftsBy: map[string]int64{},
		MaskedDrifts: t.masked, CacheChecked: t.checked, MissDespiteReuse: t.missed,
		ExpectedCachedTokens: t.expected, EngineCachedTokens: t.engine,
		RecentDrifts: append([]DriftRecord{}, t.recent...),
		Reuse:        ReuseSummary{Samples: t.reuseN, Mean: nan, P50: nan, P90: nan, Min: nan},
	}
	for r := prefix.UntrackedReason(1); r < prefix.NumUntrackedReasons; r++ {
		if n := t.untracked[r]; n > 0 {
			s.Untracked[r.String()] = n
		}
	}
	for k := range t.by {
		for c, n := range t.by[k] {
			if n > 0 {
				s.DriftsBy[prefix.SegmentKind(k).String()+"/"+prefix.Class(c).String()] = n
			}
		}
	}
	if t.reuseN > 0 {
		s.Reuse.Mean = Float(t.reuseSum / float64(t.reuseN))
		sorted := slices.Clone(t.reuse)
		slices.Sort(sorted)
		s.Reuse.P50, s.Reuse.P90, s.Reuse.Min = Float(dist.NearestRank(sorted, 50)), Float(dist.NearestRank(sorted, 90)), Float(sorted[0])
	}
	return s
}

var nan = dist.NaN

// MergePrefix combines the prefix sections of several windows (nil ones
// are skipped; nil when all are). Counts and the mean add up exactly; the
// merged reuse percentiles cannot be rebuilt from summaries and are null;
// the most recent drift events are kept.
func MergePrefix(sections ...*PrefixSection) *PrefixSection {
	return dist.MergeSections(sections, mergePrefix)
}

// mergePrefix combines two or more sections.
func mergePrefix(in []*PrefixSection) *PrefixSection {
	out := &PrefixSection{Untracked: map[string]int64{}, DriftsBy: map[string]int64{}, RecentDrifts: []DriftRecord{},
		Reuse: ReuseSummary{Mean: nan, P50: nan, P90: nan, Min: nan}}
	var sum float64
	for _, s := range in {
		out.Tracked += s.Tracked
		out.Drifts += s.Drifts
		out.MaskedDrifts += s.MaskedDrifts
		out.CacheChecked += s.CacheChecked
		out.MissDespiteReuse += s.MissDespiteReuse
		out.ExpectedCachedTokens += s.ExpectedCachedTokens
		out.EngineCachedTokens += s.EngineCachedTokens
		dist.AddCounts(out.Untracked, s.Untracked)
		dist.AddCounts(out.DriftsBy, s.DriftsBy)
		out.RecentDrifts = append(out.RecentDrifts, s.RecentDrifts...)
		if s.Reuse.Samples > 0 {
			sum += float64(s.Reuse.Mean) * float64(s.Reuse.Samples)
			out.Reuse.Samples += s.Reuse.Samples
			out.Reuse.Min = dist.Min(out.Reuse.Min, s.Reuse.Min)
		}
	}
	if out.Reuse.Samples > 0 {
		out.Reuse.Mean = Float(sum / float64(out.Reuse.Samples))
	}
	slices.SortStableFunc(out.RecentDrifts, func(a, b DriftRecord) int { return a.At.Compare(b.At) })
	if n := len(out.RecentDrifts); n > maxWindowDrifts {
		out.RecentDrifts = out.RecentDrifts[n-maxWindowDrifts:]
	}
	return out
}
