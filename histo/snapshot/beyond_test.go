package snapshot

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/anvilproxy/anvilproxy/histo"
	"github.com/anvilproxy/anvilproxy/histo/dist"
	"github.com/anvilproxy/anvilproxy/histo/selfcheck"
	"github.com/anvilproxy/anvilproxy/proxy"
	"github.com/anvilproxy/anvilproxy/proxy/prefix"
)

// agentTrace is request i of three interleaved agent conversations: the
// workload's trace(i), linked to conversation i%3+1 at turn i/3, with a
// prompt whose history grows by 8 KiB a turn, admitted with i%5 others in
// flight.
func agentTrace(i int) proxy.Trace {
	tr := trace(i)
	turn := i / 3
	tr.InflightAtAdmit = i % 5
	tr.Prefix = prefix.Result{
		Tracked: true, ConversationID: uint64(i%3 + 1), Turn: turn, Reuse: -1,
		SystemBytes: 4096, ToolsBytes: 8192, HistoryBytes: int64(turn) * 8192, LastTurnBytes: 1024,
	}
	tr.Prefix.PromptBytes = 4096 + 8192 + int64(turn)*8192 + 1024
	return tr
}

// agentWindows records requests 0..n−1 of the agent workload, rotating
// after each cut, and returns the windows' documents read back from files.
func agentWindows(t *testing.T, n int, cuts ...int) []*Document {
	t.Helper()
	r, clk := newRecorder(t, histo.Config{})
	var docs []*Document
	from := 0
	for _, to := range append(cuts, n) {
		for i := from; i < to; i++ {
			tr := agentTrace(i)
			r.Record(&tr)
		}
		clk.t = t0.Add(time.Duration(to) * time.Second)
		docs = append(docs, roundTrip(t, build(t, r.Rotate())))
		from = to
	}
	return docs
}

// TestSectionsInSnapshot: the four sections are in the document, read back
// from a file, and merge: the ledger and the concurrency levels exactly as
// one window over every request, the conversations' counts and times by
// adding up.
func TestSectionsInSnapshot(t *testing.T) {
	whole := agentWindows(t, 30)[0]
	g := generic(t, whole)["anvilproxy"].(map[string]any)
	for _, k := range []string{"conversations", "prompt_ledger", "concurrency", "measurement_quality"} {
		require.IsType(t, map[string]any{}, g[k], k)
	}
	parts := agentWindows(t, 30, 13)
	merged, err := Merge(parts[1], parts[0])
	require.NoError(t, err)
	merged = roundTrip(t, merged)
	w, m := generic(t, whole)["anvilproxy"].(map[string]any), generic(t, merged)["anvilproxy"].(map[string]any)
	require.Equal(t, w["prompt_ledger"], m["prompt_ledger"])
	require.Equal(t, w["concurrency"], m["concurrency"])

	read := func(d *Document) *histo.ConversationsSection {
		s, err := section[histo.ConversationsSection](d.Anvilproxy.Conversations, "conversations")
		require.NoError(t, err)
		return s
	}
	cw, cm := read(whole), read(merged)
	require.Equal(t, cw.Turns, cm.Turns)
	require.InDelta(t, float64(cw.AgentMs), float64(cm.AgentMs), 1e-6, "the gap across the cut counts once")
	require.InDelta(t, float64(cw.EngineMs), float64(cm.EngineMs), 1e-6)
	require.Equal(t, cw.AgentGapMs, cm.AgentGapMs)
	require.Equal(t, int64(6), cm.Conversations, "three conversations in each of two windows")
	jw, err := json.Marshal(cw.Slowest)
	require.NoError(t, err)
	jm, err := json.Marshal(cm.Slowest)
	require.NoError(t, err)
	require.JSONEq(t, string(jw), string(jm), "each conversation by its latest record")

	q, err := section[selfcheck.Section](merged.Anvilproxy.MeasurementQuality, "measurement_quality")
	require.NoError(t, err)
	require.Equal(t, selfcheck.VerdictUnknown, q.Verdict, "the probe was not started")
}

// TestMergeBenchmarkKeepsSectionsNull: a benchmark file has none of the
// sections, and a merge of it alone has none either.
func TestMergeBenchmarkKeepsSectionsNull(t *testing.T) {
	ref, err := Decode(readReference(t))
	require.NoError(t, err)
	merged, err := Merge(ref, ref)
	require.NoError(t, err)
	g := generic(t, merged)["anvilproxy"].(map[string]any)
	for _, k := range []string{"conversations", "prompt_ledger", "concurrency", "measurement_quality"} {
		require.Nil(t, g[k], k)
	}
	mixed, err := Merge(ref, agentWindows(t, 12)[0])
	require.NoError(t, err)
	require.NotNil(t, mixed.Anvilproxy.PromptLedger)
}

// TestReportBeyondGolden: the report's lines after the phase table for a
// window of the agent workload, and a noisy host.
func TestReportBeyondGolden(t *testing.T) {
	doc := agentWindows(t, 30)[0]
	q := selfcheck.Section{
		Verdict: selfcheck.VerdictNoisy, Reasons: []string{"timer overshoot p99 12 ms > 5 ms", "cpu pressure 35% > 10%"},
		TimerOvershootMs: dist.Dist{Count: 240, P50: 0.4, P90: 3, P95: 6, P99: 12.1, Max: 40},
		ProbePeriodMs:    250, Pressure: selfcheck.PSI{CPU: 0.35, IO: 0.01, Memory: 0},
		Thresholds: selfcheck.Thresholds{OvershootP99Ms: 5, Pressure: 0.1},
	}
	raw, err := json.Marshal(q)
	require.NoError(t, err)
	doc.Anvilproxy.MeasurementQuality = raw
	var b strings.Builder
	require.NoError(t, WriteTable(&b, doc))
	out := b.String()
	out = out[strings.Index(out, "goodput"):]
	golden := filepath.Join("testdata", "report-beyond.golden")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		require.NoError(t, os.WriteFile(golden, []byte(out), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), out)
}

func TestKneeLine(t *testing.T) {
	rule := "lowest level where queue p95 >= 0.5 x service p50"
	for _, c := range []struct {
		s    histo.ConcurrencySection
		want string
	}{
		{histo.ConcurrencySection{Reading: histo.ReadingHeadroom, Knee: 4, Typical: 1, KneeRule: rule},
			"headroom: typically 1 in flight; the knee is at 4 (knee: the " + rule + ")"},
		{histo.ConcurrencySection{Reading: histo.ReadingAtKnee, Knee: 4, Typical: 4, KneeRule: rule},
			"at the knee: typically 4 in flight, where requests start to wait; more load will queue (knee: the " + rule + ")"},
		{histo.ConcurrencySection{Reading: histo.ReadingQueueBound, Knee: 4, Typical: 9, KneeRule: rule},
			"queue-bound: typically 9 in flight, past the knee at 4: requests wait about as long as they are served (knee: the " + rule + ")"},
		{histo.ConcurrencySection{Reading: histo.ReadingRejecting, Knee: -1, Typical: 3, LimiterRejected: 7, KneeRule: rule},
			"rejecting: a noticeable share of the most loaded requests got 429/503 (7 refused by the proxy's limiter); typically 3 in flight; no level reached the knee (knee: the " + rule + ")"},
		{histo.ConcurrencySection{Reading: histo.ReadingUnknown, Knee: -1, Typical: -1, KneeRule: rule},
			"unknown: no request with a known queue and service time"},
	} {
		require.Equal(t, c.want, kneeLine(&c.s))
	}
}

// TestReportSlotsKVBound: the report's engine line says why fewer than
// the slots ran at once when the engine's KV cache held requests back.
func TestReportSlotsKVBound(t *testing.T) {
	doc := agentWindows(t, 30)[0]
	for _, c := range []struct {
		kv   int64
		want string
	}{
		{0, "engine      4 slots for the occupancy split (hint; --engine-slots 4)\n"},
		{6, "engine      4 slots for the occupancy split (hint; --engine-slots 4; KV cache held 6 waits)\n"},
	} {
		raw, err := json.Marshal(histo.SlotsSection{Hint: 4, Learned: 2, Effective: 4, State: histo.SlotsHint, Waited: 6, KVBound: c.kv})
		require.NoError(t, err)
		doc.Anvilproxy.EngineSlots = raw
		var b strings.Builder
		require.NoError(t, WriteTable(&b, doc))
		require.Contains(t, b.String(), c.want)
	}
}
