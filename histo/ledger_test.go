package histo

import (
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
