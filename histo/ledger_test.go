package histo

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// composed is a request of turn turn whose prompt has the given part sizes.
func composed(turn int, system, tools, history, last int64) prefix.Result {
	return prefix.Result{Tracked: true, ConversationID: 1, Turn: turn, Reuse: -1,
		PromptBytes: system + tools + history + last,
		SystemBytes: system, ToolsBytes: tools, HistoryBytes: history, LastTurnBytes: last}
}

// TestLedger: scripted prompt compositions give exact byte counts and
// shares, per-request share percentiles, and means by turn bucket.
func TestLedger(t *testing.T) {
	r, reg, _ := newTest(t, Config{})
	results := []prefix.Result{
		composed(0, 1000, 2000, 0, 1000),    // 25/50/0/25 %
		composed(1, 1000, 2000, 6000, 1000), // 10/20/60/10 %
		composed(2, 1000, 2000, 16000, 1000),
		composed(3, 1000, 2000, 26000, 1000),
		composed(4, 1000, 2000, 36000, 1000),
		composed(20, 1000, 2000, 76000, 1000),
		{Tracked: true, PromptBytes: 5000, Reuse: -1}, // a completions prompt: no parts
		{Untracked: prefix.UntrackedNotJSON, Reuse: -1},
	}
	for _, res := range results {
		tr := chat()
		tr.Prefix = res
		r.Record(&tr)
	}
	s := r.Rotate().Ledger
	require.Equal(t, int64(6), s.Requests)
	require.Equal(t, int64(6*4000+160000), s.PromptBytes)
	require.Equal(t, int64(6000), s.Parts.System.Bytes)
	require.Equal(t, int64(12000), s.Parts.Tools.Bytes)
	require.Equal(t, int64(160000), s.Parts.History.Bytes)
	require.Equal(t, int64(40000), s.Parts.History.TokensEst)
	require.Equal(t, int64(6000), s.Parts.LastTurn.Bytes)
	require.Equal(t, Float(160000.0/184000), s.Parts.History.Share, "history's share of all bytes sent, exact")
	require.Equal(t, int64(6), s.Parts.History.PerRequest.Count)
	// Per-request history shares: 0, .6, .8, .8667, .9, .95.
	require.InDelta(t, 0.8, float64(s.Parts.History.PerRequest.P50), 0.001)
	require.InDelta(t, 0.95, float64(s.Parts.History.PerRequest.P95), 0.001)
	require.InDelta(t, 0.5, float64(s.Parts.Tools.PerRequest.Max), 0.001)

	var turns []string
	for _, b := range s.ByTurn {
		turns = append(turns, b.Turns)
	}
	require.Equal(t, []string{"0", "1", "2", "3-4", "17+"}, turns)
	require.Equal(t, TurnBucket{Turns: "3-4", Requests: 2, MeanBytes: PartFloats{System: 1000, Tools: 2000, History: 31000, LastTurn: 1000}}, s.ByTurn[3])

	// Prometheus: bytes by part, and one share observation per part and request.
	require.Equal(t, 160000.0, counterValue(t, reg, "anvilproxy_prompt_bytes_total", prometheus.Labels{"part": "history"}))
	m := metricOf(t, reg, "anvilproxy_prompt_share_ratio", prometheus.Labels{"part": "last_turn"})
	require.Equal(t, uint64(6), m.GetHistogram().GetSampleCount())

	// Merging two windows gives what one window over both gives.
	half := func(rs []prefix.Result) *LedgerSection {
		for _, res := range rs {
			tr := chat()
			tr.Prefix = res
			r.Record(&tr)
		}
		return r.Rotate().Ledger
	}
	a, b := half(results[:3]), half(results[3:])
	whole := half(results)
	require.Equal(t, whole, MergeLedger(a, nil, b))
}

// TestLedgerMetricsAsVecs: the ledger's collector exports what a
// HistogramVec and a CounterVec of the same names, help, labels and
// buckets export for the same observations (shares on and between the
// bounds, parts of 0 bytes), created timestamps aside.
func TestLedgerMetricsAsVecs(t *testing.T) {
	ref := prometheus.NewRegistry()
	share := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "anvilproxy_prompt_share_ratio",
		Help:    "Share of each tracked prompt's bytes in one part: system, tools, history (up to the last assistant message) or last_turn (after it).",
		Buckets: prometheus.LinearBuckets(0.1, 0.1, 10),
	}, []string{"part"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "anvilproxy_prompt_bytes_total",
		Help: "Canonical prompt bytes sent, by part: system, tools, history or last_turn.",
	}, []string{"part"})
	ref.MustRegister(share, bytes)
	for p := range numParts {
		share.WithLabelValues(partNames[p])
		bytes.WithLabelValues(partNames[p])
	}
	got := prometheus.NewRegistry()
	m, cs := newLedgerMetrics()
	got.MustRegister(cs...)
	for _, res := range []prefix.Result{
		composed(0, 100, 0, 0, 900), composed(1, 100, 200, 300, 400), composed(2, 1, 1, 1, 1),
		composed(3, 3, 0, 7, 0), composed(4, 0, 0, 0, 5), composed(5, 1, 2, 3, 4),
	} {
		m.observe(&res)
		b, _ := partsOf(&res)
		for p, n := range b {
			share.WithLabelValues(partNames[p]).Observe(float64(n) / float64(res.PromptBytes))
			bytes.WithLabelValues(partNames[p]).Add(float64(n))
		}
	}
	require.Equal(t, exposition(t, ref), exposition(t, got))
}

// exposition is reg's families as text, created timestamps left out.
func exposition(t *testing.T, reg *prometheus.Registry) string {
	fams, err := reg.Gather()
	require.NoError(t, err)
	var b strings.Builder
	for _, f := range fams {
		fmt.Fprintf(&b, "%s %s %s\n", f.GetName(), f.GetType(), f.GetHelp())
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				fmt.Fprintf(&b, " %s=%s", l.GetName(), l.GetValue())
			}
			if c := m.GetCounter(); c != nil {
				fmt.Fprintf(&b, " counter %v", c.GetValue())
			}
			if h := m.GetHistogram(); h != nil {
				fmt.Fprintf(&b, " count %d sum %v", h.GetSampleCount(), h.GetSampleSum())
				for _, bk := range h.GetBucket() {
					fmt.Fprintf(&b, " le%v:%d", bk.GetUpperBound(), bk.GetCumulativeCount())
				}
				require.True(t, h.CreatedTimestamp.IsValid(), "a created timestamp")
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
