package histo

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// The prompt ledger: what each request's prompt is made of (system, tools,
// history, last turn; see prefix.Result.SystemBytes), so that a user sees
// at a glance that "history is 70% of what you send" and how each part
// grows with the turn number.

// part is one part of a prompt.
type part uint8

const (
	partSystem part = iota
	partTools
	partHistory
	partLastTurn
	numParts
)

var partNames = [numParts]string{"system", "tools", "history", "last_turn"}

// ledgerBytesPerToken estimates tokens from bytes, as the sim and the
// prefix tracker do by default.
const ledgerBytesPerToken = 4

// partsOf is res's composition, or false when it has none (untracked, a
// completions prompt, or an empty prompt).
func partsOf(res *prefix.Result) ([numParts]int64, bool) {
	p := [numParts]int64{res.SystemBytes, res.ToolsBytes, res.HistoryBytes, res.LastTurnBytes}
	ok := res.Tracked && res.PromptBytes > 0 && p[0]+p[1]+p[2]+p[3] == res.PromptBytes
	return p, ok
}

// turnBuckets bound the turn numbers the ledger averages over: the first
// turns one by one, then doubling ranges.
var turnBuckets = [...]struct {
	name    string
	through int // the last turn in the bucket
}{{"0", 0}, {"1", 1}, {"2", 2}, {"3-4", 4}, {"5-8", 8}, {"9-16", 16}, {"17+", 1<<31 - 1}}

func turnBucket(turn int) int {
	for i, b := range turnBuckets {
		if turn <= b.through {
			return i
		}
	}
	return len(turnBuckets) - 1
}

// ledgerMetrics are the prompt ledger's Prometheus exports: the share
// histogram and the bytes counter by part. A request's four share
// observations and four byte counts are taken under one mutex, and
// exported at scrape as constant metrics (Collect), the same series a
// HistogramVec and a CounterVec would export (TestLedgerMetricsAsVecs):
// those took sixteen atomic updates per request (BENCHMARKS.md "Session 8
// (issue 25): the recording's cost"). Safe for concurrent use.
type ledgerMetrics struct {
	share, bytes *prometheus.Desc
	created      time.Time

	mu    sync.Mutex
	below [numParts][len(shareBounds) + 1]uint64 // observations by bucket, not cumulative; the last above every bound
	count [numParts]uint64
	sum   [numParts]float64
	total [numParts]float64 // bytes
}

// shareBounds are the share histogram's bucket upper bounds.
var shareBounds = [10]float64(prometheus.LinearBuckets(0.1, 0.1, 10))

func newLedgerMetrics() (*ledgerMetrics, []prometheus.Collector) {
	m := &ledgerMetrics{
		share: prometheus.NewDesc("anvilproxy_prompt_share_ratio",
			"Share of each tracked prompt's bytes in one part: system, tools, history (up to the last assistant message) or last_turn (after it).",
			[]string{"part"}, nil),
		bytes: prometheus.NewDesc("anvilproxy_prompt_bytes_total",
			"Canonical prompt bytes sent, by part: system, tools, history or last_turn.",
			[]string{"part"}, nil),
		created: time.Now(),
	}
	return m, []prometheus.Collector{m}
}

func (m *ledgerMetrics) observe(res *prefix.Result) {
	b, ok := partsOf(res)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for p, n := range b {
		v := float64(n) / float64(res.PromptBytes)
		// The first bound at or above v, as client_golang's findBucket.
		m.below[p][sort.SearchFloat64s(shareBounds[:], v)]++
		m.count[p]++
		m.sum[p] += v
		m.total[p] += float64(n)
	}
}

// Describe implements prometheus.Collector.
func (m *ledgerMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.share
	ch <- m.bytes
}

// Collect implements prometheus.Collector: the counts as they are now.
func (m *ledgerMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	below, count, sum, total := m.below, m.count, m.sum, m.total
	m.mu.Unlock()
	for p := range numParts {
		cum, n := make(map[float64]uint64, len(shareBounds)), uint64(0)
		for i, ub := range shareBounds {
			n += below[p][i]
			cum[ub] = n
		}
		ch <- prometheus.MustNewConstHistogramWithCreatedTimestamp(m.share, count[p], sum[p], cum, m.created, partNames[p])
		ch <- prometheus.MustNewConstMetricWithCreatedTimestamp(m.bytes, prometheus.CounterValue, total[p], m.created, partNames[p])
	}
}

// LedgerSection is a window's prompt composition: the snapshot's
// anvilproxy.prompt_ledger object. It holds byte counts and ratios, never
// text.
type LedgerSection struct {
	// Requests counts the requests with a composition (tracked chat,
	// Responses and Messages prompts); PromptBytes is their canonical
	// prompt bytes.
	Requests    int64       `json:"requests"`
	PromptBytes int64       `json:"prompt_bytes"`
	Parts       LedgerParts `json:"parts"`
	// ByTurn is the mean size of each part by the request's turn in its
	// conversation: how the parts grow as an agent works.
	ByTurn        []TurnBucket `json:"by_turn"`
	BytesPerToken int          `json:"bytes_per_token"` // the tokens_est divisor
}

// LedgerParts holds one value per prompt part.
type LedgerParts struct {
	System   LedgerPart `json:"system"`
	Tools    LedgerPart `json:"tools"`
	History  LedgerPart `json:"history"`
	LastTurn LedgerPart `json:"last_turn"`
}

// LedgerPart is one part's bytes over the window: Share is Bytes /
// PromptBytes (of all bytes sent, the part's share), PerRequest the
// distribution of each request's own share.
type LedgerPart struct {
	Bytes      int64     `json:"bytes"`
	TokensEst  int64     `json:"tokens_est"`
	Share      Float     `json:"share"`
	PerRequest dist.Dist `json:"share_per_request"`
}

// TurnBucket is the mean bytes of each part over the requests whose turn
// falls in Turns ("0", "1", "2", "3-4", "5-8", "9-16", "17+").
type TurnBucket struct {
	Turns     string     `json:"turns"`
	Requests  int64      `json:"requests"`
	MeanBytes PartFloats `json:"mean_bytes"`
}

// PartFloats holds one number per prompt part.
type PartFloats struct {
	System   Float `json:"system"`
	Tools    Float `json:"tools"`
	History  Float `json:"history"`
	LastTurn Float `json:"last_turn"`
}

func (l *LedgerParts) at(p part) *LedgerPart {
	return [...]*LedgerPart{&l.System, &l.Tools, &l.History, &l.LastTurn}[p]
}

func (f *PartFloats) at(p part) *Float {
	return [...]*Float{&f.System, &f.Tools, &f.History, &f.LastTurn}[p]
}

// ledgerTally accumulates a window's prompt composition; guarded by
// Recorder.mu.
type ledgerTally struct {
	requests, prompt int64
	bytes            [numParts]int64
	share            [numParts]dist.Rec
	byTurn           [len(turnBuckets)]struct {
		n     int64
		bytes [numParts]int64
	}
}

func (t *ledgerTally) add(tr *proxy.Trace) {
	res := &tr.Prefix
	b, ok := partsOf(res)
	if !ok {
		return
	}
	t.requests++
	t.prompt += res.PromptBytes
	bt := &t.byTurn[turnBucket(res.Turn)]
	bt.n++
	for p, n := range b {
		t.bytes[p] += n
		bt.bytes[p] += n
		t.share[p].Record(dist.Share, float64(n)/float64(res.PromptBytes))
	}
}

func (t *ledgerTally) clone() ledgerTally {
	c := *t
	for p := range c.share {
		c.share[p] = t.share[p].Clone()
	}
	return c
}

// section summarizes the tally; it does not modify it.
func (t *ledgerTally) section() *LedgerSection {
	s := &LedgerSection{Requests: t.requests, PromptBytes: t.prompt, BytesPerToken: ledgerBytesPerToken, ByTurn: []TurnBucket{}}
	for p := range numParts {
		*s.Parts.at(p) = LedgerPart{
			Bytes: t.bytes[p], TokensEst: t.bytes[p] / ledgerBytesPerToken,
			Share: ratio(t.bytes[p], t.prompt), PerRequest: t.share[p].Dist(dist.Share),
		}
	}
	for i, bt := range t.byTurn {
		if bt.n > 0 {
			s.ByTurn = append(s.ByTurn, turnBucketOf(i, bt.n, bt.bytes))
		}
	}
	return s
}

func turnBucketOf(i int, n int64, bytes [numParts]int64) TurnBucket {
	b := TurnBucket{Turns: turnBuckets[i].name, Requests: n}
	for p := range numParts {
		*b.MeanBytes.at(p) = Float(float64(bytes[p]) / float64(n))
	}
	return b
}

// MergeLedger combines the ledger sections of several windows (nil ones
// are skipped; nil when all are). Byte counts add up and the per-request
// share distributions merge exactly; the means by turn are weighted by
// their requests.
func MergeLedger(sections ...*LedgerSection) *LedgerSection {
	return dist.MergeSections(sections, mergeLedger)
}

// mergeLedger combines two or more sections.
func mergeLedger(in []*LedgerSection) *LedgerSection {
	var t ledgerTally
	var shares [numParts][]dist.Dist
	for _, s := range in {
		t.requests += s.Requests
		t.prompt += s.PromptBytes
		for p := range numParts {
			t.bytes[p] += s.Parts.at(p).Bytes
			shares[p] = append(shares[p], s.Parts.at(p).PerRequest)
		}
		for _, b := range s.ByTurn {
			for i, tb := range turnBuckets {
				if tb.name != b.Turns {
					continue
				}
				bt := &t.byTurn[i]
				bt.n += b.Requests
				for p := range numParts {
					if v := *b.MeanBytes.at(p); v.Known() {
						bt.bytes[p] += int64(math.Round(float64(v) * float64(b.Requests)))
					}
				}
			}
		}
	}
	out := t.section()
	for p := range numParts {
		out.Parts.at(p).PerRequest = dist.Merge(dist.Share, shares[p]...)
	}
	return out
}
